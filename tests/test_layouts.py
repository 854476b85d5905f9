"""Parallel layouts (dp_replicate, tp, cp) at plan time, through `sweep plan` on grid files and options: no Ray.

A layout the grid can never run is refused in one line (exit 2); a layout the code does not build for a recipe
or model is planned `unsupported` with the reason; the defaults leave a trial as it was.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from test_grid_cli import error_line  # exit 2, one `error: ...` line, no traceback

from sweep.spec.expand import expand
from sweep.spec.grid import parse_grid

LLAMA = "{arch: llama, name: l4, n_layers: 1, d_embd: 64, n_heads: 4, n_kv_heads: 2, ffn_hidden: 96, vocab_size: 128}"


@pytest.fixture
def four_ranks(tmp_path):
    """A CPU profile of 8 ranks, so layouts of 4 and 8 ranks plan (nothing runs)."""
    path = tmp_path / "four.yaml"
    path.write_text("name: four\naccelerator: cpu\nray_address: local\nnodes: 1\ngpus_per_node: 8\ncpus_per_rank: 1\n")
    return path


def plan(cli, profile, grid_text: str, write_grid, *options):
    return cli("plan", write_grid(grid_text), "--cluster", profile, *options)


@pytest.mark.parametrize(
    "grid, needle",
    [
        ("gpus: 4\ntp: 3", "tp: 3: gpus 4 is not a multiple of dp_replicate x tp x cp (3 at the least with tp 3)"),
        (
            "gpus: 2\ntp: 2\ndp_replicate: 2",
            "tp: 2: gpus 2 is not a multiple of dp_replicate x tp x cp (4 at the least",
        ),
        ("gpus: 4\ntp: 4", "tp: 4 does not divide l4's n_kv_heads (2)"),
        ("gpus: 8\ntp: 8", "tp: 8 does not divide l4's n_heads (4)"),
        ("gpus: 4\ntp: 2\nseq_len: 63", "tp: 2 does not divide seq_len 63 (sequence parallel splits it)"),
        (
            "gpus: 4\ncp: 2",
            "cp: 2: context parallel is not built: torch 2.13's context_parallel has no sharding "
            "rule for CPU attention (aten._scaled_dot_product_flash_attention_for_cpu)",
        ),
        ("gpus: 4\ntp: 0", "tp.0: Input should be greater than 0"),
    ],
)
def test_a_layout_that_can_never_run_is_one_line_and_exit_2(cli, write_grid, four_ranks, grid, needle):
    line = error_line(plan(cli, four_ranks, f"models: [{LLAMA}]\nbatch_sizes: [1]\n{grid}\n", write_grid))
    assert needle in line, line


def test_cp_on_the_command_line_is_refused_until_built(cli, four_ranks):
    line = error_line(
        cli("plan", "--cluster", four_ranks, "--model", "llama-tiny", "--batch-size", "1", "--gpus", "4", "--cp", "2")
    )
    assert line.endswith(
        "cp: 2: context parallel is not built: torch 2.13's context_parallel has no sharding rule "
        "for CPU attention (aten._scaled_dot_product_flash_attention_for_cpu), so it cannot be "
        "tested on CPU ranks; use cp: 1"
    ), line


def test_tp_must_stay_within_a_node(cli, write_grid, tmp_path):
    path = tmp_path / "six.yaml"
    path.write_text("name: six\naccelerator: cpu\nray_address: local\nnodes: 1\ngpus_per_node: 6\ncpus_per_rank: 1\n")
    model = LLAMA.replace("n_kv_heads: 2", "n_kv_heads: 4")  # 4 heads and kv heads: tp 4 splits the model
    line = error_line(
        plan(cli, path, f"models: [{model}]\nbatch_sizes: [1]\nseq_len: 64\ngpus: 4\ntp: 4\n", write_grid)
    )
    assert "tp: 4 ranks cannot stay on one node of 6 ranks (tp must divide the ranks per node)" in line


def test_a_layout_that_does_not_divide_one_gpus_value_runs_at_the_others(cli, write_grid, four_ranks):
    result = plan(
        cli,
        four_ranks,
        f"models: [{LLAMA}]\nbatch_sizes: [1]\nseq_len: 64\ncompile: none\n"
        f"gpus: [2, 4]\ntp: [1, 2]\ndp_replicate: [1, 2]\n",
        write_grid,
    )
    assert result.exit_code == 0, result.output
    # gpus 2 with dp_replicate 2 x tp 2 is left out; the other 7 combinations are trials
    assert "7 trials on four" in result.stdout, result.stdout


@pytest.mark.parametrize(
    "model, precision, keys, reason",
    [
        (LLAMA, "fp8-torchao-tensorwise", "", "tensor parallel (tp > 1) with torchao float8"),
        ("gpt-tiny", "bf16", "", "tensor parallel is built for llama models"),
        (LLAMA, "bf16", "compile: full", "tp > 1 with compile: full does not compile (torch 2.13)"),
        (LLAMA, "bf16", "ac: selective", "tp > 1 with ac: selective and compile: regional does not compile"),
    ],
)
def test_a_layout_a_recipe_or_model_does_not_build_is_planned_unsupported(
    cli, write_grid, four_ranks, model, precision, keys, reason
):
    result = plan(
        cli,
        four_ranks,
        f"models: [{model}]\nprecisions: [{precision}]\nbatch_sizes: [1]\nseq_len: 64\ngpus: 4\ntp: 2\n{keys}\n",
        write_grid,
    )
    assert result.exit_code == 0, result.output
    assert "no (1)" in result.stdout and reason in " ".join(result.stdout.split()), result.stdout


def test_layout_options_on_the_command_line_replace_the_grids(cli, write_grid, four_ranks):
    result = plan(
        cli,
        four_ranks,
        f"models: [{LLAMA}]\nbatch_sizes: [1]\nseq_len: 64\ngpus: 4\ntp: 4\n",
        write_grid,
        "--tp",
        "2",
        "--dp-replicate",
        "1",
        "--dp-replicate",
        "2",
    )
    assert result.exit_code == 0, result.output
    assert "2 trials on four" in result.stdout and "tp=2" in result.stdout, result.stdout


def test_the_default_layout_leaves_trial_ids_and_config_keys_as_before():
    """A trial id hashes only options off their default: a grid without the new axes keeps its recorded ids."""
    base = {"models": ["llama-tiny"], "batch_sizes": [2], "gpus": 2}
    plain = expand(parse_grid(base), cluster="local")[0]
    spelled = expand(parse_grid({**base, "tp": 1, "dp_replicate": [1], "cp": 1}), cluster="local")[0]
    split = expand(parse_grid({**base, "tp": 2}), cluster="local")[0]
    assert plain.trial_id == spelled.trial_id and plain.config_key == spelled.config_key
    assert split.trial_id != plain.trial_id and split.config_key != plain.config_key
    assert (plain.dp_shard, split.dp_shard) == (2, 1)
    key = {
        "cluster": "local",
        "model": plain.model.model_dump(exclude_none=True),
        "precision": "bf16",
        "compile": "regional",
        "ac": "none",
        "batch_size": 2,
        "seq_len": 1024,
        "gpus": 2,
        "warmup": 3,
        "measure": 10,
        "memory_cap": None,
        "retry": 0,
    }
    assert plain.trial_id == hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def test_ranks_fill_nodes_in_rank_order_so_a_tp_group_is_on_one_node():
    """Past one node, each node's share of the ranks is one bundle on a node of its own (STRICT_SPREAD) and rank r
    goes to bundle r // gpus_per_node: a TP group (tp consecutive ranks, tp dividing gpus_per_node) never straddles
    two nodes, and an HSDP replica of dp_shard x tp = 8 ranks is one node."""
    from clusters import load_profile
    from sweep.execution.placement import bundle_index, placement

    h200 = load_profile("h200")  # 8 GPUs a node
    bundles, strategy = placement(h200, 16)
    assert strategy == "STRICT_SPREAD" and bundles == [{"CPU": 8 * h200.cpus_per_rank, "GPU": 8}] * 2
    node = [bundle_index(h200, rank, 16) for rank in range(16)]
    for tp in (2, 4, 8):
        assert all(len({node[r] for r in range(start, start + tp)}) == 1 for start in range(0, 16, tp))
    assert placement(h200, 8) == ([{"CPU": h200.cpus_per_rank, "GPU": 1}] * 8, "STRICT_PACK")  # one node: as before


def test_the_state_is_checked_against_the_ranks_that_shard_it(cli):
    """Llama3-70B's 16 B x 70.6B of training state over 8 H200s: FSDP and FSDP 4 x TP 2 shard it 8 ways (fits),
    HSDP 2 x 4 only 4 ways within each replica (263 GiB a rank: planned unsupported, no GPU time)."""
    result = cli(
        "plan",
        "--cluster",
        "h200",
        "--model",
        "llama3-70b",
        "--batch-size",
        "1",
        "--gpus",
        "8",
        "--seq-len",
        "1024",
        "--dp-replicate",
        "1",
        "--dp-replicate",
        "2",
        "--tp",
        "1",
        "--tp",
        "2",
        "--no-predict",
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "state need 263 GiB per rank (16 B × 70.6B params / 4 ranks) > 141 GiB per h200" in text, text
    rows = [line for line in result.stdout.splitlines() if line.startswith("│") and "GiB" in line]
    # in grid order: FSDP 8, FSDP 4 x TP 2, HSDP 2 x 4, HSDP 2 x 2 x TP 2 (whose tp=2 wraps onto a line of its own)
    cells = [[cell.strip() for cell in line.split("│")[2:5]] for line in rows]
    assert [(options, runs == "yes") for options, _, runs in cells] == [
        ("-", True),
        ("tp=2", True),
        ("dp_replicate=2", False),
        ("dp_replicate=2", False),
    ], rows
    # the predicted largest batch names the layout: TP splits activations and logits, so more fits
    assert "8 ranks as tp 2): 4" in text and "8 ranks): 2" in text
