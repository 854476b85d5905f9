"""`sweep tune` and a `search: fastest` grid through the real CLI on a real local Ray: issue 16's CPU acceptance.

Tiny llama models on 2 gloo ranks, as a user runs them; the rows are read back with pyarrow.dataset and the
verdicts from <output>/_search/*.json. The search itself (stages, pruning, budget caps) is tested against a
simulated runner in tests/test_tune.py; here the claims are the ones a user can check in what was written:
one verdict per precision within its budget, the best is the fastest full measurement, the baseline was
measured in the same search, options that change numerics move only when named, every probe holds the
global batch, the best alone carries a trace (one profiled trial after the finals, none of them profiled), and a
tune that cannot work stops before anything runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import yaml
from conftest import invoke

from sweep.search.fastest.space import SHORT, probe_steps
from sweep.spec.grid import TUNABLE

pytestmark = pytest.mark.integration

FINAL = (1, 4)  # the finals' steps (warm-up, measured): neither the short probes' (2, 3) nor the rung's (3, 9)
COMMON = (
    "--gpus",
    2,
    "--seq-len",
    32,
    "--compile",
    "none",
    "--warmup",
    FINAL[0],
    "--measure",
    FINAL[1],
    "--cluster",
    "local",
    "--no-progress",
)
FIXED_NUMERICS = {"reduce_dtype": "fp32", "grad_sync": "micro_batch", "fp8_lm_head": False}
SHARES = ("gemm_pct", "attention_pct", "comm_exposed_pct", "optimizer_pct", "other_pct")


def sweep(*args):
    """The real CLI, in-process (it reuses the session's Ray), at 200 columns."""
    return invoke(*args, env={"COLUMNS": "200"})


def verdicts(out: Path) -> list[dict]:
    (path,) = (out / "_search").glob("*.json")
    return json.loads(path.read_text())


def rows(out: Path) -> list[dict]:
    return ds.dataset(out, format="parquet").to_table().to_pylist()


def config(row_or_config: dict) -> dict:
    return {k: row_or_config[k] for k in TUNABLE}


def one_line_error(result, *words: str) -> None:
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and "Traceback" not in result.output, result.output
    for word in words:
        assert word in line, line


# -- `sweep tune` over two precisions ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tuned(ray_session, tmp_path_factory):
    """bf16 and torchao FP8 (emulated on CPU) tuned over accumulation and checkpointing at batch 4, the
    default numerics: a llama model, whose untied head an FP8 recipe could run in FP8, and 2 ranks with
    more than one micro-batch, where gradients could be reduced in bf16 or once per step."""
    out = tmp_path_factory.mktemp("tune") / "out"
    result = sweep(
        "tune",
        "--model",
        "llama-tiny",
        "--precision",
        "bf16",
        "--precision",
        "fp8-torchao-tensorwise",
        "--vary",
        "grad_accum",
        "--vary",
        "ac",
        "--start",
        4,
        "--budget",
        7,
        *COMMON,
        "--output",
        out,
    )
    assert result.exit_code == 0, result.output
    return {
        "out": out,
        "output": result.output,
        "verdicts": {v["precision"]: v for v in verdicts(out)},
        "rows": rows(out),
    }


def test_tune_gives_one_fastest_verdict_per_precision_within_its_budget(tuned):
    got = tuned["verdicts"]
    assert set(got) == {"bf16", "fp8-torchao-tensorwise"}
    assert len({v["search_id"] for v in got.values()}) == 2
    for v in got.values():
        assert v["kind"] == "fastest" and v["aborted"] is None, v
        assert (v["model"], v["seq_len"], v["gpus"], v["cluster"], v["budget"]) == ("llama-tiny", 32, 2, "local", 7)
        probes = [r for r in tuned["rows"] if r["search_id"] == v["search_id"]]
        assert {r["precision"] for r in probes} == {v["precision"]}
        assert len(probes) == v["probes"] <= v["budget"]
        assert v["tried"] == len({tuple(config(r).values()) for r in probes})
    # every row belongs to one of the searches
    assert {r["search_id"] for r in tuned["rows"]} == {v["search_id"] for v in got.values()}
    assert "fastest configuration per model × precision" in tuned["output"]


def test_the_best_is_the_fastest_full_measurement_against_a_baseline_of_the_same_search(tuned):
    for v in tuned["verdicts"].values():
        probes = [r for r in tuned["rows"] if r["search_id"] == v["search_id"]]
        finals = [r for r in probes if (r["warmup_steps"], r["measure_steps"]) == FINAL and r["status"] == "ok"]
        short = [r for r in probes if (r["warmup_steps"], r["measure_steps"]) != FINAL]
        assert finals and short, [(r["warmup_steps"], r["measure_steps"]) for r in probes]
        fastest = max(finals, key=lambda r: r["tflops_per_gpu"])
        assert v["best_trial_id"] == fastest["trial_id"]
        assert v["tflops_at_best"] == fastest["tflops_per_gpu"] and v["best"] == config(fastest)
        (base,) = [r for r in finals if r["trial_id"] == v["baseline_trial_id"]]
        # the baseline: the grid's own options (one micro-batch, no checkpointing) at the seed batch
        assert (
            v["baseline"]
            == config(base)
            == {**config(base), "batch_size": 4, "ac": "none", "grad_accum": 1, **FIXED_NUMERICS}
        )
        assert v["baseline_tflops"] == base["tflops_per_gpu"]
        assert v["speedup"] == pytest.approx(fastest["tflops_per_gpu"] / base["tflops_per_gpu"])


def test_numerics_changing_options_stay_fixed_unless_named(tuned):
    for v in tuned["verdicts"].values():
        assert v["allowed"] == ["grad_accum", "ac"] and v["numerics_allowed"] == []
    probes = tuned["rows"]
    for r in probes:
        assert {k: r[k] for k in FIXED_NUMERICS} == FIXED_NUMERICS, r
    assert {r["grad_accum"] for r in probes} > {1}  # probes where grad_sync: step would have changed something


def test_the_best_alone_is_profiled_after_the_finals_and_the_verdict_cites_its_trace(tuned):
    out = tuned["out"]
    for v in tuned["verdicts"].values():
        probes = [r for r in tuned["rows"] if r["search_id"] == v["search_id"]]
        # one trace: the best's profile trial, at a short probe's steps; no full measurement is profiled
        (traced,) = [r for r in probes if r["trace_file"] is not None]
        assert config(traced) == v["best"] and traced["status"] == "ok"
        assert (traced["warmup_steps"], traced["measure_steps"]) == probe_steps(SHORT, traced["grad_accum"])
        assert (out / traced["trace_file"]).is_file(), traced["trace_file"]
        assert sum(traced[f"profile_{k}"] for k in SHARES) == pytest.approx(100)
        assert v["profile"] == {**{k: traced[f"profile_{k}"] for k in SHARES}, "trace_file": traced["trace_file"]}
        # the best's figure is its full measurement's, not the profile trial's short reading
        (best,) = [r for r in probes if r["trial_id"] == v["best_trial_id"]]
        assert (best["warmup_steps"], best["measure_steps"]) == FINAL and best["trace_file"] is None
        assert v["tflops_at_best"] == best["tflops_per_gpu"] and traced["trial_id"] != best["trial_id"]
        # the search's last trial: it started once every other attempt of its search had ended
        assert traced["started_at"] >= max(r["finished_at"] for r in probes if r is not traced)


def test_results_verdicts_and_compare_best_read_the_tune(tuned):
    out, got = tuned["out"], tuned["verdicts"]
    shown = sweep("results", "verdicts", out)
    assert shown.exit_code == 0, shown.output
    assert "fastest configuration" in shown.stdout and "fp8-torchao-tensorwise" in shown.stdout
    compared = sweep("results", "compare", out, "--baseline", "bf16", "--best", "--format", "csv")
    assert compared.exit_code == 0, compared.output
    import csv
    import io

    (line,) = csv.DictReader(io.StringIO(compared.stdout))
    fp8, bf16 = got["fp8-torchao-tensorwise"], got["bf16"]
    assert line["precision"] == "fp8-torchao-tensorwise" and line["tuned"] == line["base_tuned"] == "True"
    assert float(line["ratio"]) == pytest.approx(fp8["tflops_at_best"] / bf16["tflops_at_best"])
    assert (int(line["grad_accum"]), line["ac"]) == (fp8["best"]["grad_accum"], fp8["best"]["ac"])


# -- numerics-changing options vary when named --------------------------------------------------------------


def test_a_named_numerics_option_is_probed_and_the_verdict_says_it_was_allowed(ray_session, tmp_path):
    out = tmp_path / "out"
    # budget 5: room for two short probes (fp32, the baseline, and bf16), the finals and the best's profile
    result = sweep(
        "tune",
        "--model",
        "llama-tiny",
        "--precision",
        "bf16",
        "--vary",
        "reduce_dtype",
        "--start",
        4,
        "--budget",
        5,
        *COMMON,
        "--output",
        out,
    )
    assert result.exit_code == 0, result.output
    (v,) = verdicts(out)
    assert v["allowed"] == ["reduce_dtype"] and v["numerics_allowed"] == ["reduce_dtype"]
    probes = rows(out)
    assert {r["reduce_dtype"] for r in probes} == {"fp32", "bf16"}
    assert len(probes) == v["probes"] <= 5
    assert v["baseline"]["reduce_dtype"] == "fp32"  # the grid's own value, whatever the best is


# -- a grid with search: fastest and a global batch ---------------------------------------------------------

GRID = {
    "models": ["llama-tiny"],
    "precisions": ["bf16"],
    "batch_sizes": [1],
    "compile": "none",
    "seq_len": 32,
    "gpus": 2,
    "steps": {"warmup": FINAL[0], "measure": FINAL[1]},
    "search": "fastest",
}
G = 8 * 2 * 32  # 8 samples per rank per step: batch x accumulation = 1x8, 2x4, 4x2 or 8x1


def write(tmp_path: Path, tune: dict) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({**GRID, "tune": tune}, sort_keys=False))
    return path


