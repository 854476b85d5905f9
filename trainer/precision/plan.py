"""What a precision stack gives training: the `PrecisionPlan` every module of `trainer.precision` returns.

A `PrecisionPlan` says how a recipe touches training:
  - `model_backend`: build plain torch modules, or Transformer Engine modules (the recipe's `layers`);
  - `convert(model)`: module swaps before compile and sharding (torchao float8 Linear);
  - `mp_policy(reduce_dtype)`: FSDP2 mixed precision (bf16 params; gradient reduction in fp32 unless the
    grid's `reduce_dtype` says bf16);
  - `training_context()`: what wraps the forward pass (TE's autocast; bf16 autocast on one rank);
  - `after_optimizer_step(model)`: per-step bookkeeping (torchao's float8 all-gather scale precompute).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn as nn

from trainer.recipes import Recipe

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from trainer.options import TrainingOptions

REDUCE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # the grid's `reduce_dtype` values


@dataclass(kw_only=True)
class PrecisionPlan:
    recipe: Recipe
    # where it trains: one unsharded rank computes under autocast instead of FSDP2
    device_type: str = "cpu"
    sharded: bool = True
    convert: Callable[[nn.Module], None] = lambda model: None
    after_optimizer_step: Callable[[nn.Module], None] = lambda model: None
    forward_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext

    @property
    def param_dtype(self) -> torch.dtype | None:
        """The dtype FSDP2 gathers parameters in (and one rank computes in under autocast); None: fp32 throughout."""
        return None if self.recipe.family == "fp32" else torch.bfloat16

    @property
    def model_backend(self) -> str:
        """The layers the model is built from: "torch" or "te" (the recipe's `layers`)."""
        return self.recipe.layers

    def mp_policy(self, reduce_dtype: str = "fp32") -> MixedPrecisionPolicy:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if self.param_dtype is None:
            return MixedPrecisionPolicy()
        # bf16 params for compute; gradients reduce-scattered in fp32 by default (accuracy of the sum over
        # ranks), or in bf16 (the grid's `reduce_dtype`: half the bytes, as FSDP1 setups commonly use).
        # Inputs are not cast: block inputs are bf16 already (the embedding is gathered in bf16), and the
        # fp32 RoPE tables passed to each block must stay fp32.
        return MixedPrecisionPolicy(
            param_dtype=self.param_dtype, reduce_dtype=REDUCE_DTYPES[reduce_dtype], cast_forward_inputs=False
        )

    def training_context(self) -> contextlib.AbstractContextManager:
        """What wraps each forward: the recipe's own context, and bf16 autocast when FSDP2 does not shard
        (one rank: the plain model keeps fp32 master weights and computes in bf16, as single-GPU
        training scripts do)."""
        stack = contextlib.ExitStack()
        if not self.sharded and self.param_dtype is not None:
            stack.enter_context(torch.autocast(self.device_type, dtype=self.param_dtype))
        stack.enter_context(self.forward_context())
        return stack


class Stack(Protocol):
    """A precision stack: a module of `trainer.precision` with this one function."""

    def plan(self, recipe: Recipe, *, device_type: str, sharded: bool, options: TrainingOptions) -> PrecisionPlan:
        """The plan for `recipe` (one of this stack's) on `device_type` ('cuda' or 'cpu')."""
