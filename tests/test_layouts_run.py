"""Parallel layouts trained for real, through `sweep run`: FSDP x TP, TP alone and HSDP on four gloo CPU ranks.

Nothing is mocked: each rank is a Ray actor that builds the named (dp_replicate, dp_shard, tp) mesh, applies tensor
parallel with sequence parallel and fully_shard over the data-parallel sub-mesh (trainer/parallelize.py).

Each layout is checked against the FSDP-only trial over the same data-parallel ranks: same model, same seed, same
tokens (a TP group trains one batch, so FSDP 2 x TP 2 sees the tokens of FSDP 2, HSDP 2 x 2 those of FSDP 4, TP 2
those of one rank). Tolerance, relative 1e-4 on every step's loss: in fp32 a layout only reorders sums (a row-parallel
matmul adds tp partial sums, a reduce-scatter adds gradients in another order), ~1e-7 relative per operation, and
three steps of AdamW do not grow that past 1e-6 (measured: the curves agree to 3e-7). A wrong layout is far outside
it: the losses of a trial that trains on other tokens (FSDP 2 against FSDP 4) differ by 3e-3 relative and more,
and a TP group whose ranks drew different tokens, or a missing all-reduce, changes the first loss itself.
"""

from __future__ import annotations

import pytest
from conftest import invoke

from sweep.record import store

pytestmark = pytest.mark.integration

GRID = """
name: layouts
models: [llama-tiny]
precisions: [fp32]
batch_sizes: [2]
compile: none
seq_len: 64
gpus: [1, 2, 4]
tp: [1, 2]
steps: {warmup: 1, measure: 2}
"""
TOLERANCE = 1e-4  # relative, on each loss (module docstring)


@pytest.fixture(scope="module")
def layout_rows(ray_session, tmp_path_factory):
    """Three `sweep run`s into one output on a profile of four CPU ranks: the grid above (gpus 1, 2, 4 x tp 1, 2;
    tp 2 does not divide 1 rank, so 5 trials), HSDP 2 x 2 (dp_replicate: 2 at 4 ranks), and TP 2 compiled regionally
    with a symbolic batch and with static shapes; then the compiled two again, into an output of their own."""
    folder = tmp_path_factory.mktemp("layouts")
    (folder / "grid.yaml").write_text(GRID)
    (folder / "four.yaml").write_text(  # its own compile cache: empty at the first run, whatever ran before
        "name: four\naccelerator: cpu\nray_address: local\nnodes: 1\ngpus_per_node: 4\ncpus_per_rank: 1\n"
        f"compile_cache: {folder / 'cache'}\n"
    )
    out = folder / "out"
    common = ["--cluster", folder / "four.yaml", "--output", out, "--no-progress"]
    (folder / "hsdp.yaml").write_text(GRID.replace("gpus: [1, 2, 4]\ntp: [1, 2]", "gpus: 4\ndp_replicate: 2"))
    (folder / "compiled.yaml").write_text(  # a symbolic batch (the default) and static shapes
        GRID.replace("gpus: [1, 2, 4]\ntp: [1, 2]", "gpus: 2\ntp: 2")
        .replace("compile: none", "compile: regional")
        .replace("batch_sizes: [2]", "batch_sizes: [2]\ndynamic_batch: [true, false]")
    )
    for grid in ("grid.yaml", "hsdp.yaml", "compiled.yaml"):
        result = invoke("run", folder / grid, *common)
        assert result.exit_code == 0, result.output
    # the compiled TP trials again, in a run of their own: their graphs are in the compile cache the first one filled
    again = invoke("run", folder / "compiled.yaml", *common[:2], "--output", folder / "again", "--no-progress")
    assert again.exit_code == 0, again.output
    rows = store.read_table(out).to_pylist()
    keyed = {(r["world_size"], r["dp_replicate"], r["tp"], r["compile"], r["dynamic_batch"]): r for r in rows}
    return keyed, out, store.read_table(folder / "again").to_pylist()


