"""What a torchao FP8 graph compiled before costs a fresh process, with and without trainer.compile_keys (CPU or GPU).

    python benchmarks/compile_keys_probe.py [--recipe fp8-torchao-rowwise] [--runs 3] [--device cpu]

Each run is a fresh process on one inductor cache: a two-block model (RMSNorm, FFN) converted to the recipe, each
block compiled as `compile: regional` does, one forward and backward. The first process of a mode fills its cache;
the next `--runs` find it. Prints, per mode, dynamo's compile seconds (`_compile.compile_inner`) of the runs that found
the cache, and what AOTAutograd's cache did. RESULTS.md "Cold sweep" (session 25) has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STEP = """
import json, torch, torch.nn as nn
from torch._dynamo.utils import counters, compilation_time_metrics
if {ours}:
    import trainer.parallelize  # installs trainer.compile_keys, as every rank and side process does
from trainer.precision import precision_plan

class Block(nn.Module):
    def __init__(self, d=256):
        super().__init__()
        self.norm, self.up, self.down = nn.RMSNorm(d), nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)
    def forward(self, x):
        return x + self.down(nn.functional.silu(self.up(self.norm(x))))

torch.manual_seed(0)
model = nn.Sequential(Block(), Block()).to("{device}")
precision_plan("{recipe}", device_type="{device}", sharded=False).convert(model)
for block in model:
    block.compile()
x = torch.randn(4, 64, 256, device="{device}", requires_grad=True)
model(x).square().mean().backward()
grads = [x.grad] + [p.grad for p in model.parameters()]
print(json.dumps({{"compile_s": sum(compilation_time_metrics["_compile.compile_inner"]),
                  "aot": dict(counters["aot_autograd"]), "grads": [g.double().sum().item() for g in grads]}}))
"""


def run(cache: Path, recipe: str, device: str, ours: bool) -> dict:
    """One fresh process's step on `cache`: its compile seconds, AOTAutograd's counters and the gradients' sums."""
    code = STEP.format(ours=ours, recipe=recipe, device=device)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"compile_keys_probe: the step failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="fp8-torchao-rowwise")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    for mode, ours in (("torch alone", False), ("compile_keys", True)):
        with tempfile.TemporaryDirectory() as cache:
            cold = run(Path(cache), args.recipe, args.device, ours)
            warm = [run(Path(cache), args.recipe, args.device, ours) for _ in range(args.runs)]
        seconds = [round(r["compile_s"], 2) for r in warm]
        print(
            f"{mode}: {args.recipe} on {args.device}: cold {cold['compile_s']:.2f} s; cache found: median "
            f"{statistics.median(seconds):.2f} s {seconds}; AOTAutograd cache {warm[-1]['aot']}"
        )


if __name__ == "__main__":
    main()
