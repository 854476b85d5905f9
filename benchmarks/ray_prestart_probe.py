"""Can Ray hand a rank actor a worker process that imported torch before the actor was placed? (issue 28, item 4)

A fresh rank's imports (torch, dynamo, inductor: 9-13 s on an H200 host, benchmarks/RESULTS.md "Cold sweep", session
26) are paid after its group is placed, so they are GPU time, unless a process that started and imported before the
placement hosts the actor. This probe asks Ray (CPU only; Ray's GPU count declared, no GPU needed):

    python benchmarks/ray_prestart_probe.py

Each case starts its own Ray in a child process, waits until the workers Ray started ahead are idle, places a
one-bundle placement group ({CPU: 1, GPU: 1}), creates a rank-like actor on it and prints one JSON line: whether the
actor's process is one Ray started (and, preloading, imported) before the placement, whether torch was imported when
its constructor ran (by then or before), CUDA_VISIBLE_DEVICES as Ray set it, and how long the actor took to answer
from its creation. The cases:

    hook         a job's `worker_process_setup_hook` imports torch, two task workers run and idle first, the actor
                 asks for the GPU (session 26's probe: Ray gives it a new process, which imports after placement)
    preload      RAY_preload_python_modules names a module that imports torch: Ray's idle workers, started as Ray
                 starts, import it; the actor has no environment of its own
    preload-env  the same, but the actor has a runtime_env (env_vars) of its own, as sweep's rank actors had

2026-12-05, Ray 2.60, this project's 2-core CPU host: hook and preload-env get a new process, which imports after the
placement (the actor answers in 5.8 and 5.3 s); preload gets a worker that imported before it (1.9 s), with
CUDA_VISIBLE_DEVICES set for it ("0") all the same. sweep.execution.prestart is built on the preload case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CASES = ("hook", "preload", "preload-env")


def preimport() -> None:
    """The hook / preloaded module's work: what a rank imports first."""
    import torch._dynamo  # noqa: F401
    import torch.distributed  # noqa: F401


def case(name: str) -> dict:
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    extra = {}
    if name == "hook":
        extra["runtime_env"] = {"worker_process_setup_hook": "ray_prestart_probe.preimport"}
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, logging_level="ERROR", **extra)

    @ray.remote
    class Rank:
        def __init__(self) -> None:
            self.found = (os.getpid(), "torch" in sys.modules, os.environ.get("CUDA_VISIBLE_DEVICES"))

        def report(self) -> tuple[int, bool, str | None]:
            return self.found

    @ray.remote(num_cpus=1)
    def warm() -> int:
        return os.getpid()

    warmed = ray.get([warm.remote() for _ in range(2)]) if name == "hook" else []
    time.sleep(12)  # every worker Ray started ahead has imported and is idle
    ahead = set(int(p) for p in os.environ.get("PROBE_AHEAD", "").split(",") if p) | set(warmed)
    pg = placement_group([{"CPU": 1, "GPU": 1}])
    ray.get(pg.ready())
    placed, began = time.time(), time.perf_counter()
    where = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=0)
    options = {"runtime_env": {"env_vars": {"PROBE": "1"}}} if name == "preload-env" else {}
    rank = Rank.options(num_cpus=1, num_gpus=1, scheduling_strategy=where, **options).remote()
    pid, imported, visible = ray.get(rank.report.remote())
    marks = Path(os.environ.get("PROBE_MARKS", "/nonexistent"))
    # a worker Ray starts on demand imports the module too, after the placement: only earlier marks count
    preloaded = {int(p.name) for p in marks.iterdir() if p.stat().st_mtime < placed} if marks.is_dir() else set()
    ray.shutdown()
    return {
        "case": name,
        "actor_in_a_process_started_ahead": pid in (ahead | preloaded),
        "torch_imported_when_the_actor_started": imported,
        "cuda_visible_devices": visible,
        "actor_ready_s": round(time.perf_counter() - began, 2),
    }


def mark() -> None:
    """What this module does when Ray's worker imports it (RAY_preload_python_modules): import, then leave this
    process's pid where the probe looks."""
    preimport()
    Path(os.environ["PROBE_MARKS"], str(os.getpid())).touch()


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--case":
        print(json.dumps(case(sys.argv[2])), flush=True)
        return
    import tempfile

    for name in CASES:
        with tempfile.TemporaryDirectory() as marks:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
            if name.startswith("preload"):  # (the hook case's own new worker would mark itself too)
                env |= {"RAY_preload_python_modules": "ray_prestart_probe", "PROBE_MARKS": marks}
            done = subprocess.run(
                [sys.executable, __file__, "--case", name], env=env, capture_output=True, text=True, cwd=HERE
            )
            print(done.stdout.strip().splitlines()[-1] if done.returncode == 0 else f"{name}: {done.stderr[-600:]}")


if __name__ == "__main__":
    main()
elif sys.argv and sys.argv[0].endswith("default_worker.py") and os.environ.get("PROBE_MARKS"):
    mark()  # imported by a worker Ray started, as RAY_preload_python_modules asks
