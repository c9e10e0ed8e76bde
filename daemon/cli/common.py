"""What every subcommand shares: the config built from the file and the global flags, logging."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from edgepilot.config import Config, load_config, resolve_config_path
from edgepilot.errors import CommandError, ConfigError


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """The global flags that override config keys (None: not given)."""
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
    """Log lines to stderr at ``level`` (stdout is for the subcommand's output)."""
    logging.basicConfig(level=getattr(logging, level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def check_view_flags(args: argparse.Namespace) -> None:
    """``--interval`` and ``--json`` of a live view (``top``, ``fleet top``)."""
    if not 0.1 <= args.interval <= 3600:
        raise CommandError(f"--interval {args.interval}: allowed 0.1..3600 seconds",
                           field="interval")
    if args.json and not args.once:
        raise CommandError("--json needs --once (the live view is for a terminal)",
                           field="json")
