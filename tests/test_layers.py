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


def test_every_package_has_the_no_cycle_contract() -> None:
    """A package added later is covered too: the acyclic contract names every package (the
    top-level one has its own contract), dispatch's and backends' subpackages included."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    covered = {a for c in config["contracts"] if c["type"] == "acyclic_siblings"
               for a in c["ancestors"]}
    packages = {"edgepilot." + ".".join(p.parent.relative_to(ROOT / "daemon").parts)
                for p in (ROOT / "daemon").rglob("__init__.py") if p.parent != ROOT / "daemon"}
    packages |= {"edgepilot." + ".".join(p.parent.relative_to(ROOT).parts)
                 for p in (ROOT / "backends").rglob("__init__.py")}
    assert "edgepilot.dispatch.gguf" in packages and "edgepilot.backends.workers" in packages
    assert packages - covered == set()
    assert "edgepilot" in covered
    assert config["exclude_type_checking_imports"] is False
