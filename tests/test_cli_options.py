"""Every grid key and CLI option the README documents, run through the real CLI on a real local Ray.

Each test runs `sweep run` / `sweep plan` / `sweep max-batch` the way a user does (a grid file, the
README's flags) with tiny models on 2 CPU ranks, then reads the Parquet rows with pyarrow.dataset and
checks that the option reached them: a column value, and where the row could carry the value without the
trainer using it, a measured effect (a different loss, a lower peak memory, a real out-of-memory row
under RLIMIT_DATA, a compile time). `test_the_table_covers_every_readme_key_and_option` keeps COVERAGE
in step with the README: a key or option added there without a test here fails it.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import yaml
from conftest import invoke

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]

# the test that runs the README's --start, --warmup and --measure of `sweep tune`
_BEST_IS_FASTEST = (
    "test_tune_cli.py::test_the_best_is_the_fastest_full_measurement_against_a_baseline_of_the_same_search"
)

# What the README shows → the test that runs it through the CLI ("module.py::test" when another module has it).
COVERAGE = {
    # the "## Grids" yaml block
    "name": "test_readme_grid_runs_every_precision_and_stores_its_name",
    "models": "test_readme_grid_runs_every_precision_and_stores_its_name",
    "precisions": "test_readme_grid_runs_every_precision_and_stores_its_name",
    "batch_sizes": "test_readme_grid_runs_every_precision_and_stores_its_name",
    "compile": "test_compile_full_is_compiled_and_compare_by_compile",
    "seq_len": "test_readme_grid_runs_every_precision_and_stores_its_name",
    "gpus": "test_readme_grid_runs_every_precision_and_stores_its_name",
    "ac": "test_activation_checkpointing_recomputes_blocks_and_compare_by_ac",
    "grad_accum": "test_integration.py::test_gradient_accumulation_counts_every_micro_batch",
    "grad_clip": "test_grad_clip_changes_the_updates",
    "fp8_lm_head": "test_fp8_recipe_trains_and_fp8_lm_head_changes_the_head",
    "reduce_dtype": "test_reduce_dtype_bf16_changes_the_reduction",
    "grad_sync": "test_integration.py::test_gradient_accumulation_counts_every_micro_batch",
    "dynamic_batch": "test_compile_reuse.py::test_a_warm_group_compiles_once_per_graph_for_every_batch_size",
    "attention": "test_kernel_options_cli.py::test_a_grid_of_kernel_options_runs_and_records_them",
    "compile_mode": "test_kernel_options_cli.py::test_a_grid_of_kernel_options_runs_and_records_them",
    "fp8_attention": "test_kernel_options.py::test_a_grid_accepts_every_value_of_each_kernel_option",
    "fp8_pow2_scales": "test_kernel_options.py::test_a_grid_accepts_every_value_of_each_kernel_option",
    "loss": "test_loss_run.py::test_a_chunked_loss_trains_to_the_full_loss_s_values_with_and_without_accumulation",
    "dp_replicate": "test_layouts_run.py::test_a_layout_trains_as_fsdp_over_its_data_parallel_ranks",
    "tp": "test_layouts_run.py::test_a_layout_trains_as_fsdp_over_its_data_parallel_ranks",
    "cp": "test_layouts.py::test_a_layout_that_can_never_run_is_one_line_and_exit_2",
    "steps": "test_readme_grid_runs_every_precision_and_stores_its_name",
    "on_oom": "test_on_oom_bisect_goes_midway_to_what_fits",
    "on_oom: next, min_batch": "test_on_oom_next_with_min_batch_under_a_profile_cap",
    "search": "test_oom.py::test_max_batch_search_finds_the_limit_in_log_probes",
    "timeout_s": "test_timeout_s_kills_a_trial_past_it",
    "memory_cap": "test_grid_cli.py::test_a_grid_files_memory_cap_really_caps_the_ranks",
    "reuse_actors": "test_warm_groups.py::test_a_grid_runs_on_one_warm_group_with_the_losses_of_fresh_processes",
    "precompile": "test_precompile.py::test_a_group_compiles_its_graphs_ahead_and_trains_as_without",
    "profile": "test_profile.py::test_profile_run_writes_a_trace_beside_its_row",
    "tune": "test_tune_cli.py::test_every_probe_of_a_grid_search_holds_its_global_batch",
    "search: fastest": "test_tune_cli.py::test_every_probe_of_a_grid_search_holds_its_global_batch",
    # options of `sweep run`, `sweep plan`, `sweep max-batch` the README shows
    "--model": "test_grid_less_run_takes_every_axis_from_options",
    "--precision": "test_grid_less_run_takes_every_axis_from_options",
    "--batch-size": "test_grid_less_run_takes_every_axis_from_options",
    "--compile": "test_compile_full_is_compiled_and_compare_by_compile",
    "--seq-len": "test_grid_less_run_takes_every_axis_from_options",
    "--gpus": "test_grid_less_run_takes_every_axis_from_options",
    "--grad-accum": "test_grid_less_run_takes_every_axis_from_options",
    "--dp-replicate": "test_layouts.py::test_layout_options_on_the_command_line_replace_the_grids",
    "--tp": "test_layouts.py::test_layout_options_on_the_command_line_replace_the_grids",
    "--cp": "test_layouts.py::test_cp_on_the_command_line_is_refused_until_built",
    "--cluster": "test_on_oom_next_with_min_batch_under_a_profile_cap",
    "--output": "test_readme_grid_runs_every_precision_and_stores_its_name",
    "--memory-cap": "test_on_oom_bisect_goes_midway_to_what_fits",
    "--max-concurrent": "test_on_oom_bisect_goes_midway_to_what_fits",
    "--resume": "test_faults.py::test_a_killed_driver_loses_only_running_trials_and_resume_finishes_the_grid",
    "--no-predict": "test_memory_predict.py::test_no_predict_and_the_grid_key_run_it_anyway",
    "--fresh-actors": "test_warm_groups.py::test_max_batch_finds_the_same_limit_on_warm_and_on_fresh_processes",
    "--no-precompile": "test_precompile.py::test_a_group_compiles_its_graphs_ahead_and_trains_as_without",
    "--profile": "test_profile.py::test_profile_run_writes_a_trace_beside_its_row",
    # options of `sweep tune` the README shows (the `tuned` fixture runs them)
    "--vary": "test_tune_cli.py::test_numerics_changing_options_stay_fixed_unless_named",
    "--budget": "test_tune_cli.py::test_tune_gives_one_fastest_verdict_per_precision_within_its_budget",
    "--start": _BEST_IS_FASTEST,
    "--warmup": _BEST_IS_FASTEST,
    "--measure": _BEST_IS_FASTEST,
    # the rest of what the README promises about these commands
    "sweep plan": "test_readme_grid_block_plans_on_h200",
    "sweep max-batch": "test_max_batch_command_and_search_with_two_precisions",
    "memory_per_device": "test_on_oom_next_with_min_batch_under_a_profile_cap",
    "unsupported rows": "test_readme_grid_runs_every_precision_and_stores_its_name",
    "SWEEP_DEBUG=1": "test_sweep_debug_brings_the_traceback_back",
    "results compare --by compile": "test_compile_full_is_compiled_and_compare_by_compile",
    "results compare --by ac": "test_activation_checkpointing_recomputes_blocks_and_compare_by_ac",
    "sweep tune": "test_tune_cli.py::test_tune_gives_one_fastest_verdict_per_precision_within_its_budget",
    "sweep plan (search: fastest)": "test_tune_cli.py::test_every_probe_of_a_grid_search_holds_its_global_batch",
    "results compare --best": "test_tune_cli.py::test_results_verdicts_and_compare_best_read_the_tune",
    "results verdicts": "test_tune_cli.py::test_results_verdicts_and_compare_best_read_the_tune",
}

TINY = dict(
    models=["llama-tiny"], batch_sizes=[2], seq_len=64, gpus=2, compile="none", steps={"warmup": 1, "measure": 2}
)
# Logits dominate its memory (B x T x V floats), so memory grows steeply with the batch: under a 128 MiB
# cap per rank, batch 4 fits (about 110 MiB) and batch 8 does not.
WIDE_VOCAB = {
    "arch": "gpt",
    "name": "wide-vocab",
    "n_layers": 1,
    "d_embd": 64,
    "n_heads": 4,
    "vocab_size": 4096,
    "max_seq_len": 128,
}
CAP_MIB = 128


def readme_grid_text() -> str:
    """The yaml block under docs/grids.md's "## The grid file", as a user would copy it."""
    section = (ROOT / "docs" / "grids.md").read_text().split("## The grid file", 1)[1]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


