"""torchao's tensorwise amax, reduced in two stages where the batch is symbolic (a `dynamic_batch` trial).

Why: torchao scales each FP8 cast by its tensor's amax (`torchao.float8.float8_utils.tensor_to_amax`); tensorwise,
that is one reduction over the whole activation. With a symbolic batch the reduction's length is symbolic, and
inductor splits it into blocks whose size is symbolic too, so its loads are neither aligned nor vectorized: on one
H200 (torch 2.11, the held-out 2.5 B model of benchmarks/campaigns/cold-sweep at batch 12) those amax kernels took
2-5x their static-shape time and the step 11.6 % longer than at a static batch (`benchmarks/device/kernels_probe.py
--profile`; RESULTS.md "Compile once per graph"). Reduced first over the static dimensions (the features), then over
the tokens' maxima, the reductions have static lengths: the step ran 0.8 % faster than static in the same job. The
maximum is exact, so the amax, the scales and the arithmetic are bitwise torchao's (tests/test_symbolic_amax.py).

Only tensorwise scaling, and only a tensor with a symbolic size, takes the two stages. torchao's casts run inside its
autograd Function, which dynamo leaves to AOTAutograd, whose trace runs this code on fake tensors whose symbolic sizes
are `torch.SymInt`s: there the dimensions are known (dynamo itself would hide them: `isinstance(size, int)` is True
for a SymInt in its trace, but it leaves this code to AOTAutograd, torch 2.11 and 2.13). Eager code, static-shape
trials, the distributed reduction (`reduce_amax`, which torchao uses for weights) and rowwise (axiswise) scaling run
torchao's own function: rowwise recipes keep static shapes (trainer.recipes, `symbolic_batch`). Its column scales (over
the tokens) reduced in static blocks of one sequence train right (session 22; session 19's stages trained wrongly) but
the step stays 30 % slower than static on one H200: inductor's fused amax-scale-cast kernels, not the reductions
alone, lose their speed with a symbolic token count (benchmarks/RESULTS.md "Cold sweep", session 22).
"""

from __future__ import annotations

from typing import Any

import torch

_original: Any = None  # torchao's tensor_to_amax, once `install` replaced it


@torch.no_grad()  # as torchao's: scales carry no gradient
def symbolic_amax(
    x: torch.Tensor,
    reduce_amax: bool = False,
    device_mesh: Any = None,
    scaling_granularity: Any = None,
    axiswise_dim: int | None = None,
) -> torch.Tensor:
    """`tensor_to_amax` with torchao's signature: tensorwise in a symbolic trace, the maximum over the static
    dimensions first, then over the symbolic ones."""
    from torchao.float8.config import ScalingGranularity

    granularity = ScalingGranularity.TENSORWISE if scaling_granularity is None else scaling_granularity
    symbolic = {d for d, size in enumerate(x.shape) if isinstance(size, torch.SymInt)}
    if reduce_amax or granularity is not ScalingGranularity.TENSORWISE or not symbolic:
        return _original(x, reduce_amax, device_mesh, granularity, axiswise_dim)
    return _two_stage(x, symbolic)


def _two_stage(x: torch.Tensor, symbolic: set[int]) -> torch.Tensor:
    """max |x|: over the dimensions not in `symbolic` first, then over the rest."""
    static = tuple(d for d in range(x.dim()) if d not in symbolic)
    magnitude = torch.abs(x)
    return torch.max(torch.amax(magnitude, dim=static) if static else magnitude)


def installed() -> bool:
    """Whether this process's torchao computes its amax here (a cached graph's key says which: trainer.compile_keys)."""
    return _original is not None


def install() -> None:
    """Replace torchao's `tensor_to_amax` with `symbolic_amax`, once per process: torchao's `tensor_to_scale` looks
    it up in its module on every call."""
    global _original
    from torchao.float8 import float8_utils

    if _original is None:
        _original = float8_utils.tensor_to_amax
        float8_utils.tensor_to_amax = symbolic_amax
