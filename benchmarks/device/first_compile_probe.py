"""What a fresh process's first compile pays once, and whether a warm-up compile before placement takes it off.

    python3 benchmarks/device/first_compile_probe.py VARIANT PRECISION [CACHE]

A fresh process (a rank's) compiles its first graph on a warm inductor cache in 2.1 s on an H100 host, later graphs
three times its size in 0.8-1.0 s (benchmarks/RESULTS.md "Cold sweep", session 44's compile report): a one-time
part. This builds four llama-shaped blocks (regional compile, bf16 or torchao tensorwise FP8), after VARIANT's
warm-up compile of a tiny function (none; cpu-aot: aot_eager on CPU tensors; cpu-inductor: inductor on CPU
tensors; cuda-inductor: inductor on the GPU), and prints one JSON line: the warm-up's seconds, the first step's
(fwd + bwd, synchronised) and a steady one's, and dynamo's compile phases of the first step. Run once to fill
CACHE, then alternate the variants, each in its own process.
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import sys
import time

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", sys.argv[3] if len(sys.argv) > 3 else "/tmp/first-compile-cc")
os.environ.setdefault("TRITON_CACHE_DIR", os.environ["TORCHINDUCTOR_CACHE_DIR"] + "/triton")

import torch  # noqa: E402
import torch._inductor.compile_fx  # noqa: E402,F401  (imported ahead on a node of one rank: trainer.preload)
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the checkout
from trainer.compile_report import compile_phases  # noqa: E402


def warm_up(variant: str) -> float:
    began = time.perf_counter()
    if variant == "none":
        return 0.0
    device = "cuda" if variant.startswith("cuda") else "cpu"
    backend = "aot_eager" if variant.endswith("aot") else "inductor"

    def tiny(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.silu(x @ w).sum()

    x = torch.randn(8, 8, device=device, requires_grad=True)
    w = torch.randn(8, 8, device=device, requires_grad=True)
    torch.compile(tiny, backend=backend)(x, w).backward()
    torch._dynamo.reset()
    compile_phases()  # read and restarted: the first step's phases are its own
    return time.perf_counter() - began


class Block(nn.Module):
    def __init__(self, d: int = 2048, heads: int = 16) -> None:
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.w1, self.w3 = nn.Linear(d, 4 * d, bias=False), nn.Linear(d, 4 * d, bias=False)
        self.w2 = nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def main() -> None:
    variant, precision = sys.argv[1], sys.argv[2]
    warm_s = warm_up(variant)
    model = nn.Sequential(*[Block() for _ in range(4)]).cuda().to(torch.bfloat16)
    if precision == "tensorwise":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("tensorwise"))
    for block in model:
        block.compile()
    x = torch.randn(4, 2048, 2048, device="cuda", dtype=torch.bfloat16)
    times = []
    profile = cProfile.Profile() if os.environ.get("PROBE_PROFILE") else None
    for step in range(3):
        torch.cuda.synchronize()
        began = time.perf_counter()
        if profile and step == 0:
            profile.enable()
        model(x).float().sum().backward()
        torch.cuda.synchronize()
        if profile and step == 0:
            profile.disable()
        times.append(time.perf_counter() - began)
    if profile:  # where the first step's seconds went, by function (benchmarks/device/first_compile.sh prints it)
        out = os.path.join(os.environ.get("OUT", "/tmp"), f"profile-{variant}-{precision}.txt")
        with open(out, "a") as f:
            stats = pstats.Stats(profile, stream=f)
            stats.sort_stats("cumulative").print_stats(60)
            stats.sort_stats("tottime").print_stats(30)
    print(
        json.dumps(
            {
                "variant": variant,
                "precision": precision,
                "warm_up_s": round(warm_s, 3),
                "first_step_s": round(times[0], 3),
                "steady_step_s": round(times[-1], 3),
                "phases": compile_phases(top=10),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