def readme_grid() -> dict:
    return yaml.safe_load(readme_grid_text())


def run_grid(folder: Path, grid: dict, *options, name: str = "grid.yaml", measures: bool = True) -> Path:
    """`sweep run <grid> --cluster local --output <folder>/out <options>`; returns the output folder.
    `measures=False`: no trial is meant to measure anything (all oom / timeout), which exits 3."""
    path = folder / name
    path.write_text(yaml.safe_dump(grid, sort_keys=False))
    out = folder / "out"
    cluster = () if "--cluster" in options else ("--cluster", "local")
    result = invoke("run", path, "--output", out, "--no-progress", *cluster, *options)
    assert result.exit_code == (0 if measures else 3), result.output
    assert measures or "no trial measured anything" in result.output
    return out


def rows(out: Path) -> list[dict]:
    """Every row under `out`, read as a user would: one pyarrow dataset (`_search/` is skipped)."""
    return ds.dataset(out, format="parquet").to_table().to_pylist()


def by_attempt(out: Path) -> list[dict]:
    return sorted(rows(out), key=lambda r: r["attempt"])


def differs(a: float, b: float) -> bool:
    return not a == pytest.approx(b, rel=1e-6, abs=0)


# -- the README's grid, shrunk to tiny sizes, and one option changed at a time ----------------------------


