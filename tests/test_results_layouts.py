"""`sweep results max-batch` and `sweep results plot` per layout (issue 33 item 5): rows of a max-batch search at
tp 1 and at tp 2 on the same two ranks, as `sweep run` writes them (``sweep.record.store.write_row``), stay two groups,
each with its own limit, and two series of the figure named by their layout. The rows' numbers are the shape of a
real run: `sweep max-batch --tp 1 --tp 2` of llama-tiny fp32 at seq 256 on 2 CPU ranks under a 128 MiB cap found
25 and 33 (tp 2 splits each rank's activations)."""

from __future__ import annotations

import csv
import datetime as dt
import io
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import rows_folder

from sweep.record.schema import TRAINING_DEFAULTS

LIMITS = {1: 25, 2: 33}  # tp -> the largest batch that fits
PROBES = (1, 2, 4, 8, 16, 24, 25, 26, 32, 33, 34, 40)


def layout_rows() -> list[dict]:
    rows, t0 = [], dt.datetime(2026, 12, 1, 13, 0, tzinfo=dt.timezone.utc)
    for tp, limit in LIMITS.items():
        for batch in PROBES:
            n = len(rows) + 1
            ok = batch <= limit
            row = {
                "run_id": "layouts",
                "trial_id": f"t{n:04d}",
                "attempt": 1,
                "grid_name": "layouts",
                "cluster": "local",
                "accelerator": "cpu",
                "cost_per_gpu_hour": None,
                "world_size": 2,
                "nodes": 1,
                "model": "llama-tiny",
                "precision": "fp32",
                "compile": "none",
                "ac": "none",
                "batch_size": batch,
                "seq_len": 256,
                "warmup_steps": 0,
                "measure_steps": 1,
                **TRAINING_DEFAULTS,
                "tp": tp,
                "dp_shard": 2 // tp,
                "memory_cap_gib": 0.125,
                "status": "ok" if ok else "oom",
                "error": None if ok else "rank 1: RuntimeError: [enforce fail at alloc_cpu.cpp:127]",
                "started_at": t0 + dt.timedelta(minutes=n),
                "finished_at": t0 + dt.timedelta(minutes=n, seconds=9),
            }
            if ok:
                tf = 0.01 * batch / (batch + 4) / tp
                row.update(
                    tflops_per_gpu=tf,
                    mfu=None,
                    tokens_per_s_per_gpu=tf * 1e5,
                    step_time_s=0.5,
                    peak_mem_gib=0.004 * batch / tp,
                )
            rows.append(row)
    return rows


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    return rows_folder(tmp_path_factory, "layouts", layout_rows())


def test_results_max_batch_finds_each_layouts_limit_apart(cli, results):
    res = cli("results", "max-batch", results, "-f", "csv")
    assert res.exit_code == 0, res.output
    groups = list(csv.DictReader(io.StringIO(res.stdout)))
    assert {int(g["tp"]): (int(g["max_ok_batch"]), int(g["oom_batch"])) for g in groups} == {
        tp: (limit, limit + 1) for tp, limit in LIMITS.items()
    }


def test_results_plot_draws_one_series_per_layout(results, tmp_path):
    (tmp_path / "matplotlibrc").write_text("svg.fonttype: none\n")  # text kept as text
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "MATPLOTLIBRC": str(tmp_path / "matplotlibrc"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }  # this checkout's sweep
    done = subprocess.run(
        [sys.executable, "-m", "sweep", "results", "plot", str(results), "--out", str(tmp_path / "fig.svg")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    texts = [t.text or "" for t in ET.parse(tmp_path / "fig.svg").iter("{http://www.w3.org/2000/svg}text")]
    assert {"fp32 · tp 1", "fp32 · tp 2"} <= set(texts), texts
    # each layout's bar is labelled with its limit and the first batch that ran out of memory
    assert {f"{limit} · OOM at {limit + 1}" for limit in LIMITS.values()} <= set(texts), texts
