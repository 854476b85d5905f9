"""Rank processes started ahead (`prestarted_ranks`, sweep.execution.prestart, trainer.preload).

The profile key and what the Ray that sweep starts is given (pure); the preload itself in a process that imports it
as Ray's worker does; then `sweep run` as its own process, as a user starts it, with the key set (on a CPU profile its
default is off) and 0: a real embedded Ray, real FSDP2 ranks on gloo. Nothing is mocked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from conftest import tiny_grid

from clusters import load_profile
from clusters.errors import ProfileError
from sweep.execution.outcome import imported_before
from sweep.execution.prestart import Prestart
from sweep.record import store
from trainer import preload, side_pool

ROOT = Path(__file__).resolve().parents[1]


def _profile(tmp_path: Path, **keys) -> Path:
    body = {"name": "mine", "accelerator": "cpu", "ray_address": "local", "nodes": 1, "gpus_per_node": 2, **keys}
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


# -- the profile key ---------------------------------------------------------------------------------------------
def test_auto_is_two_groups_of_ranks_on_gpu_and_none_on_cpu_and_zero_is_off(tmp_path):
    assert load_profile(str(_profile(tmp_path))).prestart_count == 0
    gpu = _profile(tmp_path, accelerator="h200", gpus_per_node=4)
    assert load_profile(str(gpu)).prestart_count == 8
    assert load_profile(str(_profile(tmp_path, prestarted_ranks=0))).prestart_count == 0
    assert load_profile(str(_profile(tmp_path, prestarted_ranks=5))).prestart_count == 5
    # fewer than a node's ranks would leave every group one process short: a node's ranks at least
    assert load_profile(str(_profile(tmp_path, prestarted_ranks=1))).prestart_count == 2
    # a cluster sweep joins was started by its owner: nothing to start ahead, auto says so quietly
    joined = _profile(tmp_path, accelerator="h200", ray_address="auto", gpus_per_node=8)
    assert load_profile(str(joined)).prestart_count == 0


@pytest.mark.parametrize(
    ("value", "said"),
    [(-1, "whole number >= 0"), ("2", "whole number >= 0"), (True, "whole number >= 0")],
)
def test_a_value_that_is_not_a_count_is_refused(tmp_path, value, said):
    with pytest.raises(ProfileError, match=said):
        load_profile(str(_profile(tmp_path, prestarted_ranks=value)))


def test_a_count_on_a_running_cluster_says_it_cannot_be_done_there(tmp_path):
    joined = _profile(tmp_path, accelerator="h200", ray_address="auto", gpus_per_node=8, prestarted_ranks=4)
    with pytest.raises(ProfileError, match="only by the Ray that sweep starts"):
        load_profile(str(joined))


def test_the_plan_of_a_profile_with_a_bad_count_is_one_line_and_exit_2(cli, write_grid, tmp_path):
    grid = write_grid(tiny_grid())
    result = cli("plan", grid, "--cluster", _profile(tmp_path, prestarted_ranks=-3))
    assert result.exit_code == 2 and "prestarted_ranks" in result.output and "Traceback" not in result.output


# -- what Ray is given -----------------------------------------------------------------------------------------
def test_ray_is_given_the_preload_the_counts_and_the_ranks_environment_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    prestart = Prestart.of(load_profile(str(_profile(tmp_path, prestarted_ranks=3))))
    assert prestart is not None
    try:
        env = prestart.env()
        assert env["RAY_preload_python_modules"] == "trainer.preload"
        assert env["RAY_worker_maximum_startup_concurrency"] == "3"
        # its CPUs (2 ranks x 1) plus the processes kept idle: Ray's default limit would kill those
        assert prestart.ray_cpus == 2 and env["RAY_num_workers_soft_limit"] == "5"
        assert prestart.expected == 2, "Ray starts no more idle workers than its CPUs"
        # what a rank actor's own environment carried before: Ray gives such an actor a new process
        assert env["TORCHINDUCTOR_CACHE_DIR"] == "/home/someone/.cache/sweep/inductor"
        assert env["OMP_NUM_THREADS"] == "1" and env["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "1"
        assert env[preload.MARKS_ENV] == str(prestart.marks) and prestart.marks.is_dir()
        assert env[side_pool.FOLDER_ENV] == str(prestart.pool)  # where the side processes started ahead wait
    finally:
        prestart.close()
    assert not prestart.marks.exists()
    assert not prestart.pool.exists()
    assert Prestart.of(load_profile(str(_profile(tmp_path, prestarted_ranks=0)))) is None


def test_on_a_node_of_one_rank_whose_run_compiles_inductor_is_imported_ahead_too(tmp_path):
    def flag(compiles: bool, **keys) -> str | None:
        prestart = Prestart.of(load_profile(str(_profile(tmp_path, prestarted_ranks=1, **keys))), compiles=compiles)
        assert prestart is not None
        prestart.close()
        return prestart.env().get(preload.ONE_DEVICE_ENV)

    assert flag(True, gpus_per_node=1) == "1"
    assert flag(False, gpus_per_node=1) is None  # nothing compiles: seconds of CPU in each process for nothing
    assert flag(True, gpus_per_node=2) is None  # which of two GPUs: Ray says once an actor is placed


def test_on_a_node_of_one_rank_the_runs_torchao_is_imported_ahead(tmp_path, monkeypatch):
    def backends(precisions: set[str], gpus_per_node: int = 1) -> str | None:
        profile = load_profile(str(_profile(tmp_path, prestarted_ranks=1, gpus_per_node=gpus_per_node)))
        prestart = Prestart.of(profile, precisions=precisions)
        assert prestart is not None
        prestart.close()
        return prestart.env().get(preload.BACKENDS_ENV)

    assert backends({"bf16", "fp8-torchao-rowwise", "fp8-torchao-tensorwise"}) == "torchao"
    assert backends({"bf16", "fp32"}) is None
    assert backends({"fp8-torchao-rowwise"}, gpus_per_node=2) is None  # its import starts the driver: which GPU?
    monkeypatch.setenv(preload.BACKENDS_ENV, "torchao")
    assert preload.modules()[-1] == "torchao.float8"
    assert preload.preload(preload.modules()).failed is None


def test_a_preloaded_process_freezes_what_its_imports_made():
    import gc

    assert preload.preload().failed is None  # what a preloaded process has imported (run alone, this test had less)
    try:
        preload.settle_imports()
        assert gc.get_freeze_count() > 100_000 and len(gc.get_objects()) < 1000  # torch's objects out of sight
    finally:
        gc.unfreeze()


def test_the_side_processes_started_ahead_take_the_profiles_counts(tmp_path):
    """SWEEP_PRECOMPILE_SIDES and SWEEP_PRECOMPILE_THREADS in a profile's env set the side processes the run starts
    ahead and their compile workers."""
    from test_precompile import config

    from trainer.precompile import SIDES_ENV, THREADS_ENV

    graphs = tuple(config(precision) for precision in ("bf16", "fp32", "fp8-torchao-tensorwise"))
    env = {SIDES_ENV: "2", THREADS_ENV: "7"}
    prestart = Prestart.of(load_profile(str(_profile(tmp_path, prestarted_ranks=1, gpus_per_node=1, env=env))), graphs)
    assert prestart is not None
    prestart.close()
    assert (prestart.sides, prestart.side_threads, len(prestart.jobs)) == (2, 7, 2)
    # three trials' blocks and two losses (bf16's and torchao's logits are the same: trainer.side_sets)
    assert [len(job.sets) for job in prestart.jobs] == [3, 2]


def test_the_wait_ends_on_the_marks_on_a_stop_or_at_its_limit(tmp_path):
    prestart = Prestart.of(load_profile(str(_profile(tmp_path, prestarted_ranks=2))))
    assert prestart is not None and prestart.expected == 2
    try:
        assert prestart.wait(stopped=lambda: False, limit_s=0.2) >= 0.2  # nothing ready: the limit
        assert prestart.late(prestart.ready()).startswith("0 of 2 rank processes started ahead were ready after")
        assert prestart.wait(stopped=lambda: True, limit_s=60) < 1  # Ctrl-C: at once
        for pid in ("101", "102"):
            (prestart.marks / pid).touch()
        assert prestart.ready() == 2 and prestart.wait(stopped=lambda: False, limit_s=60) < 1
    finally:
        prestart.close()


def test_a_group_was_ready_before_placement_only_if_every_rank_had_imported_by_then():
    placed = datetime(2026, 12, 5, 8, 0, 10, tzinfo=timezone.utc)
    at = placed.timestamp()
    assert imported_before([{"preloaded_at": at - 3}, {"preloaded_at": at - 1}], placed) is True
    assert imported_before([{"preloaded_at": at - 3}, {"preloaded_at": at + 0.5}], placed) is False
    assert imported_before([{"preloaded_at": at - 3}, {"preloaded_at": None}], placed) is False
    assert imported_before([{"pid": 7}], placed) is False  # a process Ray started without the preload
    assert imported_before([], placed) is None and imported_before([{"preloaded_at": at}], None) is None


# -- the preload ---------------------------------------------------------------------------------------------
def test_the_preload_stops_at_the_first_module_that_fails_and_says_which(tmp_path, monkeypatch):
    (tmp_path / "first_ok.py").write_text("VALUE = 1\n")
    (tmp_path / "broken_one.py").write_text("raise ImportError('its own reason')\n")
    (tmp_path / "never_reached.py").write_text("VALUE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    done = preload.preload(["first_ok", "broken_one", "never_reached"])
    assert done.failed == "broken_one: ImportError: its own reason"
    assert "first_ok" in sys.modules and "never_reached" not in sys.modules
    assert done.device_started is False


def test_a_process_that_started_its_device_while_importing_ahead_may_not_train(monkeypatch):
    preload.check()  # nothing preloaded in this process: nothing to say
    started = preload.Preloaded(finished_at=0.0, seconds=1.0, failed=None, device_started=True)
    monkeypatch.setattr(preload, "DONE", started)
    with pytest.raises(RuntimeError, match="prestarted_ranks: 0"):
        preload.check()
    monkeypatch.setenv(preload.ONE_DEVICE_ENV, "1")  # a node of one rank: the one GPU there is, whenever it started
    preload.check()
    assert preload.modules() == preload.MODULES + preload.INDUCTOR_MODULES


@pytest.mark.parametrize("one_device", [False, True])
def test_a_worker_imports_the_trainer_without_starting_a_device_and_leaves_its_mark(tmp_path, sweep_env, one_device):
    """As Ray's default_worker.py imports it: everything a rank's first trial imports before its model, not inductor
    (its runtime starts the CUDA driver on a GPU host) unless on a node of one rank, no Transformer Engine, no device,
    and the mark the driver waits for."""
    code = (
        "import sys; sys.argv = ['/x/ray/_private/workers/default_worker.py']\n"
        "import json, torch, trainer.preload as p\n"
        "print(json.dumps({'failed': p.DONE.failed, 'device': p.DONE.device_started, 'seconds': p.DONE.seconds,\n"
        "  'missing': [m for m in p.MODULES if m not in sys.modules], 'cuda': torch.cuda.is_initialized(),\n"
        "  'inductor': 'torch._inductor.runtime.triton_heuristics' in sys.modules,\n"
        "  'te': 'transformer_engine' in sys.modules, 'pid': __import__('os').getpid()}))\n"
    )
    env = {**sweep_env(), preload.MARKS_ENV: str(tmp_path), **({preload.ONE_DEVICE_ENV: "1"} if one_device else {})}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["failed"] is None and seen["missing"] == [] and seen["seconds"] > 0
    assert seen["device"] is False and seen["cuda"] is False and seen["te"] is False
    assert seen["inductor"] is one_device
    assert [p.name for p in tmp_path.iterdir()] == [str(seen["pid"])]


def test_importing_the_module_elsewhere_preloads_nothing():
    # the driver imports it for its constants: only a worker Ray started runs the imports
    assert preload.DONE is None and os.path.basename(sys.argv[0]) != "default_worker.py"


# -- through `sweep run`, its own embedded Ray -----------------------------------------------------------------
def _sweep_run(grid: Path, profile: Path, out: Path, env: dict[str, str], *options: str) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-m", "sweep", "run", grid, "--cluster", profile, "--output", out, "--no-progress", *options],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = store.read_table(out).to_pylist()
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows]
    return sorted(rows, key=lambda r: r["started_at"])


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_groups_take_the_ranks_started_ahead_until_none_is_left(write_grid, tmp_path, sweep_env):
    """Two one-rank processes started ahead, three one-rank trials each on fresh processes (`reuse_actors: false`),
    one at a time: the first two groups find theirs imported before placement (the second one's kept idle while the
    first trained), the third starts its own once placed."""
    grid = write_grid(tiny_grid(precisions=["fp32"], gpus=1, batch_sizes=[2, 4, 6], reuse_actors=False))
    profile = _profile(tmp_path, prestarted_ranks=2)
    rows = _sweep_run(grid, profile, tmp_path / "out", sweep_env(), "--max-concurrent", "1")
    assert [r["imported_before_placement"] for r in rows] == [True, True, False]
    assert all(r["actor_reused"] is False and r["import_s"] is not None for r in rows)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_with_none_started_ahead_each_rank_starts_once_placed(write_grid, tmp_path, sweep_env):
    grid = write_grid(tiny_grid(precisions=["fp32"], gpus=2, batch_sizes=[2, 4]))
    rows = _sweep_run(grid, _profile(tmp_path, prestarted_ranks=0), tmp_path / "out", sweep_env())
    first, warm = rows
    assert first["imported_before_placement"] is False and first["group_trial_index"] == 0
    assert warm["imported_before_placement"] is None and warm["group_trial_index"] == 1  # started nothing


def test_a_preloaded_process_computes_inductors_once_a_process_cache_keys():
    """Where inductor was imported ahead, `settle_imports` leaves torch's and Triton's keys computed (the first
    compile's AOTAutograd and FX graph cache keys ask for both; Triton's hashes its 415 MB library): computed, a
    `prefetchable_cache` refuses a value set again."""
    script = (
        "import torch._inductor.codecache as codecache\n"
        "from trainer import preload\n"
        "preload.settle_imports()\n"
        "for key in preload.CACHE_KEYS:\n"
        "    try:\n"
        "        getattr(codecache, key).set(None)\n"
        "    except RuntimeError:\n"
        "        print(key, 'computed')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["torch_key computed", "triton_key computed"]
