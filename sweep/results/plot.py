"""``sweep results plot``: one image, two rows of panels, one panel per model in each row.

- Top row(s): median TFLOP/s/GPU vs per-GPU batch size, one line per series (precision, plus
  whichever of cluster, compile, ac, seq_len, world_size, the training options and the memory cap
  vary within a model), error bars min–max over repeats. A batch where every attempt hit OOM is an
  ``x`` on the zero line; one that failed otherwise (error, timeout, unsupported) is a hollow triangle.
- Bottom row(s): the largest batch that fits per series (bar, number on top, "OOM at n" where a
  larger batch ran out of memory, "≥ n" where none did, "fastest n" when a smaller batch was faster).

Series are labelled by the values that vary, each with its name ("bf16 · accum 8 · reduce bf16");
what differs only between models goes in the panel titles ("gpt2-1.5b · seq 1024"), what is the same
everywhere in the figure title, once.

matplotlib is imported here only, through ``Figure`` and the Agg canvas: no pyplot global state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from sweep.errors import UserError
from sweep.record.schema import TRAINING_DEFAULTS
from sweep.results import aggregate
from sweep.results.energy import PLOT_METRICS
from sweep.results.render import CONFIG_HEADERS, says_nothing, setting

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

Label = Callable[[dict[str, Any]], str]  # a series' legend text from one of its rows

SERIES_KEYS = ("cluster", "precision", "compile", "ac", "seq_len", "world_size", *TRAINING_DEFAULTS, "memory_cap_gib")
DPI = 110  # the tick thinning measures text at this resolution: the saved image must use the same
MAX_WIDTH = 22.0  # inches: wider panels wrap onto more rows


def _text(key: str, value: Any) -> str:  # a cell of any column
    """One value named by its table header: 'accum 8', 'fp8 head on', 'cap 80 GiB'; a precision is its own name."""
    if key == "precision":
        return str(value)
    if key == "memory_cap_gib":  # a capped search is its own series, never joined to the uncapped one
        return "no cap" if value is None else f"cap {setting(value)} GiB"
    if isinstance(value, bool):
        return f"{CONFIG_HEADERS[key]} {'on' if value else 'off'}"
    return f"{CONFIG_HEADERS[key]} {value}"


def plot(directory: Path, out: Path, where: Iterable[str] = (), skip_bad: bool = False, metric: str = "tflops") -> Path:
    """Aggregate ``directory`` and write the figure; returns the path written (``out`` + .png without a suffix).
    ``metric``: the top panels' y (a key of ``energy.PLOT_METRICS``)."""
    import threading

    # matplotlib's import (~0.3 s) runs while DuckDB aggregates, which holds no GIL
    importing = threading.Thread(target=_import_matplotlib, name="sweep-import-matplotlib", daemon=True)
    importing.start()
    inputs = ("status", *PLOT_METRICS[metric][:3], "tflops_min", "tflops_max", *aggregate.MAX_BATCH_INPUTS)
    configs = aggregate.config_table(aggregate.load_rows(directory, where, skip_bad), inputs)
    importing.join()
    y = PLOT_METRICS[metric][0]
    if metric != "tflops" and configs.column(y).null_count == configs.num_rows:
        raise UserError(
            f"--metric {metric}: no row in {directory} measured it (energy is measured on GPU ranks from schema 1.10)"
        )
    return plot_tables(configs, aggregate.max_batch_table(configs), Path(out), metric)


