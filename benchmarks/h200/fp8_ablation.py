"""One-GPU ablation of the torchao tensorwise recipe on seed 002's GPT-1.5B (bsz 12, T=1024, regional compile).

Runs `trainer.worker.RankWorker` in-process (world size 1) for: bf16; fp8-torchao-tensorwise as shipped
(float8 FSDP all-gather + scale precompute); the same without the float8 all-gather. Prints TFLOP/s.
    python3 benchmarks/h200/fp8_ablation.py
"""

from __future__ import annotations

import dataclasses
import os
import socket
import statistics

import trainer.precision as precision
from trainer.flops import spec_flops_per_token
from trainer.job import RankJob
from trainer.models import REGISTRY
from trainer.worker import RankWorker

SPEC, BATCH, SEQ = REGISTRY["gpt2-1.5b"], 12, 1024


def run(name: str, label: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ)
    job = RankJob(rank=0, world_size=1, local_rank=0, master_addr="127.0.0.1", master_port=port,
                  model_spec_json=SPEC.to_json(), precision=name, compile="regional", ac="none", batch_size=BATCH,
                  seq_len=SEQ, warmup_steps=5, measure_steps=20, device_type="cuda")
    r = RankWorker().run(job)
    os.environ.clear()
    os.environ.update(env)
    if r["status"] != "ok":
        print(label, r["status"], r.get("error"), r.get("traceback"))
        return
    t = statistics.median(r["step_times"])
    tflops = spec_flops_per_token(SPEC, SEQ) * BATCH * SEQ / t / 1e12
    print(f"{label}: median step {t:.4f} s, p10 {sorted(r['step_times'])[2]:.4f} s, {tflops:.1f} TFLOP/s, "
          f"peak {r['peak_mem_bytes'] / 2**30:.1f} GiB", flush=True)


def main() -> None:
    run("bf16", "bf16")
    run("fp8-torchao-tensorwise", "fp8 tensorwise, float8 all-gather (as shipped)")
    original = precision._torchao_plan

    def no_fp8_all_gather(recipe, *, emulate):
        from torchao.float8 import Float8LinearConfig

        real = Float8LinearConfig.__init__

        def init(self, *a, **kw):
            real(self, *a, **{**kw, "enable_fsdp_float8_all_gather": False})

        Float8LinearConfig.__init__ = init
        try:
            return original(recipe, emulate=emulate)
        finally:
            Float8LinearConfig.__init__ = real

    precision._torchao_plan = no_fp8_all_gather
    run("fp8-torchao-tensorwise", "fp8 tensorwise, bf16 all-gather")
    precision._torchao_plan = original


if __name__ == "__main__":
    main()
