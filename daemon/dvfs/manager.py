"""ProfileManager: apply DVFS profiles as transactions, restore what we changed, undo crashes.

Apply: validate the whole plan against the board, journal the original texts (fsync'd), run
nvpmodel / jetson_clocks, write governors and limits in an order the kernel accepts, read each
back; on any failure put every file back as it was before this apply, in reverse order.
Restore: files that still hold what we applied go back to their original text; files somebody
else changed since are left alone and reported as ``profile.conflict`` events.
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
from edgepilot.dvfs.profiles import Profile, ProfileStore
from edgepilot.dvfs.resolve import Plan, build_plan, limit_order, target_steps
from edgepilot.dvfs.thermal import validate_limits
from edgepilot.dvfs.tools import JetsonClocks, NvpModel, ToolLocation, locate_tool
from edgepilot.errors import BoardError, EdgepilotError, NotFoundError, ProfileError
from edgepilot.events import EventBus

log = logging.getLogger(__name__)

JETSON_CLOCKS_STORE = "jetson_clocks.conf"
# aliases: inside the class, ``list`` is the method
Writes = list[dict[str, str]]
Steps = list[tuple[Path, str]]
Errors = list[str]
_GOV = ("scaling_governor", "governor")
_MIN = ("scaling_min_freq", "min_freq")
_MAX = ("scaling_max_freq", "max_freq")


class ProfileManager:
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
        # set by the daemon's DVFS service: () -> the thermal guard's state, for status()
        self.thermal_state: Callable[[], dict[str, Any]] | None = None
        # caps on max frequencies over any profile (the power cap's), see edgepilot.dvfs.caps
        self.caps = LimitCaps(board)
        # energy policies' state for status() and summary(): name -> () -> plain data
        self.reporters: dict[str, Callable[[], dict[str, Any]]] = {}
        # set by the SLO picker: (hot profile, its configured fallback, profiles on the guard's
        # stack) -> the profile the thermal guard applies instead (None: the configured one)
        self.fallback_chooser: Callable[[str, str | None, list[str]], str | None] | None = None
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

    # ---- queries -------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Cheap (no board reads): active profile, vendor tools, thermal guard; for the
        daemon's ``status``."""
        return {"active": self.active_name, "tools": self.tools_report(),
                "thermal": self.thermal_state() if self.thermal_state is not None else None,
                **self._reports()}

    def _reports(self) -> dict[str, Any]:
        return {name: fn() for name, fn in self.reporters.items()}

    def profiles(self) -> dict[str, Profile]:
        return self.store.for_board(self.board.identity)

    def get(self, name: str) -> Profile:
        profiles = self.profiles()
        if name not in profiles:
            raise NotFoundError(f"unknown profile {name!r} for this {self.board.identity.family} "
                                f"board; allowed: {', '.join(sorted(profiles))}", field="name")
        return profiles[name]

    def list(self) -> list[dict[str, Any]]:
        """Every profile for this board with whether it validates here."""
        out = []
        profiles = self.profiles()
        for name, prof in sorted(profiles.items()):
            entry: dict[str, Any] = {"name": name, "description": prof.spec.description,
                                     "source": str(prof.source), "active": name == self.active_name}
            try:
                self._plan(prof, profiles)
                entry["valid"], entry["error"] = True, None
            except EdgepilotError as exc:
                entry["valid"], entry["error"] = False, exc.message
            out.append(entry)
        return out

    def show(self, name: str) -> dict[str, Any]:
        """The merged profile and what it would set on this board."""
        prof = self.get(name)
        result = prof.as_dict()
        result["tools"] = self.tools_report()
        try:
            result["plan"] = self._plan(prof).as_dict()
        except EdgepilotError as exc:
            result["plan"], result["error"] = None, exc.message
        return result

    def status(self) -> dict[str, Any]:
        """Active profile, journal, current clocks, vendor tools and the thermal guard."""
        journal = jr.load(self.state_dir)
        sample = self.board.sample()
        if self.thermal_state is not None:
            thermal = self.thermal_state()
        else:  # CLI, or a daemon without telemetry: limits are known but nobody watches them
            limits = None
            if self.active_name is not None:
                try:
                    limits = self.get(self.active_name).spec.thermal.model_dump()
                except EdgepilotError:
                    limits = None
            thermal = {"watching": False, "limits": limits}
        return {
            "active": self.active_name,
            "family": self.board.identity.family,
            "journal": str(jr.journal_path(self.state_dir)) if journal else None,
            "since": journal.started if journal else None,
            "changed_files": sorted(journal.original) if journal else [],
            "cpu": sample.cpu,
            "devfreq": sample.devfreq,
            "tools": self.tools_report(),
            "thermal": thermal,
            "caps": self.caps.state(),
            **self._reports(),
        }

    def tools_report(self) -> dict[str, dict[str, Any]]:
        """Per vendor tool: its path, or why its steps are skipped / cannot run."""
        return {name: loc.as_dict() for name, loc in self.tools.items()}

    def _plan(self, prof: Profile, profiles: dict[str, Profile] | None = None) -> Plan:
        """Validate ``prof`` on this board (clocks, thermal limits, tools) into a Plan."""
        plan = build_plan(prof, self.board)
        validate_limits(prof, profiles if profiles is not None else self.profiles(), self.board)
        steps = (("nvpmodel", plan.nvpmodel is not None, f"nvpmodel -m {plan.nvpmodel}"),
                 ("jetson_clocks", bool(plan.jetson_clocks), "jetson_clocks"))
        for tool_name, wanted, what in steps:
            tool = self.tools[tool_name]
            if not wanted or tool.path is not None:
                continue
            if tool.error is not None:
                raise ProfileError(f"{prof.source}: profiles.{prof.name}.{tool_name}: "
                                   f"{tool.error}", field=tool_name)
            plan.skipped.append(f"{what}: skipped: {tool.skip}")
            if tool_name == "nvpmodel":
                plan.nvpmodel = None
            else:
                plan.jetson_clocks = None
        return plan

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

    def _write_plan(self, plan: Plan, baseline: dict[str, str]) -> Writes:
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
        """Exact text of every governor/min/max file of online devices (setspeed excluded:
        it reads '<unsupported>' and is not a setting to restore)."""
        snap: dict[str, str] = {}
        for path in self.board.writable_files():
            if path.name == "scaling_setspeed":
                continue
            text = self.board.read_value(path)
            if text is not None:
                snap[self.board.fs.rel(path)] = text
        return snap

    def _rollback(self, before: dict[str, str], journal: jr.Journal, previous: jr.Journal | None,
                  ran_nvpmodel: bool, ran_store: bool, ran_unlock: bool = False) -> None:
        errors: Errors = []
        if journal.jetson_clocks_store and ran_store:
            self._try(errors, self.jetson_clocks.restore, Path(journal.jetson_clocks_store))
        if ran_nvpmodel and journal.nvpmodel_before is not None:
            self._try(errors, self.nvpmodel.set_mode, journal.nvpmodel_before)
        if ran_unlock:
            self._try(errors, self.jetson_clocks.lock)
        errors += self._put_back(before, only=None)
        if errors:
            log.error("rollback incomplete: %s", "; ".join(errors))
            self.events.emit("profile.rollback_incomplete", errors=errors)
        if previous is None:
            jr.remove(self.state_dir)
        else:
            jr.save(self.state_dir, previous)

    @staticmethod
    def _try(errors: Errors, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except EdgepilotError as exc:
            errors.append(exc.message)

    def _put_back(self, target: dict[str, str], only: set[str] | None) -> Errors:
        """Write original texts back where they differ, per device in a kernel-safe order;
        governors last (reverse of apply). Returns the errors; never stops half-way."""
        errors: Errors = []
        by_dir: dict[Path, dict[str, str]] = {}
        for rel, text in target.items():
            if only is not None and rel not in only:
                continue
            path = self.board.fs.path(rel)
            if self.board.read_value(path) != text:
                by_dir.setdefault(path.parent, {})[path.name] = text
        for directory in reversed(list(by_dir)):
            files = by_dir[directory]
            mins = [n for n in files if n in _MIN]
            maxs = [n for n in files if n in _MAX]
            new_min = _int(files[mins[0]]) if mins else None
            new_max = _int(files[maxs[0]]) if maxs else None
            cur_min = self.board.fs.read_int(directory / (mins[0] if mins else _MIN[0]))
            cur_max = self.board.fs.read_int(directory / (maxs[0] if maxs else _MAX[0]))
            order = []
            for which in limit_order(cur_min, cur_max, new_min, new_max):
                order += mins if which == "min" else maxs
            order += [n for n in files if n not in order]
            for name in order:
                try:
                    self.board.write_value(directory / name, files[name])
                except BoardError as exc:
                    errors.append(exc.message)
        return errors

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
            errors: Errors = []
            if journal.jetson_clocks_store:
                self._try(errors, self.jetson_clocks.restore, Path(journal.jetson_clocks_store))
            if journal.nvpmodel_before is not None:
                try:
                    if self.nvpmodel.query()[0] != journal.nvpmodel_before:
                        self.nvpmodel.set_mode(journal.nvpmodel_before)
                except EdgepilotError as exc:
                    errors.append(exc.message)
            errors += self._put_back(journal.original, only=restore_set)
            for c in conflicts:
                self.events.emit("profile.conflict", profile=journal.profile, **c)
            if errors:
                # keep the journal: the next restore (or start) tries again
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
                errors = self._put_back(before, only=None)
                if errors:
                    log.error("rollback of a cap incomplete: %s", "; ".join(errors))
                if previous is None:
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


def _int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None
