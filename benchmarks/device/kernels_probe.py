"""A kernel option (issue 34) or a compile knob alone, on one GPU, before any of them is a sweep option: a probe.

    python3 benchmarks/device/kernels_probe.py --batch 4 --out $OUT/kernels.jsonl \
        bf16 bf16:attn=cudnn bf16:autotune fp8-torchao-tensorwise fp8-torchao-tensorwise:attn=cudnn ...

One process, one rank, sweep's own trainer (`trainer.train.run_trial`: the same model, step, compile and timing
as a `sweep run` trial; no Ray). Each VARIANT is PRECISION[:KNOB[,KNOB...]], a knob switching one thing
process-wide for that trial only (dynamo is reset between trials so each compiles under its own knobs):
  attn=flash|cudnn|efficient  the only SDPA backend allowed (torch.backends.cuda.enable_*_sdp)
  autotune                    inductor's GEMM autotuning (what compile mode max-autotune-no-cudagraphs sets)
  cudagraphs                  CUDA graphs over each compiled graph (inductor's triton.cudagraphs: what compile mode
                              reduce-overhead / max-autotune add); shapes are static in a trial
  pow2                        torchao float8 scales rounded to powers of 2 (Float8LinearConfig)
  b=N                         batch N for this variant (else --batch)
  head                        FP8 recipes: the output head in FP8 too (the grid's fp8_lm_head)
  dyn                         a symbolic batch dimension (the trial option dynamic_batch, which sweep's grid folds to
                              false for torchao rowwise: here it is not folded)
  torchao-amax                torchao's own amax (tensor_to_amax) instead of trainer.precision.symbolic_amax's
  ind.NAME=VALUE              one inductor config entry (torch._inductor.config, dotted NAME, VALUE a Python literal)
Each record has `compile_phases` (dynamo's compile times by phase, summed: where the first step's compile went) and
`release` (what giving the trial back costs: a full garbage collection, the caching allocator's empty_cache, and a
collection after `gc.freeze()`). With --profile each variant also runs its profiled steps (trainer.profiling) and
its record gets `kernels`: CUDA time per step of each kernel name (trailing _N numbering dropped), the largest
first, to see where two variants' steps differ.
Run it with TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0: the caches' keys do not include the
SDPA backend flags, so with them on an `attn=` variant loads the graph an earlier variant compiled (seen:
compile 1.0 s, the same step time).
The model is Llama3-8B's layer dims with 8 layers (issue 34's peer config; `--model held-out`: the cold sweep's
2.5 B model) at T 4096, per-block compile, bf16 autocast with fp32 masters, fused AdamW, clip 1.0. Prints and
appends one JSON line per variant.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

HELD_OUT = dict(  # benchmarks/campaigns/cold-sweep/a-grid.yaml's held-out model
    arch="llama",
    name="held-out-2.5b",
    n_layers=20,
    d_embd=2560,
    n_heads=20,
    n_kv_heads=4,
    ffn_hidden=8960,
    vocab_size=151936,
)
MODEL = dict(
    arch="llama",
    name="llama3-8b-8l",
    n_layers=8,
    d_embd=4096,
    n_heads=32,
    n_kv_heads=8,
    ffn_hidden=14336,
    vocab_size=128256,
)


@contextlib.contextmanager
def knobs(names: list[str]):
    import torch
    import torch._inductor.config as inductor

    backends = torch.backends.cuda
    saved = (
        backends.flash_sdp_enabled(),
        backends.mem_efficient_sdp_enabled(),
        backends.cudnn_sdp_enabled(),
        backends.math_sdp_enabled(),
        inductor.max_autotune,
        inductor.max_autotune_gemm,
        inductor.triton.cudagraphs,
    )
    undo = []
    try:
        for knob in names:
            if knob.startswith("attn="):
                which = knob.split("=", 1)[1]
                backends.enable_flash_sdp(which == "flash")
                backends.enable_mem_efficient_sdp(which == "efficient")
                backends.enable_cudnn_sdp(which == "cudnn")
                backends.enable_math_sdp(False)
            elif knob == "autotune":
                inductor.max_autotune = inductor.max_autotune_gemm = True
            elif knob == "cudagraphs":
                inductor.triton.cudagraphs = True
            elif knob == "pow2":
                from torchao.float8 import Float8LinearConfig

                original = Float8LinearConfig.from_recipe_name
                Float8LinearConfig.from_recipe_name = staticmethod(  # type: ignore[method-assign]
                    # `original` bound now: each patch wraps (and its undo restores) the method as it was then
                    lambda name, original=original: dataclasses.replace(original(name), round_scales_to_power_of_2=True)
                )
                undo.append(
                    lambda original=original: setattr(Float8LinearConfig, "from_recipe_name", staticmethod(original))
                )
            elif knob.startswith("ind."):
                import ast

                name, _, value = knob[4:].partition("=")
                *path, leaf = name.split(".")
                owner = inductor
                for part in path:
                    owner = getattr(owner, part)
                previous = getattr(owner, leaf)
                setattr(owner, leaf, ast.literal_eval(value))
                undo.append(lambda owner=owner, leaf=leaf, previous=previous: setattr(owner, leaf, previous))
            elif knob == "torchao-amax":
                from torchao.float8 import float8_utils

                from trainer.precision import symbolic_amax

                float8_utils.tensor_to_amax = symbolic_amax._original
                undo.append(lambda: setattr(float8_utils, "tensor_to_amax", symbolic_amax.symbolic_amax))
            elif knob == "dyn":
                pass  # a trial option: main() puts it in TrainingOptions
            elif knob:
                raise SystemExit(f"unknown knob {knob!r}")
        yield
    finally:
        for u in undo:
            u()
        backends.enable_flash_sdp(saved[0])
        backends.enable_mem_efficient_sdp(saved[1])
        backends.enable_cudnn_sdp(saved[2])
        backends.enable_math_sdp(saved[3])
        inductor.max_autotune, inductor.max_autotune_gemm = saved[4], saved[5]
        inductor.triton.cudagraphs = saved[6]


def kernel_times(trace_gz: bytes, steps: int, top: int = 60) -> list[tuple[str, float, int]]:
    """(kernel name, ms of CUDA time per step, launches per step) from a gzipped Chrome trace, largest first."""
    import gzip
    import re

    events = json.loads(gzip.decompress(trace_gz))["traceEvents"]
    total: dict[str, float] = {}
    count: dict[str, int] = {}
    for e in events:
        if e.get("cat") == "kernel":
            name = re.sub(r"_\d+$", "", e["name"])[:120]
            total[name] = total.get(name, 0.0) + e.get("dur", 0.0)
            count[name] = count.get(name, 0) + 1
    ranked = sorted(total, key=total.get, reverse=True)[:top]
    return [(n, round(total[n] / 1000 / steps, 3), count[n] // steps) for n in ranked]


def release_costs() -> dict[str, float]:
    """Seconds of what a warm rank does between trials (trainer.release): a full collection, empty_cache, and a
    full collection once the surviving objects are frozen (gc.freeze), with the objects each traversed."""
    import gc

    import torch

    t0 = time.perf_counter()
    gc.collect()
    t1 = time.perf_counter()
    tracked = len(gc.get_objects())
    torch.cuda.empty_cache()
    t2 = time.perf_counter()
    gc.collect()
    t3 = time.perf_counter()
    gc.freeze()
    t4 = time.perf_counter()
    gc.collect()
    t5 = time.perf_counter()
    gc.unfreeze()
    return {
        "gc_s": round(t1 - t0, 4),
        "gc_objects": tracked,
        "empty_cache_s": round(t2 - t1, 4),
        "gc_again_s": round(t3 - t2, 4),
        "gc_frozen_s": round(t5 - t4, 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--measure", type=int, default=10)
    ap.add_argument("--compile", default="regional")
    ap.add_argument("--out", default="kernels.jsonl")
    ap.add_argument("--model", choices=("llama3-8b-8l", "held-out"), default="llama3-8b-8l")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from trainer.compile_report import compile_phases
    from trainer.job import TrialConfig
    from trainer.models.specs import ModelSpec
    from trainer.options import TrainingOptions
    from trainer.profiling import recorded_steps
    from trainer.train import Rank, run_trial

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    rank = Rank(device=torch.device("cuda", 0), mesh=init_device_mesh("cuda", (1,)))
    if any(v.startswith("fp8-torchao") for v in args.variants):
        from trainer.precision import symbolic_amax

        symbolic_amax.install()  # before any variant, so that `torchao-amax` can undo it for its own
    spec = ModelSpec(**(HELD_OUT if args.model == "held-out" else MODEL))
    for variant in args.variants:
        precision, _, knob_text = variant.partition(":")
        names = [k for k in knob_text.split(",") if k and not k.startswith("b=") and k != "head"]
        batch = next((int(k[2:]) for k in knob_text.split(",") if k.startswith("b=")), args.batch)
        config = TrialConfig(
            model_spec_json=spec.to_json(),
            precision=precision,
            compile=args.compile,
            ac="none",
            batch_size=batch,
            seq_len=args.seq_len,
            warmup_steps=args.warmup,
            measure_steps=args.measure,
            options=TrainingOptions(fp8_lm_head="head" in knob_text.split(","), dynamic_batch="dyn" in names),
            profiled=args.profile,
        )
        torch._dynamo.reset()
        began = time.perf_counter()
        record = {
            "variant": variant,
            "precision": precision,
            "knobs": names,
            "batch_size": batch,
            "seq_len": args.seq_len,
            "compile": args.compile,
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0),
        }
        try:
            with knobs(names):
                m = run_trial(config, rank)
            median = statistics.median(m.step_times)
            record.update(
                status="ok",
                step_time_s=median,
                tokens_per_s=batch * args.seq_len / median,
                step_p10=sorted(m.step_times)[len(m.step_times) // 10],
                compile_time_s=m.compile_time_s,
                loss_first=m.losses[0],
                loss_last=m.losses[-1],
                losses=m.losses,
                peak_gib=m.memory.get("peak_mem_bytes", 0) / 2**30,
                reserved_gib=(m.memory.get("reserved_mem_bytes") or 0) / 2**30,
            )
            if m.profile:
                record["kernels"] = kernel_times(m.profile["trace_gz"], recorded_steps(config.options.grad_accum))
                record["shares"] = {k: v for k, v in m.profile.items() if k.endswith("_pct")}
        except torch.OutOfMemoryError as e:
            record.update(status="oom", error=str(e).splitlines()[0][:200])
        except Exception as e:  # a knob the stack refuses (e.g. a backend that cannot run this shape)
            record.update(status="error", error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
        record["wall_s"] = time.perf_counter() - began
        record["compile_phases"] = compile_phases()  # as SWEEP_COMPILE_REPORT prints them (trainer.compile_report)
        record["release"] = release_costs()
        line = json.dumps(record)
        print({k: v for k, v in record.items() if k != "losses"}, flush=True)
        with open(args.out, "a") as f:
            f.write(line + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
