"""The CLI as an operator runs it: ``python -m edgepilot`` in a child process, with a config
written next to its own state dir (the plan/bench tests share it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# quick planning for tests: few timed runs, one pass, one calibration input
FAST_PLANNING = """
[dispatch]
profile_runs = 3
warmup_runs = 1
profile_passes = 1
calibration_inputs = 1
kernel_corpus = false
[mqtt]
enabled = false
"""


def run_cli(tmp: Path, *args: str, config: str = FAST_PLANNING,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``edgepilot --config tmp/edgepilot.toml --state-dir tmp/st ARGS``, its output captured."""
    cfg = tmp / "edgepilot.toml"
    cfg.write_text(config)
    return subprocess.run(
        [sys.executable, "-m", "edgepilot", "--config", str(cfg), "--state-dir", str(tmp / "st"),
         *args], capture_output=True, text=True, timeout=timeout, check=False)
