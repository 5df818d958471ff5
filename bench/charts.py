"""PNG charts beside the benchmark tables: where a request's time goes, and how busy the device is.

Two pictures, drawn with matplotlib's Agg backend (no display needed):
  stage_bars         one horizontal stacked bar per row (a backend, or an estimate someone adds):
                     decode, preprocess, queue, inference, postprocess, in ms, one scale
  utilisation_lines  device busy (%) against concurrency, one line per input, one panel per table,
                     the bound without HTTP as a dashed line of the same colour

matplotlib is a development tool here (the `dev` extra), never a service dependency: without it
the benchmarks still print their tables and say that no chart was written (`available()`).

Example usage:
    from bench.charts import stage_bars
    stage_bars([{"label": "cpu", "stages_ms": {"decode": 2.4, "inference": 4.9, ...}}], "out.png", "curl_bench")
"""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

from bench.service import ROOT

# The order of a request's stages, as the service reports them in timing_ms (app/api/schemas.py Timing).
STAGES = ("decode", "preprocess", "queue", "inference", "postprocess")
# One colour per stage (colour-blind safe, Okabe-Ito), the same on the try-it page (app/static/style.css).
STAGE_COLOURS = {"decode": "#0072B2", "preprocess": "#56B4E9", "queue": "#E69F00", "inference": "#009E73",
                 "postprocess": "#CC79A7"}
LINE_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9")
DPI = 100
PANEL_TITLE_CHARS = 62  # a panel's title wraps here, so titles of side-by-side panels never run into each other
WIDTH_IN = 9.0                  # 900 px wide
BAR_ROW_IN, BAR_EXTRA_IN = 0.55, 1.9   # stage chart: per bar, plus title, axis and legend
PANEL_W_IN, PANEL_H_IN, PANEL_COLS = 4.5, 3.2, 2
CHART_DIR = ROOT / "build" / "bench"   # the default place: build/ is not committed


def available() -> bool:
    """True when matplotlib can be imported (the dev extra is installed)."""
    return importlib.util.find_spec("matplotlib") is not None


def stage_chart_size(rows: int) -> tuple[int, int]:
    """The stage chart's size in pixels for `rows` bars (width fixed, height grows with the rows)."""
    return round(WIDTH_IN * DPI), round((BAR_EXTRA_IN + BAR_ROW_IN * rows) * DPI)


def utilisation_chart_size(panels: int) -> tuple[int, int]:
    """The utilisation chart's size in pixels for `panels` tables (two panels a row)."""
    cols = min(PANEL_COLS, max(1, panels))
    rows = -(-max(1, panels) // PANEL_COLS)
    return round(PANEL_W_IN * cols * DPI), round((PANEL_H_IN * rows + 0.6) * DPI)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server or in CI
    import matplotlib.pyplot as plt

    return plt


def stage_bars(rows: list[dict], path: Path | str, title: str) -> Path:
    """One horizontal stacked bar per row, top to bottom in the rows' order.

    Each row is {"label": str, "stages_ms": {stage: ms}}; a stage it lacks counts as 0 (an estimate
    may know only its inference). Every segment wider than the text gets its ms written on it, and
    each bar its sum at its end. Returns the path written.
    """
    plt = _pyplot()
    width, height = stage_chart_size(len(rows))
    fig, ax = plt.subplots(figsize=(width / DPI, height / DPI), dpi=DPI)
    longest = max((sum(r["stages_ms"].get(s) or 0 for s in STAGES) for r in rows), default=0) or 1.0
    labels = [r["label"] for r in rows]
    positions = list(range(len(rows)))[::-1]  # first row on top
    for stage in STAGES:
        lefts = [sum(r["stages_ms"].get(s) or 0 for s in STAGES[:STAGES.index(stage)]) for r in rows]
        values = [r["stages_ms"].get(stage) or 0 for r in rows]
        ax.barh(positions, values, left=lefts, height=0.6, color=STAGE_COLOURS[stage], label=stage,
                edgecolor="white", linewidth=0.5)
        for y, left, value in zip(positions, lefts, values):
            if value >= longest * 0.045:  # room for the figure inside the segment (~40 px)
                ax.text(left + value / 2, y, f"{value:.1f}", ha="center", va="center", fontsize=8, color="white")
    for y, r in zip(positions, rows):
        total = sum(r["stages_ms"].get(s) or 0 for s in STAGES)
        ax.text(total + longest * 0.01, y, f"{total:.1f} ms", ha="left", va="center", fontsize=9)
    ax.set_yticks(positions, labels)
    ax.set_xlim(0, longest * 1.15)
    ax.set_xlabel("ms (median of each stage over the warm requests)")
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(ncols=len(STAGES), loc="lower left", bbox_to_anchor=(0, 1.0), frameon=False, fontsize=8,
              handlelength=1.2, columnspacing=1.2)
    fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    fig.tight_layout()
    return _save(fig, plt, path, (width, height))


def utilisation_lines(panels: list[dict], path: Path | str, title: str) -> Path:
    """Device busy (%) against concurrency, one panel per table.

    Each panel is {"title": str, "points": [{"input", "concurrency", "device_busy"}...],
    "bounds": {input: busy fraction without HTTP}} (bounds may be empty). Inputs keep their colour
    across panels; the y axis is 0-100% everywhere, so panels compare at a glance.
    """
    plt = _pyplot()
    width, height = utilisation_chart_size(len(panels))
    cols = min(PANEL_COLS, max(1, len(panels)))
    rows = -(-max(1, len(panels)) // PANEL_COLS)
    fig, axes = plt.subplots(rows, cols, figsize=(width / DPI, height / DPI), dpi=DPI, squeeze=False)
    inputs = list(dict.fromkeys(p["input"] for panel in panels for p in panel["points"]))
    colour = {name: LINE_COLOURS[i % len(LINE_COLOURS)] for i, name in enumerate(inputs)}
    for ax, panel in zip(axes.flat, panels):
        for name in inputs:
            points = sorted((p for p in panel["points"] if p["input"] == name), key=lambda p: p["concurrency"])
            if not points:
                continue
            ax.plot([p["concurrency"] for p in points], [p["device_busy"] * 100 for p in points], marker="o",
                    markersize=4, color=colour[name], label=name)
            bound = panel.get("bounds", {}).get(name)
            if bound is not None:
                ax.axhline(bound * 100, color=colour[name], linestyle="--", linewidth=1,
                           label=f"{name}, without HTTP")
        levels = sorted({p["concurrency"] for p in panel["points"]})
        if levels and levels[-1] / max(1, levels[0]) >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_ylim(0, 105)
        ax.set_xlabel("concurrent connections")
        ax.set_ylabel("device busy, %")
        ax.set_title(textwrap.fill(panel["title"], PANEL_TITLE_CHARS), fontsize=8, loc="left")  # two panels a row
        ax.grid(alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    for ax in list(axes.flat)[1:len(panels)]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    order = sorted(range(len(labels)), key=lambda i: labels[i].endswith("without HTTP"))  # lines, then bounds
    handles, labels = [handles[i] for i in order], [labels[i] for i in order]
    fig.legend(handles, labels, loc="lower center", ncols=min(len(inputs), len(labels)) or 1, frameon=False,
               fontsize=8)
    fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0.6 / (PANEL_H_IN * rows + 0.6), 1, 1))
    return _save(fig, plt, path, (width, height))


def _save(fig, plt, path: Path | str, size: tuple[int, int]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png", facecolor="white")  # no bbox="tight": the size stays as promised
    plt.close(fig)
    return path
