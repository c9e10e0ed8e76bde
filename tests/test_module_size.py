"""Small modules with one job: no module of the package is over 400 lines (a module that grows
past it is split where its concepts part, not at a line count)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 400


def test_no_module_is_over_400_lines() -> None:
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines())
             for folder in ("daemon", "backends") for p in (ROOT / folder).rglob("*.py")}
    assert len(sizes) > 150  # the whole package was read
    assert {path: n for path, n in sizes.items() if n > LIMIT} == {}
