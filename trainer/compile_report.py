"""SWEEP_COMPILE_REPORT=1: a benchmark's diagnosis of where a rank's compile seconds went, on rank 0's stderr.

After each trial: what its compilation hit and missed in inductor's caches (dynamo's counters), dynamo's compile
seconds by phase, and every Triton kernel inductor benchmarked its configs of (at a kernel's first run, unless
inductor's autotune cache held its best config): the kernel, forward or backward, what the autotune cache said, how
many configs it ran, and `remembered` where trainer.autotune_store served the timings an earlier process measured
instead. benchmarks/device/cold_sweep.sh collects the lines (benchmarks/RESULTS.md "Cold sweep": each rowwise trial
benchmarked 7 kernels on a warm cache, inductor's halved-RBLOCK copies, until the store kept them).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.result import RankResult

REPORT_ENV = "SWEEP_COMPILE_REPORT"

_benchmarked: list[str] = []  # the kernels benchmarked since the last report, in order (`watch_benchmarks`)


def enabled() -> bool:
    """Whether this process reports (REPORT_ENV set)."""
    return bool(os.environ.get(REPORT_ENV))


def compile_phases(top: int = 24) -> dict[str, float]:
    """Dynamo's compile seconds by phase (`dynamo_timed`) since the last call, each summed over the compiles, largest
    first; dynamo's counters and timings restart (benchmarks/device/kernels_probe.py records them per variant)."""
    from torch._dynamo import utils

    headers, values = utils.compile_times(repr="csv", aggregate=True)
    phases = {h: round(float(str(v)), 3) for h, v in zip(headers, values) if v not in ("", None)}  # csv: strings
    utils.counters.clear()
    utils.compilation_time_metrics.clear()
    return dict(sorted(phases.items(), key=lambda kv: -kv[1])[:top])


def benchmarked(kernel: Any) -> str:
    """One benchmarked kernel (inductor's CachingAutotuner), as the report names it: name, fw or bw, the autotune
    cache's state for it, the configs it ran, the first characters of its source file's hash."""
    state = (getattr(kernel, "autotune_cache_info", None) or {}).get("autotune_cache_state", "-")
    name = kernel.inductor_meta.get("kernel_name", "?")
    source = os.path.basename(getattr(kernel, "filename", None) or "")[:10]
    return f"{name}:{'bw' if getattr(kernel, 'is_backward', False) else 'fw'}:{state}:{len(kernel.launchers)}:{source}"


def watch_benchmarks() -> None:
    """Record every kernel inductor benchmarks in this process from now on (`benchmarked`); once per process."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    from trainer import autotune_store

    autotune_store.install()  # first, so that this sees what the store serves (the trial would install it after)
    original = CachingAutotuner.benchmark_all_configs
    if getattr(original, "sweep_watched", False):
        return

    def watched(self: Any, *args: Any, **kwargs: Any) -> Any:
        timings = original(self, *args, **kwargs)
        # after the call: trainer.autotune_store marks a kernel whose timings it kept from an earlier process
        _benchmarked.append(benchmarked(self) + (":remembered" if getattr(self, "sweep_remembered", False) else ""))
        return timings

    watched.sweep_watched = True  # type: ignore[attr-defined]
    CachingAutotuner.benchmark_all_configs = watched  # type: ignore[method-assign]


def report() -> str:
    """The report of the trial that just ran (its caches, phases and benchmarked kernels), printed on stderr; the
    counters restart for the next trial."""
    from torch._dynamo.utils import counters

    caches = {group: dict(counters[group]) for group in ("aot_autograd", "inductor", "stats", "recompiles")}
    kernels = f"benchmarked {len(_benchmarked)} kernels: {' '.join(_benchmarked)}"
    _benchmarked.clear()
    text = f"sweep compile report: {caches}\n{compile_phases()}\n{kernels}"
    print(text, file=sys.stderr, flush=True)
    return text


def trial_phases(spans: tuple[float, ...], result: RankResult, collect_s: float | None = None) -> str:
    """A trial's seconds in its rank by phase (`trainer.worker`'s clock readings `spans`): the imports, the join, the
    wait for side processes, the run (its model build, its steps, and the rest: the meter, barriers, peak memory), the
    result, and the release and count between trials (`trainer.release.settle`; `collect_s` of it its collection)."""
    gaps = [later - earlier for earlier, later in zip(spans, spans[1:])]
    steps = sum(result.step_times) + sum(result.warmup_times)
    build = result.model_build_s or 0.0
    collection = "" if collect_s is None else f" (collection {collect_s:.3f})"
    return (
        f"sweep trial phases: imports {gaps[0]:.3f}, join {gaps[1]:.3f}, sides {gaps[2]:.3f}, run {gaps[3]:.3f} "
        f"(build {build:.3f}, steps {steps:.3f}, rest {gaps[3] - build - steps:.3f}), result {gaps[4]:.3f}, "
        f"settle {gaps[5]:.3f} s{collection}"
    )
