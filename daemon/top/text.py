"""``top --once``: one snapshot as plain text (aligned columns, no colour, no terminal needed)."""

from __future__ import annotations

from edgepilot.top import view
from edgepilot.top.snapshot import Snapshot


def table_text(table: view.Table) -> str:
    """A title line, a header row and the rows, columns padded to their widest cell."""
    widths = [max(len(c), *(len(r[i]) for r in table.rows)) if table.rows else len(c)
              for i, c in enumerate(table.columns)]

    def line(cells: list[str]) -> str:
        return "  " + "  ".join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True)
                                ).rstrip()

    out = [table.title.upper(), line(table.columns)]
    out += [line(r) for r in table.rows]
    if table.note:
        out.append(f"  note: {table.note}")
    return "\n".join(out)


def render(snap: Snapshot) -> str:
    """The whole snapshot: header, profile and MQTT lines, then every table."""
    parts = [view.header(snap), view.profile_line(snap), view.mqtt_line(snap)]
    errors = view.errors_line(snap)
    if errors:
        parts.append(f"unavailable: {errors}")
    text = "\n".join(parts)
    return text + "\n\n" + "\n\n".join(table_text(t) for t in view.tables(snap)) + "\n"
