"""Warm groups: rank processes that run trial after trial (sweep.execution.scheduler), and when they must not.

Through `sweep run` / `sweep max-batch` on the session's real Ray: FSDP2 over gloo, 2 CPU ranks, tiny models.
A grid runs on one group with the losses of fresh processes; an OOM, a killed rank or `--fresh-actors` (grid
`reuse_actors: false`) gives the next trial fresh processes. The worker's own report (the real RankWorker in
spawned processes, no Ray) shows each trial giving back every byte of tensor memory it held.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import types

import pytest
from conftest import tiny_trial

# /proc helpers of the fault tests: a rank found among this process's descendants by its Ray title
from test_faults import _alive, _not_master, _rank_workers, _training_ranks, _wait_for  # noqa: E402

from sweep.record import store

pytestmark = pytest.mark.integration

GRID = """
models: [gpt-tiny, llama-tiny, {arch: gpt, name: gpt-wide, n_layers: 1, d_embd: 128, n_heads: 4, vocab_size: 512}]
precisions: [bf16]
batch_sizes: [2]
compile: none
seq_len: 32
gpus: 2
steps: {warmup: 1, measure: 3}
"""
# Logits dominate memory (B x T x V floats): 64 rows run out of 128 MiB per rank, 2 and 4 fit (tests/test_oom.py)
WIDE_VOCAB = "{arch: gpt, name: wide-vocab, n_layers: 1, d_embd: 64, n_heads: 4, vocab_size: 4096, max_seq_len: 128}"


def _rows(out) -> list[dict]:
    return sorted(store.read_table(out).to_pylist(), key=lambda r: r["started_at"])


def _losses(rows) -> dict:
    return {(r["model"], r["batch_size"]): (r["loss_first"], r["loss_last"]) for r in rows}


@pytest.mark.timeout(240)
def test_a_grid_runs_on_one_warm_group_with_the_losses_of_fresh_processes(ray_session, cli, write_grid, tmp_path):
    """The fresh processes are the grid's own `reuse_actors: false` (`--fresh-actors` has the tests below)."""
    grid, no_reuse = write_grid(GRID), write_grid(GRID + "reuse_actors: false\n", "no-reuse.yaml")
    one, fresh, two = tmp_path / "one-group", tmp_path / "fresh", tmp_path / "two-groups"
    for path, out, *options in (
        (grid, one, "--max-concurrent", 1),
        (no_reuse, fresh),  # two at once, and the third trial still on fresh processes
        (grid, two),
    ):
        result = cli("run", path, "--cluster", "local", "--output", out, "--no-progress", *options)
        assert result.exit_code == 0, result.output

    warm = _rows(one)
    assert [r["status"] for r in warm] == ["ok"] * 3, [r["error"] for r in warm]
    # one group, trial after trial, whatever the model: its processes ran them all
    assert [r["group_trial_index"] for r in warm] == [0, 1, 2]
    assert [r["actor_reused"] for r in warm] == [False, True, True]
    # the first starts the group; the group then takes the smaller model first (sweep.execution.groups.footprint)
    assert [r["model"] for r in warm] == ["gpt-tiny", "llama-tiny", "gpt-wide"]
    assert warm[1]["n_params"] < warm[2]["n_params"]

    cold = _rows(fresh)
    assert [(r["status"], r["actor_reused"], r["group_trial_index"]) for r in cold] == [("ok", False, 0)] * 3
    # each trial trains exactly as in a process where nothing ran before it
    assert _losses(warm) == _losses(cold)

    # several groups at once where the cluster has room (4 CPUs, 2 ranks a trial): two fresh ones, overlapping,
    # and the third trial on one of them
    both = _rows(two)
    assert sorted(r["group_trial_index"] for r in both) == [0, 0, 1], both
    first, second = [r for r in both if r["group_trial_index"] == 0]
    assert first["started_at"] < second["finished_at"] and second["started_at"] < first["finished_at"]
    assert all(r["actor_reused"] == (r["group_trial_index"] > 0) for r in both)
    assert _losses(both) == _losses(cold)

    # the groups left idle at the end are gone with their run: no rank process, no placement group
    _wait_for(lambda: not _rank_workers(os.getpid(), "ray::RankWorker"), 30, "the idle groups' ranks to exit")
    from ray.util import placement_group_table

    assert {pg["state"] for pg in placement_group_table().values()} <= {"REMOVED"}


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "gpus, limit", [(1, ("--max-concurrent", 1)), (4, ())], ids=["one-at-a-time", "placement-waits"]
)
def test_a_warm_group_takes_the_smallest_trial_of_its_kind_first(ray_session, cli, write_grid, tmp_path, gpus, limit):
    """The first trial starts the group (the oldest: placement stays in submission order); the group then runs
    the rest smallest first, so the one likeliest to run out of memory (and retire the group) comes last
    (sweep.execution.groups.footprint). Also when the next trial's placement was already requested and waits for the
    group's CPUs (4-rank trials on 4 CPUs, no --max-concurrent): the group, once idle, still picks the
    smallest, not the waiting one."""
    profile = write_grid(
        "name: four-ranks\naccelerator: cpu\nray_address: local\nnodes: 1\ngpus_per_node: 4\ncpus_per_rank: 1\n",
        "four-ranks.yaml",
    )
    grid = write_grid(
        "models: [gpt-tiny]\nprecisions: [fp32]\nbatch_sizes: [2, 4, 1, 3]\ncompile: none\nseq_len: 32\n"
        f"gpus: {gpus}\nsteps: {{warmup: 1, measure: 1}}\n"
    )
    out = tmp_path / "out"
    result = cli("run", grid, "--cluster", profile, "--output", out, "--no-progress", *limit)
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    assert [(r["batch_size"], r["status"], r["group_trial_index"]) for r in rows] == [
        (2, "ok", 0),
        (1, "ok", 1),
        (3, "ok", 2),
        (4, "ok", 3),
    ], [r["error"] for r in rows]