def test_every_probe_of_a_grid_search_holds_its_global_batch(ray_session, tmp_path):
    grid = write(tmp_path, {"vary": ["batch_size", "grad_accum"], "budget": 8, "global_batch_tokens": G})
    planned = sweep("plan", grid, "--cluster", "local")
    assert planned.exit_code == 0, planned.output
    title = "".join(planned.stdout.split())  # the table's title wraps at its (narrow) width, mid-word too
    assert "1trialonlocal(cpu,2ranks)—fastest-configurationsearch" in title and "max-batch" not in title
    out = tmp_path / "out"
    result = sweep("run", grid, "--cluster", "local", "--output", out, "--no-progress")
    assert result.exit_code == 0, result.output
    (v,) = verdicts(out)
    assert v["kind"] == "fastest" and v["global_batch_tokens"] == G and v["aborted"] is None, v
    probes = rows(out)
    assert len(probes) == v["probes"] <= 8
    for r in probes:
        assert r["batch_size"] * r["grad_accum"] * r["world_size"] * r["seq_len"] == G, r
    assert len({r["batch_size"] for r in probes}) >= 3  # the search moved along the splits
    assert v["best"]["batch_size"] * v["best"]["grad_accum"] * 2 * 32 == G


def test_a_global_batch_no_split_holds_stops_before_anything_runs(ray_session, tmp_path):
    grid = write(tmp_path, {"vary": ["batch_size", "grad_accum"], "budget": 8, "global_batch_tokens": G + 32})
    one_line_error(sweep("plan", grid, "--cluster", "local"), "global_batch_tokens", str(G + 32))
    out = tmp_path / "out"
    one_line_error(
        sweep("run", grid, "--cluster", "local", "--output", out, "--no-progress"), "global_batch_tokens", str(G + 32)
    )
    assert not out.exists()


