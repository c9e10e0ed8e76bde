"""``edgepilot run [--host H] [--port P]``: the daemon in the foreground."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from edgepilot.cli.common import config_from, overrides_from, setup_logging
from edgepilot.config import check_http_exposure, resolve_config_path
from edgepilot.errors import EdgepilotError


def add_parser(sub: Any) -> None:
    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("--host", default=None, help="HTTP bind address (overrides [http] host)")
    run.add_argument("--port", type=int, default=None, help="HTTP port (overrides [http] port)")
    run.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    # imported here: the composition root pulls in every runtime, which other subcommands skip
    from edgepilot.lifecycle import Daemon

    config = config_from(args)
    setup_logging(config.daemon.log_level)
    if args.port is not None and not 0 <= args.port <= 65535:
        raise EdgepilotError(f"--port {args.port}: allowed 0..65535", field="port")
    # before anything starts (models, DVFS, the broker): an exposed API without a token is
    # refused outright, not served with a warning nobody reads
    check_http_exposure(args.host or config.http.host, config.http)
    daemon = Daemon(config, resolve_config_path(args.config), args.host, args.port,
                    overrides=overrides_from(args))
    return asyncio.run(daemon.run())
