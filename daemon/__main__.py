"""``python -m edgepilot``: the command line, as ``edgepilot``."""

from edgepilot.cli import main

raise SystemExit(main())
