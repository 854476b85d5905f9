"""One side process's compile (`trainer.precompile`) taken apart, on one GPU: where a set of graphs' seconds go, and
whether a later process finds what it autotuned. Each step runs in a fresh process on one shared, initially empty
compile cache, as the side processes and trials of a cold sweep do; one JSON record per step.

    python3 benchmarks/device/side_compile_probe.py --out FILE [--profile] STEP ...

Each argument is a group of STEPs joined by '+', run at once (as a rank's side processes run); groups run in turn.
A STEP is PRECISION:BATCH (the cold-sweep grid's trial, cut as a side process cuts it: `trainer.precompile.reduced`)
or PRECISION:BATCH:full (the whole trial, as a rank runs it after its side processes); a suffix :nice runs it
at niceness 10. Each record has the step's
seconds, dynamo's compile phases (`trainer.compile_report.compile_phases`), the FX graph and AOTAutograd cache hits and
misses, the Triton kernels whose autotuning was found in inductor's autotune cache or not, and those benchmarked.
--profile: the steps' top functions by own time (cProfile), in the record.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

GRID = Path(__file__).resolve().parents[1] / "campaigns/cold-sweep/a-grid.yaml"


def _config(step: str, grid_file: Path):  # noqa: ANN202 - a TrialConfig
    from sweep import service
    from sweep.execution.placement import trial_config
    from trainer.precompile import reduced

    precision, batch, *full = step.split(":")
    _, _, grid = service.prepare(grid_file, "local", None, {"steps": {"warmup": 2, "measure": 5}})
    trial = next(t for t in grid if t.precision == precision and t.batch_size == int(batch))
    return trial_config(trial) if full else reduced(trial_config(trial))


def _instrument() -> dict[str, collections.Counter]:
    """Count each kernel's autotune-cache state and the kernels benchmarked (torch's inductor runtime, patched)."""
    from torch._inductor.runtime import triton_heuristics as th

    seen: dict[str, collections.Counter] = {"autotune": collections.Counter(), "benchmarked": collections.Counter()}
    check = getattr(th, "check_autotune_cache", None)  # torch 2.11 and 2.13 have it; another may not

    def checked(configs, filename, inductor_meta):  # noqa: ANN001, ANN202
        out = check(configs, filename, inductor_meta)
        seen["autotune"][out[2].get("autotune_cache_state", "none")] += 1
        return out

    if check is not None:
        th.check_autotune_cache = checked
    bench = th.CachingAutotuner.benchmark_all_configs

    def benchmarked(self, *args, **kwargs):  # noqa: ANN001, ANN202
        seen["benchmarked"][f"{self.fn.__name__} {os.path.basename(self.filename or '')[:12]}"] += 1
        return bench(self, *args, **kwargs)

    th.CachingAutotuner.benchmark_all_configs = benchmarked
    return seen


def one(step: str, profile: bool, grid_file: Path, device_type: str) -> dict:
    from torch._dynamo.utils import counters

    from trainer.compile_report import compile_phases
    from trainer.precompile import side_rank
    from trainer.train import run_trial

    if step.endswith(":nice"):  # before inductor starts its compile workers: they inherit it
        os.nice(10)
        step = step.removesuffix(":nice")
    config = _config(step, grid_file)
    seen = _instrument()
    rank = side_rank(device_type)  # as a side process makes itself a rank
    profiler = cProfile.Profile() if profile else None
    began = time.perf_counter()
    if profiler:
        profiler.enable()
    result = run_trial(config, rank)
    if profiler:
        profiler.disable()
    record = {
        "step": step,
        "seconds": round(time.perf_counter() - began, 2),
        "ended_at": round(time.time(), 2),
        "compile_time_s": result.report().compile_time_s,
        "caches": {g: dict(counters[g]) for g in ("aot_autograd", "inductor")},
        "autotune": dict(seen["autotune"]),
        "benchmarked": len(seen["benchmarked"]),
        "benchmarked_kernels": sorted(seen["benchmarked"])[:40],
        "phases": compile_phases(40),
    }
    if profiler:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
        record["profile_tottime"] = text.getvalue().splitlines()[-45:]
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(60)
        record["profile_cumulative"] = text.getvalue().splitlines()[-75:]
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("steps", nargs="+")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--one", action="store_true", help="run the one step given, in this process")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--grid", type=Path, default=GRID)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    if args.one:
        print("RECORD " + json.dumps(one(args.steps[0], args.profile, args.grid, args.device)), flush=True)
        return
    for group in args.steps:
        began = time.perf_counter()
        procs = {}
        for step in group.split("+"):  # a group's steps at once, as a rank's side processes run
            cmd = [sys.executable, __file__, "--one", step, "--grid", str(args.grid), "--device", args.device]
            cmd += ["--profile"] if args.profile else []
            procs[step] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for step, proc in procs.items():
            out, err = proc.communicate()
            lines = [line[7:] for line in out.splitlines() if line.startswith("RECORD ")]
            record = json.loads(lines[0]) if lines else {"step": step, "error": err[-3000:]}
            record.update(group=group, process_s=round(time.perf_counter() - began, 2))
            print(json.dumps({k: v for k, v in record.items() if not k.startswith("profile")}), flush=True)
            if args.out:
                with args.out.open("a") as f:
                    f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
