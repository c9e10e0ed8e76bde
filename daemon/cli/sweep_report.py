"""``edgepilot sweep --csv FILE --plot FILE.png``: the sweep as a table and as a picture.

The plot puts energy per inference (mJ) on x and latency (ms) on y: per profile a dot at p50
and a cross at p95 joined by a bar, the Pareto front (energy against p95) drawn as a line
through its profiles, the SLO as a horizontal line and its pick ringed. matplotlib's Agg
backend draws it without a display (an SSH session on a board has none).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from edgepilot.errors import ConfigError

CSV_COLUMNS = ("profile", "ok", "p50_ms", "p95_ms", "power_w", "energy_mj_per_inference",
               "pareto", "meets_slo", "slo_pick", "plan", "targets", "reason")


def csv_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One dict per profile, with the :data:`CSV_COLUMNS` keys (empty = not known)."""
    slo = result.get("slo_ms")
    out = []
    for r in result["profiles"]:
        ok = bool(r["ok"])
        p95 = r.get("p95_ms") if ok else None
        out.append({
            "profile": r["profile"], "ok": ok,
            "p50_ms": r.get("median_ms") if ok else None, "p95_ms": p95,
            "power_w": r.get("power_w") if ok else None,
            "energy_mj_per_inference": r.get("energy_mj_per_inference") if ok else None,
            "pareto": r.get("pareto", False) if ok else False,
            "meets_slo": (p95 is not None and p95 <= slo) if slo is not None else None,
            "slo_pick": result.get("slo_pick") == r["profile"] if slo is not None else None,
            "plan": r.get("plan"), "targets": " -> ".join(r.get("targets") or []),
            "reason": r.get("reason"),
        })
    return out


def write_csv(result: dict[str, Any], path: Path) -> None:
    """A header and one row per profile (failed profiles too, with their reason)."""
    try:
        with open(path, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(CSV_COLUMNS))
            writer.writeheader()
            for row in csv_rows(result):
                writer.writerow({k: "" if v is None else v for k, v in row.items()})
    except OSError as exc:
        raise ConfigError(f"--csv {path}: cannot write it ({exc.strerror})",
                          field="csv") from None


def write_plot(result: dict[str, Any], path: Path) -> None:
    """A PNG of latency (p50, p95) against energy per inference for every measured profile."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--plot needs matplotlib; install it with "
                          "`.venv/bin/pip install 'edgepilot[plot]'`", field="plot") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rows = [r for r in result["profiles"]
            if r["ok"] and r.get("energy_mj_per_inference") is not None]
    fig, ax = plt.subplots(figsize=(7.5, 5), dpi=110)
    try:
        for r in rows:
            x = r["energy_mj_per_inference"]
            ax.plot([x, x], [r["median_ms"], r["p95_ms"]], color="0.6", lw=1, zorder=1)
            ax.scatter([x], [r["median_ms"]], color="tab:blue", zorder=3,
                       label="p50" if r is rows[0] else None)
            ax.scatter([x], [r["p95_ms"]], color="tab:orange", marker="x", zorder=3,
                       label="p95" if r is rows[0] else None)
            ax.annotate(r["profile"], (x, r["p95_ms"]), textcoords="offset points",
                        xytext=(5, 5), fontsize=8)
        front = [next(r for r in rows if r["profile"] == name) for name in result["pareto"]]
        if front:
            ax.plot([r["energy_mj_per_inference"] for r in front],
                    [r["p95_ms"] for r in front], color="tab:green", lw=1.5, ls="--",
                    marker="o", mfc="none", ms=11, zorder=2, label="Pareto front (p95)")
        slo = result.get("slo_ms")
        if slo is not None:
            top = max((r["p95_ms"] for r in rows), default=slo)
            label = f"SLO p95 <= {slo:g} ms"
            if slo <= 3 * top:
                ax.axhline(slo, color="tab:red", lw=1, ls=":", label=label)
            else:  # far above every point: drawn, it would squash them into the bottom line
                ax.add_line(Line2D([], [], color="tab:red", lw=1, ls=":", label=label))
            pick = next((r for r in rows if r["profile"] == result.get("slo_pick")), None)
            if pick is not None:
                ax.scatter([pick["energy_mj_per_inference"]], [pick["p95_ms"]], s=260,
                           facecolors="none", edgecolors="tab:red", lw=2, zorder=4,
                           label=f"SLO pick: {pick['profile']}")
        if not rows:
            ax.text(0.5, 0.5, "no profile has a measured energy (no power sensor)",
                    ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("energy per inference (mJ, whole board)")
        ax.set_ylabel("latency (ms)")
        ax.set_title(f"{result['model']}: latency against energy per DVFS profile")
        ax.grid(True, alpha=0.3)
        if rows:
            ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        try:
            fig.savefig(path, format="png")
        except OSError as exc:
            raise ConfigError(f"--plot {path}: cannot write it ({exc.strerror})",
                              field="plot") from None
    finally:
        plt.close(fig)
