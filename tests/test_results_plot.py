"""`sweep results plot` on a mixed results folder, as a max-batch campaign on one H200 leaves it.

Three models, two precisions, grad_accum 1 and 8, reduce_dtype fp32 and bf16; compile regional, no
gradient clipping, grad_sync step and a 120 GiB cap everywhere; each series a max-batch search whose probes end
close together (113, 117, 118, 119, 121), and one series per model that never ran out of memory (its largest
batch is only a lower bound).
Rows are written with ``sweep.record.store.write_row`` as ``sweep run`` writes them.
"""

from __future__ import annotations

import datetime as dt
import itertools
from pathlib import Path

import pytest
from conftest import invoke, rows_folder

from sweep.record.schema import TRAINING_DEFAULTS
from sweep.results import plot as plotting

MODELS = {"llama3-8b": 4, "gpt2-1.5b": 24, "llama-tiny": 121}  # smallest OOM batch at bf16, accum 1
PROBES = (1, 2, 4, 8, 16, 32, 64, 113, 117, 118, 119, 121)  # a search's probes, in the order it ran them


def mixed_rows() -> list[dict]:
    rows, n = [], 0
    t0 = dt.datetime(2025, 7, 1, 8, 0, tzinfo=dt.timezone.utc)
    for (model, oom_at), precision, accum, reduce in itertools.product(
        MODELS.items(), ("bf16", "fp8-te-delayed"), (1, 8), ("fp32", "bf16")
    ):
        # fp8 fits a bit more; reduce bf16 with accum 8 never ran out of memory within the probes
        limit = None if (accum, reduce) == (8, "bf16") else oom_at + (2 if precision != "bf16" else 0)
        for batch in PROBES:
            if limit is not None and batch > limit + 8:
                break  # the search stopped above its first OOM
            n += 1
            status = "oom" if limit is not None and batch >= limit else "ok"
            row = {
                "run_id": "campaign",
                "trial_id": f"t{n:04d}",
                "attempt": 1,
                "grid_name": "mixed",
                "cluster": "h200",
                "accelerator": "h200",
                "cost_per_gpu_hour": None,
                "world_size": 1,
                "nodes": 1,
                "model": model,
                "precision": precision,
                "compile": "regional",
                "ac": "none",
                "batch_size": batch,
                "seq_len": 1024 if model == "gpt2-1.5b" else 4096,
                "warmup_steps": 3,
                "measure_steps": 10,
                **TRAINING_DEFAULTS,
                "grad_clip": 0.0,
                "grad_sync": "step",
                "grad_accum": accum,
                "reduce_dtype": reduce,
                "memory_cap_gib": 120.0,
                "status": status,
                "error": "CUDA out of memory" if status == "oom" else None,
                "started_at": t0 + dt.timedelta(minutes=n),
                "finished_at": t0 + dt.timedelta(minutes=n, seconds=30),
            }
            if status == "ok":
                tf = 600 * (1 - 0.5 / (batch + 1)) * (1.3 if precision != "bf16" else 1.0) * (1.02 if accum == 8 else 1)
                row.update(
                    tflops_per_gpu=tf,
                    mfu=tf / 989,
                    tokens_per_s_per_gpu=tf * 40,
                    step_time_s=0.5,
                    peak_mem_gib=10 + batch,
                )
            rows.append(row)
    return rows


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    return rows_folder(tmp_path_factory, "mixed", mixed_rows())


def sweep_results(*args: object):
    return invoke("results", *args)


TITLE = ["cluster h200", "compile regional", "ac none", "GPUs 1", "clip 0.0", "grad sync step", "cap 120 GiB"]