@pytest.fixture(scope="module")
def options_run(ray_session, tmp_path_factory):
    """The README's grid block with CPU sizes (its `search` and `memory_cap` have tests of their own), then
    the bf16 trial again with options changed, all into one dataset: grad_clip and reduce_dtype in one run (one
    warm group runs the three new trials; `--resume` reuses the unchanged one's row), compile full in another."""
    folder = tmp_path_factory.mktemp("options")
    grid = {k: v for k, v in readme_grid().items() if k not in ("search", "memory_cap")}
    grid.update(TINY, fp8_lm_head=[False, True])
    bf16 = {**grid, "precisions": ["bf16"], "fp8_lm_head": False}
    out = run_grid(folder, grid)
    first = {r["trial_id"] for r in rows(out)}
    options = {**bf16, "grad_clip": [1.0, 1e-7], "reduce_dtype": ["fp32", "bf16"]}
    run_grid(folder, options, "--resume", "--max-concurrent", 1, name="options.yaml")  # one group, not two at once
    run_grid(folder, grid, "--precision", "bf16", "--compile", "full")
    return {"grid": grid, "out": out, "rows": rows(out), "first": first}


def _one(options_run, **match) -> dict:
    (row,) = [r for r in options_run["rows"] if all(r[k] == v for k, v in match.items())]
    return row


def _baseline(options_run) -> dict:
    return _one(options_run, precision="bf16", compile="none", grad_clip=1.0, reduce_dtype="fp32")


