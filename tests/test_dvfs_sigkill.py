"""SIGKILL rounds: no board left changed.

A process applying DVFS profiles (one or two in a row, as a daemon switching profiles does) is
killed with SIGKILL together with the vendor-tool emulators it runs, one process group, as
systemd kills the whole unit. The kill lands at a random point: between two file writes of
``nvpmodel -m`` or ``jetson_clocks`` (the emulators stop after the N-th write of the round, N
drawn at random), or at a random time anywhere in the transaction, or after it finished. Each
round then recovers in-process the way the next daemon start does (``ProfileManager.recover``)
and compares the whole fake tree, byte for byte, with the tree before the first round.

The fake Jetson Orin NX tree runs the nvpmodel/jetson_clocks emulators (tests/bin); the fake
Snapdragon 8 Gen 3 tree has no vendor tools, so only our own writes are cut there.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from board_fixtures import BIN_DIR, FakeBoard, build_tree

from edgepilot.board import Board
from edgepilot.dvfs import journal as jr
from edgepilot.dvfs.manager import ProfileManager
from edgepilot.dvfs.profiles import ProfileStore

APPLY_SCRIPT = """
import sys
from pathlib import Path
from edgepilot.board import Board
from edgepilot.dvfs.manager import ProfileManager
from edgepilot.dvfs.profiles import ProfileStore
root, state, tools, done, *names = sys.argv[1:]
kw = {"nvpmodel": Path(tools) / "nvpmodel", "jetson_clocks": Path(tools) / "jetson_clocks"} \\
    if tools else {}
mgr = ProfileManager(Board(root), ProfileStore(), state, **kw)
print("ready", flush=True)
for name in names:
    mgr.apply(name)
