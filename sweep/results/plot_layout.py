"""Where the plot's panels go, computed from text widths and panel counts: no layout engine, no draw to measure.

matplotlib's constrained layout draws the figure to measure every artist (~0.9 s of a 12-panel figure) and the
old tick thinning measured every laid-out tick number; here each string's width is the sum of its characters'
advances in the font the figure uses (``TextWidths``, read from the font once a character), and the axes are
placed in inches from those widths. ``tests/test_results_plot.py`` draws the figure and checks that every text
fits inside it and no two tick numbers or bar notes of a panel overlap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

DPI = 100
PANEL_WIDTH = 5.6  # inches, a TFLOP/s panel and the max-batch panel under it
PERF_HEIGHT = 3.0
BAR_PITCH = 0.22  # inches per series in a max-batch panel: one line of small text and a gap
MAX_COLUMNS = 3
MAX_SERIES = 32
"""Series a model's panels may have (``sweep results plot --max-series``): past it the lines are a tangle and the
max-batch panel pages long (a 10^6-row folder of 8,064 configs has 192 series a panel: a 2,257 x 9,523 px figure,
3.5 s to draw)."""
GAP = 0.35  # between columns (only the leftmost column prints y tick labels) and below a panel's x label


class TextWidths:
    """The width in inches of a line of text at a font size, as the Agg renderer lays it out (the sum of the
    characters' advances under the hinting in force; DejaVu's kerning moves a line by less than a pixel). One
    glyph lookup a character and size: ~2 µs, against ~0.4 ms for a renderer's layout of the whole string."""

    def __init__(self, dpi: float = DPI) -> None:
        self.dpi = dpi
        self._fonts: dict[float, Any] = {}
        self._advance: dict[tuple[float, str], float] = {}

    def points(self, size: str | float) -> float:
        from matplotlib.font_manager import FontProperties

        return float(FontProperties(size=size).get_size_in_points())

    def __call__(self, text: str, size: str | float = "medium") -> float:
        """Inches of the widest line of ``text``."""
        points = self.points(size)
        return max(sum(self._char(points, c) for c in line) for line in text.split("\n")) / self.dpi

    def _char(self, points: float, char: str) -> float:
        from matplotlib.backends.backend_agg import get_hinting_flag

        key = (points, char)
        if key not in self._advance:
            font = self._font(points)
            font.set_size(points, self.dpi)  # the font object is shared with the renderer, which sets its own size
            self._advance[key] = font.load_char(ord(char), flags=get_hinting_flag()).horiAdvance / 64
        return self._advance[key]

    def _font(self, points: float) -> Any:
        if points not in self._fonts:
            from matplotlib.font_manager import FontProperties, findfont, get_font

            self._fonts[points] = get_font(findfont(FontProperties(size=points)))
        return self._fonts[points]


@dataclass(frozen=True)
class Layout:
    """The figure's size and each panel's place, inches from the bottom left corner."""

    size: tuple[float, float]
    perf: list[tuple[float, float, float, float]]  # (left, bottom, width, height) per model
    bars: list[tuple[float, float, float, float]]
    columns: int
    legend_columns: int
    legend_bottom: float  # inches
    title_top: float
    x_label_below: float  # inches under a TFLOP/s panel, the top of its x label
    y_label_left: float  # inches left of it, the bottom (right side, rotated) of its y label


def columns(models: int) -> int:
    """Panels a row: at most MAX_COLUMNS, and rows as even as they go (4 models: 2 + 2, not 3 + 1)."""
    rows = math.ceil(models / MAX_COLUMNS)
    return math.ceil(models / rows)


def layout(
    widths: TextWidths,
    models: int,
    series_labels: list[str],
    legend_labels: list[str],
    y_ticks: list[str],
    shared_y: bool,
    title_lines: int,
    panel_title_lines: int,
) -> Layout:
    """Place ``models`` pairs of panels (TFLOP/s over max-batch) in rows of ``columns(models)``.

    The left margin holds the longer of the series labels of the max-batch panels and the TFLOP/s panels' tick
    numbers (``y_ticks``) with their axis label; only the leftmost column prints either, but for the tick numbers
    of panels that do not share their y range (not ``shared_y``): the gap between columns holds them then.
    """
    em = widths.points("medium") / 72
    title_em = widths.points("large") / 72
    ncols = columns(models)
    nrows = math.ceil(models / ncols)
    bar_height = BAR_PITCH * len(series_labels) + 0.1
    tick_room = 7 / 72  # tick length 3.5 pt and its pad 3.5 pt
    x_label = tick_room + 1.2 * em + 4 / 72  # under the x tick numbers, the axis label pad (4 pt)
    below = x_label + 1.3 * em
    above = 6 / 72 + panel_title_lines * 1.25 * title_em + 0.05  # the panel title over its pad
    y_label = tick_room + max(widths(t) for t in y_ticks) + 4 / 72
    left = 0.15 + max(
        y_label + 1.3 * em,  # perf: tick numbers and axis label
        3 * 4 / 72 + 0.3 + max(widths(s, "small") for s in series_labels),  # bars: a series' line and label a row
    )
    gap = GAP if shared_y else max(GAP, y_label + 0.1)
    width = left + ncols * PANEL_WIDTH + (ncols - 1) * gap + 0.3

    legend_columns, legend_rows = _legend_grid(widths, legend_labels, width - 0.4)
    legend_height = legend_rows * 1.6 * em + 0.9 * em  # a row: the text (1.17 em) and the 0.5 em between rows
    top = 0.15 + title_lines * 1.4 * em
    group = above + PERF_HEIGHT + below + GAP + above + bar_height + GAP  # the max-batch panel has no x axis
    height = top + nrows * group + legend_height + 0.1

    perf, bars = [], []
    for i in range(models):
        row, col = divmod(i, ncols)
        x = left + col * (PANEL_WIDTH + gap)
        perf_top = height - top - row * group - above
        perf.append((x, perf_top - PERF_HEIGHT, PANEL_WIDTH, PERF_HEIGHT))
        bar_top = perf_top - PERF_HEIGHT - below - GAP - above
        bars.append((x, bar_top - bar_height, PANEL_WIDTH, bar_height))
    return Layout((width, height), perf, bars, ncols, legend_columns, 0.1, height - 0.1, x_label, y_label)


def _legend_grid(widths: TextWidths, labels: list[str], room: float) -> tuple[int, int]:
    """(columns, rows) of the figure legend: as many columns as ``room`` inches hold, at the widest label each
    (a handle of 2 em, a pad of 0.8 em, 2 em between columns: matplotlib's defaults)."""
    em = widths.points("medium") / 72
    column = 2.8 * em + max(widths(label) for label in labels)
    ncols = max(1, min(len(labels), int((room + 2 * em) // (column + 2 * em))))
    return ncols, math.ceil(len(labels) / ncols)


def thinned(widths: TextWidths, positions: list[float], labels: list[str]) -> list[int]:
    """The indices of the tick labels to print, centred at ``positions`` (inches along the axis): the first and
    the last always, any other only where it is half an em clear of the one before it and of the last one (probes
    close together, 113 117 118 119, would print as one smudge)."""
    gap = 0.5 * widths.points("medium") / 72
    half = [widths(label) / 2 for label in labels]
    last = len(labels) - 1
    keep = [0]
    for i in range(1, last + 1):
        clear = positions[i] - half[i] >= positions[keep[-1]] + half[keep[-1]] + gap
        if clear and (i == last or positions[i] + half[i] + gap <= positions[last] - half[last]):
            keep.append(i)
    return keep
