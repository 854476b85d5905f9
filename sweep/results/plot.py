"""``sweep results plot``: one image, a pair of panels per model, in rows of up to three models.

- Top of a pair: median TFLOP/s/GPU vs per-GPU batch size, one line per series (precision, plus
  whichever of cluster, compile, ac, seq_len, world_size, the training options and the memory cap
  vary within a model), error bars min–max over repeats. A batch where every attempt hit OOM is an
  ``x`` on the zero line; one that failed otherwise (error, timeout, unsupported) is a hollow triangle.
  These panels share one y range, numbered on the leftmost panel of a row (unless the models' maxima
  are more than SHARE_WITHIN apart: then each its own).
- Under it: the largest batch that fits per series (a horizontal bar, a row per series; the leftmost
  panel of a row names each row beside a short line of the series' style, the legend of the lines
  above; a bar's note: the number, "OOM at n" where a larger batch ran out of memory, "≥ n" where none
  did, "fastest n" when a smaller batch was faster). The figure legend: the two failure markers.

Series are labelled by the values that vary, each with its name ("bf16 · accum 8 · reduce bf16");
what differs only between models goes in the panel titles ("gpt2-1.5b · seq 1024"), what is the same
everywhere in the figure title, once.

Drawn for speed (issue 31: ≤ 2 s on 10^6 rows, the process included): no layout engine (the panels are
placed from text widths read off the font, ``plot_layout``), few artists a panel (``plot_panels``), drawn
once, the PNG written by ``plot_png``. matplotlib is imported here only, through ``Figure`` and the Agg canvas:
no pyplot global state.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from sweep.errors import UserError
from sweep.record.schema import TRAINING_DEFAULTS
from sweep.results import aggregate
from sweep.results.energy import PLOT_METRICS
from sweep.results.plot_layout import DPI, MAX_SERIES, PANEL_WIDTH, Layout, TextWidths, columns, layout
from sweep.results.plot_panels import Label, bar_panel, perf_panel, place_axis_labels, series_axis, value_axis
from sweep.results.plot_png import write_png
from sweep.results.render import CONFIG_HEADERS, says_nothing, setting

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Glyphs as FreeType outlines them, without running the font's hinting program on each (matplotlib's default): at
# 100 dpi the same shapes, a touch softer; ~20 % less drawing time for the ~220 lines of text of a 12-panel figure.
TEXT: dict[Any, Any] = {"text.hinting": "no_hinting"}
SHARE_WITHIN = 3.0  # the TFLOP/s panels share one y range where the models' maxima are within this factor
SERIES_KEYS = ("cluster", "precision", "compile", "ac", "seq_len", "world_size", *TRAINING_DEFAULTS, "memory_cap_gib")


def _text(key: str, value: Any) -> str:  # a cell of any column
    """One value named by its table header: 'accum 8', 'fp8 head on', 'cap 80 GiB'; a precision is its own name."""
    if key == "precision":
        return str(value)
    if key == "memory_cap_gib":  # a capped search is its own series, never joined to the uncapped one
        return "no cap" if value is None else f"cap {setting(value)} GiB"
    if isinstance(value, bool):
        return f"{CONFIG_HEADERS[key]} {'on' if value else 'off'}"
    return f"{CONFIG_HEADERS[key]} {value}"


def plot(
    directory: Path,
    out: Path,
    where: Iterable[str] = (),
    skip_bad: bool = False,
    metric: str = "tflops",
    max_series: int = MAX_SERIES,
) -> Path:
    """Aggregate ``directory`` and write the figure; returns the path written (``out`` + .png without a suffix).
    ``metric``: the top panels' y (a key of ``energy.PLOT_METRICS``); ``max_series``: the most series a model's
    panels may have (0: any number; more is a UserError that says what to narrow)."""
    import threading

    # matplotlib's import (~0.3 s) runs while DuckDB aggregates, which holds no GIL
    importing = threading.Thread(target=_import_matplotlib, name="sweep-import-matplotlib", daemon=True)
    importing.start()
    inputs = ("status", *PLOT_METRICS[metric][:3], "tflops_min", "tflops_max", *aggregate.MAX_BATCH_INPUTS)
    configs = aggregate.config_table(aggregate.load_rows(directory, where, skip_bad), inputs)
    if max_series:
        _check_series(configs.select(["model", *SERIES_KEYS]).to_pylist(), max_series)
    importing.join()
    y = PLOT_METRICS[metric][0]
    if metric != "tflops" and configs.column(y).null_count == configs.num_rows:
        raise UserError(
            f"--metric {metric}: no row in {directory} measured it (energy is measured on GPU ranks from schema 1.10)"
        )
    return plot_tables(configs, aggregate.max_batch_table(configs), Path(out), metric)


def _import_matplotlib() -> None:
    """Import matplotlib and draw a tiny figure of every kind of artist the plot has, while DuckDB aggregates: the
    fonts, the marker paths and the modules matplotlib imports at a first draw are loaded here, not in the
    plot's draw."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    fig = Figure(figsize=(2, 2), dpi=DPI)
    ax = fig.add_axes((0.2, 0.2, 0.7, 0.7))
    ax.plot([1, 2], [1, 2], marker="o", linestyle="--")
    ax.add_collection(LineCollection([((1, 0.9), (1, 1.1))], colors=["C0"]))
    ax.scatter([1], [0], marker="x", color=["C1"], clip_on=False)
    ax.add_artist(Rectangle((0, 0), 1, 1, facecolor="C0", linewidth=0))
    ax.text(1, 1, "≥ 1 · OOM at 2", fontsize="small")
    ax.set_xscale("log", base=2)
    ax.set_xticks([1, 2], ["1", "2"])
    ax.set_title("warm-up · 0123456789")
    fig.legend(handles=ax.get_lines()[:1], labels=["bf16"], loc="lower center", frameon=False)
    FigureCanvasAgg(fig).draw()


