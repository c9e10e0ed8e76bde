"""The live view: a Textual app that reads the daemon every ``interval`` seconds.

Fetching runs in a worker thread (``urllib`` blocks), so keys stay responsive while a slow
daemon answers; a daemon that goes away mid-run is shown as unreachable and read again at the
next tick. ``q`` quits, ``r`` reads now.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Footer, Header, Static

from edgepilot.errors import EdgepilotError
from edgepilot.top import view
from edgepilot.top.snapshot import DEFAULT_TIMEOUT_S, Snapshot, fetch

PANELS = ("power", "thermal", "clocks", "models")


class TopApp(App[int]):
    """``edgepilot top``: power, thermal, clocks and models of one daemon, refreshed live."""

    TITLE = "edgepilot top"
    CSS = """
    #summary { height: auto; padding: 0 1; }
    #error { height: auto; padding: 0 1; color: $error; }
    #upper { height: auto; max-height: 50%; }
    .panel { height: auto; border: round $primary; padding: 0 1; }
    #upper .panel { width: auto; max-width: 50%; }
    .panel DataTable { height: auto; max-height: 20; width: auto; }
    .note { color: $text-muted; }
    """
    BINDINGS: ClassVar[list[Binding | tuple[str, str] | tuple[str, str, str]]] = [
        Binding("q", "quit", "Quit"), Binding("r", "refresh", "Refresh now")]

    def __init__(self, url: str, interval: float = 1.0,
                 timeout: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__()
        self.url = url
        self.interval = interval
        self.timeout = timeout
        self.snapshot: Snapshot | None = None
        self.error: str | None = None
        # snapshots shown so far (tests wait on it instead of on the clock)
        self.updates = 0

    def compose(self) -> ComposeResult:
        yield Header()
        # daemon text is shown as is: "[mqtt]" in a message is no markup tag
        yield Static(id="summary", markup=False)
        yield Static(id="error", markup=False)
        with Horizontal(id="upper"):
            for key in PANELS[:3]:
                yield self._panel(key)
        yield self._panel("models")
        yield Footer()

    @staticmethod
    def _panel(key: str) -> Vertical:
        table: DataTable[Text] = DataTable(id=f"{key}-table", cursor_type="row",
                                          zebra_stripes=True)
        panel = Vertical(table, Static(id=f"{key}-note", classes="note", markup=False),
                         id=f"{key}-panel", classes="panel")
        panel.border_title = key.capitalize()
        return panel

    def on_mount(self) -> None:
        self.sub_title = self.url
        self.action_refresh()
        self.set_interval(self.interval, self.action_refresh)

    def action_refresh(self) -> None:
        """Read the daemon now (a read still in progress is replaced)."""
        self.run_worker(self._read(), group="read", exclusive=True)

    async def _read(self) -> None:
        try:
            snap = await asyncio.to_thread(fetch, self.url, self.timeout)
        except EdgepilotError as exc:
            self.error = exc.message
            self.query_one("#error", Static).update(f"{exc.message} (retrying)")
            return
        self.show(snap)

    def show(self, snap: Snapshot) -> None:
        """Put ``snap`` on screen."""
        self.snapshot, self.error = snap, None
        lines = [view.header(snap), view.profile_line(snap), view.mqtt_line(snap)]
        self.query_one("#summary", Static).update("\n".join(lines))
        errors = view.errors_line(snap)
        self.query_one("#error", Static).update(f"unavailable: {errors}" if errors else "")
        for table in view.tables(snap):
            widget: DataTable[Text] = self.query_one(f"#{table.key}-table", DataTable)
            if [str(c.label) for c in widget.columns.values()] != table.columns:
                widget.clear(columns=True)
                widget.add_columns(*table.columns)
            else:
                widget.clear()
            for row in table.rows:
                widget.add_row(*(Text(cell) for cell in row), key=row[0])
            self.query_one(f"#{table.key}-note", Static).update(table.note)
        self.updates += 1