@pytest.fixture(scope="module")
def svg_texts(mixed, tmp_path_factory) -> list[str]:
    """Every text of the figure, in order, from `sweep results plot --out fig.svg` (text kept as text)."""
    import os
    import subprocess
    import sys
    import xml.etree.ElementTree as ET

    tmp = tmp_path_factory.mktemp("svg")
    (tmp / "matplotlibrc").write_text("svg.fonttype: none\n")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(tmp)),
        "MATPLOTLIBRC": str(tmp / "matplotlibrc"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),  # this checkout's sweep, not the one installed
    }
    done = subprocess.run(
        [sys.executable, "-m", "sweep", "results", "plot", str(mixed), "--out", str(tmp / "fig.svg")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return [t.text or "" for t in ET.parse(tmp / "fig.svg").iter("{http://www.w3.org/2000/svg}text")]


def test_plot_names_what_varies_and_puts_the_rest_in_the_title_once(svg_texts):
    parts = [p for t in svg_texts for p in t.split(" · ")]
    for part in TITLE:
        assert parts.count(part) == 1, (part, [t for t in svg_texts if part in t])
    for model, seq in (("gpt2-1.5b", 1024), ("llama-tiny", 4096), ("llama3-8b", 4096)):
        assert f"{model} · seq {seq}" in svg_texts
        assert f"{model} · seq {seq}: largest batch per GPU that fits" in svg_texts
    legend = {
        f"{p} · accum {a} · reduce {r}" for p in ("bf16", "fp8-te-delayed") for a in (1, 8) for r in ("fp32", "bf16")
    }
    # each series named once: left of its row of max-batch bars, which the row's three panels share, beside a line
    # of its style (the TFLOP/s panels' legend); the figure's legend has the failure markers only
    assert {t: svg_texts.count(t) for t in legend} == dict.fromkeys(legend, 1)
    assert svg_texts[-2:] == ["OOM", "error / timeout / unsupported"]
    # no bare value lists ("bf16 · 1024 · 1 · bf16"): each part a precision, a model, a number or a named value
    names = {"bf16", "fp8-te-delayed", *MODELS, "OOM"}
    for text in svg_texts:
        assert all(part in names or " " in part or part.isdigit() for part in text.split(" · ")), text


def test_plot_marks_a_limit_that_was_not_found(mixed, svg_texts):
    res = sweep_results("max-batch", mixed, "-f", "csv")
    assert res.exit_code == 0, res.output
    import csv
    import io

    groups = list(csv.DictReader(io.StringIO(res.stdout)))
    unbounded = [g for g in groups if g["status"] == "ok" and not g["oom_batch"]]
    assert len(unbounded) >= 6
    assert sorted(t for t in svg_texts if t.startswith("≥")) == sorted(f"≥ {g['max_ok_batch']}" for g in unbounded)
    bounded = sorted(f"{g['max_ok_batch']} · OOM at {g['oom_batch']}" for g in groups if g["oom_batch"])
    assert sorted(t for t in svg_texts if " · OOM at " in t) == bounded


def test_plot_out_without_suffix_says_the_file_it_wrote(mixed, tmp_path):
    from PIL import Image

    res = sweep_results("plot", mixed, "--out", tmp_path / "prec")
    assert res.exit_code == 0, res.output
    assert res.stderr.strip() == f"wrote {tmp_path / 'prec.png'}"
    assert [p.name for p in tmp_path.iterdir()] == ["prec.png"]
    with Image.open(tmp_path / "prec.png") as image:  # a PNG any reader decodes, at the figure's size and dpi
        image.load()
        assert image.mode == "RGBA" and image.info["dpi"] == pytest.approx((plotting.DPI, plotting.DPI), abs=0.01)
        width, height = image.size
        assert width > 1000 and 500 < height < width and len(image.getcolors(1 << 24) or ()) > 100


def _drawn(folder: Path, where=()):
    """The figure of ``folder`` drawn as `sweep results plot` draws it, and the renderer that drew it."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from sweep.results import aggregate

    configs = aggregate.configs(folder, where)
    with matplotlib.rc_context(plotting.TEXT):
        fig = plotting.figure(configs, aggregate.max_batch_table(configs))
        renderer = FigureCanvasAgg(fig).get_renderer()
        fig.draw(renderer)
    return configs, fig, renderer


@pytest.mark.parametrize(
    "where", [[], ["model=llama3-8b", "grad_accum=1", "reduce_dtype=fp32"]], ids=["all", "one-model"]
)
def test_plot_text_fits_and_does_not_overprint(mixed, where):
    """Laid out as saved, no layout engine: every text inside the figure; no two tick numbers, bar notes or series
    labels of a panel overlap, and no note runs out of its panel."""
    _, fig, renderer = _drawn(mixed, where)
    assert fig.get_layout_engine() is None
    drawn = fig.get_tightbbox(renderer)  # inches, every artist drawn: a title cut at the edges sticks out
    width, height = fig.get_size_inches()
    assert drawn.x0 >= -0.01 and drawn.y0 >= -0.01 and drawn.x1 <= width + 0.01 and drawn.y1 <= height + 0.01, drawn
    for ax in fig.axes:
        panel = ax.get_window_extent(renderer)
        for group in ([t for t in ax.get_xticklabels() if t.get_text()], list(ax.texts)):
            boxes = sorted((t.get_window_extent(renderer) for t in group), key=lambda b: b.x0)
            for left, right in zip(boxes, boxes[1:]):
                assert left.x1 <= right.x0 or left.y1 <= right.y0 or right.y1 <= left.y0, (ax.get_title(), left, right)
        notes = [t.get_window_extent(renderer) for t in ax.texts if t.get_position()[0] >= 0 and t.get_ha() == "left"]
        assert all(panel.x0 <= box.x0 and box.x1 <= panel.x1 for box in notes), ax.get_title()


def test_plot_draws_every_median_min_max_and_failure(mixed):
    """Each model's TFLOP/s panel: every ok config's median on a line, its min-max bar with a cap at each end (an I
    a point, one LineCollection), and every failed batch as a marker on the zero line."""
    configs, fig, _ = _drawn(mixed)
    rows = configs.to_pylist()
    for ax in fig.axes[::2]:  # a model's TFLOP/s panel, then its max-batch panel
        model = ax.get_title().split(" · ")[0]
        mine = [r for r in rows if r["model"] == model]
        ok = [(r["batch_size"], r["tflops_per_gpu"]) for r in mine if r["tflops_per_gpu"] is not None]
        points = [(x, y) for line in ax.get_lines() for x, y in zip(line.get_xdata(), line.get_ydata())]
        assert sorted(points) == sorted(ok) and len(ax.get_lines()) == 8  # a line per series
        data = [c for c in ax.collections if hasattr(c, "get_segments") and c.get_transform() is ax.transData]
        bars = []
        for segment in data[0].get_segments():  # an I a point: low cap, bar, high cap
            (left, low), (right, low_2), (x, low_3), (x_2, high), (left_2, high_2), (right_2, high_3) = segment
            assert low == low_2 == low_3 and high == high_2 == high_3 and x == x_2
            assert left == left_2 < x < right == right_2
            bars.append((x, low, high))
        assert sorted(bars) == sorted(
            (r["batch_size"], r["tflops_min"], r["tflops_max"]) for r in mine if r["tflops_per_gpu"]
        )
        failed = [o for c in ax.collections if not hasattr(c, "get_segments") for o in c.get_offsets()]
        assert len(failed) == sum(r["tflops_per_gpu"] is None for r in mine) > 0
        assert all(y == 0 for _, y in failed)


def test_a_row_of_panels_shares_one_y_axis_numbered_once(mixed):
    """The three TFLOP/s panels: one y range, numbered on the leftmost only. The three max-batch panels: a row per
    series, named left of the leftmost only beside a line of the series' own style, a bar and a note each."""
    _, fig, _ = _drawn(mixed)
    perf, bars = fig.axes[::2], fig.axes[1::2]
    assert len({ax.get_ylim() for ax in perf}) == 1 and len({ax.get_ylim() for ax in bars}) == 1
    assert [ax.yaxis.get_visible() for ax in perf] == [True, False, False]
    assert perf[0].get_ylabel() == "TFLOP/s/GPU (median)"
    labels = [t.get_text() for t in bars[0].texts if t.get_ha() == "right"]
    assert len(labels) == 8 and labels == sorted(labels)
    look = lambda line: (line.get_color(), line.get_linestyle(), line.get_marker())  # noqa: E731
    handles = [look(line) for line in bars[0].get_lines()]
    assert len(set(handles)) == len(labels) and set(handles) == {look(line) for line in perf[0].get_lines()}
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["OOM", "error / timeout / unsupported"]
    from matplotlib.colors import to_rgba

    row_colour = {p.get_y() + p.get_height() / 2: p.get_facecolor() for p in bars[0].patches}
    assert all(to_rgba(line.get_color()) == row_colour[line.get_ydata()[0]] for line in bars[0].get_lines())
    for ax in bars:
        assert not ax.xaxis.get_visible() and not ax.yaxis.get_visible()
        assert len(ax.patches) == len(labels) == len([t for t in ax.texts if t.get_ha() == "left"])
        assert sorted(p.get_y() + p.get_height() / 2 for p in ax.patches) == list(range(len(labels)))
    assert all(t.get_ha() == "left" for ax in bars[1:] for t in ax.texts) and not any(ax.get_lines() for ax in bars[1:])


@pytest.mark.parametrize("parts", [1, 3])
def test_the_png_writer_keeps_every_pixel(tmp_path, parts):
    import numpy as np
    from PIL import Image

    from sweep.results.plot_png import write_png

    pixels = np.random.default_rng(0).integers(0, 256, (70, 50, 4), dtype=np.uint8)
    write_png(tmp_path / "p.png", pixels, 100, "test", parts)
    with Image.open(tmp_path / "p.png") as image:
        assert np.array_equal(np.asarray(image), pixels) and image.info["Software"] == "test"


def test_plot_refuses_more_series_than_max_series_and_says_what_narrows_them(mixed, tmp_path):
    """The mixed folder has 8 series a model (precision x accum x reduce): over --max-series 4 the command says
    so in one line (exit 2, nothing written) and names a --where that narrows it; that --where, or a larger
    --max-series, draws."""
    res = sweep_results("plot", mixed, "--out", tmp_path / "fig.png", "--max-series", "4")
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == (
        "error: plot: 8 series in the gpt2-1.5b panels, more than --max-series 4 (values per key: precision 2, "
        "grad_accum 2, reduce_dtype 2): narrow them with --where, e.g. -w grad_accum=1, or raise --max-series "
        "(0: no limit)"
    )
    assert not (tmp_path / "fig.png").exists()
    for options in (("--max-series", "4", "-w", "grad_accum=1"), ("--max-series", "8"), ("--max-series", "0")):
        res = sweep_results("plot", mixed, "--out", tmp_path / "fig.png", *options)
        assert res.exit_code == 0, (options, res.output)
