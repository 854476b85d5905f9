"""Side processes started ahead (trainer.side_pool): real `python -m trainer.precompile --pool` processes on this
machine, taken by a rank (`trainer.precompile.start`) before it starts its own; how many the driver starts
(sweep.execution.prestart, pure); and through `sweep run` with its own Ray, a first trial whose graphs were compiled
by one of them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT
from test_precompile import GRID, config

from clusters import load_profile
from sweep.execution.prestart import Prestart
from sweep.record import store
from trainer import precompile, side_pool
from trainer.side_sets import SideSet


@pytest.fixture
def pool(tmp_path, sweep_env):
    """A folder of side processes started ahead, stopped at the test's end."""
    folder = tmp_path / "pool"
    folder.mkdir()
    started: list[subprocess.Popen] = []

    def spawn(count: int, jobs: tuple = (), **env: str) -> list[subprocess.Popen]:
        procs = side_pool.spawn(folder, count, precompile.side_env({**sweep_env(), **env}, 1), jobs)
        started.extend(procs)
        return procs

    yield folder, spawn
    side_pool.stop(started)


def test_each_side_process_started_ahead_is_taken_by_one_rank_and_given_its_job(pool, monkeypatch, tmp_path):
    folder, spawn = pool
    procs = spawn(3)
    first, second = side_pool.claim(folder, 1), side_pool.claim(folder, 5)
    assert len(first) == 1 and len(second) == 2 and side_pool.claim(folder, 1) == []
    assert {s.pid for s in first + second} == {p.pid for p in procs}

    # a rank's start takes those still free first, then starts its own: here one of each, for two sets of graphs
    for side in second[1:]:
        (folder / f"claimed-{side.pid}").rename(folder / f"free-{side.pid}")
    monkeypatch.setenv(side_pool.FOLDER_ENV, str(folder))
    monkeypatch.setenv(precompile.SIDES_ENV, "2")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    sides = precompile.start((config("no-such-recipe"), config("no-such-recipe", 4, dynamic=False)), "cpu")
    assert sides is not None
    report = sides.wait(limit_s=120)
    assert (report.graphs, report.compiled, report.ahead) == (2, 0, 1)
    assert len(report.errors) == 2 and all("no-such-recipe" in e for e in report.errors), report.errors
    assert (folder / f"done-{second[1].pid}").exists()


def test_side_processes_given_their_graphs_as_they_start_are_waited_for_by_the_first_rank_alone(
    pool, monkeypatch, tmp_path
):
    folder, spawn = pool
    given, started, left = (config("no-such-recipe", n, dynamic=False) for n in (2, 4, 6))
    (handed,) = spawn(1, jobs=(side_pool.SideJob((SideSet(given),), "cpu"),))
    assert (folder / f"given-{handed.pid}").exists() and side_pool.claim(folder, 1) == []  # not a free one
    monkeypatch.setenv(side_pool.FOLDER_ENV, str(folder))
    monkeypatch.setenv(precompile.SIDES_ENV, "1")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    # the rank's own three sets: the one given is left out, the other two go to one side process it starts
    sides = precompile.start((given, started, left), "cpu")
    assert sides is not None and len(sides.procs) == 2
    report = sides.wait(limit_s=120)
    assert (report.graphs, report.compiled, report.ahead, report.given) == (3, 0, 1, 1)
    assert sorted(e.split(":")[0] for e in report.errors) == [f"no-such-recipe batch {n}" for n in (2, 4, 6)]
    assert handed.wait(timeout=60) == 0 and (folder / f"done-{handed.pid}").exists()
    # a later group's first trial finds none given: with one set left to compile ahead, no side process at all
    assert side_pool.claim_given(folder) == [] and precompile.start((given,), "cpu") is None


def test_a_side_process_never_taken_ends_with_its_folder_and_one_that_dies_is_reported(pool):
    folder, spawn = pool
    left, dies = spawn(2)
    taken = side_pool.claim(folder, 2)
    victim = next(s for s in taken if s.pid == dies.pid)
    dies.kill()
    dies.wait()
    out, errors = victim.collect(limit_s=30)
    assert out == "" and len(errors) == 1 and errors[0].startswith("a side process started ahead died")

    for path in folder.iterdir():  # the run ends: its folder goes, and a waiting side process with it
        path.unlink()
    folder.rmdir()
    assert left.wait(timeout=60) == 0


