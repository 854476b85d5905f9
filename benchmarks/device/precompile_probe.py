"""Compiling ahead on one GPU, through the rank's own worker (`trainer.worker.RankWorker`, no Ray): a fresh rank's
trials of the cold-sweep grid's held-out model, one after the other, on an empty compile cache, with the group's
graphs compiled ahead in side processes (`trainer.precompile`) or not. One JSON record per trial.

    TORCHINDUCTOR_CACHE_DIR=EMPTY TRITON_CACHE_DIR=EMPTY/triton python3 benchmarks/device/precompile_probe.py \
        --ahead|--no-ahead --out FILE [PRECISION:BATCH ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sweep import service  # noqa: E402
from sweep.execution.placement import rank_jobs, trial_config  # noqa: E402
from trainer.job import compile_ahead  # noqa: E402
from trainer.worker import RankWorker  # noqa: E402

GRID = Path(__file__).resolve().parents[1] / "campaigns/cold-sweep/a-grid.yaml"
FIELDS = (
    "status",
    "error",
    "precompile_s",
    "precompiled_graphs",
    "compile_time_s",
    "compile_cache_hits",
    "compile_cache_misses",
    "init_time_s",
    "import_s",
    "process_setup_s",
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "trials",
        nargs="*",
        default=["bf16:4", "fp8-torchao-tensorwise:4", "fp8-torchao-rowwise:4", "fp8-torchao-rowwise:6"],
    )
    parser.add_argument("--ahead", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    began = time.perf_counter()
    _, _, grid = service.prepare(GRID, "local", None, {"steps": {"warmup": 2, "measure": 5}})
    trials = []
    for item in args.trials:
        precision, batch = item.split(":")
        trials.append(next(t for t in grid if t.precision == precision and t.batch_size == int(batch)))
    configs = [trial_config(t) for t in trials]
    ahead = compile_ahead(configs[0], configs[1:], 1) if args.ahead else ()
    worker = RankWorker(keep_group=True)
    info = worker.node_info()
    for i, trial in enumerate(trials):
        t0 = time.perf_counter()
        (job,) = rank_jobs(trial, [info], device_type="cuda", precompile=ahead if i == 0 else ())
        result = worker.run(job)
        record = {
            "ahead": args.ahead,
            "trial": f"{trial.precision}:{trial.batch_size}",
            "index": i,
            "wall_s": round(time.perf_counter() - t0, 2),
            "since_start_s": round(time.perf_counter() - began, 2),
            "step_s": min(result.step_times) if result.step_times else None,
            **{k: getattr(result, k) for k in FIELDS},
        }
        print(json.dumps(record), flush=True)
        with args.out.open("a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