def test_readme_grid_runs_every_precision_and_stores_its_name(options_run):
    grid = options_run["grid"]
    first = [r for r in options_run["rows"] if r["trial_id"] in options_run["first"]]
    # fp8_lm_head folds away for bf16; FP8 recipes run with and without it
    assert sorted((r["precision"], r["fp8_lm_head"]) for r in first) == sorted(
        [("bf16", False)] + [(p, head) for p in grid["precisions"] if p != "bf16" for head in (False, True)]
    )
    for r in first:
        assert r["grid_name"] == grid["name"] == "fp8-vs-bf16"
        assert (r["model"], r["batch_size"], r["seq_len"], r["world_size"]) == ("llama-tiny", 2, 64, 2)
        assert (r["warmup_steps"], r["measure_steps"], r["compile"], r["ac"]) == (1, 2, "none", "none")
        assert (r["grad_accum"], r["grad_clip"], r["reduce_dtype"], r["grad_sync"]) == (1, 1.0, "fp32", "micro_batch")
        if r["precision"].startswith("fp8-te"):  # no Transformer Engine on CPU ranks: a row, no actors
            assert r["status"] == "unsupported" and "needs a GPU" in r["error"], r
            assert r["step_time_s"] is None and r["hosts"] is None
        else:
            assert r["status"] == "ok", r["error"]
            assert len(r["params_local"]) == 2 and r["loss_last"] < r["loss_first"]
            # the trainer ran exactly `measure` timed steps: the median of two is their mean
            assert r["steps_time_s"] == pytest.approx(2 * r["step_time_s"])


def test_fp8_recipe_trains_and_fp8_lm_head_changes_the_head(options_run):
    """torchao tensorwise FP8 (emulated on CPU) through `sweep run`; fp8_lm_head casts the output head too."""
    plain = _one(options_run, precision="fp8-torchao-tensorwise", fp8_lm_head=False)
    head = _one(options_run, precision="fp8-torchao-tensorwise", fp8_lm_head=True)
    bf16 = _baseline(options_run)
    assert plain["torchao_version"] and plain["status"] == head["status"] == "ok"
    # the same initial weights and data, FP8 matmuls: close to bf16 at the first step, not equal
    assert plain["loss_first"] == pytest.approx(bf16["loss_first"], rel=0.02) and differs(
        plain["loss_first"], bf16["loss_first"]
    )
    assert differs(head["loss_first"], plain["loss_first"])  # the head's matmul is FP8 too


def test_grad_clip_changes_the_updates(options_run):
    """A max norm of 1e-7 shrinks every gradient below AdamW's eps: the model barely moves."""
    clipped = _one(options_run, precision="bf16", grad_clip=1e-7, reduce_dtype="fp32")
    base = _baseline(options_run)
    assert clipped["status"] == "ok" and clipped["loss_first"] == base["loss_first"]  # the same start
    # the same last batch, a model that learned less (the last batch is not the first: compare like with like)
    assert clipped["loss_last"] > base["loss_last"]


def test_reduce_dtype_bf16_changes_the_reduction(options_run):
    reduced = _one(options_run, precision="bf16", reduce_dtype="bf16", grad_clip=1.0)
    base = _baseline(options_run)
    assert reduced["status"] == "ok" and reduced["loss_first"] == base["loss_first"]  # one forward before any reduce
    assert differs(reduced["loss_last"], base["loss_last"])  # gradients summed in bf16, then the updates differ


def test_compile_full_is_compiled_and_compare_by_compile(options_run):
    """`--compile full` on the grid's `compile: none`: the whole model goes through inductor once."""
    full = _one(options_run, compile="full")
    base = _baseline(options_run)
    assert full["status"] == "ok", full["error"]
    # inductor's fused kernels round bf16 differently from eager's (which gives the same loss every run)
    assert full["loss_first"] == pytest.approx(base["loss_first"], rel=1e-3)
    assert differs(full["loss_first"], base["loss_first"])
    # compiling takes many steady steps (seconds against milliseconds)
    assert full["compile_time_s"] > 20 * full["step_time_s"]
    result = invoke(
        "results", "compare", options_run["out"], "--by", "compile", "--where", "precision=bf16", "--format", "csv"
    )
    assert result.exit_code == 0, result.output
    (line,) = _csv(result.stdout)
    assert line["compile"] == "full" and float(line["base_tflops_per_gpu"]) == pytest.approx(base["tflops_per_gpu"])
    assert float(line["ratio"]) == pytest.approx(full["tflops_per_gpu"] / base["tflops_per_gpu"])


