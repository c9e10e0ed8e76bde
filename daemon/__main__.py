from edgepilot.cli import main

raise SystemExit(main())
