"""Grid parsing, validation and expansion (pure), and the CLI's answer to bad input: exit 2, one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweep.errors import UserError
from sweep.spec.expand import expand
from sweep.spec.grid import load_grid, parse_grid

GOOD = """
models: [gpt-tiny, {arch: llama, name: inline, n_layers: 1, d_embd: 32, n_heads: 4, n_kv_heads: 2,
         ffn_hidden: 64, vocab_size: 128}]
precisions: [bf16, fp32]
batch_sizes: [1, 2, 4]
compile: none
seq_len: [32, 64]
gpus: 2
steps: {warmup: 1, measure: 2}
"""


def test_expansion_is_the_cartesian_product_with_stable_ids(write_grid):
    grid = load_grid(write_grid(GOOD))
    trials = expand(grid, cluster="local", max_ranks=2)
    assert len(trials) == 2 * 2 * 3 * 2
    ids = [t.trial_id for t in trials]
    assert len(set(ids)) == len(ids)
    assert ids == [t.trial_id for t in expand(load_grid(write_grid(GOOD)), cluster="local", max_ranks=2)]
    # the id depends on the cluster and on every measured field, not on lineage
    assert trials[0].trial_id != expand(grid, cluster="h200")[0].trial_id
    child = trials[0].child(batch_size=1)
    assert child.attempt == 2 and child.parent_trial_id == trials[0].trial_id
    assert {t.model.label for t in trials} == {"gpt-tiny", "inline"}


def test_scalars_become_lists_and_defaults_apply():
    grid = parse_grid({"models": "gpt-tiny", "batch_sizes": 2})
    assert grid.compile == ["regional"] and grid.seq_len == [1024] and grid.gpus == [1]
    assert grid.steps.warmup == 3 and grid.on_oom.policy == "halve"


def test_training_options_are_axes_and_keep_earlier_ids():
    base = {"models": ["llama-tiny", "gpt-tiny"], "batch_sizes": [2], "precisions": ["bf16", "fp8-torchao-tensorwise"]}
    plain = expand(parse_grid(base), cluster="local")
    assert all((t.grad_accum, t.grad_clip, t.fp8_lm_head) == (1, 1.0, False) for t in plain)
    # options at their default leave the id as it was before they existed (resume of older results)
    assert plain[0].trial_id == "aff6f42986fcc9ba" and plain[0].options_text() == ""
    t = plain[0]  # and the config key (hence the max-batch search id) is the one from before
    assert t.config_key == (t.cluster, t.model.to_json(), t.precision, t.compile, t.ac, t.seq_len, t.gpus)
    grid = parse_grid({**base, "grad_accum": [1, 4], "grad_clip": 0, "fp8_lm_head": [False, True]})
    trials = expand(grid, cluster="local")
    # the FP8 head only exists for FP8 recipes on an untied head: llama x fp8 gets both, the rest one
    assert len(trials) == 2 * (1 + 2 + 1 + 1)
    assert {(t.model.label, t.precision) for t in trials if t.fp8_lm_head} == {("llama-tiny", "fp8-torchao-tensorwise")}
    assert len({t.trial_id for t in trials}) == len(trials) and {t.grad_clip for t in trials} == {0.0}
    assert {t.config_key for t in trials}.isdisjoint({t.config_key for t in plain})
    four = next(t for t in trials if t.grad_accum == 4)
    assert "grad_accum=4" in four.describe() and "grad_clip=0.0" in four.options_text()


def test_fsdp_gradient_options_fold_where_they_do_nothing():
    """reduce_dtype needs ranks to reduce over and bf16 params; grad_sync also needs more than one micro-batch."""
    grid = parse_grid(
        {
            "models": ["llama-tiny"],
            "batch_sizes": [2],
            "precisions": ["bf16", "fp32"],
            "gpus": [1, 2],
            "grad_accum": [1, 4],
            "reduce_dtype": ["fp32", "bf16"],
            "grad_sync": ["micro_batch", "step"],
        }
    )
    trials = expand(grid, cluster="local")
    varied = {
        (t.precision, t.gpus, t.grad_accum): {
            (t2.reduce_dtype, t2.grad_sync)
            for t2 in trials
            if (t2.precision, t2.gpus, t2.grad_accum) == (t.precision, t.gpus, t.grad_accum)
        }
        for t in trials
    }
    assert varied[("bf16", 2, 4)] == {(r, s) for r in ("fp32", "bf16") for s in ("micro_batch", "step")}
    assert varied[("bf16", 2, 1)] == {("fp32", "micro_batch"), ("bf16", "micro_batch")}
    assert varied[("fp32", 2, 4)] == {("fp32", "micro_batch"), ("fp32", "step")}
    assert varied[("bf16", 1, 4)] == varied[("fp32", 1, 1)] == {("fp32", "micro_batch")}
    assert len(trials) == 4 + 2 + 2 + 1 + 4 * 1
    step = next(t for t in trials if t.grad_sync == "step" and t.reduce_dtype == "bf16")
    assert step.options_text() == "grad_accum=4 reduce_dtype=bf16 grad_sync=step"


@pytest.mark.parametrize(
    "field, value",
    [
        ("grad_accum", 0),
        ("grad_clip", -1.0),
        ("grad_clip", float("nan")),
        ("reduce_dtype", "fp16"),
        ("grad_sync", "never"),
    ],
)
def test_training_options_are_validated(field, value):
    with pytest.raises(UserError, match=field):
        parse_grid({"models": ["gpt-tiny"], "batch_sizes": [1], field: value})


def test_memory_cap_needs_a_unit():
    assert parse_grid({"models": ["gpt-tiny"], "batch_sizes": [1], "memory_cap": "80GiB"}).memory_cap == 80 * 1024**3
    assert parse_grid({"models": ["gpt-tiny"], "batch_sizes": [1], "memory_cap": "192GB"}).memory_cap == 192 * 10**9
    for bad in (80, "80", "0GiB", "lots"):  # a bare 80 would be an 80-byte cap: every trial would OOM
        with pytest.raises(UserError, match="memory_cap"):
            parse_grid({"models": ["gpt-tiny"], "batch_sizes": [1], "memory_cap": bad})


BAD = {
    "syntax": ("models: [gpt-tiny\nbatch_sizes: [1]\n", "YAML error"),
    "empty": ("   \n", "empty"),
    "not a mapping": ("- gpt-tiny\n- llama-tiny\n", "mapping"),
    "unknown key": ("models: [gpt-tiny]\nbatch_size: [1]\n", "batch_size"),
    "unknown model": ("models: [gpt-huge]\nbatch_sizes: [1]\n", "gpt-huge"),
    "unknown precision": ("models: [gpt-tiny]\nbatch_sizes: [1]\nprecisions: [fp4]\n", "fp4"),
    "unknown compile": ("models: [gpt-tiny]\nbatch_sizes: [1]\ncompile: max\n", "compile"),
    "zero batch": ("models: [gpt-tiny]\nbatch_sizes: [0]\n", "batch_sizes"),
    "negative seq": ("models: [gpt-tiny]\nbatch_sizes: [1]\nseq_len: -5\n", "seq_len"),
    "zero steps": ("models: [gpt-tiny]\nbatch_sizes: [1]\nsteps: {warmup: 0, measure: 0}\n", "measure"),
    "wrong type": ("models: [gpt-tiny]\nbatch_sizes: [two]\n", "batch_sizes"),
    "indivisible": (
        "models: [{arch: gpt, n_layers: 1, d_embd: 30, n_heads: 4, vocab_size: 64}]\nbatch_sizes: [1]\n",
        "divisible",
    ),
    "unknown arch": (
        "models: [{arch: rwkv, n_layers: 1, d_embd: 32, n_heads: 4, vocab_size: 64}]\nbatch_sizes: [1]\n",
        "arch",
    ),
    "python tag": (
        "models: !!python/object/apply:os.system ['echo hacked > /tmp/sweep-hacked']\nbatch_sizes: [1]\n",
        "YAML error",
    ),
    "too many ranks": ("models: [gpt-tiny]\nbatch_sizes: [1]\ngpus: 64\n", "64"),
    "cap without unit": ("models: [gpt-tiny]\nbatch_sizes: [1]\nmemory_cap: 80\n", "memory_cap"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_grid_exits_2_with_one_line(case, cli, write_grid, tmp_path):
    text, needle = BAD[case]
    out = tmp_path / "results"
    result = cli("run", write_grid(text), "--cluster", "local", "--output", out)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
    assert not out.exists()


def test_binary_and_missing_files(cli, tmp_path):
    binary = tmp_path / "grid.yaml"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    for path, needle in ((binary, "UTF-8"), (tmp_path / "nope.yaml", "not found")):
        result = cli("run", path, "--cluster", "local", "--output", tmp_path / "r")
        assert result.exit_code == 2 and needle in result.stderr and "Traceback" not in result.output


def test_unknown_cluster_lists_valid_names(cli, write_grid):
    result = cli("plan", write_grid(GOOD), "--cluster", "nowhere")
    assert result.exit_code == 2
    assert "nowhere" in result.stderr and "mi300x" in result.stderr and "local" in result.stderr


def test_plan_lists_trials_and_unsupported_ones(cli, write_grid):
    result = cli(
        "plan",
        write_grid("models: [gpt-tiny]\nbatch_sizes: [1]\nprecisions: [bf16, fp8-te-delayed]\n"),
        "--cluster",
        "local",
    )
    assert result.exit_code == 0, result.output
    assert "2 trials" in result.stdout and "unsupported" in result.stdout


def test_options_override_the_grid(cli, write_grid):
    result = cli("plan", write_grid(GOOD), "--cluster", "local", "--batch-size", "8", "--precision", "bf16")
    assert result.exit_code == 0, result.output
    assert "4 trials" in result.stdout  # 2 models x 1 precision x 1 batch x 2 seq_len


def test_one_line_trial_from_options(cli):
    result = cli("plan", "--model", "llama3-8b", "--precision", "bf16", "--batch-size", "2", "--cluster", "h200")
    assert result.exit_code == 0, result.output
    assert "1 trial on h200" in result.stdout


def test_plan_shows_what_varies_and_says_the_rest_once(cli, write_grid):
    grid = write_grid(
        "models: [llama-tiny]\nbatch_sizes: [2]\ngpus: 2\ngrad_accum: 4\ncompile: none\n"
        "grad_sync: [micro_batch, step]\n"
    )
    result = cli("plan", grid, "--cluster", "local")
    assert result.exit_code == 0, result.output
    assert "2 trials on local" in result.stdout and "grad_sync=step" in result.stdout
    shared = next(line for line in result.stdout.splitlines() if line.startswith("every trial:"))
    assert "model llama-tiny" in shared and "gpus 2" in shared and "compile none" in shared


def test_python_tags_never_execute(write_grid, tmp_path):
    import os

    with pytest.raises(UserError):
        load_grid(write_grid(BAD["python tag"][0]))
    assert not os.path.exists("/tmp/sweep-hacked")


ROOT = Path(__file__).parent.parent
SHIPPED_GRIDS = sorted(
    p for folder in ("benchmarks", "examples") for p in (ROOT / folder).rglob("*.yaml") if "profiles" not in p.parts
)


PROFILE = ROOT / "benchmarks" / "profiles" / "h200x2.yaml"  # the one benchmarks/run.sh runs the campaigns on
AXES = {
    "models": "model",
    "precisions": "precision",
    "batch_sizes": "batch_size",
    "compile": "compile",
    "seq_len": "seq_len",
    "gpus": "gpus",
    "ac": "ac",
    "grad_accum": "grad_accum",
    "grad_clip": "grad_clip",
}


@pytest.mark.parametrize("path", SHIPPED_GRIDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_grids_plan_as_written(path, cli):
    """The example grids and those that reproduce benchmarks/RESULTS.md plan through the CLI on the profile
    the benchmark jobs use (4-GPU grids on the 4-GPU one), and every value they list reaches a trial: none lost to a
    fold or a merge."""
    grid = load_grid(path)
    profile = PROFILE if max(grid.gpus) <= 2 else PROFILE.with_name("h200x4.yaml")  # the layouts campaign's 4 GPUs
    result = cli("plan", path, "--cluster", profile)
    assert result.exit_code == 0, result.output
    trials = expand(grid, cluster=profile.stem)
    assert f"{len(trials)} trial{'s' * (len(trials) != 1)} on {profile.stem}" in result.stdout
    for axis, field in AXES.items():
        assert {getattr(t, field) for t in trials} == set(getattr(grid, axis)), axis
    assert len({t.model.label for t in trials}) == len(set(grid.models))  # one label per distinct spec
