"""Other work on the machine, for tests of what planning and serving make of it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import psutil


@contextmanager
def burners() -> Iterator[None]:
    """One busy-looping process per CPU: other work that takes the whole machine (started
    through a shell that exits, so that they are no children of this process: a child's CPU
    time is this process's own work)."""
    pids = []
    for _ in range(psutil.cpu_count() or 1):
        out = subprocess.run(["sh", "-c", f"'{sys.executable}' -c 'while True: pass' "
                              ">/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                             check=True)
        pids.append(int(out.stdout.strip()))
    try:
        assert not {c.pid for c in psutil.Process().children(recursive=True)} & set(pids)
        time.sleep(0.3)  # started and spinning
        yield
    finally:
        for pid in pids:
            with suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
