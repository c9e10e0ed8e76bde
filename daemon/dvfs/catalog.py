"""The read-only side of the ProfileManager: which profiles this board has, whether each
validates here, what one would set, and the status of the one in force.

Nothing here writes; :class:`edgepilot.dvfs.manager.ProfileManager` adds the transactions
(apply, restore, caps) on top and sets the attributes declared below.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgepilot.board import Board
from edgepilot.dvfs import journal as jr
from edgepilot.dvfs.caps import LimitCaps
from edgepilot.dvfs.profiles import Profile, ProfileStore
from edgepilot.dvfs.tools import ToolLocation
from edgepilot.dvfs.write_plan import WritePlan, build_plan, validate_limits
from edgepilot.errors import EdgepilotError, NotFoundError, ProfileError


class ProfileCatalog:
    """Queries over one board's profiles; blocking (board reads), like the manager."""

    board: Board
    store: ProfileStore
    state_dir: Path
    tools: dict[str, ToolLocation]
    caps: LimitCaps
    active_name: str | None
    # name -> () -> plain data: "thermal" (the guard), "power_cap", "slo" (energy policies)
    reporters: dict[str, Callable[[], dict[str, Any]]]

    # ---- queries -------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Cheap (no board reads): active profile, vendor tools, thermal guard; for the
        daemon's ``status``."""
        return {"active": self.active_name, "tools": self.tools_report(),
                "thermal": self._thermal_state(), **self._reports()}

    def add_reporter(self, name: str, fn: Callable[[], dict[str, Any]]) -> None:
        """Report ``fn()`` as ``name`` in :meth:`summary` and :meth:`status` (the thermal guard
        as "thermal", the energy policies as "power_cap" and "slo")."""
        self.reporters[name] = fn

    def _thermal_state(self) -> dict[str, Any] | None:
        fn = self.reporters.get("thermal")
        return fn() if fn is not None else None

    def _reports(self) -> dict[str, Any]:
        return {name: fn() for name, fn in self.reporters.items() if name != "thermal"}

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
        thermal = self._thermal_state()
        # CLI, or a daemon without telemetry: limits are known but nobody watches them
        if thermal is None:
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

    def _plan(self, prof: Profile, profiles: dict[str, Profile] | None = None) -> WritePlan:
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