def _csv(text: str) -> list[dict]:
    import csv
    import io

    return list(csv.DictReader(io.StringIO(text)))


# -- one run per option that needs its own grid ---------------------------------------------------------


def test_grid_less_run_takes_every_axis_from_options(ray_session, tmp_path, options_run):
    """`sweep run --model ...` with no grid file: the README's one-trial form, here with two micro-batches."""
    out = tmp_path / "out"
    result = invoke(
        "run",
        "--model",
        "llama-tiny",
        "--precision",
        "bf16",
        "--batch-size",
        2,
        "--gpus",
        2,
        "--seq-len",
        64,
        "--compile",
        "none",
        "--grad-accum",
        2,
        "--cluster",
        "local",
        "--output",
        out,
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    (row,) = rows(out)
    assert row["status"] == "ok", row["error"]
    assert (
        row["model"],
        row["precision"],
        row["batch_size"],
        row["world_size"],
        row["seq_len"],
        row["compile"],
        row["grad_accum"],
    ) == ("llama-tiny", "bf16", 2, 2, 64, "none", 2)
    assert row["grid_name"] is None and (row["warmup_steps"], row["measure_steps"]) == (3, 10)  # the defaults
    assert row["tokens_per_s_per_gpu"] == pytest.approx(2 * 2 * 64 / row["step_time_s"])
    # the first step's loss is the mean over its two micro-batches: about the one-micro-batch loss of the same
    # model, seed and data (both ~ln V), not equal to it
    base = _baseline(options_run)
    assert row["loss_first"] == pytest.approx(base["loss_first"], rel=0.02)
    assert differs(row["loss_first"], base["loss_first"])


@pytest.fixture(scope="module")
def ac_run(ray_session, tmp_path_factory):
    """8 blocks and a small vocabulary: the blocks' saved activations dominate a rank's peak memory."""
    deep = {
        "arch": "llama",
        "name": "deep",
        "n_layers": 8,
        "d_embd": 64,
        "n_heads": 4,
        "n_kv_heads": 2,
        "ffn_hidden": 512,
        "vocab_size": 64,
    }
    out = run_grid(
        tmp_path_factory.mktemp("ac"),
        {
            **TINY,
            "models": [deep],
            "precisions": ["fp32"],
            "batch_sizes": [4],
            "seq_len": 256,
            "ac": ["none", "selective", "full"],
        },
    )
    return out, {r["ac"]: r for r in rows(out)}


def test_activation_checkpointing_recomputes_blocks_and_compare_by_ac(ac_run):
    out, by_ac = ac_run
    assert set(by_ac) == {"none", "selective", "full"}
    for r in by_ac.values():
        assert r["status"] == "ok", r["error"]
    # recomputing a block gives back its exact activations: the same losses
    assert by_ac["selective"]["loss_last"] == by_ac["full"]["loss_last"] == by_ac["none"]["loss_last"]
    # ... while holding fewer of them: every block checkpointed < every other block < none
    assert by_ac["full"]["peak_mem_gib"] < by_ac["selective"]["peak_mem_gib"] < by_ac["none"]["peak_mem_gib"]
    result = invoke("results", "compare", out, "--by", "ac", "--format", "csv")
    assert result.exit_code == 0, result.output
    lines = {line["ac"]: line for line in _csv(result.stdout)}
    assert set(lines) == {"selective", "full"}
    for ac, line in lines.items():
        assert float(line["base_tflops_per_gpu"]) == pytest.approx(by_ac["none"]["tflops_per_gpu"])
        assert float(line["ratio"]) == pytest.approx(by_ac[ac]["tflops_per_gpu"] / by_ac["none"]["tflops_per_gpu"])


def _oom_grid(batches: list[int], **keys) -> dict:
    return {
        **TINY,
        "models": [WIDE_VOCAB],
        "precisions": ["bf16"],
        "batch_sizes": batches,
        "seq_len": 128,
        "steps": {"warmup": 1, "measure": 1},
        **keys,
    }


def test_on_oom_next_with_min_batch_under_a_profile_cap(ray_session, tmp_path):
    """A profile's memory_per_device caps every rank; `next` retries B-1 and stops at min_batch."""
    profile = tmp_path / "capped.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "name": "capped",
                "accelerator": "cpu",
                "ray_address": "local",
                "nodes": 1,
                "gpus_per_node": 2,
                "cpus_per_rank": 1,
                "memory_per_device": f"{CAP_MIB}MiB",
            }
        )
    )
    out = run_grid(
        tmp_path, _oom_grid([64], on_oom={"policy": "next", "min_batch": 63}), "--cluster", profile, measures=False
    )
    attempts = by_attempt(out)
    assert [(r["batch_size"], r["status"]) for r in attempts] == [(64, "oom"), (63, "oom")]
    assert attempts[1]["parent_trial_id"] == attempts[0]["trial_id"]
    for r in attempts:
        assert r["cluster"] == "capped" and r["memory_cap_gib"] == pytest.approx(CAP_MIB / 1024)
        assert "allocat" in r["error"]  # torch's CPU allocator refused: the cap is real


