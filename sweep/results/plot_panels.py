"""The two panels of a model: median TFLOP/s (or tokens per kWh) vs batch, and the largest batch that fits.

Few artists a panel, whatever its series: one line per series (its markers on it), the min-max bars of every
series as one LineCollection and their caps as one scatter, the failures as one scatter a kind, the max-batch
bars as one ``barh`` call. Drawing cost is per artist and per line of text, not per point.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from sweep.results.plot_layout import PANEL_WIDTH, TextWidths, thinned

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.transforms import Affine2DBase

Label = Callable[[dict[str, Any]], str]  # a series' legend text from one of its rows
NOTE_OFFSET = 3 / 72  # inches between a bar's end and its note
LABEL_PAD = 4 / 72  # inches between a max-batch panel, a series' line and its label
HANDLE = 0.3  # inches, the line left of a series' label (matplotlib's legend: 2 em)
CAP = 3 / 72  # inches, half a min-max bar's cap (errorbar's capsize=3)


def perf_panel(
    ax: Axes, rows: dict[str, list[dict]], style: dict, metric: tuple[str, str, str, str], widths: TextWidths
) -> None:
    """One line per series (median of ``metric`` vs batch), min-max bars, failed batches on the zero line.
    ``rows``: the model's rows by series label, each list in batch order."""
    from matplotlib.collections import LineCollection

    key, low, high, axis_label = metric
    failures: dict[bool, list[tuple[float, str]]] = {True: [], False: []}  # OOM or not: (batch nudged, colour)
    for n, s in enumerate(style):
        # failure markers sit on the zero line, nudged sideways per series so they do not hide each other
        nudge = 2 ** (0.07 * (n - (len(style) - 1) / 2))
        for r in rows.get(s, []):
            if r["tflops_per_gpu"] is None:
                failures[bool(r["n_oom"])].append((r["batch_size"] * nudge, style[s]["color"]))
    batches = sorted({r["batch_size"] for mine in rows.values() for r in mine})
    shift = batch_axis(ax, widths, batches, [x for points in failures.values() for x, _ in points])
    # each min-max bar and its two caps one polyline (an I, its caps half retraced), all of a panel one collection:
    # a path is transformed to the log axis one at a time, so one a point, not three
    bars: list[list[tuple[float, float]]] = []
    colours: list[tuple[float, ...]] = []
    for s, look in style.items():
        ok = [r for r in rows.get(s, []) if r[key] is not None]
        if not ok:
            continue
        x = [r["batch_size"] for r in ok]
        ax.plot(x, [r[key] for r in ok], color=look["color"], linestyle=look["linestyle"], marker=look["marker"])
        for b, r in zip(x, ok):
            left, right = shift(b, -CAP), shift(b, CAP)
            bars.append([(left, r[low]), (right, r[low]), (b, r[low]), (b, r[high]), (left, r[high]), (right, r[high])])
        colours += [look["color"]] * len(ok)
    if bars:
        ax.add_collection(LineCollection(bars, colors=colours, linewidths=1.2, zorder=2.5), autolim=False)
    # one scatter a kind for the panel: an x where every attempt ran out of memory, a hollow triangle otherwise
    oom, other = failures[True], failures[False]
    if oom:
        ax.scatter(*_on_zero(oom), marker="x", s=50, linewidths=2, color=[c for _, c in oom], clip_on=False, zorder=3)
    if other:
        edges = [c for _, c in other]
        ax.scatter(*_on_zero(other), marker="^", s=40, facecolors="none", edgecolors=edges, clip_on=False, zorder=3)
    ax.set_xlabel("batch size per GPU")
    ax.set_ylabel(axis_label)


def _on_zero(points: list[tuple[float, Any]]) -> tuple[list[float], list[float]]:
    return [x for x, _ in points], [0.0] * len(points)


def batch_axis(ax: Axes, widths: TextWidths, batches: list[int], marks: list[float]) -> Callable[[float, float], float]:
    """Every batch tried gets a tick; a number only where it does not run into its neighbour's (``thinned``).
    A log2 axis where the batches span 4x or more. The limits (the batches' and the failure ``marks``' span, 5 %
    more each side) are set here, not autoscaled at the draw: the tick numbers' places are computed from them.
    Returns ``shift(x, inches)``: the x that many inches right of ``x`` on this axis."""
    log = batches[-1] >= 4 * batches[0]
    if log:
        ax.set_xscale("log", base=2)
    at: Callable[[float], float] = math.log2 if log else float  # type: ignore[assignment]
    lo, hi = at(min([batches[0], *marks])), at(max([batches[-1], *marks]))
    span = (hi - lo) or 2.0
    start, end = lo - 0.05 * span, hi + 0.05 * span
    ax.set_xlim(*((2**start, 2**end) if log else (start, end)))
    inches = [PANEL_WIDTH * (at(b) - start) / (end - start) for b in batches]
    keep = thinned(widths, inches, [str(b) for b in batches])
    ax.set_xticks([batches[i] for i in keep], [str(batches[i]) for i in keep])
    thinned_out = [b for i, b in enumerate(batches) if i not in keep]
    if thinned_out:  # setting none would still make a minor tick object
        ax.set_xticks(thinned_out, minor=True)
    grid_lines(ax, [batches[i] for i in keep], "x")
    per_inch = (end - start) / PANEL_WIDTH
    if log:
        return lambda x, d: x * 2 ** (d * per_inch)
    return lambda x, d: x + d * per_inch