@pytest.mark.parametrize(
    "layout, baseline",
    [((4, 1, 2), (2, 1, 1)), ((2, 1, 2), (1, 1, 1)), ((4, 2, 1), (4, 1, 1))],
    ids=["fsdp2-x-tp2", "tp2", "hsdp2-x-2"],
)
def test_a_layout_trains_as_fsdp_over_its_data_parallel_ranks(layout_rows, layout, baseline):
    rows, _, _ = layout_rows
    row, base = rows[(*layout, "none", True)], rows[(*baseline, "none", True)]
    assert row["status"] == "ok", row["error"]
    curve = row["loss_curve"]
    assert len(curve) == 3 and curve[-1] < curve[0]  # it trains
    assert curve == pytest.approx(base["loss_curve"], rel=TOLERANCE)
    world, replicas, tp = layout
    assert row["dp_shard"] == world // (replicas * tp) and row["nodes"] == 1
    # the state is sharded over dp_shard x tp ranks: each holds about 1 / (dp_shard x tp) of the parameters
    share = row["n_params"] / (row["dp_shard"] * tp)
    assert all(0.9 * share <= local <= 1.1 * share for local in row["params_local"]), row["params_local"]
    # a TP group trains one micro-batch: its tokens are shared among its ranks
    assert row["loss_curve_tokens"][1] == 2 * 64 * world // tp


def test_a_layout_apart_from_fsdp_changes_the_losses_it_is_compared_on(layout_rows):
    """The check above can fail: FSDP over 2 and over 4 ranks train on other tokens (a step's loss is the mean
    over its data-parallel ranks' batches), and their curves differ by far more than the tolerance."""
    rows, _, _ = layout_rows
    two, four = rows[(2, 1, 1, "none", True)]["loss_curve"], rows[(4, 1, 1, "none", True)]["loss_curve"]
    assert max(abs(a - b) / b for a, b in zip(two, four)) > 10 * TOLERANCE


def test_a_regionally_compiled_tp_trial_trains_as_the_eager_one(layout_rows):
    """Each block compiled with its TP collectives inside: the same losses as eager TP 2 (inductor reorders fp32
    sums, well within the tolerance). With plain tensors between the compiled blocks the embedding got no
    gradient, and the second loss was 0.03 off (trainer/tensor_parallel.py)."""
    rows, _, _ = layout_rows
    eager = rows[(2, 1, 2, "none", True)]
    for dynamic_batch in (True, False):
        compiled = rows[(2, 1, 2, "regional", dynamic_batch)]
        assert compiled["status"] == "ok", compiled["error"]
        assert compiled["loss_curve"] == pytest.approx(eager["loss_curve"], rel=TOLERANCE)


def test_a_compiled_tp_trial_finds_its_graphs_in_the_cache_an_earlier_run_filled(layout_rows):
    """Its device meshes are graph inputs of every compiled block, keyed by what they are (trainer/compile_keys.py,
    3.): before, every run of it missed all four graphs and compiled them again. With static shapes the later run's
    ranks then failed in the first block, twice, and the trial was an error: AOTAutograd's entries of its graphs shared
    one key (4.), so a graph with a mesh input bypasses that cache."""
    rows, _, again = layout_rows
    assert sorted(r["dynamic_batch"] for r in again) == [False, True]
    for second in again:
        assert second["status"] == "ok", second["error"]
        assert (second["compile_cache_hits"], second["compile_cache_misses"]) == (4, 0)
        assert second["loss_curve"] == rows[(2, 1, 2, "regional", second["dynamic_batch"])]["loss_curve"]


def test_compare_by_tp_sets_each_layout_against_fsdp_on_as_many_ranks(layout_rows, cli):
    _, out, _ = layout_rows
    result = cli("results", "compare", out, "--by", "tp", "--format", "csv")
    assert result.exit_code == 0, result.output
    header, *lines = result.stdout.strip().splitlines()
    cols = header.split(",")
    pairs = [dict(zip(cols, line.split(","))) for line in lines]
    # tp 2 at 4 ranks against tp 1 at 4 ranks, and at 2 ranks against 2 (HSDP, dp_replicate 2, has no tp 2 partner)
    assert {(p["world_size"], p["tp"], p["dp_replicate"]) for p in pairs if p["base_status"]} >= {
        ("4", "2", "1"),
        ("2", "2", "1"),
    }
    assert all(float(p["ratio"]) > 0 for p in pairs if p["ratio"])
    bad = cli("results", "compare", out, "--by", "tp", "--baseline", "two")
    assert bad.exit_code == 2 and "--by tp compares whole numbers of ranks" in bad.stderr