def _profile(tmp_path: Path, **keys) -> Path:
    path = tmp_path / "profile.yaml"
    cpu = {
        "name": "p",
        "accelerator": "cpu",
        "ray_address": "local",
        "nodes": 1,
        "gpus_per_node": 1,
        "cpus_per_rank": 1,
    }
    path.write_text(yaml.safe_dump({**cpu, **keys}))
    return path


def _sides(profile: Path, graphs: tuple) -> int:
    """How many side processes the run of `profile` would start ahead for `graphs` (its folders removed after)."""
    prestart = Prestart.of(load_profile(str(profile)), graphs, node_groups=1)
    assert prestart is not None
    prestart.close()
    return prestart.sides


def _jobs(profile: Path, graphs: tuple) -> tuple:
    """The graphs of each side process the run of `profile` would give its job as it starts it."""
    prestart = Prestart.of(load_profile(str(profile)), graphs, node_groups=1)
    assert prestart is not None
    prestart.close()
    assert all(job.device_type == "cpu" and job.env is None for job in prestart.jobs)
    return tuple(tuple((item.config, item.part) for item in job.sets) for job in prestart.jobs)


def test_the_run_starts_side_processes_for_the_graphs_its_cache_lacks(tmp_path, monkeypatch):
    graphs = (config("bf16"), config("fp32"), config("bf16", 4, dynamic=False))
    default = _profile(tmp_path, prestarted_ranks=1, compile_cache=str(tmp_path / "cache"))
    assert _sides(default, graphs) == precompile.side_count(3)  # none on a host under 8 cores

    with_env = _profile(tmp_path, prestarted_ranks=1, env={precompile.SIDES_ENV: "2"}, compile_cache=str(tmp_path))
    assert _sides(with_env, graphs) == 2
    # one rank a node: they are given the graphs as they start, shared as the rank would share them: each trial's
    # blocks, the first's first, then the losses (trainer.side_sets)
    bf16, fp32, static = graphs
    shared = (
        ((bf16, "blocks"), (static, "blocks"), (fp32, "loss")),
        ((fp32, "blocks"), (bf16, "loss"), (static, "loss")),
    )
    assert _jobs(with_env, graphs) == shared
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    for c in graphs[:2]:
        precompile.mark(c)
    # the marks of what a cache holds are read in the ranks' cache, not the driver's
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "the-drivers"))
    assert _sides(with_env, graphs) == 0
    assert _sides(with_env, ()) == 0
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    two_ranks = _profile(tmp_path, prestarted_ranks=1, gpus_per_node=2, env={precompile.SIDES_ENV: "2"})
    assert _sides(two_ranks, graphs) == 2 and _jobs(two_ranks, graphs) == ()  # which rank's GPU: known once placed


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_first_trial_takes_the_side_processes_the_run_started_ahead(tmp_path, sweep_env):
    """`sweep run` on its own Ray, one rank process and one side process started ahead, given the run's graphs as it
    starts (a node of one rank): the first group takes it, and it compiles the group's graphs (two precisions); both
    trials find them all in the cache."""
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(GRID))
    profile = _profile(
        tmp_path, prestarted_ranks=1, compile_cache=str(tmp_path / "cache"), env={precompile.SIDES_ENV: "1"}
    )
    done = subprocess.run(
        [sys.executable, "-m", "sweep", "run", grid, "--cluster", profile, "--output", tmp_path / "out"]
        + ["--no-progress", "--max-concurrent", "1"],
        cwd=ROOT,
        env=sweep_env(),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = sorted(store.read_table(tmp_path / "out").to_pylist(), key=lambda r: r["started_at"])
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows]
    first, second = rows
    # one rank a node: the side process was given the graphs as it started, not once the rank was placed
    # (four sets: each precision's blocks and its loss)
    assert (first["precompiled_graphs"], first["precompile_sides_ahead"], first["precompile_sides_given"]) == (4, 1, 1)
    assert first["imported_before_placement"] is True and second["precompile_sides_ahead"] is None
    assert [(r["compile_cache_hits"], r["compile_cache_misses"]) for r in rows] == [(4, 0), (4, 0)]