def bar_panel(ax: Axes, groups: list[dict], series: list[str], label: Label, style: dict, widths: TextWidths) -> None:
    """The largest batch that fits, a horizontal bar per series in the figure's series order (``series_axis``:
    labels on the leftmost panel only), in the series' colour (no hatch: the row is named; Agg's hatching cost
    0.05 s a figure), each with its note at its end."""
    from matplotlib.patches import Rectangle
    from matplotlib.transforms import ScaledTranslation

    row = {s: i for i, s in enumerate(series)}
    groups = sorted(groups, key=lambda g: row[label(g)])
    heights = [g["max_ok_batch"] or 0 for g in groups]
    for g, height in zip(groups, heights):  # add_artist, not barh: no data limits to update (the limits are set)
        look = style[label(g)]
        ax.add_artist(Rectangle((0, row[label(g)] - 0.35), height, 0.7, facecolor=look["color"], linewidth=0))
    notes = [_note(g) for g in groups]
    # the x limit leaves each note room right of its bar: bar / limit * width + offset + note <= width
    room = [PANEL_WIDTH - NOTE_OFFSET - widths(n, "small") - 0.1 for n in notes]
    top = max((h * PANEL_WIDTH / max(r, 0.3 * PANEL_WIDTH) for h, r in zip(heights, room)), default=1)
    ax.set_xlim(0, max(top, 1.05 * max(heights, default=1), 1))
    offset = ax.transData + ScaledTranslation(NOTE_OFFSET, 0, ax.figure.dpi_scale_trans)
    for g, height, note in zip(groups, heights, notes):
        ax.text(height, row[label(g)], note, transform=offset, va="center", fontsize="small")
    # every bar says its length: no x axis numbers to read it from (``series_axis`` hides the axis)


def _note(group: dict) -> str:
    """'≥ 64' (nothing larger ran out of memory: the limit was not found), '32 · OOM at 64', '… · fastest 16'; a
    config without one ok batch: its status."""
    fits = group["max_ok_batch"]
    if fits is None:
        return str(group["status"])
    text = f"≥ {fits}" if group["oom_batch"] is None else f"{fits} · OOM at {group['oom_batch']}"
    if group["fastest_batch"] is not None and group["fastest_batch"] != fits:
        text += f" · fastest {group['fastest_batch']}"
    return text


def value_axis(ax: Axes, limits: tuple[float, float], ticks: list[float], numbered: bool) -> None:
    """A TFLOP/s panel's y axis, shared with its row without matplotlib's sharing (which shares the tick locator
    too): ``limits`` and a grid line at each of ``ticks``; ``numbered``: the ticks too, else no y axis at all (a
    tick is six artists: ~1 ms to make and draw)."""
    from matplotlib.ticker import NullLocator

    ax.set_ylim(*limits)
    if numbered:
        ax.set_yticks(ticks)
    else:
        ax.yaxis.set_major_locator(NullLocator())  # no ticks, not even the one set_yticks([]) would make
        ax.yaxis.set_visible(False)
    grid_lines(ax, ticks)


def series_axis(ax: Axes, series: list[str], style: dict, named: bool) -> None:
    """A max-batch panel's rows, the first series on top; the ``named`` panel (leftmost) writes each series' label
    left of its row with a short line of its style, as a legend's entry: the series legend of the TFLOP/s panels
    above. No axis, no ticks."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator
    from matplotlib.transforms import ScaledTranslation, blended_transform_factory

    ax.set_ylim(len(series) - 0.5, -0.5)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(NullLocator())
        axis.set_visible(False)
    if not named:
        return
    # x in inches from the panel's left edge (the axes' transform is affine: a box's), y a row
    inches = ax.figure.dpi_scale_trans + ScaledTranslation(0, 0, cast("Affine2DBase", ax.transAxes))
    left = blended_transform_factory(inches, ax.transData)
    start, end = -LABEL_PAD - HANDLE, -LABEL_PAD
    for y, name in enumerate(series):
        look = style[name]
        handle = Line2D(
            [start, (start + end) / 2, end],
            [y, y, y],
            color=look["color"],
            linestyle=look["linestyle"],
            marker=look["marker"],
            markevery=[1],  # one marker, in the middle, as a legend's handle
            transform=left,
            clip_on=False,
        )
        ax.add_artist(handle)  # not add_line: no data limits to update
        ax.text(start - LABEL_PAD, y, name, transform=left, ha="right", va="center", fontsize="small")


def grid_lines(ax: Axes, values: list[float], axis: str = "y") -> None:
    """A panel's grid across one axis, one LineCollection at ``values`` (not a line a tick; for the y axis the
    ticks of its row, which the panel may not have itself), looking like matplotlib's grid at alpha 0.3."""
    from matplotlib import rcParams
    from matplotlib.collections import LineCollection

    across = [((0, v), (1, v)) for v in values] if axis == "y" else [((v, 0), (v, 1)) for v in values]
    lines = LineCollection(
        across,
        colors=rcParams["grid.color"],
        linewidths=rcParams["grid.linewidth"],
        alpha=0.3,
        zorder=0.5,  # under the data, as the axes' own grid
        transform=ax.get_yaxis_transform() if axis == "y" else ax.get_xaxis_transform(),  # across, at data values
    )
    ax.add_collection(lines, autolim=False)


def place_axis_labels(ax: Axes, below: float, left: float) -> None:
    """The x label ``below`` inches under the axes, the y label ``left`` inches left of it, where matplotlib would
    put them after measuring every tick label of the axes and its siblings (~5 ms a panel)."""
    from matplotlib.transforms import ScaledTranslation

    inches = ax.figure.dpi_scale_trans
    ax.xaxis.set_label_coords(0.5, 0, ax.transAxes + ScaledTranslation(0, -below, inches))
    ax.yaxis.set_label_coords(0, 0.5, ax.transAxes + ScaledTranslation(-left, 0, inches))