def test_a_budget_too_small_for_a_baseline_and_a_finalist_stops_before_anything_runs(ray_session, tmp_path):
    out = tmp_path / "out"
    result = sweep("tune", "--model", "llama-tiny", "--precision", "bf16", "--budget", 2, *COMMON, "--output", out)
    one_line_error(result, "tune.budget", "2")
    assert not out.exists()


def test_a_search_skips_what_its_max_cost_cannot_pay_for_and_says_so(ray_session, tmp_path):
    # max_cost 2 one-trial costs cannot pay for the two finals it keeps room for (the best's and the baseline's, at
    # their most steps) and the profile: once the fit has measured what a trial costs, every exploring probe is
    # predicted past it and skipped
    grid = write(tmp_path, {"vary": ["batch_size", "grad_accum"], "budget": 12, "max_cost": 2})
    out = tmp_path / "out"
    result = sweep("run", grid, "--cluster", "local", "--output", out, "--no-progress")
    assert result.exit_code == 0, result.output
    (v,) = verdicts(out)
    assert v["max_cost"] == 2 and v["aborted"] is None and v["skipped_for_cost"], v
    probes = rows(out)
    assert {r["grad_accum"] for r in probes} == {1}  # no accumulation probed
    assert {(c["grad_accum"] > 1) for c in v["skipped_for_cost"]} == {True}
    assert "not probed (predicted past max_cost 2x one trial): batch" in " ".join(result.stdout.split())


