"""The ``edgepilot`` command line: one module per subcommand, wired in :mod:`.main`.

``main`` is re-exported so that the console script (``edgepilot.cli:main``, as installed) and
``python -m edgepilot`` keep one entry point.
"""

from edgepilot.cli.main import main

__all__ = ["main"]
