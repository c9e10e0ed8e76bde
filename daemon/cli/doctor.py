"""``edgepilot doctor``: what this board and install can do, and why not where they can't.

Board identity and sysfs (from the board layer), every backend target with a PASS/FAIL tiny probe
and its reason, state-dir writability and MQTT broker reachability. Exit code 0 when the daemon
can serve at least one target, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from edgepilot import __version__
from edgepilot.cli.common import config_from
from edgepilot.config import Config


def add_parser(sub: Any) -> None:
    p = sub.add_parser("doctor", help="report board, backends (PASS/FAIL probes), sysfs, MQTT")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    from edgepilot.backends import BACKENDS

    p.add_argument("--backend", action="append", default=None, choices=sorted(BACKENDS),
                   help="probe only this backend (repeatable)")
    p.set_defaults(func=cmd_doctor)


def check_state_dir(path: Path) -> dict[str, Any]:
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".doctor-"):
            pass
        return {"path": str(path), "writable": True, "reason": ""}
    except OSError as exc:
        return {"path": str(path), "writable": False,
                "reason": f"{exc.strerror}; set [daemon] state_dir or --state-dir"}


def check_mqtt(config: Config, timeout: float = 3.0) -> dict[str, Any]:
    """A real MQTT CONNECT/CONNACK with the configured credentials, not just a TCP dial."""
    m = config.mqtt
    out: dict[str, Any] = {"enabled": m.enabled, "host": m.host, "port": m.port,
                           "protocol": m.protocol}
    if not m.enabled:
        return {**out, "reachable": None, "reason": "disabled in config"}
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    proto = mqtt.MQTTv5 if m.protocol == "5" else mqtt.MQTTv311
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"edgepilot-doctor-{os.getpid()}",
                         protocol=proto)
    if m.username:
        client.username_pw_set(m.username, m.password)
    if m.tls is not None:
        client.tls_set(ca_certs=str(m.tls.ca_file) if m.tls.ca_file else None,
                       certfile=str(m.tls.cert_file) if m.tls.cert_file else None,
                       keyfile=str(m.tls.key_file) if m.tls.key_file else None)
        client.tls_insecure_set(m.tls.insecure)
    result: dict[str, Any] = {}

    def on_connect(_c: Any, _u: Any, _f: Any, reason: Any, _p: Any = None) -> None:
        result["reason"] = str(reason)
        result["ok"] = not reason.is_failure

    client.on_connect = on_connect
    t0 = time.monotonic()
    try:
        client.connect(m.host, m.port, keepalive=10)
    except (OSError, socket.gaierror) as exc:
        return {**out, "reachable": False, "reason": f"{exc}"}
    while "ok" not in result and time.monotonic() - t0 < timeout:
        client.loop(timeout=0.1)
    client.disconnect()
    if "ok" not in result:
        return {**out, "reachable": False, "reason": f"no CONNACK within {timeout:g}s"}
    return {**out, "reachable": result["ok"], "reason": result["reason"],
            "ms": round((time.monotonic() - t0) * 1000, 1)}


def board_report(config: Config) -> dict[str, Any]:
    from edgepilot.board import Board
    from edgepilot.dvfs.profiles import matching_profile_files

    try:
        board = Board(config.daemon.sysfs_root)
        report = dict(board.report())
        # which profile files match is the DVFS layer's knowledge, not the board's
        report["profile_files"] = [str(p) for p in matching_profile_files(board.identity)]
    except Exception as exc:  # doctor reports, it never dies on a strange board
        return {"error": f"{type(exc).__name__}: {exc}"}
    if str((report.get("identity") or {}).get("family", "")).startswith("jetson"):
        from edgepilot.dvfs.tools import locate_tool

        report["vendor_tools"] = {
            name: locate_tool(name, getattr(config.dvfs, name), config.daemon.sysfs_root).as_dict()
            for name in ("nvpmodel", "jetson_clocks")}
    return report


def collect(config: Config, backends: list[str] | None = None) -> dict[str, Any]:
    from edgepilot.serving.probes import as_dicts, run_selftests

    results = run_selftests(config, backends)
    from edgepilot.mqtt import spool_info

    return {
        "version": __version__,
        "board": board_report(config),
        "backends": as_dicts(results),
        "state_dir": check_state_dir(config.state_dir),
        "mqtt": {**check_mqtt(config), "spool": spool_info(config.state_dir)},
    }


def render(report: dict[str, Any]) -> str:
    lines = [f"edgepilot {report['version']}"]
    board = report["board"]
    ident = board.get("identity") or {}
    lines.append(f"board: {ident.get('model') or 'unknown'} (family {ident.get('family')}, "
                 f"compatible {', '.join(ident.get('compatible') or []) or '-'})")
    if "error" in board:
        lines.append(f"  board layer error: {board['error']}")
    for pol in board.get("policies", []):
        lines.append(f"  cpufreq {pol.get('name')}: cpus {pol.get('cpus')} governor "
                     f"{pol.get('governor')} [{', '.join(pol.get('governors') or [])}]")
    for dev in board.get("devfreq", []):
        lines.append(f"  devfreq {dev.get('name')} ({dev.get('kind')}): governor "
                     f"{dev.get('governor')}")
    if board.get("rails_w"):
        lines.append(f"  power rails (W): {_short(board['rails_w'])}; total {board.get('power_w')} "
                     f"from {board.get('power_source')}")
    else:
        lines.append("  power rails: none found (no INA3221/INA2xx hwmon, battery or RAPL)")
    if board.get("temps_c"):
        lines.append(f"  thermal zones (°C): {_short(board['temps_c'])}")
    for name, tool in (board.get("vendor_tools") or {}).items():
        where = tool["path"] or f"not used: {tool['skipped'] or tool['error']}"
        lines.append(f"  {name}: {where}")
    lines.append(f"  profile files: {', '.join(board.get('profile_files') or []) or 'none'}")
    writable = board.get("writable") or {}
    if writable:
        ok = sum(1 for v in writable.values() if v)
        lines.append(f"  sysfs writable: {ok}/{len(writable)} DVFS files"
                     + ("" if ok == len(writable) else " (run as root or grant CAP_DAC_OVERRIDE)"))
    else:
        lines.append("  sysfs writable: no cpufreq/devfreq files to write on this board")
    lines.append("backends:")
    for b in report["backends"]:
        if not b["available"]:
            lines.append(f"  {b['name']}: MISSING ({b['reason']})")
            continue
        lines.append(f"  {b['name']} {b['version'] or ''}".rstrip()
                     + (f": {b['reason']}" if b["reason"] else ""))
        for t in b["targets"]:
            lines.append(f"    {t['status']} {t['target']}: {t['reason']}")
    sd = report["state_dir"]
    lines.append(f"state dir {sd['path']}: {'writable' if sd['writable'] else 'NOT writable'} "
                 f"{sd['reason']}".rstrip())
    mq = report["mqtt"]
    state = {True: "reachable", False: "UNREACHABLE", None: "not checked"}[mq["reachable"]]
    lines.append(f"mqtt {mq['host']}:{mq['port']} (v{mq['protocol']}): {state} ({mq['reason']})")
    spool = mq.get("spool") or {}
    if spool.get("spool_exists"):
        lines.append(f"  spool: {spool.get('messages')} message(s) waiting, telemetry seq "
                     f"{spool.get('first_seq')}..{spool.get('last_seq')}")
    if spool.get("seq_published") is not None:
        lines.append(f"  last telemetry seq published: {spool['seq_published']}")
    elif spool.get("seq_recorded") is not None:
        lines.append(f"  telemetry seq: at most {spool['seq_recorded']} (reserved in blocks; "
                     "the exact number is written at a clean stop)")
    for err in spool.get("errors") or []:
        lines.append(f"  spool problem: {err}")
    return "\n".join(lines)


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) < 200 else text[:197] + "..."


def cmd_doctor(args: argparse.Namespace) -> int:
    config = config_from(args)
    report = collect(config, args.backend)
    print(json.dumps(report, indent=2, default=str) if args.json else render(report))
    passing = any(t["ok"] for b in report["backends"] for t in b["targets"])
    return 0 if passing else 1
