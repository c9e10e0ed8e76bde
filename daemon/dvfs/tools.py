"""Jetson vendor tools: ``nvpmodel`` and ``jetson_clocks``, run as argument lists with a timeout.

They are found on PATH (tests put small emulators there). Their output is parsed; a failure
raises BoardError with the tool's own message.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from pathlib import Path

from edgepilot.board.sysfs import Sysfs
from edgepilot.errors import BoardError

log = logging.getLogger(__name__)

_MODE_RE = re.compile(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)\s*>")
_QUERY_RE = re.compile(r"NV Power Mode:\s*(\S+)\s*\n\s*(\d+)")


def read_nvpmodel_modes(fs: Sysfs) -> dict[int, str]:
    """Mode id -> name from /etc/nvpmodel.conf below the root (empty when absent)."""
    text = fs.read_text(fs.path("/etc/nvpmodel.conf"))
    if not text:
        return {}
    return {int(m.group(1)): m.group(2) for m in _MODE_RE.finditer(text)}


def run_tool(argv: list[str], timeout_s: float) -> str:
    """Run a vendor tool; return stdout or raise BoardError naming the command."""
    exe = shutil.which(argv[0])
    if exe is None:
        raise BoardError(f"{argv[0]} not found on PATH; install the vendor tools (nvidia-l4t-tools "
                         "on Jetson) or remove nvpmodel/jetson_clocks from the profile",
                         field=argv[0])
    try:
        proc = subprocess.run([exe, *argv[1:]], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise BoardError(f"{' '.join(argv)} did not finish within {timeout_s:g}s "
                         "([dvfs] command_timeout_s)", field=argv[0]) from None
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise BoardError(f"{' '.join(argv)} failed (exit {proc.returncode}): "
                         f"{msg[-1] if msg else 'no output'}", field=argv[0])
    log.debug("%s -> %s", argv, proc.stdout.strip())
    return proc.stdout


class NvpModel:
    """``nvpmodel -q`` / ``nvpmodel -m ID``."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    def query(self) -> tuple[int, str]:
        """(mode id, mode name); 'NVPM WARN' lines before the answer are ignored."""
        out = run_tool(["nvpmodel", "-q"], self.timeout_s)
        m = _QUERY_RE.search(out)
        if not m:
            raise BoardError(f"cannot parse 'nvpmodel -q' output: {out.strip()!r}",
                             field="nvpmodel")
        return int(m.group(2)), m.group(1)

    def set_mode(self, mode: int) -> None:
        run_tool(["nvpmodel", "-m", str(mode)], self.timeout_s)
        got, _ = self.query()
        if got != mode:
            raise BoardError(f"nvpmodel -m {mode} left the board in mode {got}; the switch may "
                             "need a reboot", field="nvpmodel")


class JetsonClocks:
    """``jetson_clocks`` with ``--store FILE`` / ``--restore FILE`` around it."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    def store(self, path: Path) -> None:
        run_tool(["jetson_clocks", "--store", str(path)], self.timeout_s)

    def lock(self) -> None:
        run_tool(["jetson_clocks"], self.timeout_s)

    def restore(self, path: Path) -> None:
        run_tool(["jetson_clocks", "--restore", str(path)], self.timeout_s)

    def show(self) -> str:
        return run_tool(["jetson_clocks", "--show"], self.timeout_s)
