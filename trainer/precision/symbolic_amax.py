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
torchao's own function: the same two stages over the tokens for rowwise's column scales trained wrongly on the H200
(loss 11.7 against 7.9 after 11 steps), so rowwise recipes keep static shapes (trainer.recipes, `symbolic_batch`).
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
    """`tensor_to_amax` with torchao's signature. In a symbolic trace: tensorwise, the maximum over the static
    dimensions first, then over the symbolic ones; axiswise over a symbolic dimension (rowwise's column scales, over
    the tokens), the maximum within static blocks of it first, then over the blocks' maxima."""
    from torchao.float8.config import ScalingGranularity

    granularity = ScalingGranularity.TENSORWISE if scaling_granularity is None else scaling_granularity
    symbolic = {d for d, size in enumerate(x.shape) if isinstance(size, torch.SymInt)}
    if not reduce_amax and symbolic:
        if granularity is ScalingGranularity.TENSORWISE:
            return _two_stage(x, symbolic)
        if axiswise_dim is not None and (block := _static_block(x, axiswise_dim % x.dim())):
            return _in_blocks(x, axiswise_dim % x.dim(), block)
    return _original(x, reduce_amax, device_mesh, granularity, axiswise_dim)


def _two_stage(x: torch.Tensor, symbolic: set[int]) -> torch.Tensor:
    """max |x|: over the dimensions not in `symbolic` first, then over the rest."""
    static = tuple(d for d in range(x.dim()) if d not in symbolic)
    magnitude = torch.abs(x)
    return torch.max(torch.amax(magnitude, dim=static) if static else magnitude)


def _static_block(x: torch.Tensor, dim: int) -> int | None:
    """The static factor of `x`'s symbolic size along `dim` (4096 for torchao's flattened tokens, batch x 4096), or
    None where the size is static or has none (then torchao's own reduction is as good)."""
    size = x.shape[dim]
    if not isinstance(size, torch.SymInt):
        return None
    coefficient, _ = size.node.expr.as_coeff_Mul()  # sympy: 4096*s0 -> (4096, s0)
    return int(coefficient) if coefficient.is_Integer and coefficient > 1 else None


def _in_blocks(x: torch.Tensor, dim: int, block: int) -> torch.Tensor:
    """max |x| over `dim` (kept, as torchao's keepdim): within blocks of `block` consecutive entries of it first (a
    reduction of static length), then over the blocks' maxima (as many as the batch: a few). The maximum is exact."""
    blocks = torch.abs(x).unflatten(dim, (-1, block))  # dim -> (blocks, block)
    return torch.amax(torch.amax(blocks, dim=dim + 1), dim=dim, keepdim=True)


def install() -> None:
    """Replace torchao's `tensor_to_amax` with `symbolic_amax`, once per process: torchao's `tensor_to_scale` looks
    it up in its module on every call."""
    global _original
    from torchao.float8 import float8_utils

    if _original is None:
        _original = float8_utils.tensor_to_amax
        float8_utils.tensor_to_amax = symbolic_amax
