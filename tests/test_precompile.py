"""Compiling ahead (trainer.precompile): which graphs a fresh group compiles at once (trainer.job.compile_ahead, pure),
the side processes, the marks of what is in the cache, a cache key that is the same in every process, and `sweep run`
(on by default; `--no-precompile`) through the CLI on real Ray ranks."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import yaml
from conftest import ROOT, invoke, tiny_trial

from trainer.job import MAX_AHEAD_GRAPHS, TrialConfig, compile_ahead, compiled_graphs
from trainer.models.specs import REGISTRY, ModelSpec
from trainer.options import TrainingOptions


def config(precision: str = "bf16", batch: int = 2, compile: str = "regional", dynamic: bool = True) -> TrialConfig:
    return TrialConfig(
        model_spec_json=REGISTRY["llama-tiny"].to_json(),
        precision=precision,
        compile=compile,  # type: ignore[arg-type]
        ac="none",
        batch_size=batch,
        seq_len=32,
        warmup_steps="auto",
        measure_steps="auto",
        options=TrainingOptions(dynamic_batch=dynamic),
    )


def test_a_group_compiles_ahead_one_trial_per_set_of_graphs_its_own_first():
    first, later = config("fp32", 2), [config("bf16", 2), config("fp32", 4), config("bf16", 4)]
    assert compile_ahead(first, later, 1) == (first, later[0])  # a symbolic batch: one set of graphs a precision


def test_static_batches_are_graphs_of_their_own():
    first, later = config(batch=2, dynamic=False), [config(batch=4, dynamic=False), config(batch=2, dynamic=False)]
    assert compile_ahead(first, later, 1) == (first, later[0])


@pytest.mark.parametrize(
    "first, later, world_size",
    [
        (config("fp32"), [config("bf16"), config("fp32", 4)], 2),  # several ranks: FSDP2 changes the graphs
        (config("fp32"), [config("fp32", 4)], 1),  # one set of graphs: the trial would wait for its own compile
        (config("fp32", compile="full"), [config("bf16", compile="full")], 1),  # one graph of the whole model
        (config("fp32", compile="none"), [config("bf16", compile="none")], 1),
    ],
)
def test_nothing_is_compiled_ahead_where_it_cannot_pay(first, later, world_size):
    assert compile_ahead(first, later, world_size) == ()


def test_at_most_max_ahead_graphs_and_a_first_trial_without_compile_leaves_the_others():
    later = [config(batch=b, dynamic=False) for b in range(1, 20)]
    ahead = compile_ahead(config(compile="none"), later, 1)
    assert ahead == tuple(later[:MAX_AHEAD_GRAPHS])


def test_the_run_compiles_ahead_only_the_graphs_of_trials_it_will_run(tmp_path):
    """A trial recorded already (--resume) and one recorded unsupported without running (TE on CPU ranks) give no
    graphs to compile ahead: side processes given them as they start would compile them, and the first trial wait."""
    from sweep import service
    from sweep.execution.runner import RunReport, _Execution, _Progress

    grid = tmp_path / "grid.yaml"
    body = {"models": ["llama-tiny"], "batch_sizes": [2, 4], "seq_len": 32, "gpus": 1, "compile": "regional"}
    grid.write_text(yaml.safe_dump({**body, "precisions": ["bf16", "fp32", "fp8-te-delayed"], "dynamic_batch": False}))
    prepared = service.prepare(grid, "local", None)
    plan = service.make_plan(prepared.spec, prepared.trials, prepared.profile)

    def ahead(recorded: dict) -> list[tuple[str, int]]:
        run = _Execution(
            plan,
            profile=prepared.profile,
            output=tmp_path / "out",
            report=RunReport(run_id="r"),
            recorded=recorded,
            bar=_Progress(False),
            grid_name=None,
            max_concurrent=None,
            reuse_actors=True,
            precompile=True,
        )
        return [(c.precision, c.batch_size) for c in run.ahead_graphs(run.runnable())]

    assert ahead({}) == [("bf16", 2), ("bf16", 4), ("fp32", 2), ("fp32", 4)]
    done = next(t for t in prepared.trials if (t.precision, t.batch_size) == ("bf16", 4))
    assert ahead({done.trial_id: {}}) == [("bf16", 2), ("fp32", 2), ("fp32", 4)]


def test_a_fresh_group_compiles_ahead_the_graphs_of_the_cold_sweep_grid_in_the_order_it_runs_them():
    """The cold-sweep grid's six trials on one GPU: bf16 4 is placed first; the others wait, bf16 6 for a placement of
    its own (which a one-GPU node never grants while the group holds the GPU: it comes back to the group), the rest in
    the queue. The group compiles bf16, tensorwise (symbolic batches) and rowwise 4 and 6 (static) ahead; a TE trial
    needs a group of its own and is left out."""
    from sweep.execution.groups import run_order, stack_stage, warm_group_key
    from sweep.execution.placement import trial_config

    def trial(precision: str, batch: int):
        static = precision == "fp8-torchao-rowwise"
        return tiny_trial(precision=precision, batch_size=batch, gpus=1, compile="regional", dynamic_batch=not static)

    first, placing = trial("bf16", 4), trial("bf16", 6)
    queue = [trial(p, b) for b in (4, 6) for p in ("fp8-torchao-tensorwise", "fp8-torchao-rowwise")]
    queue.append(trial("fp8-te-delayed", 4))
    later = run_order(warm_group_key(first), stack_stage(first), [placing, *queue])
    ahead = compile_ahead(trial_config(first), [trial_config(t) for t in later], 1)
    assert [(c.precision, c.batch_size) for c in ahead] == [
        ("bf16", 4),
        ("fp8-torchao-tensorwise", 4),
        ("fp8-torchao-rowwise", 4),
        ("fp8-torchao-rowwise", 6),
    ]


def test_a_set_of_graphs_another_group_of_the_node_compiles_ahead_is_left_to_it():
    first, later = config("fp32"), [config("bf16"), config("fp32", 4, dynamic=False), config("bf16", 4)]
    taken = {compiled_graphs(config("bf16", 8))}
    assert compile_ahead(first, later, 1, taken) == (first, later[1])
    assert compile_ahead(later[0], later[1:], 1, taken) == (later[0], later[1])  # a group's own first set is its own


def test_two_groups_of_one_node_compile_ahead_no_set_of_graphs_twice_and_share_its_cores(monkeypatch):
    """A 2-GPU node, three precisions queued: the first group compiles the sets of the trials it may run after its
    own (its queue), the second only what the first left, and each rank's side processes get half the node's cores;
    a group on another node compiles what it runs itself."""
    from clusters.schema import ClusterProfile
    from sweep.execution.groups import warm_group_key
    from sweep.execution.rank_group import GroupState, RankGroup
    from sweep.execution.scheduler import Scheduler
    from trainer import precompile

    profile = ClusterProfile.model_validate(
        {"name": "two", "accelerator": "cpu", "ray_address": "auto", "nodes": 2, "gpus_per_node": 2}
    )
    scheduler = Scheduler(profile, precompile=True)
    tw = "fp8-torchao-tensorwise"
    trials = [tiny_trial(precision=p, compile="regional", gpus=1) for p in ("fp32", "bf16", tw, "fp32")]
    scheduler.queue = trials[2:]

    def group(first, node: str) -> RankGroup:
        node_info = {"node_id": node, "ip": "10.0.0.1", "port": 1, "hostname": node, "pid": 1}
        return RankGroup(key=warm_group_key(first), pg=None, ready_ref=None, first=first, nodes=[node_info])

    one, two = group(trials[0], "a"), group(trials[1], "a")  # one starting its first trial, two waiting for placement
    one.state = GroupState.STARTING
    scheduler.groups = [one, two]
    assert [c.precision for c in scheduler._ahead(one, trials[0])] == ["fp32", "bf16", tw]
    two.state, scheduler.queue = GroupState.STARTING, []
    assert scheduler._ahead(two, trials[1]) == ()  # its own set alone is left: it compiles it as its trial starts
    scheduler.queue = trials[2:3]
    assert [c.precision for c in scheduler._ahead(group(trials[0], "b"), trials[0])] == ["fp32", tw]

    monkeypatch.delenv(precompile.SIDES_ENV, raising=False)
    monkeypatch.setattr(precompile, "usable_cpus", lambda: 32)
    counts = (precompile.side_count(20), precompile.side_count(20, node_groups=2), precompile.side_count(20, 8))
    assert counts == (16, 8, 0)  # one per 2 of the node's cores each group may use; none below 8 of them


def test_graphs_marked_as_in_the_cache_are_not_compiled_ahead_again(monkeypatch, tmp_path):
    from trainer.precompile import mark, unmarked

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    bf16, fp32, fp32_static = config("bf16"), config("fp32"), config("fp32", 4, dynamic=False)
    assert unmarked((bf16, fp32, fp32_static)) == (bf16, fp32, fp32_static)
    mark(config("bf16", 8))  # a symbolic batch: one mark for every batch size of the graphs
    assert unmarked((bf16, fp32, fp32_static)) == (fp32, fp32_static)
    mark(config("fp32", 8, dynamic=False))  # a static batch marks its own size only
    assert unmarked((fp32, fp32_static)) == (fp32, fp32_static)
    mark(fp32)
    assert unmarked((bf16, fp32, fp32_static)) == ()  # one set left: the trial compiles it as fast itself
    assert sorted(p.parent.name for p in tmp_path.rglob("*") if p.is_file()) == ["sweep-compiled"] * 3


def test_the_reduced_copy_keeps_what_the_graphs_depend_on():
    from trainer.precompile import REDUCED_LAYERS, reduced
    from trainer.side_sets import SMALL_VOCAB

    big = dataclasses.replace(
        config(), model_spec_json=REGISTRY["llama-tiny"].model_copy(update={"n_layers": 6}).to_json()
    )
    small = reduced(dataclasses.replace(big, memory_cap_bytes=2**30, auto_max=(3, 5), profiled=True))
    spec, full = (
        ModelSpec.model_validate_json(small.model_spec_json),
        ModelSpec.model_validate_json(big.model_spec_json),
    )
    assert full.vocab_size > SMALL_VOCAB  # the blocks' copy: a cut vocabulary and an eager loss, whose graph is apart
    assert (spec.n_layers, spec.vocab_size, small.compiled_loss) == (REDUCED_LAYERS, SMALL_VOCAB, False)
    assert spec.model_copy(update={"n_layers": 6, "vocab_size": full.vocab_size}) == full
    assert (small.warmup_steps, small.measure_steps, small.memory_cap_bytes, small.auto_max, small.profiled) == (
        1,
        1,
        None,
        None,
        False,
    )
    assert dataclasses.replace(
        small, model_spec_json="", warmup_steps="auto", measure_steps="auto", compiled_loss=True
    ) == dataclasses.replace(big, model_spec_json="")


@pytest.mark.parametrize("options", [{"loss": "chunked"}, {"fp8_lm_head": True}], ids=["chunked-loss", "fp8-head"])
def test_a_loss_that_is_not_a_graph_of_its_own_keeps_the_vocabulary_in_the_copy(options):
    """A chunked loss is computed inside the model, with the head; an FP8 head makes logits no plain head makes."""
    from trainer.precompile import reduced

    big = dataclasses.replace(config(), options=TrainingOptions(**options))
    small = reduced(big)
    assert ModelSpec.model_validate_json(small.model_spec_json).vocab_size == REGISTRY["llama-tiny"].vocab_size
    assert small.compiled_loss


def test_side_processes_one_per_two_cores_none_below_eight_and_the_env_decides(monkeypatch):
    from trainer import precompile

    monkeypatch.delenv(precompile.SIDES_ENV, raising=False)
    monkeypatch.setattr(precompile, "usable_cpus", lambda: 16)
    assert (precompile.side_count(9), precompile.side_count(3)) == (8, 3)
    monkeypatch.setattr(precompile, "usable_cpus", lambda: 7)
    assert precompile.side_count(8) == 0  # a few processes compiling everything: slower than the trial itself
    monkeypatch.setenv(precompile.SIDES_ENV, "1")
    assert precompile.side_count(8) == 1
    monkeypatch.setenv(precompile.SIDES_ENV, "0")
    assert precompile.start((config(),), "cpu") is None


def test_each_side_process_may_use_the_ranks_cores_for_compile_workers_unless_the_env_says(monkeypatch):
    from trainer import precompile

    monkeypatch.delenv(precompile.THREADS_ENV, raising=False)
    monkeypatch.setattr(precompile, "usable_cpus", lambda: 16)
    assert (precompile.side_threads(1), precompile.side_threads(2), precompile.side_threads(32)) == (16, 8, 1)
    assert precompile.side_threads(1, given="4") == 4  # the ranks' environment (a profile's env)
    monkeypatch.setenv(precompile.THREADS_ENV, "12")
    assert precompile.side_threads(1) == 12


def test_a_side_process_that_fails_is_reported_and_costs_only_its_time(monkeypatch, tmp_path):
    from trainer import precompile

    monkeypatch.setenv(precompile.SIDES_ENV, "1")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    sides = precompile.start((config("no-such-recipe"), config("no-such-recipe", 4, dynamic=False)), "cpu")
    assert sides is not None
    report = sides.wait(limit_s=120)
    assert (report.graphs, report.compiled) == (2, 0)
    assert len(report.errors) == 2 and all("no-such-recipe" in e for e in report.errors)
    assert len(report.seconds) == 2 and all(0 <= s < report.waited_s for s in report.seconds)  # each set's own
    assert report.peak_bytes == (None, None)  # neither ran
    assert not (tmp_path / precompile.MARKS).exists()  # nothing compiled, nothing marked


def test_a_side_process_reports_each_sets_seconds_and_peak_memory(monkeypatch, tmp_path):
    """What the first trial's wait went to (printed with SWEEP_COMPILE_REPORT): two eager copies, so that the side
    process's run is seconds on a CPU, not a compile."""
    from trainer import precompile

    monkeypatch.setenv(precompile.SIDES_ENV, "1")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    sides = precompile.start((config("fp32", compile="none"), config("bf16", compile="none")), "cpu")
    assert sides is not None and len(sides.procs) == 1
    report = sides.wait(limit_s=120)
    assert (report.graphs, report.compiled, report.errors) == (2, 2, ())
    assert len(report.seconds) == 2 and sum(report.seconds) < report.waited_s
    assert len(report.peak_bytes) == 2 and all(b > 0 for b in report.peak_bytes)  # the step's resident set, on a CPU
    (imported, began, ended), second = report.spans  # when: its imports, then each set, one after the other
    assert imported <= began < ended <= second[1] < second[2] <= report.began_at + report.waited_s
    assert report.alone == 0  # both fitted beside each other
    assert re.search(r"\(imports [+-]\d+\.\d, set [+-]\d+\.\d to \+\d+\.\d\)", report.line())