def _import_matplotlib() -> None:
    """Import matplotlib and draw a tiny figure of every kind of artist the plot has, while DuckDB aggregates: the
    fonts, their glyph caches and the marker and hatch paths are loaded here, not in the first draw of the plot
    (~0.25 s of a 12-panel figure)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 2), dpi=DPI)  # no layout engine: the plot's one layout stays the only one
    ax = fig.subplots()
    ax.errorbar([1, 2], [1, 2], yerr=[[0.1, 0.1], [0.1, 0.1]], capsize=3, marker="o", linestyle="--")
    ax.scatter([1], [0], marker="x", color=["C1"], clip_on=False)
    ax.bar([1], [1], hatch="//", edgecolor="white")
    ax.annotate("≥ 1\nOOM at 2", (1, 1), xytext=(0, 3), textcoords="offset points", fontsize="small")
    ax.set_xticks([1, 2], ["cluster\nbf16", "2"], fontsize="small")
    ax.set_title("warm-up · 0123456789")
    fig.legend(handles=ax.get_lines()[:1], labels=["bf16"], loc="lower center", frameon=False)
    FigureCanvasAgg(fig).draw()


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
    """Colour by precision; line style, marker and bar hatch by the rest of the series key (cluster...)."""
    precisions = sorted({str(r["precision"]) for r in rows})
    rest = lambda r: tuple(_text(k, r[k]) for k in varying if k != "precision")  # noqa: E731
    others = sorted({rest(r) for r in rows})
    styles = {}
    for r in rows:
        i = others.index(rest(r))
        styles[label(r)] = {
            "color": f"C{precisions.index(str(r['precision'])) % 10}",
            "linestyle": ("-", "--", ":", "-.")[i % 4],
            "marker": "osD^vP*X"[i % 8],
            "hatch": ("", "//", "..", "xx", "\\\\", "++")[i % 6],
        }
    return dict(sorted(styles.items()))


def plot_tables(configs: pa.Table, max_batch: pa.Table, out: Path, metric: str = "tflops") -> Path:
    """Write ``figure`` to ``out`` (format from the suffix; none: .png, added to the name that is returned)."""
    if not out.suffix:  # matplotlib would write out + ".png" and the caller would name the wrong file
        out = out.with_name(out.name + ".png")
    fig = figure(configs, max_batch, metric)
    out.parent.mkdir(parents=True, exist_ok=True)
    # zlib level 3, not PIL's 6: the same pixels in ~8 % more bytes, encoded in 0.25 s less (a 2,150 x 5,350 px figure)
    options = {"pil_kwargs": {"compress_level": 3}} if out.suffix.lower() == ".png" else {}
    try:
        fig.savefig(out, dpi=DPI, **options)
    except (ValueError, OSError) as e:
        raise UserError(f"--out {out}: cannot write the plot ({e})") from None
    return out


def figure(configs: pa.Table, max_batch: pa.Table, metric: str = "tflops"):
    """The matplotlib Figure of ``configs`` (from ``aggregate.configs``) and their ``max_batch_table``."""
    from matplotlib.figure import Figure

    rows, groups = configs.to_pylist(), max_batch.to_pylist()
    varying, per_model, constant = _split_keys(rows)
    label = lambda r: " · ".join(_text(k, r[k]) for k in varying)  # noqa: E731
    style = _styles(rows, varying, label)
    series = list(style)
    models = sorted({r["model"] for r in rows})
    # a max-batch panel is as wide as its bars need: each holds "OOM at 121" and its longest label line
    most_bars = max(sum(g["model"] == m for g in groups) for m in models)
    longest = max(len(part) for s in series for part in s.split(" · "))
    panel = max(5.4, most_bars * max(0.8, 0.065 * longest + 0.25) + 1.0)
    ncols = max(1, min(len(models), 3, int(MAX_WIDTH // panel)))
    nrows = math.ceil(len(models) / ncols)

    fig = Figure(figsize=(panel * ncols, 4.0 * 2 * nrows + 0.6), dpi=DPI, layout="constrained")
    axes = fig.subplots(2 * nrows, ncols, squeeze=False)
    perf_axes = []
    for i, model in enumerate(models):
        top, bottom = axes[i // ncols][i % ncols], axes[nrows + i // ncols][i % ncols]
        mine = [r for r in rows if r["model"] == model]
        _perf_panel(top, mine, label, style, PLOT_METRICS[metric])
        _bar_panel(bottom, [g for g in groups if g["model"] == model], label, style)
        name = " · ".join([model, *(_text(k, mine[0][k]) for k in per_model)])
        top.set_title(name)
        bottom.set_title(f"{name}: largest batch that fits")
        perf_axes.append((top, sorted({r["batch_size"] for r in mine})))
    for ax in [*axes[:nrows].flat[len(models) :], *axes[nrows:].flat[len(models) :]]:
        ax.set_visible(False)

    _legend(fig, series, style)
    title = [_text(k, rows[0][k]) for k in constant if not says_nothing(k, rows[0][k])]
    if title:
        fig.suptitle(_wrap(title, int(fig.get_figwidth() * fig.dpi // 8)), fontsize="medium")
    _batch_ticks(fig, perf_axes)
    return fig


def _legend(fig: Figure, series: list[str], style: dict[str, dict[str, Any]]) -> None:
    """One legend under the panels: a line per series, then the failure markers."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color=style[s]["color"], linestyle=style[s]["linestyle"], marker=style[s]["marker"], label=s)
        for s in series
    ]
    handles += [
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
    # as many columns as the figure's width holds for the longest label (~7 px per character)
    width_px = fig.get_figwidth() * fig.dpi
    longest = max(len(str(h.get_label())) for h in handles) * 7 + 40
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncols=max(1, min(len(handles), int(width_px // longest))),
        frameon=False,
    )


def _batch_ticks(fig: Figure, panels: list[tuple[Any, list[int]]]) -> None:
    """Every batch tried gets a tick; a number only where it does not run into its neighbour's.

    The first and last batch are always numbered. Overlap is measured on the laid-out figure: batches a
    search probed close together (113, 117, 118, 119) would otherwise print as one smudge. One layout serves
    every panel: a panel's numbers keep their height when another's are thinned, the first and last stay, so no
    panel moves. That layout is the figure's: it is run once here (measuring every tick number, not drawing the
    artists) and then fixed, so saving draws the figure once, not twice more (~1 s of a 12-panel figure).
    """
    from matplotlib.ticker import FixedLocator, ScalarFormatter

    for ax, batches in panels:
        if batches[-1] >= 4 * batches[0]:
            ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(batches))
        ax.xaxis.set_major_formatter(ScalarFormatter())
    engine = fig.get_layout_engine()
    if engine is not None:  # the figure is made with layout="constrained"
        engine.execute(fig)
    for ax, batches in panels:
        _thin(fig, ax, batches)
    # no engine: the axes stay where the layout put them, and savefig draws once (a placeholder engine, "none",
    # would still cost a draw to lay out); a matplotlibrc that asks for a layout by default gets the placeholder
    fig.set_layout_engine(None)
    if fig.get_layout_engine() is not None:
        fig.set_layout_engine("none")


def _thin(fig: Figure, ax: Axes, batches: list[int]) -> None:
    from matplotlib.ticker import FixedLocator, NullFormatter

    labels = ax.get_xticklabels()
    boxes = [t.get_window_extent() for t in labels]
    # half an em between two numbers: closer, "510 926" reads as one number, or as two printed over each other
    gap, last = 0.5 * float(labels[0].get_fontsize()) * fig.dpi / 72, len(batches) - 1
    keep = [0]
    for i in range(1, last + 1):
        clear = boxes[i].x0 >= boxes[keep[-1]].x1 + gap
        if clear and (i == last or boxes[i].x1 + gap <= boxes[last].x0):  # leave room for the last one
            keep.append(i)
    ax.xaxis.set_major_locator(FixedLocator([batches[i] for i in keep]))
    ax.xaxis.set_minor_locator(FixedLocator([b for i, b in enumerate(batches) if i not in keep]))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _perf_panel(
    ax: Axes, rows: list[dict], label: Label, style: dict, metric: tuple[str, str, str, str] = PLOT_METRICS["tflops"]
) -> None:
    key, low, high, axis_label = metric
    top = max((r[high] or 0 for r in rows), default=0) or 1.0
    series = list(style)
    oom: list[tuple[float, str]] = []  # (batch nudged, colour): every series' markers, drawn as one set a kind
    other: list[tuple[float, str]] = []
    for n, s in enumerate(series):
        mine = sorted((r for r in rows if label(r) == s), key=lambda r: r["batch_size"])
        ok = [r for r in mine if r[key] is not None]
        if ok:
            y = [r[key] for r in ok]
            err = [[v - r[low] for v, r in zip(y, ok)], [r[high] - v for v, r in zip(y, ok)]]
            ax.errorbar(
                [r["batch_size"] for r in ok],
                y,
                yerr=err,
                capsize=3,
                color=style[s]["color"],
                linestyle=style[s]["linestyle"],
                marker=style[s]["marker"],
            )
        # Failure markers sit on the zero line, nudged sideways per series so they do not hide each other.
        nudge = 2 ** (0.07 * (n - (len(series) - 1) / 2))
        failed = [r for r in mine if r["tflops_per_gpu"] is None]
        oom += [(r["batch_size"] * nudge, style[s]["color"]) for r in failed if r["n_oom"]]
        other += [(r["batch_size"] * nudge, style[s]["color"]) for r in failed if not r["n_oom"]]
    # one scatter a kind for the whole panel, not two per series (192 collections of a 6-panel figure: ~0.3 s)
    kinds: tuple[tuple[list, dict[str, Any]], ...] = (
        (oom, {"marker": "x", "s": 60, "linewidths": 2, "color": [c for _, c in oom]}),
        (other, {"marker": "^", "s": 50, "facecolors": "none", "edgecolors": [c for _, c in other]}),
    )
    for points, kind in kinds:
        if points:
            marks = ax.scatter([x for x, _ in points], [0] * len(points), clip_on=False, zorder=3, **kind)
            marks.set_in_layout(False)  # on the zero line, inside the axes: nothing for the layout to measure
    ax.set_ylim(-0.04 * top, 1.1 * top)
    ax.set_xlabel("batch size per GPU")
    ax.set_ylabel(axis_label)
    ax.grid(alpha=0.3)


def _bar_panel(ax: Axes, groups: list[dict], label: Label, style: dict) -> None:
    from matplotlib.ticker import MaxNLocator

    groups = sorted(groups, key=label)
    top = max((g["max_ok_batch"] or 0 for g in groups), default=0) or 1
    # one bar call for the panel (a container of its own per bar costs ~10 ms a panel)
    looks = [style[label(g)] for g in groups]
    ax.bar(
        range(len(groups)),
        [g["max_ok_batch"] or 0 for g in groups],
        width=0.7,
        color=[s["color"] for s in looks],
        hatch=[s["hatch"] for s in looks],
        edgecolor="white",
    )
    for x, g in enumerate(groups):
        height = g["max_ok_batch"] or 0
        if g["max_ok_batch"] is None:
            text = g["status"]
        elif g["oom_batch"] is None:
            text = f"≥ {height}"  # nothing larger ran out of memory: the limit was not found
        else:
            text = f"{height}\nOOM at {g['oom_batch']}"
        if g["fastest_batch"] is not None and g["fastest_batch"] != g["max_ok_batch"]:
            text += f"\nfastest {g['fastest_batch']}"
        note = ax.annotate(
            text, (x, height), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize="small"
        )
        # inside the axes (the y limit leaves 30 % above the tallest bar): the layout need not measure it
        note.set_in_layout(False)
    ax.set_xticks(range(len(groups)), [label(g).replace(" · ", "\n") for g in groups], fontsize="small")
    ax.set_ylim(0, top * 1.3)
    ax.yaxis.set_major_locator(
        MaxNLocator(integer=True, steps=[1, 2, 5, 10])
    )  # a batch is whole: no 0.2 ticks when the largest is 1
    ax.set_ylabel("largest ok batch per GPU")
    ax.grid(axis="y", alpha=0.3)
