"""The compile report (SWEEP_COMPILE_REPORT, trainer.compile_report): which kernels inductor benchmarked a trial.

Triton kernels run on a GPU only, so the kernel here is one shaped as inductor's CachingAutotuner: the report's
wrapping of the autotuner's benchmark (installed once, the original still called) is what is tested.
"""

from types import SimpleNamespace

from trainer import compile_report


def test_the_report_names_each_kernel_inductor_benchmarked_then_starts_again(monkeypatch, capsys):
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    from trainer import autotune_store

    calls = []
    monkeypatch.setattr(CachingAutotuner, "benchmark_all_configs", lambda self, *a: calls.append(a) or "timings")
    monkeypatch.setattr(CachingAutotuner, autotune_store.INSTALLED, True, raising=False)  # the report alone here
    compile_report.watch_benchmarks()
    compile_report.watch_benchmarks()  # a second trial of the rank: still one record per benchmark
    kernel = SimpleNamespace(
        inductor_meta={"kernel_name": "triton_red_fused_0"},
        autotune_cache_info={"autotune_cache_state": "miss"},
        is_backward=True,
        launchers=[object()] * 3,
        filename="/cache/ab/cabcdef0123456789.py",
    )
    assert CachingAutotuner.benchmark_all_configs(kernel, "args") == "timings" and calls == [("args",)]
    assert "benchmarked 1 kernels: triton_red_fused_0:bw:miss:3:cabcdef012" in compile_report.report()
    assert "benchmarked 0 kernels: " in compile_report.report()
    assert "sweep compile report: " in capsys.readouterr().err


def test_a_trials_phases_add_up_to_its_wall_in_the_rank():
    """The report's line of where a trial's seconds went in its rank (compile_report.trial_phases): the run less its
    build and every step (warm-up too) is the rest, the meter's stop, barriers and peak memory."""
    from trainer.result import RankResult

    result = RankResult(status="ok", step_times=[0.5, 0.5], warmup_times=[2.0, 0.5], model_build_s=0.25)
    line = compile_report.trial_phases((10.0, 10.0, 10.5, 10.5, 14.5, 14.625, 14.75), result, 0.0625)
    assert line == (
        "sweep trial phases: imports 0.000, join 0.500, sides 0.000, run 4.000 (build 0.250, steps 3.500, "
        "rest 0.250), result 0.125, settle 0.125 s (collection 0.062)"
    )
