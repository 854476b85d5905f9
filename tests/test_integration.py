"""End to end on a real local Ray: `sweep run` → rank actors → FSDP2 over gloo (2 CPU ranks) → Parquet.

Nothing is mocked: the CLI runs in-process on the session's Ray, each rank is a Ray actor process that
initialises a gloo process group and trains with `fully_shard`.
"""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest
from conftest import invoke

from sweep.record import compact, store
from sweep.record.schema import RESULT_SCHEMA, SCHEMA_VERSION, VERSION_KEY
from trainer.models import REGISTRY

pytestmark = pytest.mark.integration

DEMO = """
name: it
models: [gpt-tiny, llama-tiny]
precisions: [bf16]
batch_sizes: [2, 4]
compile: none
seq_len: 64
gpus: 2
steps: {warmup: 1, measure: 3}
"""


@pytest.fixture(scope="module")
def demo_results(ray_session, tmp_path_factory):
    folder = tmp_path_factory.mktemp("demo")
    (folder / "grid.yaml").write_text(DEMO)
    # one trial at a time, on one warm group: two groups started at once take twice as long on a 2-core host
    out = folder / "out"
    result = invoke(
        "run", folder / "grid.yaml", "--cluster", "local", "--output", out, "--no-progress", "--max-concurrent", 1
    )
    assert result.exit_code == 0, result.output
    return folder / "out", result


def test_every_trial_is_an_ok_row_with_the_declared_schema(demo_results):
    out, result = demo_results
    files = store.result_files(out)
    # one file per attempt while the run ran, merged into one when it ended (sweep.record.compact)
    assert [compact.level(f) for f in files] == [0] and pq.read_metadata(files[0]).num_rows == 4, files
    assert not list(out.rglob(".*.tmp"))
    for f in files:
        assert pq.read_schema(f).metadata[VERSION_KEY] == SCHEMA_VERSION.encode()
        assert pq.read_schema(f).remove_metadata().equals(RESULT_SCHEMA.remove_metadata())
    rows = store.read_table(out).to_pylist()
    assert {(r["model"], r["batch_size"]) for r in rows} == {(m, b) for m in ("gpt-tiny", "llama-tiny") for b in (2, 4)}
    for r in rows:
        assert r["status"] == "ok", r["error"]
        assert r["world_size"] == 2 and r["cluster"] == "local" and r["accelerator"] == "cpu"
        assert r["attempt"] == 1 and r["parent_trial_id"] is None
        assert len(r["hosts"]) == 2 and r["nodes"] == 1
        assert r["step_time_p10_s"] <= r["step_time_s"] <= r["step_time_p90_s"]
        assert r["peak_mem_gib"] > 0 and r["torch_version"] and r["ray_version"]
        assert r["started_at"] <= r["finished_at"]
    assert "gpt-tiny" in result.stdout  # the result table


def test_parameters_are_really_sharded_across_ranks(demo_results):
    for r in store.read_table(demo_results[0]).to_pylist():
        n = r["n_params"]
        assert n == REGISTRY[r["model"]].n_params()
        assert len(r["params_local"]) == 2
        # each rank holds about half (FSDP2 pads dim-0 shards to equal size)
        for local in r["params_local"]:
            assert 0.45 * n <= local <= 0.55 * n, r["params_local"]


def test_measurements_are_consistent(demo_results):
    for r in store.read_table(demo_results[0]).to_pylist():
        spec = REGISTRY[r["model"]]
        tokens = r["batch_size"] * r["seq_len"]
        assert r["tokens_per_s_per_gpu"] == pytest.approx(tokens / r["step_time_s"])
        expected_fpt = 6 * r["n_params"] + 12 * spec.n_layers * spec.n_heads * spec.head_dim * r["seq_len"]
        assert r["flops_per_token"] == pytest.approx(expected_fpt)
        assert r["tflops_per_gpu"] == pytest.approx(expected_fpt * r["tokens_per_s_per_gpu"] / 1e12)
        assert r["mfu"] is None and r["peak_tflops"] is None  # CPU ranks have no peak
        # initialised properly: the first loss is ~ln(V), and training lowers it
        assert abs(r["loss_first"] - math.log(spec.vocab_size)) < 0.1 * math.log(spec.vocab_size)
        assert r["loss_last"] < r["loss_first"]


def test_results_show_reads_the_run(demo_results, cli):
    result = cli("results", "show", demo_results[0])
    assert result.exit_code == 0, result.output
    assert "llama-tiny" in result.stdout