_PICKLE_MEMORY_FORMAT = """
import sys, types, pickle
if {shim}:  # a module that reaches torch, imported before it (as Ray imports cython.cimports.libc in its workers)
    shim = types.ModuleType("a_shim")
    sys.modules["a_shim"] = shim
import torch
if {shim}:
    shim.torch = torch
if {ours}:
    import trainer.parallelize
print(pickle.dumps(torch.contiguous_format).hex())
"""


def _pickled(shim: bool, ours: bool) -> str:
    code = _PICKLE_MEMORY_FORMAT.format(shim=shim, ours=ours)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return out.stdout.strip()


def test_a_memory_format_pickles_the_same_whatever_the_process_imported():
    """Inductor's FX graph cache key pickles each input's memory format: without trainer.parallelize's reducer, pickle
    names it by the first module in sys.modules that reaches it, so two processes keyed the same graph apart."""
    assert _pickled(shim=True, ours=False) != _pickled(shim=False, ours=False)  # the bug, as torch has it
    assert _pickled(shim=True, ours=True) == _pickled(shim=False, ours=True)


GRID = {
    "models": ["gpt-tiny"],  # its block compiles faster than llama-tiny's (18 s against 25 s, one CPU thread)
    "precisions": ["fp32", "bf16"],
    "batch_sizes": [2],
    "seq_len": 32,
    "gpus": 1,
    "compile": "regional",
    "steps": {"warmup": 1, "measure": 2},
}


