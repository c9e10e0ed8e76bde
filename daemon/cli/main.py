"""The ``edgepilot`` parser and entry point: global flags, then a subcommand.

Each subcommand is a module of this package with ``add_parser(subparsers) -> None`` whose parser
sets ``func(args) -> int``; they are imported and added below, in the order ``--help`` lists them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from edgepilot import __version__
from edgepilot.cli import doctor, fleet, plan, profile, run, sweep, top, worker
from edgepilot.errors import EdgepilotError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgepilot",
        description="Serve models on ARM/NPU edge boards through the fastest mix of backends.")
    add_global_flags(parser, None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    run.add_parser(sub)
    ver = sub.add_parser("version", help="print the version")
    ver.add_argument("--json", action="store_true")
    ver.set_defaults(func=cmd_version)
    for module in (doctor, profile, plan, sweep, top, fleet, worker):
        module.add_parser(sub)
    # global flags after the subcommand too (`edgepilot run --config F`, `make run ARGS=...`)
    for subparser in set(sub.choices.values()):
        add_global_flags(subparser, argparse.SUPPRESS)
    return parser


def add_global_flags(parser: argparse.ArgumentParser, default: Any) -> None:
    """The flags every subcommand shares; ``default`` SUPPRESS on a subcommand's parser keeps
    a flag given before the subcommand when it is not repeated after it. A subcommand that
    defines one of these names itself keeps its own."""
    flags: list[tuple[str, dict[str, Any]]] = [
        ("--config", {"type": Path, "help": "TOML config (default /etc/edgepilot/edgepilot.toml "
                                            "when present, else the embedded default)"}),
        ("--sysfs-root", {"type": Path,
                          "help": "root under which /sys and /proc are read (default /)"}),
        ("--state-dir", {"type": Path,
                         "help": "journals, plan cache, spool, demo models (default "
                                 "$STATE_DIRECTORY, else $XDG_STATE_HOME/edgepilot, else "
                                 "~/.local/state/edgepilot)"}),
        ("--model-dir", {"type": Path,
                         "help": "where models are loaded from (default <state dir>/models)"}),
        ("--log-level", {"choices": ["debug", "info", "warning", "error"]}),
    ]
    for flag, kwargs in flags:
        try:
            parser.add_argument(flag, default=default, **kwargs)
        except argparse.ArgumentError:
            continue


def cmd_version(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps({"version": __version__}))
    else:
        print(f"edgepilot {__version__}")
    return 0


# commands that run as services: an unexpected error keeps its traceback on stderr
_KEEP_TRACEBACK = {"run", "worker"}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below
        return rc
    except EdgepilotError as exc:
        print(f"edgepilot: error: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `edgepilot ... | head`: the reader left; say nothing more (no traceback) and exit
        # as a shell does when its output pipe closes
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:
        if args.command in _KEEP_TRACEBACK:
            raise  # the service's journal keeps what a crash says
        # a bug of ours, not the operator's input: one line, the traceback kept for a report
        fd, where = tempfile.mkstemp(prefix="edgepilot-traceback-", suffix=".txt")
        with os.fdopen(fd, "w") as out:
            traceback.print_exc(file=out)
        text = " ".join(str(exc).split())[:200]
        print(f"edgepilot: internal error: {type(exc).__name__}: {text} (a bug in edgepilot, "
              f"not in the input; traceback in {where})", file=sys.stderr)
        return 70
