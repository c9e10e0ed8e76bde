"""``edgepilot doctor``: what this board and install can do (filled in by each capability)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("doctor", help="report board, backends, sysfs writability, MQTT")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    from edgepilot import __version__

    report: dict[str, Any] = {"version": __version__}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(report)
    return 0