def _check_series(rows: list[dict], most: int) -> None:
    """A UserError when a model's panels would have more than ``most`` series, naming what varies and a --where
    that narrows it (one value of the key with the most values)."""
    varying, _, _ = _split_keys(rows)
    series: dict[str, set[tuple]] = {}
    for r in rows:
        series.setdefault(r["model"], set()).add(tuple(r[k] for k in varying))
    model, drawn = max(series.items(), key=lambda item: len(item[1]))
    if len(drawn) <= most:
        return
    values = {k: sorted({str(r[k]) for r in rows if r["model"] == model}) for k in varying}
    key = max(values, key=lambda k: (k != "precision", len(values[k])))  # precision last: it is what a plot compares
    spread = ", ".join(f"{k} {len(v)}" for k, v in values.items())
    raise UserError(
        f"plot: {len(drawn)} series in the {model} panels, more than --max-series {most} (values per key: {spread}):"
        f" narrow them with --where, e.g. -w {key}={values[key][0]}, or raise --max-series (0: no limit)"
    )


def _split_keys(rows: list[dict]) -> tuple[list[str], list[str], list[str]]:
    """SERIES_KEYS as (series, per model, constant).

    Series keys vary within a model's panel (precision always: it is the colour); per-model keys differ
    between models only (gpt2's seq_len 1024 beside llama's 4096) and go in the panel titles; constant
    keys go once in the figure title.
    """
    models: dict[str, list[dict]] = {}
    for r in rows:
        models.setdefault(r["model"], []).append(r)
    series = [k for k in SERIES_KEYS if k == "precision" or any(len({r[k] for r in rs}) > 1 for rs in models.values())]
    per_model = [k for k in SERIES_KEYS if k not in series and len({r[k] for r in rows}) > 1]
    constant = [k for k in SERIES_KEYS if k not in series and k not in per_model]
    return series, per_model, constant


def _wrap(parts: list[str], width: int) -> str:
    """Join ``parts`` with ' · ', breaking lines between parts at ``width`` characters (a title never gets cut)."""
    lines = [""]
    for part in parts:
        if lines[-1] and len(lines[-1]) + 3 + len(part) > width:
            lines.append("")
        lines[-1] += (" · " if lines[-1] else "") + part
    return "\n".join(lines)