def test_an_oom_retires_the_group_and_the_next_trial_runs_on_a_fresh_one(ray_session, cli, write_grid, tmp_path):
    """A group runs plain torch first, smallest first: batch 2, then 64, which runs out of memory in the group's
    second trial and retires it; torchao batch 2 then runs on fresh processes (and its 64 runs out there)."""
    grid = write_grid(
        f"models: [{WIDE_VOCAB}]\nprecisions: [bf16, fp8-torchao-tensorwise]\nbatch_sizes: [2, 64]\n"
        "compile: none\nseq_len: 128\ngpus: 2\nsteps: {warmup: 1, measure: 1}\non_oom: {policy: none}\n"
    )
    out = tmp_path / "out"
    result = cli(
        "run",
        grid,
        "--cluster",
        "local",
        "--memory-cap",
        "128MiB",
        "--output",
        out,
        "--max-concurrent",
        1,
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    assert [(r["precision"], r["batch_size"], r["status"], r["group_trial_index"]) for r in rows] == [
        ("bf16", 2, "ok", 0),
        ("bf16", 64, "oom", 1),
        ("fp8-torchao-tensorwise", 2, "ok", 0),
        ("fp8-torchao-tensorwise", 64, "oom", 1),
    ], [r["error"] for r in rows]
    assert [r["actor_reused"] for r in rows] == [False, True, False, True]
    assert all("allocat" in r["error"] for r in rows if r["status"] == "oom")


@pytest.mark.timeout(180)
def test_plain_torch_then_torchao_share_a_group_with_the_losses_of_fresh_processes(
    ray_session, cli, write_grid, tmp_path
):
    """torchao's float8 conversion patches inductor for its whole process (sweep.execution.groups.STACKS), so a group
    runs plain torch first, also the group placed for a torchao trial listed first (sweep.execution.groups.opener), then
    torchao on the same processes: one group start, not two, and each trial trains as in processes where
    nothing ran before it."""
    grid = write_grid(
        "models: [gpt-tiny]\nprecisions: [fp8-torchao-tensorwise, bf16]\nbatch_sizes: [2]\n"
        "compile: none\nseq_len: 32\ngpus: 2\nsteps: {warmup: 1, measure: 2}\n"
    )
    warm_out, fresh_out = tmp_path / "warm", tmp_path / "fresh"
    for out, options in ((warm_out, ("--max-concurrent", 1)), (fresh_out, ("--fresh-actors",))):
        result = cli("run", grid, "--cluster", "local", "--output", out, "--no-progress", *options)
        assert result.exit_code == 0, result.output
    warm, fresh = _rows(warm_out), _rows(fresh_out)
    assert [(r["precision"], r["status"], r["group_trial_index"]) for r in warm] == [
        ("bf16", "ok", 0),
        ("fp8-torchao-tensorwise", "ok", 1),
    ], [r["error"] for r in warm]
    assert [(r["status"], r["group_trial_index"]) for r in fresh] == [("ok", 0)] * 2
    by_precision = lambda rows: {r["precision"]: (r["loss_first"], r["loss_last"]) for r in rows}  # noqa: E731
    assert by_precision(warm) == by_precision(fresh)


def test_max_batch_finds_the_same_limit_on_warm_and_on_fresh_processes(ray_session, cli, tmp_path):
    """A warm process's CPU cap (RLIMIT_DATA from its size at the trial's start) is no looser than a fresh one's:
    the fitting probes run on one group, each OOM retires it, and the largest batch is the same. (Not always in
    as many probes: the search predicts from peak memory, and a fresh process's first trial counts the
    process's own first-use growth in its CPU peak.)

    A batch row here is ~11 MiB. The cap sits between batch 8's need and batch 9's, a few MiB from each: a fresh
    process may legitimately need a few MiB more, what its first trial's kernels allocate for the process's life
    beyond the first-use warm-up (trainer/memory.py), and a Ray thread started in a trial on a loaded machine takes
    ~1 MiB more. The needs move between hosts by a few MiB, so the cap is the middle of the gap: on 2026-12-05's
    2-core host (`sweep run` of batches [8, 9, 10] at a cap, warm and `--fresh-actors`) batch 8 fit at 91 MiB, not
    at 88; batch 9 fit a warm process at 100 and a fresh one at 104, neither at 96 (the cap was 100 MiB then, and
    the warm search found 9 where the fresh one found 8). An earlier host needed 95-96 MiB for batch 8 and
    106-108 for batch 9."""
    verdicts, rows = {}, {}
    for name, options in (("warm", ()), ("fresh", ("--fresh-actors",))):
        out = tmp_path / name
        result = cli(
            "max-batch",
            "--model",
            "gpt-tiny",
            "--precision",
            "bf16",
            "--gpus",
            "1",
            "--seq-len",
            "1024",
            "--compile",
            "none",
            "--warmup",
            "0",
            "--measure",
            "1",
            "--memory-cap",
            "94MiB",
            "--cluster",
            "local",
            "--output",
            out,
            "--no-progress",
            *options,
        )
        assert result.exit_code == 0, result.output
        (verdict,) = json.loads(next((out / "_search").glob("*.json")).read_text())
        verdicts[name] = verdict["max_batch"]
        rows[name] = _rows(out)
        # `sweep max-batch` ends at a limit it probed both sides of: the largest batch fits, the next does not
        status = {r["batch_size"]: r["status"] for r in rows[name]}
        assert status[verdicts[name]] == "ok" and status[verdicts[name] + 1] == "oom", (name, status)
    assert verdicts["warm"] == verdicts["fresh"]
    assert not any(r["actor_reused"] for r in rows["fresh"])
    warm = rows["warm"]
    assert any(r["actor_reused"] for r in warm)
    # a probe after an OOM starts fresh processes; one after a fitting probe runs on the same ones
    for before, after in zip(warm, warm[1:]):
        assert after["actor_reused"] == (before["status"] == "ok"), [(r["batch_size"], r["status"]) for r in warm]


@pytest.mark.timeout(150)
def test_an_idle_group_runs_its_kind_first_then_gives_way_to_a_trial_that_needs_its_cpus(
    ray_session, cli, write_grid, tmp_path
):
    """The session's Ray has 4 CPUs; the trials are queued 1 rank, 4 ranks, 1 rank, 4 ranks. After the first, its
    idle group takes the other 1-rank trial although a 4-rank one is ahead of it (taking the queue strictly in
    order would start a group for every trial); then, nothing of its kind left, it gives way to the 4-rank
    trial it blocks (else the sweep waits for ever), and every trial runs, two groups in all."""
    profile = write_grid(
        "name: four-ranks\naccelerator: cpu\nray_address: local\nnodes: 1\ngpus_per_node: 4\ncpus_per_rank: 1\n",
        "four-ranks.yaml",
    )
    grid = write_grid(
        "models: [gpt-tiny]\nprecisions: [fp32]\nbatch_sizes: [2]\ncompile: none\nseq_len: [32, 64]\n"
        "gpus: [1, 4]\nsteps: {warmup: 1, measure: 2}\n"
    )
    out = tmp_path / "out"
    result = cli("run", grid, "--cluster", profile, "--output", out, "--max-concurrent", 1, "--no-progress")
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    assert [(r["seq_len"], r["world_size"], r["status"], r["group_trial_index"]) for r in rows] == [
        (32, 1, "ok", 0),
        (64, 1, "ok", 1),
        (32, 4, "ok", 0),
        (64, 4, "ok", 1),
    ], [r["error"] for r in rows]


@pytest.mark.timeout(180)
def test_a_rank_killed_mid_trial_retires_its_group(ray_session, cli, write_grid, tmp_path):
    # ~100 steps of a few tens of ms: the kill lands in the second trial's steps, on the warm group
    grid = write_grid(
        "models: [gpt-tiny]\nprecisions: [fp32]\nbatch_sizes: [2, 3]\ncompile: none\nseq_len: 32\n"
        "gpus: 2\nsteps: {warmup: 1, measure: 100}\n"
    )
    out = tmp_path / "out"
    results = []
    sweep = threading.Thread(
        target=lambda: results.append(
            cli("run", grid, "--cluster", "local", "--output", out, "--max-concurrent", 1, "--no-progress")
        ),
        daemon=True,
    )
    sweep.start()

    _wait_for(lambda: store.result_files(out), 120, "the first trial's row")
    workers = _wait_for(lambda: _training_ranks(os.getpid(), 2), 60, "the second trial's ranks to train")
    victim = _not_master(workers)
    (peer,) = set(workers) - {victim}
    os.kill(victim, signal.SIGKILL)

    sweep.join(timeout=150)
    assert not sweep.is_alive(), "the sweep did not finish after a rank was killed"
    assert results[0].exit_code == 0, results[0].output
    rows = _rows(out)
    assert [(r["batch_size"], r["status"], r["group_trial_index"]) for r in rows] == [
        (2, "ok", 0),
        (3, "error", 1),
        (3, "ok", 0),
    ], [r["error"] for r in rows]
    failed, retry = rows[1:]
    assert failed["actor_reused"] and f"of 2 died (pid {victim} on " in failed["error"], failed["error"]
    assert retry["parent_trial_id"] == failed["trial_id"] and not retry["actor_reused"]
    # the group is gone: its surviving rank was killed with it, not kept for the retry
    _wait_for(lambda: not _alive(peer), 30, "the killed rank's peer to exit")


# -- what the worker reports: tensor memory back to the baseline after each trial --------------------------


def _warm_rank(jobs: list, queue) -> None:
    """One rank's process running `jobs` one after the other on one warm RankWorker. A job whose model is named
    'leaky' leaves a tensor behind, as a library holding on to a trial's state would. With each result: the objects
    the process froze (trainer.release.settle) and those a full collection still traverses."""
    import gc

    import torch

    from trainer.worker import RankWorker

    worker, kept = RankWorker(keep_group=True), []
    for job in jobs:
        result = worker.run(job)
        if '"name":"leaky"' in job.trial.model_spec_json.replace(" ", ""):
            kept.append(torch.ones(1 << 20))
        queue.put((job.rank, result, (gc.get_freeze_count(), len(gc.get_objects()))))


def test_each_trial_gives_back_the_memory_its_process_held_before(rank_jobs, run_ranks):
    from sweep.execution.groups import returned_to_baseline
    from trainer.models.specs import REGISTRY

    leaky = REGISTRY["gpt-tiny"].model_copy(update={"name": "leaky"})
    trials = [
        rank_jobs(REGISTRY["llama-tiny"], "bf16", world_size=2, compile="regional", grad_accum=2),
        rank_jobs(REGISTRY["gpt-tiny"], "fp32", world_size=2, batch_size=3),
        rank_jobs(leaky, "fp32", world_size=2),
        rank_jobs(REGISTRY["gpt-tiny"], "fp32", world_size=2),
    ]
    reports = run_ranks(_warm_rank, [[jobs[rank] for jobs in trials] for rank in range(2)], timeout=240)
    by_rank = {rank: [r for k, r, _ in reports if k == rank] for rank in range(2)}
    for _, _, (frozen, traversed) in reports:
        # the imports (torch, dynamo, inductor after the compiled trial) are out of every later collection's sight:
        # a full one traverses what trials made since, a fraction of the process's objects
        assert frozen > 100_000 and traversed < frozen / 2, (frozen, traversed)
    for results in by_rank.values():
        assert [r.status for r in results] == ["ok"] * 4, [r.error for r in results]
        assert len({r.baseline_bytes for r in results}) == 1  # the group's, from before its first trial
        compiled, plain, leaking, after_leak = results
        # a compiled trial and a plain one each hold nothing more once they end
        assert compiled.held_bytes <= compiled.baseline_bytes and plain.held_bytes <= plain.baseline_bytes
        # the leak happened after the third trial reported: the fourth sees its 4 MiB and says so
        assert leaking.held_bytes <= leaking.baseline_bytes
        assert after_leak.held_bytes >= after_leak.baseline_bytes + 4 * 2**20
    assert returned_to_baseline([by_rank[r][1] for r in range(2)])
    assert not returned_to_baseline([by_rank[r][3] for r in range(2)])


@pytest.mark.gpu
def test_on_a_gpu_each_trial_gives_back_its_allocated_memory(rank_jobs, run_ranks):
    """CUDA's own count: allocated bytes back to the baseline after a compiled bf16 trial (cuBLAS workspaces,
    inductor's kernels), a torchao float8 one and a plain fp32 one, on one rank (NCCL)."""
    import torch

    from trainer.models.specs import REGISTRY

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA/ROCm GPU")
    spec = REGISTRY["llama-tiny"]
    trials = [
        rank_jobs(spec, "bf16", device_type="cuda", compile="regional", seq_len=128),
        rank_jobs(spec, "fp8-torchao-tensorwise", device_type="cuda", compile="regional", seq_len=128),
        rank_jobs(spec, "fp32", device_type="cuda", seq_len=128),
    ]
    reports = [result for _, result in run_ranks(_warm_rank, [[jobs[0] for jobs in trials]], timeout=300)]
    assert [r.status for r in reports] == ["ok"] * 3, [r.error for r in reports]
    assert [r.held_bytes - r.baseline_bytes for r in reports] == [0, 0, 0]


def test_release_frees_the_workspaces_transformer_engine_caches(monkeypatch):
    """TE keeps its cuBLAS workspaces in `functools.lru_cache`s of `transformer_engine.pytorch.cpp_extensions.gemm`
    (TE 2.20): release() clears them, or every TE trial would leave its group 32 MiB above the baseline. TE
    does not import without CUDA: a module laid out as TE's stands in for it here; the GPU test below runs TE."""
    import functools

    import torch

    from trainer.release import held_bytes, release

    gemm = types.ModuleType("transformer_engine.pytorch.cpp_extensions.gemm")
    workspace = functools.lru_cache(maxsize=None)(lambda device: torch.empty(1 << 22, dtype=torch.uint8))
    gemm.get_cublas_workspace = workspace
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", types.ModuleType("transformer_engine.pytorch"))
    monkeypatch.setitem(sys.modules, gemm.__name__, gemm)
    cpu = torch.device("cpu")
    release(cpu)
    before = held_bytes(cpu)
    gemm.get_cublas_workspace(0)
    assert held_bytes(cpu) >= before + (1 << 22)
    release(cpu)
    assert gemm.get_cublas_workspace.cache_info().currsize == 0 and held_bytes(cpu) <= before


@pytest.mark.gpu
def test_on_a_gpu_transformer_engine_trials_give_back_their_memory(rank_jobs, run_ranks):
    """Two TE trials on one warm rank each end at the baseline: before release() cleared TE's cached cuBLAS
    workspaces, each ended 32.0 MiB above it on an H200 and retired its group (RESULTS.md, session 10)."""
    import torch

    from sweep.execution.groups import KEPT_BYTES_ALLOWED
    from trainer.models.specs import REGISTRY

    if not torch.cuda.is_available() or torch.version.hip:
        pytest.skip("needs an NVIDIA GPU")
    spec = REGISTRY["llama-tiny"]
    trials = [
        rank_jobs(spec, "fp8-te-delayed", device_type="cuda", compile="regional", seq_len=128),
        rank_jobs(spec, "bf16-te", device_type="cuda", seq_len=128),
    ]
    reports = [result for _, result in run_ranks(_warm_rank, [[jobs[0] for jobs in trials]], timeout=300)]
    assert [r.status for r in reports] == ["ok"] * 2, [r.error for r in reports]
    # TE keeps a few scale bytes process-wide (3072 and 512 B on an H200, session 10): within what a group may keep
    assert all(0 <= r.held_bytes - r.baseline_bytes <= KEPT_BYTES_ALLOWED for r in reports), reports


# -- pure rules --------------------------------------------------------------------------------------------


def test_a_group_stays_warm_over_a_library_cache_but_not_over_a_trials_leftovers():
    from sweep.execution.groups import KEPT_BYTES_ALLOWED, returned_to_baseline
    from trainer.result import RankResult

    def rank(held: int | None) -> RankResult:
        return RankResult(status="ok", baseline_bytes=base, held_bytes=held)

    base = 5 << 30
    assert returned_to_baseline([rank(base + 3072), rank(base + KEPT_BYTES_ALLOWED)])
    assert not returned_to_baseline([rank(base), rank(base + 32 * 2**20 + 1024)])
    assert not returned_to_baseline([rank(None)])  # a rank that could not say


def test_one_group_runs_trials_of_one_shape_cap_and_process_family():
    from sweep.execution.groups import warm_group_key
    from trainer.models.specs import REGISTRY

    same = [
        tiny_trial(),
        tiny_trial(batch_size=8, model=REGISTRY["llama-tiny"], compile="regional"),
        tiny_trial(precision="fp32"),
        tiny_trial(precision="fp8-torchao-tensorwise"),
    ]
    assert len({warm_group_key(t) for t in same}) == 1
    for other in (tiny_trial(gpus=1), tiny_trial(memory_cap_bytes=2**30), tiny_trial(precision="fp8-te-delayed")):
        assert warm_group_key(other) != warm_group_key(tiny_trial())
    assert warm_group_key(tiny_trial(precision="fp8-te-delayed")) == warm_group_key(tiny_trial(precision="bf16-te"))


def test_a_group_picks_plain_torch_before_torchao_then_the_smallest_and_never_goes_back():
    from sweep.execution.groups import pick, warm_group_key

    key = warm_group_key(tiny_trial())
    small, large = tiny_trial(batch_size=4), tiny_trial(batch_size=8)
    fp8_tiny, fp8_large = (tiny_trial(precision="fp8-torchao-tensorwise", batch_size=b) for b in (1, 16))
    te = tiny_trial(precision="fp8-te-delayed", batch_size=1)
    queue = [fp8_large, large, te, fp8_tiny, small]
    assert pick(key, 0, queue) is small  # stage 0 first (the smaller torchao and TE trials wait), smallest first
    assert pick(key, 0, [fp8_large, fp8_tiny, te]) is fp8_tiny
    assert pick(key, 1, [small, large, te]) is None  # torchao ran in it: plain torch needs fresh processes
    assert pick(warm_group_key(te), 0, queue) is te
    twin = tiny_trial(batch_size=4, seq_len=32)  # the same footprint as `small`: the oldest of equals
    assert pick(key, 0, [twin, small]) is twin and pick(key, 0, [small, twin]) is small


def test_a_group_runs_static_shape_trials_after_the_batches_that_share_compiled_graphs():
    """torchao tensorwise batches 4 and 6 (a symbolic batch) and rowwise 4 and 6 (static shapes): the static ones
    wait for tensorwise 6, which runs the graphs tensorwise 4 compiled; a static trial would drop them first."""
    from sweep.execution.groups import pick, stack_stage, warm_group_key

    compiled = dict(compile="regional", seq_len=4096)
    tensorwise = [tiny_trial(precision="fp8-torchao-tensorwise", batch_size=b, **compiled) for b in (4, 6)]
    rowwise = [
        tiny_trial(precision="fp8-torchao-rowwise", batch_size=b, dynamic_batch=False, **compiled) for b in (4, 6)
    ]
    queue = [tensorwise[0], rowwise[0], tensorwise[1], rowwise[1]]  # the grid's order: precisions at each batch
    key, stage = warm_group_key(tensorwise[0]), stack_stage(tensorwise[0])
    order = []
    while queue:
        order.append(pick(key, stage, queue))
        queue.remove(order[-1])
    assert order == [*tensorwise, *rowwise]
    eager = [tiny_trial(batch_size=b, dynamic_batch=False) for b in (2, 4)]  # nothing compiled: nothing to drop
    assert pick(warm_group_key(eager[0]), 0, [eager[1], tiny_trial(batch_size=3)]).batch_size == 3


def test_a_new_group_runs_what_it_was_placed_for_unless_an_earlier_stage_waits():
    from sweep.execution.groups import opener

    placed, large, fp8 = (
        tiny_trial(batch_size=8),
        tiny_trial(batch_size=16),
        tiny_trial(precision="fp8-torchao-tensorwise"),
    )
    te = tiny_trial(precision="fp8-te-delayed")
    assert opener(placed, [large, tiny_trial(batch_size=2)]) is placed  # submission order, not the smallest
    assert opener(fp8, [te, large, placed]) is large  # plain torch first: the oldest of them
    assert opener(te, [placed, fp8]) is te  # another family: not its to run


@pytest.mark.timeout(240)
def test_a_profiled_trial_retires_its_group(ray_session, cli, write_grid, tmp_path):
    # the profiler's hooks stay in a process after a trace and slow the next trial's kernel launches
    grid = write_grid(
        "models: [gpt-tiny]\nbatch_sizes: [2, 4]\ncompile: none\nseq_len: 32\ngpus: 2\nsteps: {warmup: 1, measure: 2}\n"
    )
    out = tmp_path / "out"
    result = cli(
        "run", grid, "--cluster", "local", "--output", out, "--no-progress", "--max-concurrent", 1, "--profile"
    )
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    assert [(r["status"], r["group_trial_index"]) for r in rows] == [("ok", 0), ("ok", 0)], [r["error"] for r in rows]


def test_rows_before_schema_1_6_read_the_new_columns_as_null(tmp_path):
    import pyarrow.parquet as pq

    from sweep.record.schema import VERSION_KEY, to_table

    row = {
        "run_id": "r",
        "trial_id": "t",
        "cluster": "c",
        "model": "m",
        "status": "ok",
        "actor_reused": True,
        "group_trial_index": 3,
    }
    old = to_table([row]).drop_columns(["actor_reused", "group_trial_index"])
    pq.write_table(old.replace_schema_metadata({VERSION_KEY: b"1.5"}), tmp_path / "old.parquet")
    (back,) = store.read_table(tmp_path).to_pylist()
    assert back["actor_reused"] is None and back["group_trial_index"] is None and back["status"] == "ok"
