"""Shared fixtures. Area-specific fixtures live in tests/<area>_fixtures.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))  # tests import their helpers as plain modules

from daemon_proc import DaemonProcess  # noqa: E402


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[object]:
    """Start real daemons; any still running at teardown are killed."""
    started: list[DaemonProcess] = []

    def make(config: str | None = None, **kw: object) -> DaemonProcess:
        sub = tmp_path / f"d{len(started)}"
        sub.mkdir()
        d = DaemonProcess(sub, config, **kw)  # type: ignore[arg-type]
        started.append(d)
        return d

    yield make
    for d in started:
        if d.proc is not None and d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
