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
    }
    sweep = Path(sys.executable).with_name("sweep")
    done = subprocess.run(
        [str(sweep), "results", "plot", str(mixed), "--out", str(tmp / "fig.svg")],
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
        assert f"{model} · seq {seq}" in svg_texts and f"{model} · seq {seq}: largest batch that fits" in svg_texts
    legend = {
        f"{p} · accum {a} · reduce {r}" for p in ("bf16", "fp8-te-delayed") for a in (1, 8) for r in ("fp32", "bf16")
    }
    assert legend <= set(svg_texts)
    # bar labels: one named value per line, the same names
    assert svg_texts.count("accum 8") == svg_texts.count("reduce bf16") == 3 * 4
    # no bare value lists ("bf16 · 1024 · 1 · bf16"): each part a precision, a model or a named value
    names = {"bf16", "fp8-te-delayed", *MODELS, "OOM"}
    for text in svg_texts:
        if not text.isdigit():  # tick numbers
            assert all(part in names or " " in part for part in text.split(" · ")), text


def test_plot_marks_a_limit_that_was_not_found(mixed, svg_texts):
    res = sweep_results("max-batch", mixed, "-f", "csv")
    assert res.exit_code == 0, res.output
    import csv
    import io

    groups = list(csv.DictReader(io.StringIO(res.stdout)))
    unbounded = [g for g in groups if g["status"] == "ok" and not g["oom_batch"]]
    assert len(unbounded) >= 6
    assert [t for t in svg_texts if t.startswith("≥")] == [f"≥ {g['max_ok_batch']}" for g in unbounded]
    bounded = [g for g in groups if g["oom_batch"]]
    assert sum(t.startswith("OOM at ") for t in svg_texts) == len(bounded)


def test_plot_out_without_suffix_says_the_file_it_wrote(mixed, tmp_path):
    res = sweep_results("plot", mixed, "--out", tmp_path / "prec")
    assert res.exit_code == 0, res.output
    assert res.stderr.strip() == f"wrote {tmp_path / 'prec.png'}"
    assert [p.name for p in tmp_path.iterdir()] == ["prec.png"]
    assert (tmp_path / "prec.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "where", [[], ["model=llama3-8b", "grad_accum=1", "reduce_dtype=fp32"]], ids=["all", "one-model"]
)
def test_plot_text_fits_and_does_not_overprint(mixed, where):
    """Laid out as saved: every text inside the figure; no two tick numbers or bar labels of a panel overlap."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from sweep.results import aggregate

    configs = aggregate.configs(mixed, where)
    fig = plotting.figure(configs, aggregate.max_batch_table(configs))
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    drawn = fig.get_tightbbox(renderer)  # inches, every artist drawn: a title cut at the edges sticks out
    width, height = fig.get_size_inches()
    assert drawn.x0 >= -0.01 and drawn.y0 >= -0.01 and drawn.x1 <= width + 0.01 and drawn.y1 <= height + 0.01, drawn
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for group in ([t for t in ax.get_xticklabels() if t.get_text()], [c for c in ax.texts]):
            boxes = sorted((t.get_window_extent(renderer) for t in group), key=lambda b: b.x0)
            for left, right in zip(boxes, boxes[1:]):
                assert left.x1 <= right.x0 or left.y1 <= right.y0 or right.y1 <= left.y0, (ax.get_title(), left, right)