def _run(folder: Path, name: str, *options: str, cache: str, env: dict[str, str] | None = None, **grid) -> list[dict]:
    """`sweep run` of GRID (+ `grid`) on one-rank CPU ranks with the compile cache `cache` (one side process each;
    `env` added to the profile's), one trial at a time: both on one group (the session's Ray would give each its own
    group, compiling its own)."""
    profile = folder / f"{name}-profile.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "name": "ahead",
                "accelerator": "cpu",
                "ray_address": "local",
                "nodes": 1,
                "gpus_per_node": 1,
                "cpus_per_rank": 1,
                "compile_cache": str(folder / cache),
                "env": {"SWEEP_PRECOMPILE_SIDES": "1", **(env or {})},  # this 2-core host would run none by default
            }
        )
    )
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**GRID, **grid}))
    result = invoke(
        "run", path, "--cluster", profile, "--output", folder / name, "--no-progress", "--max-concurrent", "1", *options
    )
    assert result.exit_code == 0, result.output
    return sorted(ds.dataset(folder / name, format="parquet").to_table().to_pylist(), key=lambda r: r["started_at"])


def _compile_reports() -> list[str]:
    """The first trials' lines on what they waited for (SWEEP_COMPILE_REPORT) in the session's Ray worker logs."""
    from ray._private import worker

    logs = Path(worker._global_node.get_logs_dir_path())
    lines = (line for path in logs.glob("worker-*.err") for line in path.read_text(errors="replace").splitlines())
    return [line for line in lines if "for side processes" in line]


