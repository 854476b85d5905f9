"""Inductor's benchmark of a kernel's configs, remembered across processes (trainer.autotune_store).

Triton's autotuner runs on a GPU only, so the benchmark here is a stand-in with the same contract ({launcher: timing}
for the object's `launchers`); what is tested is the wrapping installed on inductor's real CachingAutotuner: the same
winner without a second benchmark, a new benchmark wherever what decides the timings differs, and the compile report
telling the two apart. The seconds it saves are measured on the device (benchmarks/RESULTS.md "Cold sweep").
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from trainer import autotune_store, compile_report


class Launcher:
    """One compiled config of a kernel (hashed by identity, as inductor's launchers are)."""

    def __init__(self, config: str) -> None:
        self.config = config


class Kernel:
    """What the wrapping reads of a CachingAutotuner: its source file and its launchers' configs."""

    def __init__(
        self, filename: str | None = "/cache/ab/cabcdef0123.py", configs: tuple[str, ...] = ("R 2048", "R 1024")
    ):
        self.filename = filename
        self.launchers = [Launcher(c) for c in configs]
        self.inductor_meta = {"kernel_name": "triton_red_fused_0"}


@pytest.fixture
def benchmarks(monkeypatch, tmp_path):
    """inductor's benchmark replaced by one that counts its calls (the second config faster), then the store installed
    over it with inductor's cache in `tmp_path`."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    calls: list[str] = []

    def benchmark(self, *args, **kwargs):
        calls.append(self.filename)
        return {launcher: 1.0 / (i + 1) for i, launcher in enumerate(self.launchers)}

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(CachingAutotuner, "benchmark_all_configs", benchmark)
    monkeypatch.setattr(CachingAutotuner, autotune_store.INSTALLED, False, raising=False)
    autotune_store.install()
    autotune_store.install()  # once per process, however often called
    return SimpleNamespace(
        calls=calls, run=CachingAutotuner.benchmark_all_configs, folder=tmp_path / autotune_store.STORE
    )


def winner(timings: dict) -> str:
    return min(timings, key=timings.get).config


def test_a_second_process_keeps_the_first_ones_winner_without_benchmarking(benchmarks):
    x = torch.empty(4, 4096, dtype=torch.bfloat16)
    first = benchmarks.run(Kernel(), x, 4096)
    assert benchmarks.calls == ["/cache/ab/cabcdef0123.py"] and winner(first) == "R 1024"
    (kept,) = benchmarks.folder.iterdir()
    assert json.loads(kept.read_text()) == {"configs": ["R 2048", "R 1024"], "timings": [1.0, 0.5]}

    again = Kernel()  # the same kernel in a later process: a new autotuner object, the same key
    timings = benchmarks.run(again, torch.empty(4, 4096, dtype=torch.bfloat16), 4096)
    assert benchmarks.calls == ["/cache/ab/cabcdef0123.py"]  # no second benchmark
    assert winner(timings) == "R 1024" and list(timings.values()) == [1.0, 0.5]
    assert again.sweep_remembered


@pytest.mark.parametrize(
    "kernel, args",
    [
        (Kernel(), (torch.empty(6, 4096, dtype=torch.bfloat16), 4096)),  # another batch
        (Kernel(), (torch.empty(4, 4096, dtype=torch.float32), 4096)),  # another dtype
        (Kernel(), (torch.empty(4096, 4).t(), 4096)),  # other strides
        (Kernel(), (torch.empty(4, 4096, dtype=torch.bfloat16), 2048)),  # another size argument
        (Kernel("/cache/cd/cdeadbeef99.py"), (torch.empty(4, 4096, dtype=torch.bfloat16), 4096)),  # another source
        (Kernel(configs=("R 2048", "R 512")), (torch.empty(4, 4096, dtype=torch.bfloat16), 4096)),  # other configs
    ],
)
def test_whatever_decides_the_timings_differs_benchmarks_again(benchmarks, kernel, args):
    benchmarks.run(Kernel(), torch.empty(4, 4096, dtype=torch.bfloat16), 4096)
    benchmarks.run(kernel, *args)
    assert len(benchmarks.calls) == 2 and not hasattr(kernel, "sweep_remembered")


def test_what_it_cannot_key_or_read_is_benchmarked_as_inductor_would(benchmarks):
    benchmarks.run(Kernel(filename=None), 1)  # no source file: nothing to key it by
    benchmarks.run(Kernel(configs=("R 2048",)), 1)  # one launcher: inductor does not benchmark it, nor does this
    assert len(benchmarks.calls) == 2 and not benchmarks.folder.exists()
    benchmarks.run(Kernel(), 1)
    (kept,) = benchmarks.folder.iterdir()
    kept.write_text("{not json")  # torn or foreign: benchmarked again, and kept whole this time
    benchmarks.run(Kernel(), 1)
    assert len(benchmarks.calls) == 4 and json.loads(kept.read_text())["timings"] == [1.0, 0.5]


def test_a_cache_that_cannot_be_written_costs_only_the_next_benchmark(benchmarks, monkeypatch, tmp_path):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "file"))  # a file where the folder would be
    assert winner(benchmarks.run(Kernel(), 1)) == "R 1024"
    assert winner(benchmarks.run(Kernel(), 1)) == "R 1024" and len(benchmarks.calls) == 2


def test_the_compile_report_tells_a_remembered_kernel_from_a_benchmarked_one(benchmarks, monkeypatch):
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    monkeypatch.setattr(compile_report, "_benchmarked", [])
    compile_report.watch_benchmarks()  # after the store, as a rank installs them (trainer.worker._run_counted)
    for kernel in (Kernel(), Kernel()):
        kernel.is_backward, kernel.autotune_cache_info = True, {"autotune_cache_state": "only 1 config"}
        CachingAutotuner.benchmark_all_configs(kernel, 1)
    kernels = "triton_red_fused_0:bw:only 1 config:2:cabcdef012"
    assert f"benchmarked 2 kernels: {kernels} {kernels}:remembered" in compile_report.report()
    assert len(benchmarks.calls) == 1


def test_under_trials_a_side_process_takes_kept_timings_and_keeps_none_of_its_own(benchmarks, monkeypatch):
    """SWEEP_AUTOTUNE_STORE=trials: what a side process measures beside the others (a shared GPU) decides nothing
    later; a trial's own benchmark is kept, and a side process then takes it."""
    monkeypatch.setenv(autotune_store.MODE_ENV, "trials")
    monkeypatch.setattr(autotune_store, "_side_process", True)
    benchmarks.run(Kernel(), 1)
    assert len(benchmarks.calls) == 1 and not benchmarks.folder.exists()  # measured, not kept
    monkeypatch.setattr(autotune_store, "_side_process", False)  # a trial's process
    benchmarks.run(Kernel(), 1)
    assert len(benchmarks.calls) == 2 and len(list(benchmarks.folder.iterdir())) == 1
    monkeypatch.setattr(autotune_store, "_side_process", True)
    side = Kernel()
    assert winner(benchmarks.run(side, 1)) == "R 1024" and side.sweep_remembered and len(benchmarks.calls) == 2


def test_by_default_a_side_process_keeps_none_of_what_it_measures_and_under_all_it_does(benchmarks, monkeypatch):
    monkeypatch.delenv(autotune_store.MODE_ENV, raising=False)
    monkeypatch.setattr(autotune_store, "_side_process", True)
    benchmarks.run(Kernel(), 1)
    assert len(benchmarks.calls) == 1 and not benchmarks.folder.exists()
    monkeypatch.setenv(autotune_store.MODE_ENV, "all")  # the side processes' timings kept too
    benchmarks.run(Kernel(), 1)
    later = Kernel()  # another side process's run of the same kernel takes what the first kept
    benchmarks.run(later, 1)
    assert len(benchmarks.calls) == 2 and later.sweep_remembered


def test_off_installs_nothing_and_an_unknown_mode_names_the_choices(monkeypatch):
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    def benchmark(self, *args, **kwargs):
        return {}

    monkeypatch.setattr(CachingAutotuner, "benchmark_all_configs", benchmark)
    monkeypatch.setattr(CachingAutotuner, autotune_store.INSTALLED, False, raising=False)
    monkeypatch.setenv(autotune_store.MODE_ENV, "off")
    autotune_store.install()
    assert CachingAutotuner.benchmark_all_configs is benchmark
    monkeypatch.setenv(autotune_store.MODE_ENV, "sides")
    with pytest.raises(ValueError, match="SWEEP_AUTOTUNE_STORE='sides' is not one of all, trials, off"):
        autotune_store.install()


def test_a_side_process_says_so_before_its_job(monkeypatch, tmp_path):
    """trainer.precompile.main, the side processes' entry (piped or started ahead), marks the process first."""
    from trainer import precompile, side_pool

    monkeypatch.setattr(autotune_store, "_side_process", False)
    monkeypatch.delenv(autotune_store.MODE_ENV, raising=False)
    monkeypatch.setattr(precompile, "_die_with_parent", lambda: None)  # not this test process
    monkeypatch.setattr(side_pool, "await_job", lambda pool: None)  # a run that ended before it claimed a job
    monkeypatch.setattr("sys.argv", ["precompile", "--pool", str(tmp_path)])
    precompile.main()
    assert autotune_store._side_process and not autotune_store.keeps()  # by default it keeps nothing it measures
    monkeypatch.setenv(autotune_store.MODE_ENV, "all")
    assert autotune_store.keeps()


@pytest.mark.integration
def test_a_compiled_trial_installs_it_as_it_starts_and_an_eager_one_does_not(monkeypatch, rank_jobs):
    """Not on import (inductor's runtime module starts the CUDA driver on a GPU host, which a preloaded rank must not:
    tests/test_prestart.py), but as a trial that compiles starts: a rank's, or a side process's blocks set."""
    from test_train import _one_rank_group
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    from trainer.models.specs import REGISTRY
    from trainer.release import release
    from trainer.train import run_trial

    monkeypatch.setattr(CachingAutotuner, autotune_store.INSTALLED, False, raising=False)
    monkeypatch.setattr(CachingAutotuner, "benchmark_all_configs", CachingAutotuner.benchmark_all_configs)
    steps = {"warmup_steps": 1, "measure_steps": 1}
    (eager,) = rank_jobs(REGISTRY["gpt-tiny"], "fp32", compile="none", **steps)
    (compiled,) = rank_jobs(REGISTRY["gpt-tiny"], "fp32", compile="regional", **steps)
    with _one_rank_group() as rank:
        try:
            run_trial(eager.trial, rank)
            assert not getattr(CachingAutotuner, autotune_store.INSTALLED)
            run_trial(compiled.trial, rank)
            assert getattr(CachingAutotuner, autotune_store.INSTALLED)
        finally:  # the compiled code a warm rank keeps for a later trial (trainer.release): not for other tests'
            release(rank.device)


@pytest.mark.integration
def test_a_profile_s_unknown_store_mode_fails_its_compiled_trial_naming_the_choices(
    ray_session, cli, write_grid, tmp_path
):
    """SWEEP_AUTOTUNE_STORE from the profile's env reaches the ranks (as the docs show it set): a compiled trial is an
    error row that names the choices (an eager one never reads it: it benchmarks no kernel)."""
    from conftest import tiny_grid

    from sweep.record import store

    profile = tmp_path / "cpu.yaml"
    profile.write_text(
        "name: cpu\naccelerator: cpu\nray_address: local\nnodes: 1\ngpus_per_node: 2\ncpus_per_rank: 1\n"
        f"compile_cache: {tmp_path / 'cache'}\nenv: {{{autotune_store.MODE_ENV}: sides}}\n"
    )
    grid = write_grid(tiny_grid(gpus=2, compile="regional", precisions=["fp32"]))
    out = tmp_path / "out"
    result = cli("run", grid, "--cluster", profile, "--output", out, "--no-progress")
    assert result.exit_code == 3, result.output  # nothing measured
    (row,) = store.read_table(out).to_pylist()
    assert row["status"] == "error" and "SWEEP_AUTOTUNE_STORE='sides' is not one of all, trials, off" in row["error"]