def _styles(rows: list[dict], varying: list[str], label: Label) -> dict[str, dict]:
    """Colour by precision; line style and marker by the rest of the series key (cluster...)."""
    from matplotlib.colors import to_rgba

    precisions = sorted({str(r["precision"]) for r in rows})
    rest = lambda r: tuple(_text(k, r[k]) for k in varying if k != "precision")  # noqa: E731
    others = sorted({rest(r) for r in rows})
    styles = {}
    for r in rows:
        i = others.index(rest(r))
        styles[label(r)] = {
            "color": to_rgba(f"C{precisions.index(str(r['precision'])) % 10}"),  # once, not once an artist
            "linestyle": ("-", "--", ":", "-.")[i % 4],
            "marker": "osD^vP*X"[i % 8],
        }
    return dict(sorted(styles.items()))


def plot_tables(configs: pa.Table, max_batch: pa.Table, out: Path, metric: str = "tflops") -> Path:
    """Write ``figure`` to ``out`` (format from the suffix; none: .png, added to the name that is returned)."""
    if not out.suffix:  # matplotlib would write out + ".png" and the caller would name the wrong file
        out = out.with_name(out.name + ".png")
    from matplotlib import __version__, rc_context
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    out.parent.mkdir(parents=True, exist_ok=True)
    with rc_context(TEXT), _no_cyclic_gc():
        fig = figure(configs, max_batch, metric)
        try:
            if out.suffix.lower() == ".png":  # drawn once, written without Pillow's row filters (plot_png)
                canvas = FigureCanvasAgg(fig)
                canvas.draw()
                write_png(out, np.asarray(canvas.buffer_rgba()), DPI, f"sweep results plot, matplotlib {__version__}")
            else:
                fig.savefig(out, dpi=DPI)
        except (ValueError, OSError) as e:
            raise UserError(f"--out {out}: cannot write the plot ({e})") from None
    return out


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """The cyclic garbage collector off while the figure is made and drawn: it allocates ~10^6 objects, so the
    collector would run ~1,500 times, traversing every object the process holds (the imports' included) at the
    oldest generation's runs; the figure's few MB of cycles wait to the end instead."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def figure(configs: pa.Table, max_batch: pa.Table, metric: str = "tflops") -> Figure:
    """The matplotlib Figure of ``configs`` (from ``aggregate.configs``) and their ``max_batch_table``, laid out
    as saved (no layout engine: drawing it draws it once)."""
    from matplotlib.figure import Figure

    rows, groups = configs.to_pylist(), max_batch.to_pylist()
    varying, per_model, constant = _split_keys(rows)
    label = lambda r: " · ".join(_text(k, r[k]) for k in varying)  # noqa: E731
    style = _styles(rows, varying, label)
    series = list(style)
    models = sorted({r["model"] for r in rows})
    widths = TextWidths(DPI)

    fig = Figure(dpi=DPI)
    fig.set_layout_engine("none")  # a matplotlibrc asking for a layout by default gets a placeholder that does nothing
    by_series: dict[str, dict[str, list[dict]]] = {m: {} for m in models}  # model -> series label -> rows
    for r in sorted(rows, key=lambda r: r["batch_size"]):
        by_series[r["model"]].setdefault(label(r), []).append(r)
    perf_axes, bar_axes, titles = [], [], []
    title_chars = int(PANEL_WIDTH / (0.6 * widths.points("large") / 72))
    for model in models:
        first = next(iter(by_series[model].values()))[0]
        name = [model, *(_text(k, first[k]) for k in per_model)]
        titles += [
            _wrap(name, title_chars),
            _wrap([*name[:-1], f"{name[-1]}: largest batch per GPU that fits"], title_chars),
        ]
        perf_axes.append(_panel(fig, titles[-2]))
        perf_panel(perf_axes[-1], by_series[model], style, PLOT_METRICS[metric], widths)
        bar_axes.append(_panel(fig, titles[-1]))
        bar_panel(bar_axes[-1], [g for g in groups if g["model"] == model], series, label, style, widths)
    high = PLOT_METRICS[metric][2]
    tops = [max((r[high] or 0 for s in by_series[m].values() for r in s), default=0) or 1.0 for m in models]
    y_ticks, shared_y = _shared_axes(perf_axes, bar_axes, style, tops)

    handles = _failure_handles()
    title = [_text(k, rows[0][k]) for k in constant if not says_nothing(k, rows[0][k])]
    room = columns(len(models)) * PANEL_WIDTH / (0.6 * widths.points("medium") / 72)  # characters
    suptitle = _wrap(title, int(room)) if title else ""
    place = layout(
        widths,
        len(models),
        series,
        [str(h.get_label()) for h in handles],
        y_ticks,
        shared_y,
        suptitle.count("\n") + 1 if suptitle else 0,
        max(t.count("\n") + 1 for t in titles),
    )
    _place(fig, place, perf_axes, bar_axes)
    fig.legend(
        handles=handles,
        loc="lower center",
        bbox_to_anchor=(0.5, place.legend_bottom / place.size[1]),
        ncols=place.legend_columns,
        frameon=False,
    )
    if suptitle:
        fig.suptitle(suptitle, y=place.title_top / place.size[1], va="top", fontsize="medium")
    return fig


def _panel(fig: Figure, title: str) -> Any:
    """A new panel, placed later (``_place``), with its title."""
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_title(title, y=1.0)  # a y of its own: matplotlib would measure the x axis to place it
    return ax


def _place(fig: Figure, place: Layout, perf_axes: list, bar_axes: list) -> None:
    """Size the figure and put each panel where ``place`` says, the TFLOP/s panels' axis labels too."""
    width, height = place.size
    fig.set_size_inches(width, height)
    for ax, rect in [*zip(perf_axes, place.perf), *zip(bar_axes, place.bars)]:
        left, bottom, w, h = rect
        ax.set_position((left / width, bottom / height, w / width, h / height))
    for ax in perf_axes:
        place_axis_labels(ax, place.x_label_below, place.y_label_left)