def test_on_oom_bisect_goes_midway_to_what_fits(ray_session, tmp_path):
    """Batch 2 fits, 64 does not: bisect retries (2 + 64) // 2 = 33 (halve would try 32, next 63), and then
    stops, since the next midpoint (17) is below min_batch. One trial at a time, so 2 is known first."""
    out = run_grid(
        tmp_path,
        _oom_grid([2, 64], on_oom={"policy": "bisect", "min_batch": 33}),
        "--memory-cap",
        f"{CAP_MIB}MiB",
        "--max-concurrent",
        1,
    )
    got = {r["batch_size"]: r for r in rows(out)}
    assert {b: r["status"] for b, r in got.items()} == {2: "ok", 64: "oom", 33: "oom"}
    assert got[33]["parent_trial_id"] == got[64]["trial_id"] and got[33]["attempt"] == 2
    assert {r["memory_cap_gib"] for r in got.values()} == {CAP_MIB / 1024}
    # one at a time: each trial was placed after the previous one finished
    ordered = sorted(got.values(), key=lambda r: r["started_at"])
    assert [r["batch_size"] for r in ordered] == [2, 64, 33]
    for before, after in zip(ordered, ordered[1:]):
        assert before["finished_at"] <= after["started_at"]


def test_timeout_s_kills_a_trial_past_it(ray_session, tmp_path):
    """A trial of 10^6 steps under `timeout_s: 1`: killed and recorded, not retried."""
    out = run_grid(
        tmp_path,
        {**TINY, "precisions": ["bf16"], "steps": {"warmup": 1, "measure": 1_000_000}, "timeout_s": 1},
        measures=False,
    )
    (row,) = rows(out)
    assert row["status"] == "timeout" and "past the 1 s limit" in row["error"], row["error"]


