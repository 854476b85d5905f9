"""Can Ray hand a rank actor a worker process that imported torch before the actor was placed? (issue 28, item 4)

A fresh rank's imports (torch, dynamo, inductor: 9-13 s on an H200 host, benchmarks/RESULTS.md "Cold sweep", session
26) are paid after its group is placed, so they are GPU time. Ray runs a job's `worker_process_setup_hook` in every
worker process of the job as it starts; if a worker started and imported before the placement (a task run ahead, with
no GPU) could then host the actor, the imports would leave the GPU's time. This probe asks Ray (CPU only, a custom
resource standing in for the GPU):

    python benchmarks/ray_prestart_probe.py

It starts Ray with the hook (importing torch._dynamo), runs two one-CPU tasks (their workers import, then go idle),
then creates an actor of the same CPU shape that needs the stand-in GPU, and prints whether the actor's process is one
of the tasks' and whether it had torch imported when its constructor ran. Ray 2.60 (2026-12-05, this project's CPU
host): a new process each time, which imported torch itself after the actor was created.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def preimport() -> None:
    """The hook: what a rank imports first (trainer.worker), before any task or actor code runs."""
    import torch._dynamo  # noqa: F401
    import torch.distributed  # noqa: F401

    os.environ["SWEEP_PROBE_PREIMPORTED"] = "1"


def main() -> None:
    import ray

    ray.init(
        num_cpus=4,
        resources={"stand_in_gpu": 1},
        include_dashboard=False,
        logging_level="ERROR",
        runtime_env={
            "worker_process_setup_hook": "ray_prestart_probe.preimport",
            "env_vars": {"PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])},
        },
    )

    @ray.remote(num_cpus=1)
    def warm() -> int:
        return os.getpid()

    @ray.remote
    class Rank:
        def __init__(self) -> None:
            self.found = (os.getpid(), "torch._dynamo" in sys.modules, bool(os.environ.get("SWEEP_PROBE_PREIMPORTED")))

        def report(self) -> tuple[int, bool, bool]:
            return self.found

    warmed = ray.get([warm.remote() for _ in range(2)])
    time.sleep(2)  # the tasks' workers are idle now
    began = time.perf_counter()
    rank = Rank.options(num_cpus=1, resources={"stand_in_gpu": 1}).remote()
    pid, imported, by_hook = ray.get(rank.report.remote())
    print(
        json.dumps(
            {
                "task_workers": warmed,
                "actor_pid": pid,
                "actor_in_a_task_worker": pid in warmed,
                "torch_imported_at_actor_start": imported,
                "by_the_hook": by_hook,
                "actor_ready_s": round(time.perf_counter() - began, 2),
            }
        )
    )
    ray.shutdown()


if __name__ == "__main__":
    main()