@pytest.mark.integration
def test_a_group_compiles_its_graphs_ahead_and_trains_as_without(ray_session, tmp_path):
    report = {"SWEEP_COMPILE_REPORT": "1", "SWEEP_PRECOMPILE_THREADS": "1"}  # what the first trial waited for
    ahead = _run(tmp_path, "ahead", cache="cache", env=report)  # compiling ahead: the default
    first, second = ahead
    said = _compile_reports()
    one_set = r"[\d.]+ s / [\d.]+ GiB \(imports [+-][\d.]+, set [+-][\d.]+ to \+[\d.]+\)"
    four_sets = rf"waited [\d.]+ s for side processes \(each set's seconds / peak memory: {', '.join([one_set] * 4)}\)"
    assert len(said) == 1 and re.search(four_sets, said[0]), said
    assert all(r["status"] == "ok" for r in ahead), [r["error"] for r in ahead]
    # its own blocks and the other precision's, then each one's loss (fp32's logits and bf16's: two graphs)
    assert first["precompile_s"] > 0 and first["precompiled_graphs"] == 4
    assert second["precompile_s"] is None and second["actor_reused"]
    # every graph each trial ran (blocks and loss, forward and backward) came from the cache
    assert [(r["compile_cache_hits"], r["compile_cache_misses"]) for r in ahead] == [(4, 0), (4, 0)]

    # again on that cache: its marks say every graph is there, so no side process starts; the trials find them
    again = _run(tmp_path, "again", cache="cache")
    assert all(r["precompile_s"] is None and r["compile_cache_misses"] == 0 for r in again)
    # without the marks, --no-precompile is what starts none
    shutil.rmtree(tmp_path / "cache" / "sweep-compiled")
    off = _run(tmp_path, "off", "--no-precompile", cache="cache")
    assert all(r["precompile_s"] is None and r["compile_cache_misses"] == 0 for r in off)

    # the grid key turns it off too, here on an empty cache: each trial compiles its own graphs and trains the same
    alone = _run(tmp_path, "alone", cache="empty", precompile=False)
    assert all(r["precompile_s"] is None and r["compile_cache_misses"] == 4 for r in alone)
    for a, b in zip(ahead, alone):
        assert (a["precision"], a["loss_curve"]) == (b["precision"], b["loss_curve"])


