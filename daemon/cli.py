"""The ``edgepilot`` command line: global flags, then a subcommand.

Subcommands live in their own modules and register through :data:`SUBCOMMANDS`: each module
exposes ``add_parser(subparsers) -> None`` whose parser sets ``func(args) -> int``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from edgepilot import __version__
from edgepilot.config import Config, load_config, resolve_config_path
from edgepilot.errors import ConfigError, EdgepilotError

log = logging.getLogger("edgepilot")

# modules with ``add_parser(subparsers)``; later capabilities append theirs
SUBCOMMANDS: list[str] = [
    "edgepilot.doctor",
    "edgepilot.profile_cli",
    "edgepilot.plan_cli",
    "edgepilot.sweep_cli",
    "edgepilot.top.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgepilot",
        description="Serve models on ARM/NPU edge boards through the fastest mix of backends.")
    add_global_flags(parser, None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("--host", default=None, help="HTTP bind address (overrides [http] host)")
    run.add_argument("--port", type=int, default=None, help="HTTP port (overrides [http] port)")
    run.set_defaults(func=cmd_run)

    ver = sub.add_parser("version", help="print the version")
    ver.add_argument("--json", action="store_true")
    ver.set_defaults(func=cmd_version)

    for modname in SUBCOMMANDS:
        importlib.import_module(modname).add_parser(sub)
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


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    return {"state_dir": args.state_dir, "model_dir": args.model_dir,
            "sysfs_root": args.sysfs_root}


def config_from(args: argparse.Namespace) -> Config:
    """The config every subcommand sees: file (or embedded default) + global flag overrides."""
    config = load_config(resolve_config_path(args.config), overrides_from(args))
    root = config.daemon.sysfs_root
    if not root.is_dir():
        # a typo here would otherwise read as an empty generic board and "work"
        raise ConfigError(f"sysfs root {root} is not a directory; fix --sysfs-root or "
                          "[daemon] sysfs_root", field="daemon.sysfs_root")
    if args.log_level:
        config.daemon.log_level = args.log_level
    return config


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def cmd_run(args: argparse.Namespace) -> int:
    from edgepilot.lifecycle import Daemon

    config = config_from(args)
    setup_logging(config.daemon.log_level)
    if args.port is not None and not 0 <= args.port <= 65535:
        raise EdgepilotError(f"--port {args.port}: allowed 0..65535", field="port")
    daemon = Daemon(config, resolve_config_path(args.config), args.host, args.port,
                    overrides=overrides_from(args))
    return asyncio.run(daemon.run())


def cmd_version(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps({"version": __version__}))
    else:
        print(f"edgepilot {__version__}")
    return 0


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
