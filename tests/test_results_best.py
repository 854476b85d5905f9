"""Each stack at its best (issue 16): `sweep results compare --best` sets each precision's fastest configuration,
whatever its batch and options, against the baseline precision's fastest; `sweep results verdicts` prints what
the searches saved, a fastest search's verdict with its speedup, an aborted one with its reason.

The rows are written with ``sweep.record.store.write_row`` and the verdicts with ``store.write_verdicts``, as
`sweep run` writes them. Numbers from the issue's 2×H200 Llama3-8B measurements, T 4096.
"""

from __future__ import annotations

import csv
import io

from conftest import invoke

from sweep.record.schema import TRAINING_DEFAULTS
from sweep.record.store import write_row, write_verdicts

BASE = {
    "run_id": "r1",
    "attempt": 1,
    "cluster": "h200",
    "accelerator": "h200",
    "world_size": 2,
    "model": "llama3-8b",
    "compile": "none",
    "ac": "none",
    "seq_len": 4096,
    **TRAINING_DEFAULTS,
}
FAST = {"grad_accum": 8, "reduce_dtype": "bf16", "grad_sync": "step"}
# (trial_id, precision, batch, options, status, TFLOP/s)
ROWS = [
    ("b1", "bf16", 1, {}, "ok", 501.0),
    ("b2", "bf16", 2, {}, "ok", 559.1),
    ("b2-fast", "bf16", 2, FAST, "ok", 627.7),  # bf16's best: batch 2 with options
    ("b3", "bf16", 3, {}, "oom", None),
    ("t2", "fp8-te", 2, {}, "ok", 782.9),
    ("t3-fast", "fp8-te", 3, {**FAST, "fp8_lm_head": True}, "ok", 897.2),  # fp8-te's best: batch 3
    ("t3-fast-again", "fp8-te", 3, {**FAST, "fp8_lm_head": True}, "ok", 891.0),  # a repeat: the median counts
    # an OOM attempt never counts, whatever it measured before it ran out
    ("t4", "fp8-te", 4, FAST, "oom", 990.0),
    ("a2", "fp8-torchao", 2, {}, "oom", None),  # nothing fits
]


def _write(out, rows=ROWS, **extra) -> None:
    for trial_id, precision, batch, options, status, tflops in rows:
        write_row(
            out,
            {
                **BASE,
                **extra,
                "trial_id": trial_id,
                "precision": precision,
                "batch_size": batch,
                **options,
                "status": status,
                "tflops_per_gpu": tflops,
                "loss_last": 7.5 if status == "ok" else None,
            },
        )


def _invoke(*args) -> str:
    res = invoke("results", *args)
    assert res.exit_code == 0, res.output
    return res.stdout


