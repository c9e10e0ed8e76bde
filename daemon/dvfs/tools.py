"""Jetson vendor tools: ``nvpmodel`` and ``jetson_clocks``, run as argument lists with a timeout.

Where the executables come from is explicit (:func:`locate_tool`): ``[dvfs] nvpmodel`` /
``[dvfs] jetson_clocks`` when set; otherwise PATH, but *only* when the sysfs root is ``/``. A
fake root with no configured tool never runs whatever happens to be on PATH (it would act on
the real board): those steps are skipped and reported. Output is parsed; a failure raises
BoardError with the tool's own message.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgepilot.board.sysfs import Sysfs
from edgepilot.errors import BoardError

log = logging.getLogger(__name__)

_MODE_RE = re.compile(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)\s*>")
_QUERY_RE = re.compile(r"NV Power Mode:\s*(\S+)\s*\n\s*(\d+)")
_PARAM_RE = re.compile(r"<\s*PARAM\s+TYPE=\w+\s+NAME=\w+\s*>\n(.*?)(?=\n\s*\n|\n<|\Z)", re.S)
def read_nvpmodel_modes(fs: Sysfs) -> dict[int, str]:
    """Mode id -> name from /etc/nvpmodel.conf below the root (empty when absent)."""
    text = fs.read_text(fs.path("/etc/nvpmodel.conf"))
    if not text:
        return {}
    return {int(m.group(1)): m.group(2) for m in _MODE_RE.finditer(text)}


def nvpmodel_files(fs: Sysfs) -> list[str]:
    """Every board path /etc/nvpmodel.conf says nvpmodel writes (its PARAM blocks: CPU online,
    CPU/GPU/EMC/DLA clock limits and caps, GPU power gating), frequency tables left out; empty
    when there is no nvpmodel.conf. These are the files a killed ``nvpmodel -m`` can leave
    half-changed, so the DVFS journal records them before the tool runs."""
    text = fs.read_text(fs.path("/etc/nvpmodel.conf"))
    if not text:
        return []
    paths: list[str] = []
    for block in _PARAM_RE.finditer(text):
        for line in block.group(1).splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].startswith("/") \
                    and not parts[0].startswith("FREQ_TABLE") and parts[1] not in paths:
                paths.append(parts[1])
    return paths


@dataclass(frozen=True)
class ToolLocation:
    """Where one vendor tool is, or why it is not used.

    Exactly one of: ``path`` (run it), ``skip`` (its profile steps are skipped on purpose: a
    fake root without a configured tool), ``error`` (it should run but cannot: a configured
    path that is not an executable, or a real root without it on PATH).
    """

    name: str
    path: Path | None = None
    skip: str | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"path": str(self.path) if self.path else None, "skipped": self.skip,
                "error": self.error}


def is_real_root(sysfs_root: Path | str) -> bool:
    return Path(sysfs_root).resolve() == Path("/")


def locate_tool(name: str, configured: Path | None, sysfs_root: Path | str) -> ToolLocation:
    """Resolve ``name`` (nvpmodel or jetson_clocks) for a board below ``sysfs_root``."""
    key = f"[dvfs] {name}"
    if configured is not None:
        path = Path(configured).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return ToolLocation(name, path=path)
        return ToolLocation(name, error=f"{key} = {str(configured)!r} is not an executable "
                            "file; fix the path or remove the key")
    if not is_real_root(sysfs_root):
        return ToolLocation(name, skip=f"sysfs_root is {str(sysfs_root)!r}, not '/', and {key} "
                            "is not set: not running the one on PATH (it would act on the real "
                            f"board); set {key} to the tool (or an emulator) to run it")
    found = shutil.which(name)
    if found is None:
        return ToolLocation(name, error=f"{name} not found on PATH; install the vendor tools "
                            f"(nvidia-l4t-tools on Jetson), set {key}, or remove {name} from "
                            "the profile")
    return ToolLocation(name, path=Path(found))


def run_tool(tool: ToolLocation, args: list[str], timeout_s: float) -> str:
    """Run a located tool; return stdout or raise BoardError naming the command."""
    if tool.path is None:
        raise BoardError(tool.error or tool.skip or f"{tool.name} is not available",
                         field=tool.name)
    argv = [str(tool.path), *args]
    shown = " ".join([tool.name, *args])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired:
        raise BoardError(f"{shown} did not finish within {timeout_s:g}s "
                         "([dvfs] command_timeout_s)", field=tool.name) from None
    except OSError as exc:
        raise BoardError(f"{shown} could not start ({tool.path}): {exc.strerror}",
                         field=tool.name) from None
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise BoardError(f"{shown} failed (exit {proc.returncode}): "
                         f"{msg[-1] if msg else 'no output'}", field=tool.name)
    log.debug("%s -> %s", argv, proc.stdout.strip())
    return proc.stdout


class NvpModel:
    """``nvpmodel -q`` / ``nvpmodel -m ID``."""

    def __init__(self, tool: ToolLocation, timeout_s: float) -> None:
        self.tool = tool
        self.timeout_s = timeout_s

    def query(self) -> tuple[int, str]:
        """(mode id, mode name); 'NVPM WARN' lines before the answer are ignored."""
        out = run_tool(self.tool, ["-q"], self.timeout_s)
        m = _QUERY_RE.search(out)
        if not m:
            raise BoardError(f"cannot parse 'nvpmodel -q' output: {out.strip()!r}",
                             field="nvpmodel")
        return int(m.group(2)), m.group(1)

    def set_mode(self, mode: int) -> None:
        run_tool(self.tool, ["-m", str(mode)], self.timeout_s)
        got, _ = self.query()
        if got != mode:
            raise BoardError(f"nvpmodel -m {mode} left the board in mode {got}; the switch may "
                             "need a reboot", field="nvpmodel")


class JetsonClocks:
    """``jetson_clocks`` with ``--store FILE`` / ``--restore FILE`` around it."""

    def __init__(self, tool: ToolLocation, timeout_s: float) -> None:
        self.tool = tool
        self.timeout_s = timeout_s

    def store(self, path: Path) -> None:
        run_tool(self.tool, ["--store", str(path)], self.timeout_s)

    def lock(self) -> None:
        run_tool(self.tool, [], self.timeout_s)

    def restore(self, path: Path) -> None:
        run_tool(self.tool, ["--restore", str(path)], self.timeout_s)

    def show(self) -> str:
        return run_tool(self.tool, ["--show"], self.timeout_s)
