"""The torch side of each precision recipe (`trainer.recipes` holds the names and needs).

A `PrecisionPlan` says how a recipe touches training:
  - `model_backend`: build plain torch modules, or Transformer Engine modules;
  - `convert(model)`: module swaps before compile and sharding (torchao float8 Linear);
  - `mp_policy(reduce_dtype)`: FSDP2 mixed precision (bf16 params; gradient reduction in fp32 unless the
    grid's `reduce_dtype` says bf16);
  - `training_context()`: what wraps the forward pass (TE's autocast; bf16 autocast on one rank);
  - `after_optimizer_step(model)`: per-step bookkeeping (torchao's float8 all-gather scale precompute).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from trainer.recipes import RECIPES, Recipe

FP8_DIM_MULTIPLE = 16  # FP8 GEMMs need both dims divisible by 16 (cuBLASLt / hipBLASLt)


HEAD_NAMES = ("output", "lm_head")
REDUCE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # the grid's `reduce_dtype` values


def fp8_module_filter(module: nn.Module, fqn: str, *, include_head: bool = False) -> bool:
    """Which Linear layers get FP8: only dims divisible by 16, and not the output head (accuracy: torchtitan's
    default) unless `include_head` (the grid's `fp8_lm_head`, as seed 000's TE head runs)."""
    if not isinstance(module, nn.Linear) or (fqn in HEAD_NAMES and not include_head):
        return False
    return module.in_features % FP8_DIM_MULTIPLE == 0 and module.out_features % FP8_DIM_MULTIPLE == 0


@dataclass(kw_only=True)
class PrecisionPlan:
    recipe: Recipe
    model_backend: str = "torch"
    param_dtype: torch.dtype | None = torch.bfloat16
    convert: Callable[[nn.Module], None] = lambda model: None
    after_optimizer_step: Callable[[nn.Module], None] = lambda model: None
    forward_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    # where it trains (set by `precision_plan`): one unsharded rank computes under autocast instead of FSDP2
    device_type: str = "cpu"
    sharded: bool = True

    def mp_policy(self, reduce_dtype: str = "fp32"):
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if self.param_dtype is None:
            return MixedPrecisionPolicy()
        # bf16 params for compute; gradients reduce-scattered in fp32 by default (accuracy of the sum over
        # ranks), or in bf16 (the grid's `reduce_dtype`: half the bytes, as seed 000's FSDP1 does).
        # Inputs are not cast: block inputs are bf16 already (the embedding is gathered in bf16), and the
        # fp32 RoPE tables passed to each block must stay fp32.
        return MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=REDUCE_DTYPES[reduce_dtype],
                                    cast_forward_inputs=False)

    def training_context(self) -> contextlib.AbstractContextManager:
        """What wraps each forward: the recipe's own context, and bf16 autocast when FSDP2 does not shard
        (one rank: the plain model keeps fp32 master weights and computes in bf16, as the seeds'
        single-GPU scripts do)."""
        stack = contextlib.ExitStack()
        if not self.sharded and self.param_dtype is not None:
            stack.enter_context(torch.autocast(self.device_type, dtype=self.param_dtype))
        stack.enter_context(self.forward_context())
        return stack


def _torchao_plan(recipe: Recipe, *, emulate: bool, sharded: bool, fp8_lm_head: bool) -> PrecisionPlan:
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    if recipe.name == "fp8-torchao-tensorwise":
        # FP8 all-gather: FSDP2 gathers float8 weights (half the bytes of bf16) - torchtitan's default.
        # On one rank there is nothing to gather and the extra casts cost ~0.1 s/step on GPT-1.5B.
        config = Float8LinearConfig(enable_fsdp_float8_all_gather=sharded)
    elif recipe.name == "fp8-torchao-rowwise":
        config = Float8LinearConfig.from_recipe_name("rowwise")
    else:
        config = Float8LinearConfig.from_recipe_name("rowwise_with_gw_hp")
    if emulate:  # CPU ranks: float8 casts are real, the matmul is emulated in high precision
        config = dataclasses.replace(config, emulate=True)

    def convert(model: nn.Module) -> None:
        convert_to_float8_training(model, config=config, module_filter_fn=functools.partial(
            fp8_module_filter, include_head=fp8_lm_head))

    def after_optimizer_step(model: nn.Module) -> None:
        if config.enable_fsdp_float8_all_gather:
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            # one all-reduce for every layer's amax instead of one per layer at the next all-gather
            precompute_float8_dynamic_scale_for_fsdp(model)

    return PrecisionPlan(recipe=recipe, convert=convert, after_optimizer_step=after_optimizer_step)


def precision_plan(name: str, *, device_type: str, sharded: bool = True, fp8_lm_head: bool = False) -> PrecisionPlan:
    """The plan for recipe `name` on `device_type` ('cuda' or 'cpu'); the recipe must be supported.
    On MI300-class GPUs torchao picks the e4m3fnuz/e5m2fnuz formats itself (torchao.float8.config)."""
    recipe = RECIPES[name]
    if recipe.backend == "torch":
        plan = PrecisionPlan(recipe=recipe, param_dtype=None if recipe.family == "fp32" else torch.bfloat16)
    elif recipe.backend == "torchao":
        plan = _torchao_plan(recipe, emulate=device_type == "cpu", sharded=sharded, fp8_lm_head=fp8_lm_head)
    else:
        from trainer.te import te_plan

        plan = te_plan(recipe)
    return dataclasses.replace(plan, device_type=device_type, sharded=sharded)