def test_regional_compile_trains(ray_session, cli, write_grid, tmp_path):
    """The default compile mode: each block compiled in place before fully_shard (inductor on the CPU)."""
    grid = write_grid(
        "models: [llama-tiny]\nprecisions: [bf16]\nbatch_sizes: [2]\ncompile: regional\n"
        "seq_len: 64\ngpus: 2\nsteps: {warmup: 1, measure: 2}\n"
    )
    out = tmp_path / "out"
    result = cli("run", grid, "--cluster", "local", "--output", out, "--no-progress")
    assert result.exit_code == 0, result.output
    (row,) = store.read_table(out).to_pylist()
    assert row["status"] == "ok", row["error"]
    assert row["compile"] == "regional" and row["compile_time_s"] > 0 and row["loss_last"] < row["loss_first"]


def test_gradient_accumulation_counts_every_micro_batch(ray_session, cli, write_grid, tmp_path):
    """grad_accum micro-batches per optimizer step, FSDP2 over 2 gloo ranks, clipping off: a step's time covers
    all of them and the optimizer step, and the tokens count every micro-batch."""
    grid = write_grid(
        "models: [llama-tiny]\nprecisions: [bf16]\nbatch_sizes: [2]\ncompile: none\nseq_len: 32\n"
        "gpus: 2\ngrad_accum: [1, 3]\ngrad_clip: 0\ngrad_sync: [micro_batch, step]\n"
        "steps: {warmup: 1, measure: 3}\n"
    )
    out = tmp_path / "out"  # its 3 trials on one warm group, as the demo's
    result = cli("run", grid, "--cluster", "local", "--output", out, "--no-progress", "--max-concurrent", 1)
    assert result.exit_code == 0, result.output
    rows = {(r["grad_accum"], r["grad_sync"]): r for r in store.read_table(out).to_pylist()}
    # one micro-batch has nothing to defer: grad_sync folds to its default there
    assert set(rows) == {(1, "micro_batch"), (3, "micro_batch"), (3, "step")}
    # the same micro-batches and updates, reduced per micro-batch or once per step: the same losses
    assert rows[(3, "step")]["loss_last"] == pytest.approx(rows[(3, "micro_batch")]["loss_last"], rel=1e-3)
    for (accum, _), row in rows.items():
        assert row["status"] == "ok", row["error"]
        assert row["grad_clip"] == 0.0 and row["fp8_lm_head"] is False
        assert row["tokens_per_s_per_gpu"] == pytest.approx(accum * 2 * 32 / row["step_time_s"], rel=1e-9)
        assert row["loss_last"] < row["loss_first"]
        # the loss reported is the mean over the step's micro-batches: still ~ln V at the first step
        assert row["loss_first"] == pytest.approx(math.log(REGISTRY["llama-tiny"].vocab_size), rel=0.1)
    # the option that varies is a column; the constant one (clip 0, not the default) is in the caption
    shown = cli("results", "show", out)
    assert shown.exit_code == 0 and "accum" in shown.stdout and "grad_clip 0.0" in shown.stdout
    assert "grad sync" in shown.stdout and "reduce_dtype" not in shown.stdout
    assert "fp8_lm_head" not in shown.stdout  # at its default everywhere: says nothing


def test_results_commands_on_a_real_sweep(demo_results, cli, tmp_path):
    """`sweep results` over rows a real CPU sweep wrote: the exports carry the rows' own numbers."""
    import csv
    import io

    out = demo_results[0]
    rows = {(r["model"], r["batch_size"]): r for r in store.read_table(out).to_pylist()}
    result = cli("results", "export", out, "--format", "csv")
    assert result.exit_code == 0, result.output
    exported = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(exported) == len(rows)
    for line in exported:
        row = rows[(line["model"], int(line["batch_size"]))]
        assert float(line["tflops_per_gpu"]) == pytest.approx(row["tflops_per_gpu"], rel=1e-9)
        assert float(line["step_time_s"]) == pytest.approx(row["step_time_s"], rel=1e-9)
        assert line["status"] == "ok" and int(line["n_ok"]) == 1
    md = cli("results", "export", out, "--format", "md")
    assert md.exit_code == 0 and md.stdout.count("| llama-tiny |") == 2
    assert cli("results", "max-batch", out).exit_code == 0
    only_bf16 = cli("results", "compare", out)  # one precision: nothing to compare, said in one line
    assert only_bf16.exit_code == 2 and "nothing to compare" in only_bf16.stderr
    png = tmp_path / "tflops.png"
    assert cli("results", "plot", out, "--out", png).exit_code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    query = cli("results", "query", out, "SELECT count(*) AS n FROM results WHERE status = 'ok'", "--format", "csv")
    assert query.exit_code == 0 and query.stdout.split()[-1] == "4"