def test_max_batch_command_and_search_with_two_precisions(ray_session, tmp_path):
    """The README's `sweep max-batch` line, on CPU sizes: one verdict per precision; one that cannot run
    here is recorded unsupported and ends its search at once."""
    out = tmp_path / "out"
    result = invoke(
        "max-batch",
        "--model",
        "gpt-tiny",
        "--precision",
        "bf16",
        "--precision",
        "fp8-te-delayed",
        "--gpus",
        2,
        "--seq-len",
        1024,
        "--compile",
        "none",
        "--warmup",
        0,
        "--measure",
        1,
        "--memory-cap",
        "96MiB",
        "--cluster",
        "local",
        "--output",
        out,
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    verdicts = {v["precision"]: v for v in json.loads(next((out / "_search").glob("*.json")).read_text())}
    assert set(verdicts) == {"bf16", "fp8-te-delayed"}
    status = {(r["precision"], r["batch_size"]): r["status"] for r in rows(out)}
    best = verdicts["bf16"]["max_batch"]
    assert status[("bf16", best)] == "ok" and status[("bf16", best + 1)] == "oom"
    assert verdicts["fp8-te-delayed"]["aborted"] == "unsupported"
    assert [s for (p, _), s in status.items() if p == "fp8-te-delayed"] == ["unsupported"]
    assert len(rows(out)) == verdicts["bf16"]["probes"] + 1 <= 2 * math.ceil(math.log2(best + 1)) + 2


# -- no trial runs ----------------------------------------------------------------------------------------


def test_readme_grid_block_plans_on_h200(tmp_path):
    """The README's grid block, verbatim, through `sweep plan --cluster h200`: every key is accepted."""
    path = tmp_path / "grid.yaml"
    path.write_text(readme_grid_text())  # verbatim, comments and all
    grid = readme_grid()
    result = invoke("plan", path, "--cluster", "h200", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "on h200" in result.stdout
    for value in [*grid["models"], *grid["precisions"]]:
        assert value in result.stdout


def test_sweep_debug_brings_the_traceback_back(tmp_path):
    """A grid with an unknown key: one line and exit 2; with SWEEP_DEBUG=1, the traceback of the UserError."""
    grid = tmp_path / "grid.yaml"
    grid.write_text("models: [llama-tiny]\nbatch_sizes: [2]\nbatchsize: 2\n")
    # a clean environment: nothing that the session's Ray wrote into this process's os.environ
    clean = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    command = [sys.executable, "-m", "sweep", "plan", str(grid), "--cluster", "local"]
    plain = subprocess.run(command, capture_output=True, text=True, env=clean, cwd=ROOT, timeout=120)
    assert plain.returncode == 2 and plain.stderr.startswith("error: ") and len(plain.stderr.splitlines()) == 1
    debug = subprocess.run(
        command, capture_output=True, text=True, env={**clean, "SWEEP_DEBUG": "1"}, cwd=ROOT, timeout=120
    )
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr
    assert "sweep.errors.UserError" in debug.stderr and "batchsize" in debug.stderr


def test_the_table_covers_every_readme_key_and_option():
    """COVERAGE names a test, here or in another module, for every grid key of the README's block and every
    option the README shows for `sweep run`, `sweep plan`, `sweep max-batch` and `sweep tune`."""
    readme = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    assert set(readme_grid()) <= set(COVERAGE)
    shown = set()  # in every `sweep run|plan|max-batch|tune ...` the README writes, up to a comment or closing
    # backtick, a line that ends in a backslash continued
    for command in re.findall(r"sweep (?:run|plan|max-batch|tune)\b((?:[^`#\n\\]|\\\n)*)", readme):
        shown |= set(re.findall(r"(--[a-z][a-z-]*)", command))
    listed = re.search(r"on the command line:\n?(.*?)\(repeatable\)", readme, re.S).group(1)
    shown |= set(re.findall(r"`(--[a-z-]+)`", listed))
    assert shown <= set(COVERAGE), shown - set(COVERAGE)
    here = sys.modules[__name__]
    for test in set(COVERAGE.values()):
        if "::" in test:
            module, name = test.split("::")
            assert f"def {name}(" in (ROOT / "tests" / module).read_text(), test
        else:
            assert callable(getattr(here, test, None)), test
