"""mypy checks the package itself: run on daemon/ and backends/ joined into one tree, as
``make test`` runs it, it sees through every ``edgepilot.*`` import (an attribute error planted
in a module of the package is reported) and finds nothing else.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = '''"""A deliberate type error: a component's attribute that does not exist."""

from edgepilot.serving.core import Serving


def probe(serving: Serving) -> None:
    serving.no_such_attribute.whatever()
'''


def test_mypy_sees_the_package_and_finds_nothing_else(tmp_path: Path) -> None:
    probe = tmp_path / "typecheck_probe.py"
    probe.write_text(PROBE)
    result = subprocess.run(
        [str(ROOT / "scripts" / "typecheck.sh"), str(Path(sys.executable).parent.parent),
         str(probe)], capture_output=True, text=True, timeout=600, check=False)
    report = result.stdout + result.stderr
    assert result.returncode == 1, report
    assert ('edgepilot/typecheck_probe.py:7: error: "Serving" has no attribute '
            '"no_such_attribute"') in report, report
    assert "Found 1 error in 1 file" in report, report
