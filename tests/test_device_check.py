"""scripts/device-check.sh on a machine without a CUDA device (this one, and CI): it says so
clearly, writes its JSON saying so, installs nothing and exits 0."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_without_cuda_it_says_so_and_exits_0(tmp_path: Path) -> None:
    # a PATH holding only the basic tools: no nvidia-smi, whatever this machine has
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("mkdir", "dirname", "head", "printf"):
        for d in ("/usr/bin", "/bin"):
            if Path(d, tool).exists():
                os.symlink(Path(d, tool), bindir / tool)
                break
    out = tmp_path / "out"
    res = subprocess.run(["/bin/bash", str(ROOT / "scripts" / "device-check.sh"), str(out),
                          str(tmp_path / "no-venv")], capture_output=True, text=True,
                         timeout=60, check=False, env={"PATH": str(bindir)})
    assert res.returncode == 0, res.stderr
    assert "no CUDA device present" in res.stdout
    report = json.loads((out / "device-check.json").read_text())
    assert report["cuda"] is False and "no CUDA device" in report["reason"]
    # nothing was installed or planned
    assert sorted(p.name for p in out.iterdir()) == ["device-check.json"]