def test_a_max_cost_of_one_trial_or_less_stops_before_anything_runs(ray_session, tmp_path):
    uncapped = sweep(
        "plan", write(tmp_path, {"vary": ["batch_size"], "budget": 8, "max_cost": None}), "--cluster", "local"
    )
    assert uncapped.exit_code == 0, uncapped.output  # null: no cap
    grid = write(tmp_path, {"vary": ["batch_size"], "budget": 8, "max_cost": 1})
    one_line_error(sweep("plan", grid, "--cluster", "local"), "tune.max_cost", "greater than 1")
    out = tmp_path / "out"
    one_line_error(
        sweep("tune", "--model", "llama-tiny", "--precision", "bf16", "--max-cost", 0.5, *COMMON, "--output", out),
        "tune.max_cost",
        "greater than 1",
    )
    assert not out.exists()


def test_a_resumed_tune_runs_nothing_again_and_gives_the_same_verdicts(tuned, tmp_path):
    # a search cut short (a job's time limit) goes on with --resume: here nothing is missing, so nothing runs
    import shutil

    out = tmp_path / "out"
    shutil.copytree(tuned["out"], out)
    result = sweep(
        "tune",
        "--model",
        "llama-tiny",
        "--precision",
        "bf16",
        "--precision",
        "fp8-torchao-tensorwise",
        "--vary",
        "grad_accum",
        "--vary",
        "ac",
        "--start",
        4,
        "--budget",
        7,
        *COMMON,
        "--output",
        out,
        "--resume",
    )
    assert result.exit_code == 0, result.output
    assert len(rows(out)) == len(tuned["rows"])  # no attempt run twice
    # run ids start with their UTC start time: the resumed run's verdicts sort last
    _, resumed = [json.loads(p.read_text()) for p in sorted((out / "_search").glob("*.json"))]
    assert len(resumed) == 2
    for v in resumed:
        b = tuned["verdicts"][v["precision"]]
        assert (v["best_trial_id"], v["baseline_trial_id"], v["probes"]) == (
            b["best_trial_id"],
            b["baseline_trial_id"],
            b["probes"],
        )
    # the folder now holds each search's verdict twice (the first run's and the resumed one's): shown once each
    shown = sweep("results", "verdicts", out)
    assert shown.exit_code == 0, shown.output
    table_rows = [line for line in shown.stdout.splitlines() if line.startswith("│") and "llama-tiny" in line]
    assert len(table_rows) == 2, shown.stdout
