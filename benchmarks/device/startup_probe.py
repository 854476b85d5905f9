"""A fresh rank's start-up, phase by phase, and whether the CUDA context can be made beside its imports (issue 28,
item 4). Run on the lent H200 from the project root (benchmarks/device/startup_probe.sh runs it):

    python3 benchmarks/device/startup_probe.py [--samples 3] [--out FILE]

Each sample is a new process doing what a rank's first trial does before its model (trainer.worker `_train`):
import torch, dynamo and the trainer; make its device current (trainer.sync.rank_device); join a one-rank NCCL
process group with its device (trainer.worker `_join`: the communicator is made eagerly); a barrier; the baseline
release (trainer.release: dynamo's reset, which imports inductor's CUDA graph trees on a CUDA host). The variants:

    today             that order
    ctx-thread        first, a thread creates the CUDA primary context through the driver API (ctypes: the call
                      lets go of the GIL, so the imports go on beside it); torch then finds the context made
    cuda-init-thread  torch's own CUDA init in a thread as soon as torch is imported (does it let go of the GIL?)
    preload           trainer.preload's imports first, as Ray's worker runs them before a rank is placed (the
                      sample's "imports" is their end); `device started` says whether they started CUDA (they must
                      not: Ray assigns the GPU later)

A sample prints one JSON line: seconds from the process's start (as the parent saw it) to each phase's end. The
variants alternate, so a drifting host shows in both. Pure measurement: nothing here changes the trainer.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import threading
import time

VARIANTS = ("today", "ctx-thread", "cuda-init-thread", "preload")


def _primary_context() -> None:
    """cuInit and the primary context of the first visible device, through libcuda (what torch's init makes)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cuda.cuInit(0) == 0
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0


def sample(variant: str, began: float) -> dict[str, float]:
    marks: dict[str, float] = {"python": time.time() - began}
    if variant == "preload":
        import trainer.preload

        done = trainer.preload.preload()
        marks["device started"] = float(done.device_started)  # 0.0 or 1.0: a median above 0 is a failure
        assert done.failed is None, done.failed
    helper = None
    if variant == "ctx-thread":
        helper = threading.Thread(target=_primary_context)
        helper.start()
    import torch

    marks["torch"] = time.time() - began
    if variant == "cuda-init-thread":
        helper = threading.Thread(target=torch.cuda.init)
        helper.start()
    import torch._dynamo  # noqa: F401
    import torch.distributed as dist

    import trainer.precompile  # noqa: F401
    import trainer.release  # noqa: F401
    import trainer.train  # noqa: F401
    from trainer.sync import rank_device

    marks["imports"] = time.time() - began
    if helper is not None:
        helper.join()
    marks["helper joined"] = time.time() - began
    device = rank_device("cuda")
    torch.empty(1, device=device)
    marks["device"] = time.time() - began
    store = dist.HashStore()
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=device)
    marks["process group"] = time.time() - began
    dist.barrier()
    torch.cuda.synchronize()
    marks["barrier"] = time.time() - began
    from trainer.release import release

    release(device)
    marks["release"] = time.time() - began
    dist.destroy_process_group()
    return marks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", choices=VARIANTS)
    parser.add_argument("--began", type=float)
    args = parser.parse_args()
    if args.child:
        print(json.dumps({"variant": args.child, **sample(args.child, args.began)}), flush=True)
        return
    records: list[dict] = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)}
    for _ in range(args.samples):
        for variant in VARIANTS:
            began = time.time()
            out = subprocess.run(
                [sys.executable, __file__, "--child", variant, "--began", repr(began)],
                env=env,
                capture_output=True,
                text=True,
            )
            if out.returncode:
                print(f"{variant}: exit {out.returncode}: {out.stderr[-800:]}", file=sys.stderr)
                continue
            record = json.loads(out.stdout.strip().splitlines()[-1])
            record["exited"] = time.time() - began
            records.append(record)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in record.items()}), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    for variant in VARIANTS:
        rows = [r for r in records if r["variant"] == variant]
        if rows:
            phases = [k for k in rows[0] if k != "variant"]
            print(variant, {k: round(statistics.median(r[k] for r in rows), 2) for k in phases})


if __name__ == "__main__":
    main()
