"""``sweep results plot``: one PNG, two rows of panels, one panel per model in each row.

- Top row(s): median TFLOP/s/GPU vs per-GPU batch size, one line per series (precision, plus
  whichever of cluster, compile, ac, seq_len, world_size vary in the data), error bars min–max over
  repeats. A batch where every attempt hit OOM is an ``x`` on the zero line; one that failed
  otherwise (error, timeout, unsupported) is a hollow triangle.
- Bottom row(s): the largest batch that fits per series (bar, number on top, "OOM at n" where a
  larger batch ran out of memory, "fastest n" when a smaller batch was faster).

matplotlib is imported here only, through ``Figure`` and the Agg canvas: no pyplot global state.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable

import pyarrow as pa

from sweep.errors import UserError
from sweep.results import aggregate
from sweep.schema import TRAINING_DEFAULTS

SERIES_KEYS = ("cluster", "precision", "compile", "ac", "seq_len", "world_size", *TRAINING_DEFAULTS, "memory_cap_gib")


def _text(key: str, value) -> str:
    if key == "memory_cap_gib":  # a capped search is its own series, never joined to the uncapped one
        return "no cap" if value is None else f"cap {value:g} GiB"
    return str(value)


def plot(directory: Path, out: Path, where: Iterable[str] = (), skip_bad: bool = False) -> Path:
    """Aggregate ``directory`` and write the figure to ``out`` (format from its suffix, e.g. .png)."""
    configs = aggregate.configs(directory, where, skip_bad)
    return plot_tables(configs, aggregate.max_batch_table(configs), Path(out))


def _labels(rows: list[dict]) -> tuple[list[str], str]:
    """Series label keys (precision and every varying key) and a caption of the constant ones."""
    varying = [k for k in SERIES_KEYS if k == "precision" or len({r[k] for r in rows}) > 1]
    constant = [f"{k} {_text(k, rows[0][k])}" for k in SERIES_KEYS if k not in varying and rows]
    return varying, " · ".join(constant)


def _styles(rows: list[dict], varying: list[str], label) -> dict[str, dict]:
    """Colour by precision; line style, marker and bar hatch by the rest of the series key (cluster...)."""
    precisions = sorted({str(r["precision"]) for r in rows})
    rest = lambda r: tuple(_text(k, r[k]) for k in varying if k != "precision")  # noqa: E731
    others = sorted({rest(r) for r in rows})
    styles = {}
    for r in rows:
        i = others.index(rest(r))
        styles[label(r)] = {"color": f"C{precisions.index(str(r['precision'])) % 10}", "linestyle": ("-", "--", ":", "-.")[i % 4],
                            "marker": "osD^vP*X"[i % 8], "hatch": ("", "//", "..", "xx", "\\\\", "++")[i % 6]}
    return dict(sorted(styles.items()))


def plot_tables(configs: pa.Table, max_batch: pa.Table, out: Path) -> Path:
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    rows, groups = configs.to_pylist(), max_batch.to_pylist()
    varying, caption = _labels(rows)
    label = lambda r: " · ".join(_text(k, r[k]) for k in varying)  # noqa: E731
    style = _styles(rows, varying, label)
    series = list(style)
    models = sorted({r["model"] for r in rows})
    ncols = min(len(models), 3)
    nrows = math.ceil(len(models) / ncols)

    fig = Figure(figsize=(5.4 * ncols, 4.0 * 2 * nrows + 0.6), layout="constrained")
    axes = fig.subplots(2 * nrows, ncols, squeeze=False)
    for i, model in enumerate(models):
        top, bottom = axes[i // ncols][i % ncols], axes[nrows + i // ncols][i % ncols]
        _perf_panel(top, [r for r in rows if r["model"] == model], label, style)
        _bar_panel(bottom, [g for g in groups if g["model"] == model], label, style)
        top.set_title(model)
        bottom.set_title(f"{model}: largest batch that fits")
        batches = sorted({r["batch_size"] for r in rows if r["model"] == model})
        if batches[-1] >= 4 * batches[0]:
            top.set_xscale("log", base=2)
        top.xaxis.set_major_locator(FixedLocator(batches))
        top.xaxis.set_minor_locator(NullLocator())
        top.xaxis.set_major_formatter(ScalarFormatter())
    for ax in [*axes[:nrows].flat[len(models):], *axes[nrows:].flat[len(models):]]:
        ax.set_visible(False)

    handles = [Line2D([], [], color=style[s]["color"], linestyle=style[s]["linestyle"], marker=style[s]["marker"], label=s) for s in series]
    handles += [Line2D([], [], color="0.3", marker="x", linestyle="none", markersize=8, label="OOM"),
                Line2D([], [], color="0.3", marker="^", markerfacecolor="none", linestyle="none", label="error / timeout / unsupported")]
    # as many columns as the figure's width holds for the longest label (~7 px per character)
    width_px = fig.get_figwidth() * fig.dpi
    longest = max(len(h.get_label()) for h in handles) * 7 + 40
    fig.legend(handles=handles, loc="outside lower center", ncols=max(1, min(len(handles), int(width_px // longest))),
               frameon=False)
    if caption:
        fig.suptitle(caption, fontsize="medium")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(out, dpi=110)
    except (ValueError, OSError) as e:
        raise UserError(f"--out {out}: cannot write the plot ({e})") from None
    return out


def _perf_panel(ax, rows: list[dict], label, style: dict) -> None:
    top = max((r["tflops_max"] or 0 for r in rows), default=0) or 1.0
    series = list(style)
    for n, s in enumerate(series):
        mine = sorted((r for r in rows if label(r) == s), key=lambda r: r["batch_size"])
        ok = [r for r in mine if r["tflops_per_gpu"] is not None]
        if ok:
            y = [r["tflops_per_gpu"] for r in ok]
            err = [[v - r["tflops_min"] for v, r in zip(y, ok)], [r["tflops_max"] - v for v, r in zip(y, ok)]]
            ax.errorbar([r["batch_size"] for r in ok], y, yerr=err, capsize=3, color=style[s]["color"],
                        linestyle=style[s]["linestyle"], marker=style[s]["marker"])
        # Failure markers sit on the zero line, nudged sideways per series so they do not hide each other.
        nudge = 2 ** (0.07 * (n - (len(series) - 1) / 2))
        oom = [r["batch_size"] * nudge for r in mine if r["tflops_per_gpu"] is None and r["n_oom"]]
        other = [r["batch_size"] * nudge for r in mine if r["tflops_per_gpu"] is None and not r["n_oom"]]
        ax.scatter(oom, [0] * len(oom), marker="x", s=60, linewidths=2, color=style[s]["color"], clip_on=False, zorder=3)
        ax.scatter(other, [0] * len(other), marker="^", s=50, facecolors="none", edgecolors=style[s]["color"], clip_on=False, zorder=3)
    ax.set_ylim(-0.04 * top, 1.1 * top)
    ax.set_xlabel("batch size per GPU")
    ax.set_ylabel("TFLOP/s/GPU (median)")
    ax.grid(alpha=0.3)


def _bar_panel(ax, groups: list[dict], label, style: dict) -> None:
    groups = sorted(groups, key=label)
    top = max((g["max_ok_batch"] or 0 for g in groups), default=0) or 1
    for x, g in enumerate(groups):
        height = g["max_ok_batch"] or 0
        ax.bar(x, height, width=0.7, color=style[label(g)]["color"], hatch=style[label(g)]["hatch"], edgecolor="white")
        text = str(height) if g["max_ok_batch"] is not None else g["status"]
        if g["oom_batch"] is not None:
            text += f"\nOOM at {g['oom_batch']}"
        if g["fastest_batch"] is not None and g["fastest_batch"] != g["max_ok_batch"]:
            text += f"\nfastest {g['fastest_batch']}"
        ax.annotate(text, (x, height), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize="small")
    ax.set_xticks(range(len(groups)), [label(g).replace(" · ", "\n") for g in groups], fontsize="small")
    ax.set_ylim(0, top * 1.3)
    ax.set_ylabel("largest ok batch per GPU")
    ax.grid(axis="y", alpha=0.3)
