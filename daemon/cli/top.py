"""``edgepilot top [--url URL] [--once [--json]] [--interval S]``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from edgepilot.cli.common import check_view_flags, config_from
from edgepilot.errors import CommandError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("top", help="live view of a running daemon (power, thermal, clocks, "
                                   "models) over its HTTP API")
    p.add_argument("--url", default=None,
                   help="the daemon's HTTP address (default: the config's [http] host and port)")
    p.add_argument("--once", action="store_true",
                   help="print one snapshot as plain text and exit (scripts, tests)")
    p.add_argument("--json", action="store_true", help="with --once: the snapshot as JSON")
    p.add_argument("--interval", type=float, default=1.0,
                   help="seconds between reads in the live view (default 1)")
    p.set_defaults(func=cmd_top)


def cmd_top(args: argparse.Namespace) -> int:
    from edgepilot.top.snapshot import base_url, fetch

    check_view_flags(args)
    url = args.url
    if url is None:
        http = config_from(args).http
        url = base_url(http.host, http.port)
    elif not url.startswith(("http://", "https://")):
        raise CommandError(f"--url {url!r}: give a full address such as "
                           "http://127.0.0.1:8470", field="url")
    snap = fetch(url)  # unreachable: DaemonUnreachable, one line and exit 2 from main()
    if args.once:
        if args.json:
            print(json.dumps(snap.as_dict(), indent=2, default=str))
        else:
            from edgepilot.top.text import render

            sys.stdout.write(render(snap))
        return 0
    try:
        from edgepilot.top.app import TopApp
    except ImportError as exc:
        raise CommandError(f"the live view needs textual ({exc}); install the 'tui' extra "
                           "(make install does) or use --once", field="once") from None
    app = TopApp(url, args.interval)
    app.run()
    return app.return_code or 0