def _md(text: str) -> dict[str, dict[str, str]]:
    """A markdown table as {precision: {header: cell}}."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return {
        r["precision"]: r
        for r in (dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:])
    }


def test_best_sets_each_precisions_fastest_config_against_the_baselines(tmp_path):
    _write(tmp_path)
    got = _md(_invoke("compare", tmp_path, "--best", "-f", "md"))
    assert set(got) == {"fp8-te", "fp8-torchao"}
    te = got["fp8-te"]
    median = (897.2 + 891.0) / 2
    assert te["TFLOP/s/GPU"] == "894.1"
    assert te["best config"] == "batch 3 · accum 8 · fp8 head on · reduce bf16 · grad sync step"
    assert te["bf16 best config"] == "batch 2 · accum 8 · reduce bf16 · grad sync step"  # another batch than fp8-te's
    assert te["bf16 TFLOP/s/GPU"] == "627.7"
    assert te["vs bf16"] == f"{median / 627.7:.3g}× (+{(median / 627.7 - 1) * 100:.3g} %)" == "1.42× (+42.4 %)"
    assert te["from"] == "fastest ok"
    assert got["fp8-torchao"]["TFLOP/s/GPU"] == "oom" and got["fp8-torchao"]["vs bf16"] == "oom"

    table = {
        r["precision"]: r for r in csv.DictReader(io.StringIO(_invoke("compare", tmp_path, "--best", "-f", "csv")))
    }
    assert float(table["fp8-te"]["ratio"]) == median / 627.7
    assert (table["fp8-te"]["batch_size"], table["fp8-te"]["base_batch_size"]) == ("3", "2")
    # without --best, compare pairs equal configs: batch 3 with options has no bf16 twin
    plain = csv.DictReader(io.StringIO(_invoke("compare", tmp_path, "-f", "csv")))
    assert {
        (r["batch_size"], r["grad_accum"], r["ratio"])
        for r in plain
        if r["precision"] == "fp8-te" and r["status"] == "ok"
    } == {("2", "1", str(782.9 / 559.1)), ("3", "8", "")}


def test_best_prefers_a_fastest_searchs_measured_best_to_a_faster_short_probe(tmp_path):
    """A fastest search's short probe of batch 4 read faster than its fully measured best (batch 3): the verdict's
    best_trial_id is the answer. In a cluster the search did not run on, the fastest ok config still is."""
    probe = ("t4-probe", "fp8-te", 4, FAST, "ok", 910.0)
    _write(tmp_path, [*ROWS, probe])
    _write(tmp_path, [*ROWS, probe], cluster="mi300x", accelerator="mi300x", run_id="r2")
    write_verdicts(
        tmp_path,
        "r1",
        [
            {
                "kind": "fastest",
                "cluster": "h200",
                "model": "llama3-8b",
                "precision": "fp8-te",
                "seq_len": 4096,
                "gpus": 2,
                "best_trial_id": "t3-fast",
                "aborted": None,
            }
        ],
    )
    got = {
        (r["cluster"], r["precision"]): r
        for r in csv.DictReader(io.StringIO(_invoke("compare", tmp_path, "--best", "-f", "csv")))
    }
    assert (got["h200", "fp8-te"]["batch_size"], got["h200", "fp8-te"]["tuned"]) == ("3", "True")
    assert float(got["h200", "fp8-te"]["tflops_per_gpu"]) == 897.2  # the finalist's row, not its short probes
    assert (got["mi300x", "fp8-te"]["batch_size"], got["mi300x", "fp8-te"]["tuned"]) == ("4", "False")
    assert "search's best" in _invoke("compare", tmp_path, "--best", "--where", "cluster=h200")


def test_best_baseline_and_by_errors(tmp_path):
    _write(tmp_path)
    res = invoke("results", "compare", tmp_path, "--best", "--baseline", "fp16")
    assert res.exit_code == 2 and "no precision of that name" in res.stderr and "Traceback" not in res.output
    res = invoke("results", "compare", tmp_path, "--best", "--by", "cluster", "--baseline", "h200")
    assert res.exit_code == 2 and "--best compares precisions" in res.stderr


def _fastest(precision: str, **fields) -> dict:
    return {
        "kind": "fastest",
        "search_id": f"s-{precision}",
        "model": "llama3-8b",
        "precision": precision,
        "seq_len": 4096,
        "gpus": 2,
        "cluster": "h200",
        "allowed": ["batch_size", "grad_accum", "reduce_dtype"],
        "numerics_allowed": ["reduce_dtype"],
        "global_batch_tokens": None,
        "budget": 40,
        "best": {
            "batch_size": 3,
            "ac": "none",
            "compile": "regional",
            "grad_accum": 8,
            "reduce_dtype": "bf16",
            "grad_sync": "micro_batch",
            "fp8_lm_head": False,
        },
        "baseline": {"batch_size": 2, "ac": "none", "compile": "regional", **TRAINING_DEFAULTS},
        "tflops_at_best": 873.3,
        "baseline_tflops": 771.9,
        "speedup": 873.3 / 771.9,
        "best_trial_id": "x",
        "probes": 23,
        "search_wall_s": 512.0,
        "cost_vs_one_trial": 7.94,
        "aborted": None,
        "profile": None,
        **fields,
    }


def test_verdicts_prints_saved_searches_with_speedup_aborted_reason_and_profile(tmp_path):
    write_verdicts(
        tmp_path,
        "r1",
        [
            _fastest(
                "fp8-torchao",
                profile={
                    "gemm_pct": 61.2,
                    "attention_pct": 14.04,
                    "comm_exposed_pct": 8.1,
                    "optimizer_pct": 3.0,
                    "other_pct": 13.66,
                    "trace_file": "_trace/r1/x.json",
                },
            ),
            _fastest(
                "fp8-te",
                best=None,
                tflops_at_best=None,
                speedup=None,
                baseline_tflops=None,
                cost_vs_one_trial=None,
                probes=4,
                aborted="nothing fits",
            ),
            {
                "kind": "max_batch",
                "search_id": "m1",
                "model": "llama3-8b",
                "precision": "bf16",
                "compile": "none",
                "seq_len": 4096,
                "gpus": 2,
                "options": "",
                "max_batch": 2,
                "first_failing_batch": 3,
                "fastest_batch": 2,
                "tflops_at_fastest": 559.1,
                "alloc_retries_at_max": 0,
                "alloc_retries_at_fastest": 0,
                "allocator": "",
                "probes": 3,
                "search_wall_s": 90.0,
                "cost_vs_one_trial": 3.0,
                "aborted": None,
            },
        ],
    )
    out = _invoke("verdicts", tmp_path)
    lines = {line.split("│")[2].strip(): line for line in out.splitlines() if line.count("│") > 10}
    torchao = [c.strip() for c in lines["fp8-torchao"].split("│")]
    # the best: only what it changed from the baseline (not compile), and its batch; speedup as compare prints ratios
    assert "batch 3 · accum 8 · reduce bf16" in torchao and "batch 2 · compile regional" in torchao
    assert "1.13× (+13.1 %)" in torchao and "23 / 40" in torchao and "7.9x" in torchao and "reduce_dtype" in torchao
    assert "aborted: nothing fits" in lines["fp8-te"] and "4 / 40" in lines["fp8-te"]
    assert (
        "llama3-8b fp8-torchao T4096 ×2, the best's step: GEMM 61.2 %, attention 14.0 %, exposed comm 8.10 %, "
        "optimizer 3.00 %, other 13.7 % · trace _trace/r1/x.json"
    ) in out
    assert "max-batch verdicts" in out and "559.1" in out


def test_verdicts_without_any_saved_search_is_one_line(tmp_path):
    _write(tmp_path)
    res = invoke("results", "verdicts", tmp_path)
    assert res.exit_code == 2 and "no saved search verdicts" in res.stderr and "Traceback" not in res.output