def _shared_axes(perf_axes: list, bar_axes: list, style: dict[str, dict], tops: list[float]) -> tuple[list[str], bool]:
    """The y axes of the panels: a row per series in the max-batch panels, named on the leftmost column only; the
    metric from just under 0 to above the highest maximum (``tops``: each model's) in the others, one range for
    all numbered on the leftmost column where the models' maxima are within SHARE_WITHIN of each other (TFLOP/s on
    the same GPUs), else each panel its own (tokens per kWh of a 1B and a 70B model). Returns the tick labels
    drawn and whether the range is shared."""
    from matplotlib.ticker import MaxNLocator

    shared = max(tops) <= SHARE_WITHIN * min(tops)
    ncols = columns(len(perf_axes))
    labels: list[str] = []
    for i, (perf, bars, top) in enumerate(zip(perf_axes, bar_axes, tops)):
        left = i % ncols == 0
        limits = (-0.04 * max(tops), 1.1 * max(tops)) if shared else (-0.04 * top, 1.1 * top)
        ticks = [float(v) for v in MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]).tick_values(*limits)]
        ticks = [v for v in ticks if limits[0] <= v <= limits[1]]
        value_axis(perf, limits, ticks, left or not shared)
        if left or not shared:
            labels += perf.yaxis.get_major_formatter().format_ticks(ticks)
        if not left:
            perf.set_ylabel("")
        series_axis(bars, list(style), style, left)
    return labels, shared


def _failure_handles() -> list:
    """The figure legend: the failure markers (each series' line is named left of its max-batch row)."""
    from matplotlib.lines import Line2D

    return [
        Line2D([], [], color="0.3", marker="x", linestyle="none", markersize=8, label="OOM"),
        Line2D(
            [],
            [],
            color="0.3",
            marker="^",
            markerfacecolor="none",
            linestyle="none",
            label="error / timeout / unsupported",
        ),
    ]
