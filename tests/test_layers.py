"""The package layers hold: import-linter's contracts (pyproject.toml) pass on the real code.

``make test`` runs the same check; this test makes pytest alone catch an import that climbs a
layer (a backend importing the daemon's config, formats importing backends) or closes a cycle.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_hold() -> None:
    result = subprocess.run(
        [str(ROOT / "scripts" / "lint-imports.sh"), str(Path(sys.executable).parent.parent)],
        capture_output=True, text=True, timeout=240, check=False)
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    assert "0 broken" in report, report
    # every contract was read and checked, none silently skipped
    assert "Contracts: 4 kept" in report, report