@pytest.mark.integration
def test_static_batches_compile_their_blocks_and_losses_apart_and_each_trial_finds_them(ray_session, tmp_path):
    """`dynamic_batch: false`: each batch size is its own blocks and its own loss (logits of its own shape), four sets
    (trainer.side_sets), here in two side processes, each batch's in one: the first trial waits for its own (and for
    the other only if that one is done too), the second for what is left; both find every graph in the cache."""
    sides = {"SWEEP_PRECOMPILE_SIDES": "2", "SWEEP_PRECOMPILE_THREADS": "1", "SWEEP_COMPILE_REPORT": "1"}
    grid = {"precisions": ["bf16"], "batch_sizes": [2, 3], "dynamic_batch": False}
    rows = _run(tmp_path, "static", cache="cache", env=sides, **grid)
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows]
    first, second = rows
    said = _compile_reports()
    assert (first["batch_size"], first["precompile_s"] > 0) == (2, True)
    # the two waits saw every set once: the second waited only if a set was left
    compiled = first["precompiled_graphs"] + (second["precompiled_graphs"] or 0)
    assert compiled == 4 and (second["precompile_s"] is None) == (first["precompiled_graphs"] == 4), (rows, said)
    assert [(r["compile_cache_hits"], r["compile_cache_misses"]) for r in rows] == [(4, 0), (4, 0)]
