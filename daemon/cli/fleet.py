"""``edgepilot fleet ls|run|top|rollout``: the fleet through the broker alone.

Exit status: 0 every device asked answered (and, for ``run``, answered ok); 1 some answered
with an error (or a rollout stopped and rolled back); 2 bad input or the broker unreachable;
3 some devices did not answer before ``--timeout`` (they are named).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from edgepilot.cli.common import check_view_flags, config_from
from edgepilot.config import MqttSection
from edgepilot.errors import CommandError

EXIT_ERRORS, EXIT_NOT_ANSWERING = 1, 3


def add_parser(sub: Any) -> None:
    p = sub.add_parser("fleet", help="the devices on the broker: list, command, top, rollout "
                                     "(needs only the broker, no local daemon)")
    p.add_argument("--host", default=None, help="broker host (default: the config's [mqtt])")
    p.add_argument("--port", type=int, default=None, help="broker port")
    p.add_argument("--prefix", default=None, help="topic prefix (default: [mqtt] topic_prefix)")
    fsub = p.add_subparsers(dest="fleet_command", metavar="FLEET_COMMAND")
    fsub.required = True
    ls = fsub.add_parser("ls", help="every device from its retained status")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_ls)
    run = fsub.add_parser("run", help="a command on many devices, each reply collected")
    run.add_argument("verb", help="the command (status, profile.apply, model.list ...)")
    run.add_argument("--params", default="{}", help="the command's params as a JSON object")
    who = run.add_mutually_exclusive_group()
    who.add_argument("--group", default=None,
                     help="a group of [mqtt] groups, or 'all' (every known device; default)")
    who.add_argument("--device", action="append", default=None,
                     help="a device id (repeatable)")
    run.add_argument("--timeout", type=float, default=5.0,
                     help="seconds to wait for replies (default 5)")
    run.add_argument("--json", action="store_true")
    run.set_defaults(func=cmd_run)
    top = fsub.add_parser("top", help="the live fleet table from telemetry, totals per kind")
    top.add_argument("--interval", type=float, default=2.0,
                     help="seconds between redraws; with --once, how long telemetry is "
                          "gathered first (make it longer than [telemetry] "
                          "publish_interval_s; default 2)")
    top.add_argument("--once", action="store_true", help="print one table and exit")
    top.add_argument("--json", action="store_true", help="with --once: as JSON")
    top.set_defaults(func=cmd_top)
    ro = fsub.add_parser("rollout", help="a DVFS profile or a config file to a group: "
                                         "canaries first, then batches, each watched; rolled "
                                         "back when unhealthy")
    ro.add_argument("what", choices=["profile", "config"], help="what is rolled out")
    ro.add_argument("name", help="the profile's name (profile.list), or the TOML file")
    ro.add_argument("--group", default="all", help="a group of [mqtt] groups, or 'all'")
    ro.add_argument("--canary", type=int, default=1, help="devices changed first (default 1)")
    ro.add_argument("--batch", type=float, default=25.0,
                    help="then this percent of the devices at a time (default 25)")
    ro.add_argument("--dwell", type=float, default=60.0,
                    help="seconds each batch is watched before the next (default 60)")
    ro.add_argument("--max-error-rate", type=float, default=0.05,
                    help="failed requests per request allowed during a dwell (default 0.05)")
    ro.add_argument("--timeout", type=float, default=5.0,
                    help="seconds to wait for each reply (default 5)")
    ro.add_argument("--json", action="store_true")
    ro.set_defaults(func=cmd_rollout)


def broker_config(args: argparse.Namespace) -> MqttSection:
    """[mqtt] of the config, with --host/--port/--prefix over it."""
    cfg = config_from(args).mqtt
    update: dict[str, Any] = {}
    if args.host is not None:
        update["host"] = args.host
    if args.port is not None:
        if not 1 <= args.port <= 65535:
            raise CommandError(f"--port {args.port}: allowed 1..65535", field="port")
        update["port"] = args.port
    if args.prefix is not None:
        update["topic_prefix"] = args.prefix
    return cfg.model_copy(update=update)


def cmd_ls(args: argparse.Namespace) -> int:
    from edgepilot.fleet.client import FleetClient
    from edgepilot.fleet.view import device_row, render_ls

    with FleetClient(broker_config(args)) as fleet:
        rows = [device_row(d) for _, d in sorted(fleet.devices.items())]
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        sys.stdout.write(render_ls(rows))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from edgepilot.fleet.client import FleetClient
    from edgepilot.fleet.view import render_run

    try:
        params = json.loads(args.params)
    except ValueError as exc:
        raise CommandError(f"--params is not JSON: {exc}", field="params") from None
    if not isinstance(params, dict):
        raise CommandError("--params must be a JSON object", field="params")
    if not 0.1 <= args.timeout <= 3600:
        raise CommandError(f"--timeout {args.timeout}: allowed 0.1..3600 seconds",
                           field="timeout")
    with FleetClient(broker_config(args)) as fleet:
        devices = fleet.select(group=args.group, devices=args.device)
        if not devices:
            raise CommandError(f"no device {'in group ' + args.group if args.group else ''}"
                               " known from the retained statuses; see `edgepilot fleet ls`",
                               field="group" if args.group else "device")
        result = fleet.run(args.verb, params, devices=devices, group=args.group,
                           timeout_s=args.timeout)
    if args.json:
        print(json.dumps(result.as_dict(), indent=2, default=str))
    else:
        sys.stdout.write(render_run(result))
    if result.missing:
        return EXIT_NOT_ANSWERING
    return EXIT_ERRORS if any(not r.get("ok") for r in result.replies.values()) else 0


def cmd_rollout(args: argparse.Namespace) -> int:
    from edgepilot.fleet.client import FleetClient
    from edgepilot.fleet.rollout import Rollout, config_change, profile_change

    for flag, value, low, high in (("canary", args.canary, 0, 100_000),
                                   ("batch", args.batch, 0.1, 100),
                                   ("dwell", args.dwell, 0, 86_400),
                                   ("max-error-rate", args.max_error_rate, 0, 1),
                                   ("timeout", args.timeout, 0.1, 3600)):
        if not low <= value <= high:
            raise CommandError(f"--{flag} {value}: allowed {low}..{high}", field=flag)
    if args.what == "config":
        path = Path(args.name)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"config file {path}: {exc}", field="name") from None
        change = config_change(path.name, text)
    else:
        change = profile_change(args.name)
    with FleetClient(broker_config(args)) as fleet:
        targets = fleet.select(group=args.group)
        if not targets:
            raise CommandError(f"no device in group {args.group!r} known from the retained "
                               "statuses; see `edgepilot fleet ls`", field="group")
        say = (lambda _: None) if args.json else (lambda line: print(line, flush=True))
        result = Rollout(fleet, change, targets, canary=args.canary, batch_pct=args.batch,
                         dwell_s=args.dwell, timeout_s=args.timeout,
                         max_error_rate=args.max_error_rate, say=say).run()
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    elif result.ok:
        print(f"rolled out {result.change} to {len(result.changed)} devices")
    else:
        print(f"stopped at {result.stopped}; rolled back: {', '.join(result.rolled_back)}")
    return 0 if result.ok else EXIT_ERRORS


def cmd_top(args: argparse.Namespace) -> int:
    import time

    from edgepilot.fleet.client import FleetClient
    from edgepilot.fleet.top import device_load, render_top, totals

    check_view_flags(args)
    with FleetClient(broker_config(args)) as fleet:
        fleet.subscribe(f"{fleet.prefix}/+/telemetry")
        while True:
            time.sleep(args.interval)
            with fleet.lock:
                rows = [device_load(d, fleet.telemetry.get(name))
                        for name, d in sorted(fleet.devices.items())]
            kinds = totals(rows)
            if args.json:
                print(json.dumps({"devices": rows, "kinds": kinds}, indent=2))
            else:
                # like top: the screen redrawn in place (plain text with --once)
                sys.stdout.write(("" if args.once else "\x1b[H\x1b[2J")
                                 + render_top(rows, kinds))
                sys.stdout.flush()
            if args.once:
                return 0
