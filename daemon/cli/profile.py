"""``edgepilot profile list|show NAME|apply NAME|restore|status`` (each with ``--json``).

Honours the global ``--sysfs-root`` and ``--state-dir``; shares the journal with a running
daemon on the same state dir, so ``profile restore`` undoes what either applied.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from edgepilot.cli.common import config_from


def add_parser(sub: Any) -> None:
    p = sub.add_parser("profile", help="list, show, apply and restore DVFS profiles")
    verbs = p.add_subparsers(dest="profile_command", metavar="ACTION")
    verbs.required = True
    for verb, help_text in (("list", "profiles for this board"),
                            ("show", "one profile and what it would set here"),
                            ("apply", "apply a profile (transactional)"),
                            ("restore", "restore what edgepilot changed"),
                            ("status", "active profile and current clocks")):
        v = verbs.add_parser(verb, help=help_text)
        if verb in ("show", "apply"):
            v.add_argument("name", help="profile name (see 'edgepilot profile list')")
        v.add_argument("--json", action="store_true", help="machine-readable output")
        v.set_defaults(func=cmd_profile)


def cmd_profile(args: argparse.Namespace) -> int:
    from edgepilot.dvfs.service import make_manager

    manager = make_manager(config_from(args))
    manager.events.subscribe(lambda ev: ev["type"] == "profile.conflict" and print(
        f"conflict: {ev['path']} is now {ev['now']!r} (we set {ev['ours']!r}); left as is",
        file=sys.stderr))
    verb = args.profile_command
    result: Any
    if verb == "list":
        result = manager.list()
    elif verb == "show":
        result = manager.show(args.name)
    elif verb == "apply":
        result = manager.apply(args.name)
    elif verb == "restore":
        result = manager.restore("cli")
    else:
        result = manager.status()
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(_human(verb, result))
    return 0


def _human(verb: str, result: Any) -> str:
    if verb == "list":
        lines = []
        for p in result:
            mark = "*" if p["active"] else " "
            state = "" if p["valid"] else f"  (not applicable: {p['error']})"
            lines.append(f"{mark} {p['name']:<14} {p['description']}{state}")
        return "\n".join(lines) or "no profiles for this board"
    if verb == "apply":
        lines = [f"applied {result['profile']}: {len(result['written'])} file(s) written"]
        lines += [f"  {w['path']} = {w['value']}" for w in result["written"]]
        lines += [f"  skipped {s}" for s in result["skipped"]]
        return "\n".join(lines)
    if verb == "restore":
        if not result["restored"]:
            return "nothing to restore"
        lines = [f"restored (profile {result['profile']} undone)"]
        lines += [f"  left {c['path']} = {c['now']} (changed by someone else)"
                  for c in result["conflicts"]]
        return "\n".join(lines)
    if verb == "status":
        lines = [f"family {result['family']}; active profile: {result['active'] or 'none'}"]
        for name, c in result["cpu"].items():
            lines.append(f"  {name} cpus {c['cpus']} {c['governor']} "
                         f"{c['min_khz']}..{c['max_khz']} kHz (cur {c['cur_khz']})"
                         + ("" if c["online"] else " offline"))
        for name, d in result["devfreq"].items():
            lines.append(f"  {name} [{d['kind']}] {d['governor']} "
                         f"{d['min_hz']}..{d['max_hz']} Hz (cur {d['cur_hz']})")
        # the Jetson tools are news only on a Jetson (or where a path was configured)
        jetson = str(result["family"]).startswith("jetson")
        lines += _tool_lines({n: t for n, t in result["tools"].items()
                              if jetson or t["path"]})
        lim = (result.get("thermal") or {}).get("limits") or {}
        if lim.get("max_c") is not None:
            lines.append(f"  thermal: max {lim['max_c']} C on {', '.join(lim['zones']) or 'all'}"
                         f" zones, fallback {lim.get('fallback') or 'none'}")
        return "\n".join(lines)
    if verb == "show":
        lines = [f"{result['name']}: {result.get('description', '')} ({result['source']})"]
        if result.get("plan") is None:
            lines.append(f"  not applicable here: {result.get('error')}")
        else:
            for t in result["plan"]["targets"]:
                lines.append("  " + " ".join(f"{k}={v}" for k, v in t.items() if v is not None))
            lines += [f"  skipped {s}" for s in result["plan"]["skipped"]]
        return "\n".join(lines)
    return json.dumps(result, indent=2, default=str)


def _tool_lines(tools: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for name, t in tools.items():
        state = t["path"] or (f"skipped: {t['skipped']}" if t["skipped"] else t["error"])
        lines.append(f"  {name}: {state}")
    return lines
