"""ProfileManager: apply DVFS profiles as transactions, restore what we changed, undo crashes.

Apply: validate the whole plan against the board, journal the original texts of every file a
profile or a vendor tool may change (fsync'd, before the first tool run or write), run nvpmodel /
jetson_clocks, write governors and limits in an order the kernel accepts, read each back; on any
failure put every file back as it was before this apply, in reverse order.
Restore: files that still hold what we applied go back to their original text and are read
again (edgepilot.dvfs.restore); files somebody else changed since are left alone and reported
as ``profile.conflict`` events. The journal goes only after a verified restore.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgepilot.board import Board
from edgepilot.dvfs import journal as jr
from edgepilot.dvfs.caps import LimitCaps
from edgepilot.dvfs.catalog import ProfileCatalog
from edgepilot.dvfs.profiles import ProfileStore
from edgepilot.dvfs.restore import mismatches, named, put_back, restore_files, snapshot
from edgepilot.dvfs.tools import JetsonClocks, NvpModel, ToolLocation, locate_tool
from edgepilot.dvfs.write_plan import WritePlan, target_steps
from edgepilot.errors import BoardError, EdgepilotError, ProfileError
from edgepilot.events import EventBus

log = logging.getLogger(__name__)

JETSON_CLOCKS_STORE = "jetson_clocks.conf"
# aliases: inside the class, ``list`` is the method
Writes = list[dict[str, str]]
Steps = list[tuple[Path, str]]
Errors = list[str]


class ProfileManager(ProfileCatalog):
    """Owns every DVFS write of one board. Methods block (sysfs, tools): call them from a
    worker thread (``daemon.run_blocking``) in async code."""

    def __init__(self, board: Board, store: ProfileStore, state_dir: Path,
                 events: EventBus | None = None, command_timeout_s: float = 10.0, *,
                 nvpmodel: Path | None = None, jetson_clocks: Path | None = None) -> None:
        """``nvpmodel``/``jetson_clocks``: the tools' paths ([dvfs] keys); None = PATH on a
        real root, skipped on a fake one (see edgepilot.dvfs.tools.locate_tool)."""
        self.board = board
        self.store = store
        self.state_dir = Path(state_dir)
        self.events = events or EventBus()
        self.command_timeout_s = command_timeout_s
        # held for a whole transaction; the thermal guard holds it across check-and-apply
        self.lock = threading.RLock()
        self._lock = self.lock
        self.tools: dict[str, ToolLocation] = {}
        self.set_tools(nvpmodel, jetson_clocks)
        # caps on max frequencies over any profile (the power cap's), see edgepilot.dvfs.caps
        self.caps = LimitCaps(board)
        # the thermal guard's and the energy policies' state for status() and summary()
        self.reporters: dict[str, Callable[[], dict[str, Any]]] = {}
        try:
            current = jr.load(self.state_dir)
        except BoardError as exc:
            # a corrupt journal must not keep the daemon (or `profile status`) from starting,
            # or systemd restarts it forever; every DVFS transaction still refuses it by name
            # (the daemon's crash recovery logs it once, the CLI prints it once)
            log.debug("%s", exc.message)
            current = None
        # a journal from another process on the same root means a profile is in force
        self.active_name: str | None = current.profile if current and current.applied else None

    def set_tools(self, nvpmodel: Path | None, jetson_clocks: Path | None) -> None:
        """(Re)locate the vendor tools from the ``[dvfs]`` keys (at start and on reload)."""
        with self.lock:
            self.tools = {
                "nvpmodel": locate_tool("nvpmodel", nvpmodel, self.board.root),
                "jetson_clocks": locate_tool("jetson_clocks", jetson_clocks, self.board.root)}
            self.nvpmodel = NvpModel(self.tools["nvpmodel"], self.command_timeout_s)
            self.jetson_clocks = JetsonClocks(self.tools["jetson_clocks"],
                                              self.command_timeout_s)

    # ---- apply ---------------------------------------------------------------------------------
    def apply(self, name: str, reason: str = "requested") -> dict[str, Any]:
        """Apply ``name`` transactionally; raise ProfileError (board unchanged) on failure.

        ``reason`` goes into the ``profile.applied`` event ("thermal" for the guard's moves).
        """
        with self._lock, jr.locked(self.state_dir):
            prof = self.get(name)
            plan = self._plan(prof)      # validation: nothing written yet
            for s in plan.skipped:
                if s.startswith(("nvpmodel", "jetson_clocks")):
                    log.warning("profile %s: %s", name, s)
            before = self._snapshot()
            previous = self._journal()
            journal = jr.Journal(str(self.board.root), name)
            if previous is not None:
                journal.original = previous.original
                journal.nvpmodel_before = previous.nvpmodel_before
                journal.jetson_clocks_store = previous.jetson_clocks_store
                journal.jetson_clocks_locked = previous.jetson_clocks_locked
            for path, text in before.items():
                journal.original.setdefault(path, text)
            # on disk before any tool runs: a kill during nvpmodel -m (with the whole unit)
            # finds every file it may have changed, cpuN/online included, in the journal
            jr.save(self.state_dir, journal)
            ran_nvpmodel = ran_store = ran_unlock = False
            caps_before = self.caps.memento()
            try:
                if journal.jetson_clocks_locked and not plan.jetson_clocks \
                        and journal.jetson_clocks_store:
                    # the last profile locked the clocks at max and this one does not: free
                    # them first, or its limits (a thermal fallback's!) would sit under a
                    # min = max lock
                    ran_unlock = True
                    self.jetson_clocks.restore(Path(journal.jetson_clocks_store))
                    journal.jetson_clocks_locked = False
                if plan.nvpmodel is not None:
                    mode, _ = self.nvpmodel.query()
                    if journal.nvpmodel_before is None:
                        journal.nvpmodel_before = mode
                    jr.save(self.state_dir, journal)
                    if mode != plan.nvpmodel:
                        ran_nvpmodel = True
                        self.nvpmodel.set_mode(plan.nvpmodel)
                if plan.jetson_clocks:
                    if journal.jetson_clocks_store is None:
                        journal.jetson_clocks_store = str(self.state_dir / JETSON_CLOCKS_STORE)
                        jr.save(self.state_dir, journal)
                        ran_store = True
                        self.jetson_clocks.store(Path(journal.jetson_clocks_store))
                    self.jetson_clocks.lock()
                    journal.jetson_clocks_locked = True
                # tools may have moved limits or offlined CPUs: plan again on what is there now
                plan = self._plan(prof)
                for path, text in self._snapshot().items():
                    journal.original.setdefault(path, before.get(path, text))
                jr.save(self.state_dir, journal)
                written = self._write_plan(plan, journal.original)
                written += self.caps.enforce()  # a cap in force stays on top of the profile
            except EdgepilotError as exc:
                self._rollback(before, journal, previous, ran_nvpmodel, ran_store, ran_unlock)
                self.caps.put_back(caps_before)
                self.events.emit("profile.failed", profile=name, message=exc.message,
                                 field=exc.field)
                raise ProfileError(f"applying profile {name!r} failed and every change was "
                                   f"rolled back: {exc.message}", field=exc.field) from None
            journal.applied = self._snapshot()
            jr.save(self.state_dir, journal)
            self.active_name = name
            result = {"profile": name, "applied": True, "written": written,
                      "skipped": plan.skipped, "nvpmodel": plan.nvpmodel,
                      "jetson_clocks": plan.jetson_clocks}
            self.events.emit("profile.applied", profile=name, written=len(written),
                             skipped=plan.skipped, reason=reason)
            return result

    def _write_plan(self, plan: WritePlan, baseline: dict[str, str]) -> Writes:
        steps: Steps = []
        for tp in plan.targets:
            steps += target_steps(self.board.fs, tp, baseline)
        written = []
        for path, value in steps:
            now = self.board.read_value(path)
            if now is not None and now.strip() == value:
                continue  # already so: a write would only disturb the governor's state
            self.board.write_value(path, f"{value}\n")
            written.append({"path": self.board.fs.rel(path), "value": value})
        return written

    def _snapshot(self) -> dict[str, str]:
        return snapshot(self.board)

    def _rollback(self, before: dict[str, str], journal: jr.Journal, previous: jr.Journal | None,
                  ran_nvpmodel: bool, ran_store: bool, ran_unlock: bool = False) -> None:
        errors: Errors = []
        if journal.jetson_clocks_store and ran_store:
            self._try(errors, self.jetson_clocks.restore, Path(journal.jetson_clocks_store))
        if ran_nvpmodel and journal.nvpmodel_before is not None:
            self._try(errors, self.nvpmodel.set_mode, journal.nvpmodel_before)
        if ran_unlock:
            self._try(errors, self.jetson_clocks.lock)
        failed = put_back(self.board, before, only=None)
        errors += named(mismatches(self.board, before, only=None), failed, before)
        if errors:
            # the in-flight journal stays: it holds every original, the next restore retries
            log.error("rollback incomplete, DVFS journal %s kept: %s",
                      jr.journal_path(self.state_dir), "; ".join(errors))
            self.events.emit("profile.rollback_incomplete", errors=errors)
        elif previous is None:
            jr.remove(self.state_dir)
        else:
            jr.save(self.state_dir, previous)

    @staticmethod
    def _try(errors: Errors, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except EdgepilotError as exc:
            errors.append(exc.message)

    # ---- restore -------------------------------------------------------------------------------
    def restore(self, reason: str = "requested") -> dict[str, Any]:
        """Put back what edgepilot changed; leave (and report) what somebody else changed."""
        with self._lock, jr.locked(self.state_dir):
            journal = self._journal()
            if journal is None:
                self.active_name = None
                self.caps.clear()
                return {"restored": False, "reason": "nothing to restore", "conflicts": []}
            conflicts: Writes = []
            restore_set = set(journal.original)
            if journal.applied is not None:
                # only a complete apply says what "ours" is; after a crash mid-transaction
                # everything goes back
                for rel, ours in journal.applied.items():
                    now = self.board.read_value(self.board.fs.path(rel))
                    if now is not None and now != ours and now != journal.original.get(rel):
                        restore_set.discard(rel)
                        conflicts.append({"path": rel, "ours": ours.strip(),
                                          "now": now.strip(),
                                          "original": journal.original.get(rel, "").strip()})
            errors = restore_files(self.board, journal, restore_set, self.nvpmodel,
                                   self.jetson_clocks)
            for c in conflicts:
                self.events.emit("profile.conflict", profile=journal.profile, **c)
            if errors:
                # keep the journal: the next restore (or start) tries again
                log.error("DVFS restore (%s) not verified, journal %s kept: %s", reason,
                          jr.journal_path(self.state_dir), "; ".join(errors))
                self.events.emit("profile.restore_failed", profile=journal.profile, errors=errors)
                raise ProfileError("restore incomplete, journal kept for a retry: "
                                   + "; ".join(errors))
            jr.remove(self.state_dir)
            self.active_name = None
            self.caps.clear()
            self.events.emit("profile.restored", profile=journal.profile, reason=reason,
                             conflicts=len(conflicts))
            return {"restored": True, "profile": journal.profile, "reason": reason,
                    "conflicts": conflicts}

    # ---- caps --------------------------------------------------------------------------------
    def set_cap(self, directory: Path, cap: int | None) -> Writes:
        """Cap the max frequency of one cpufreq policy or devfreq device directory at ``cap``
        (kHz / Hz; None lifts it), over whatever profile is active, as a transaction: the
        original texts are journaled first (stop and crash recovery restore them), a refused
        write puts back everything of this call. Raises ProfileError naming the file."""
        with self._lock, jr.locked(self.state_dir):
            previous = self._journal()
            journal = previous or jr.Journal(str(self.board.root), self.active_name)
            before = self._snapshot()
            for path, text in before.items():
                journal.original.setdefault(path, text)
            completed, journal.applied = journal.applied, None   # in flight
            jr.save(self.state_dir, journal)
            try:
                written = self.caps.set(directory, cap)
            except EdgepilotError as exc:
                failed = put_back(self.board, before, only=None)
                errors = named(mismatches(self.board, before, only=None), failed, before)
                if errors:
                    # the in-flight journal stays: the next restore (or start) retries
                    log.error("rollback of a cap not verified, DVFS journal %s kept: %s",
                              jr.journal_path(self.state_dir), "; ".join(errors))
                elif previous is None:
                    jr.remove(self.state_dir)
                else:
                    journal.applied = completed
                    jr.save(self.state_dir, journal)
                raise ProfileError(f"capping {self.board.fs.rel(directory)} at {cap} failed "
                                   f"and was undone: {exc.message}", field=exc.field) from None
            journal.applied = self._snapshot()
            jr.save(self.state_dir, journal)
            return written

    def _journal(self) -> jr.Journal | None:
        """The journal, refused when it was written for another sysfs root: its originals
        (a fake tree's, another board's) must never be written to this one."""
        journal = jr.load(self.state_dir)
        if journal is not None and os.path.realpath(journal.sysfs_root) != str(self.board.root):
            raise ProfileError(
                f"the DVFS journal {jr.journal_path(self.state_dir)} belongs to sysfs root "
                f"{journal.sysfs_root}, not {self.board.root}; restore it with --sysfs-root "
                f"{journal.sysfs_root}, or use another --state-dir", field="state_dir")
        return journal

    def recover(self) -> dict[str, Any] | None:
        """At start: undo a journal left by a crashed process (None when there is none)."""
        journal = jr.load(self.state_dir)
        if journal is None:
            return None
        log.warning("found a DVFS journal from pid %s (profile %s): restoring first",
                    journal.pid, journal.profile)
        return self.restore(reason="crash-recovery")