Path(done).write_text("applied")
sys.stdin.read()  # a running daemon: holds the profile until it is killed
"""

ORIN_SEQUENCES = [("powersave",), ("performance",), ("balanced",), ("powersave", "performance"),
                  ("performance", "powersave"), ("balanced", "powersave")]
SM8650_SEQUENCES = [("performance",), ("powersave",), ("performance", "powersave")]
ORIN_ROUNDS = 50
SM8650_ROUNDS = 10
GRACE_S = 60.0  # how long a round may take to reach its kill point before the test gives up


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` still runs (zombies have stopped)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "(comm)": state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


class Rounds:
    """Runs kill rounds on one fake tree, all against the tree as it was built."""

    def __init__(self, fake: FakeBoard, tmp: Path, tools: bool) -> None:
        self.fake = fake
        self.tmp = tmp
        self.state = tmp / "state"
        self.tools = tools
        self.before = fake.files()
        # per profile sequence: the trace lines of a full run (which write is which tool's)
        self.traces: dict[tuple[str, ...], list[str]] = {}
        self.durations: dict[tuple[str, ...], float] = {}
        self.killed_in: list[str] = []  # what each round's kill interrupted

    def start(self, names: tuple[str, ...], trace: Path, hang_after: int | None
              ) -> tuple[subprocess.Popen[str], Path]:
        done = self.tmp / "done"
        done.unlink(missing_ok=True)
        trace.unlink(missing_ok=True)
        env = {**os.environ, "EDGEPILOT_FAKE_ROOT": str(self.fake.root),
               "EDGEPILOT_FAKE_TOOL_TRACE": str(trace)}
        env.pop("EDGEPILOT_FAKE_TOOL_HANG_AFTER", None)
        if hang_after is not None:
            env["EDGEPILOT_FAKE_TOOL_HANG_AFTER"] = str(hang_after)
        proc = subprocess.Popen(
            [sys.executable, "-c", APPLY_SCRIPT, str(self.fake.root), str(self.state),
             str(BIN_DIR) if self.tools else "", str(done), *names],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
            start_new_session=True)  # its own process group: the unit systemd would kill
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", "the applying process did not start"
        return proc, done

    def kill(self, proc: subprocess.Popen[str]) -> None:
        """SIGKILL the whole group (the process and any tool it runs) and wait until every
        member has stopped, so nothing writes during recovery."""
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=GRACE_S)
        deadline = time.monotonic() + GRACE_S
        while group_alive(proc.pid):
            assert time.monotonic() < deadline, f"process group {proc.pid} survived SIGKILL"
            time.sleep(0.005)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()

    def learn(self, names: tuple[str, ...]) -> None:
        """A full run of ``names`` (killed once applied: also a round): its trace and time."""
        trace = self.tmp / "trace"
        t0 = time.monotonic()
        proc, done = self.start(names, trace, None)
        self.wait_for(proc, lambda: done.exists())
        self.durations[names] = time.monotonic() - t0
        self.kill(proc)
        self.traces[names] = trace.read_text().splitlines() if trace.exists() else []
        self.killed_in.append("after the apply")
        self.recover_and_check(names, "after the apply")

    def wait_for(self, proc: subprocess.Popen[str], ready: Any) -> None:
        deadline = time.monotonic() + GRACE_S
        while not ready():
            if proc.poll() is not None:
                raise AssertionError(f"the applying process exited {proc.returncode} early")
            assert time.monotonic() < deadline, "the round never reached its kill point"
            time.sleep(0.002)

    def round(self, rng: random.Random, names: tuple[str, ...], inside_tool: bool) -> None:
        if names not in self.traces:
            self.learn(names)
            return
        trace = self.tmp / "trace"
        writes = self.traces[names]
        if inside_tool and writes:
            # stop the tools after the n-th of their writes in this sequence, then kill
            n = rng.randint(1, len(writes))
            proc, done = self.start(names, trace, n)
            self.wait_for(proc, lambda: done.exists() or (
                trace.exists() and trace.read_text().endswith("HANG\n")))
            where = "after the apply" if done.exists() else \
                f"inside {' '.join(writes[n - 1].split()[:-1])} after write {n}"
        else:
            proc, done = self.start(names, trace, None)
            time.sleep(rng.uniform(0, self.durations[names]))  # anywhere in the transaction
            where = "after the apply" if done.exists() else "at a random time"
        self.kill(proc)
        self.killed_in.append(where)
        self.recover_and_check(names, where)

    def recover_and_check(self, names: tuple[str, ...], where: str) -> None:
        kw: dict[str, Any] = {"nvpmodel": BIN_DIR / "nvpmodel",
                              "jetson_clocks": BIN_DIR / "jetson_clocks"} if self.tools else {}
        mgr = ProfileManager(Board(self.fake.root), ProfileStore(), self.state, **kw)
        mgr.recover()
        changed = differences(self.before, self.fake.files())
        assert changed == [], f"{names} killed {where}: left changed: {changed}"
        assert jr.load(self.state) is None, f"{names} killed {where}: journal left"


@pytest.fixture
def orin_rounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    fake = build_tree(tmp_path / "root", "orin")
    monkeypatch.setenv("EDGEPILOT_FAKE_ROOT", str(fake.root))  # the emulators' input
    yield Rounds(fake, tmp_path, tools=True)
    fake.close()


def test_sigkill_rounds_on_orin_leave_no_file_changed(orin_rounds: Rounds) -> None:
    rng = random.Random(int(os.environ.get("EDGEPILOT_SIGKILL_SEED", "11")))
    rounds = orin_rounds
    for i in range(ORIN_ROUNDS):
        # two of every three rounds stop the tools half-way; the rest cut anywhere
        rounds.round(rng, rng.choice(ORIN_SEQUENCES), inside_tool=i % 3 != 2)
    assert len(rounds.killed_in) == ORIN_ROUNDS
    inside_nvpmodel = [w for w in rounds.killed_in if w.startswith("inside nvpmodel -m")]
    inside_clocks = [w for w in rounds.killed_in if w.startswith("inside jetson_clocks")]
    # the rounds did hit the case of the bug: CPUs offlined by a killed nvpmodel -m
    assert len(inside_nvpmodel) >= 5, rounds.killed_in
    assert inside_clocks, rounds.killed_in


def test_sigkill_rounds_on_snapdragon_leave_no_file_changed(tmp_path: Path) -> None:
    fake = build_tree(tmp_path / "root", "sm8650")
    try:
        rounds = Rounds(fake, tmp_path, tools=False)
        rng = random.Random(8650)
        for _ in range(SM8650_ROUNDS):
            rounds.round(rng, rng.choice(SM8650_SEQUENCES), inside_tool=False)
        assert len(rounds.killed_in) == SM8650_ROUNDS
    finally:
        fake.close()


def test_a_killed_nvpmodel_that_offlined_cpus_is_undone_though_its_mode_reads_old(
        orin_rounds: Rounds) -> None:
    """The probe's case, pinned: nvpmodel -m 2 (15W) killed after it offlined cpu4-7 but
    before it recorded the mode. ``nvpmodel -q`` still says MAXN; the journal, not the tool,
    says what to put back."""
    rounds = orin_rounds
    trace = rounds.tmp / "trace"
    # 15W's first writes: cpu0..cpu3 online = 1, cpu4..cpu7 online = 0; stop after cpu5's
    proc, _ = rounds.start(("powersave",), trace, 6)
    rounds.wait_for(proc, lambda: trace.exists() and trace.read_text().endswith("HANG\n"))
    rounds.kill(proc)
    lines = trace.read_text().splitlines()
    assert all(line.startswith("nvpmodel -m 2 ") for line in lines[:-1]), lines
    offline = [n for n in range(8)
               if rounds.fake.read(f"/sys/devices/system/cpu/cpu{n}/online") == "0\n"]
    status = rounds.fake.read("/var/lib/nvpmodel/status")
    assert status == rounds.before["/var/lib/nvpmodel/status"].decode()  # -q says: old mode
    journal = jr.load(rounds.state)
    assert journal is not None and journal.nvpmodel_before == 0
    assert all(journal.original[f"/sys/devices/system/cpu/cpu{n}/online"] == "1\n"
               for n in range(8))
    assert offline == [4, 5]
    rounds.recover_and_check(("powersave",), "inside nvpmodel -m 2")


def test_a_file_that_does_not_verify_keeps_the_journal_and_is_named(
        orin_rounds: Rounds, caplog: pytest.LogCaptureFixture) -> None:
    """A file only nvpmodel writes (GPU power gating: not on our write allow-list) left changed
    by a killed ``nvpmodel -m``, which the emulator's next ``-m`` does not set back: recovery
    runs the tool again, reads the file, keeps the journal and names the file; once the file is
    right again, the next recovery removes the journal."""
    from edgepilot.errors import ProfileError

    rounds = orin_rounds
    trace = rounds.tmp / "trace"
    proc, _ = rounds.start(("powersave",), trace, 6)
    rounds.wait_for(proc, lambda: trace.exists() and trace.read_text().endswith("HANG\n"))
    rounds.kill(proc)
    mask = "/sys/devices/platform/gpu.0/tpc_pg_mask"
    rounds.fake.write(mask, "252\n")  # what 15W sets, as the real tool would have
    mgr = ProfileManager(Board(rounds.fake.root), ProfileStore(), rounds.state,
                         nvpmodel=BIN_DIR / "nvpmodel", jetson_clocks=BIN_DIR / "jetson_clocks")
    with caplog.at_level("WARNING", logger="edgepilot.dvfs"), \
            pytest.raises(ProfileError, match="tpc_pg_mask") as exc:
        mgr.recover()
    assert "the DVFS journal holds '240'" in exc.value.message
    assert jr.load(rounds.state) is not None  # kept for a retry
    logged = [r.getMessage() for r in caplog.records]
    assert any("running nvpmodel -m 0 again" in m for m in logged), logged
    assert any("journal" in m and "kept" in m and mask in m for m in logged), logged
    # everything but the mask is back already
    assert differences(rounds.before, rounds.fake.files()) == [mask]
    rounds.fake.write(mask, rounds.before[mask].decode())
    rounds.recover_and_check(("powersave",), "inside nvpmodel -m 2, retried")
