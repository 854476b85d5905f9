"""torchao's float8 training: Linear layers swapped for Float8Linear before compile and sharding.

The recipe's `scaling` is torchao's recipe name (`Float8LinearConfig.from_recipe_name`), its
`fp8_all_gather` whether FSDP2 gathers float8 weights; the trial's `fp8_pow2_scales` rounds every scale down to a
power of 2 (`round_scales_to_power_of_2`, as torchao's rowwise recipes do already). On MI300-class GPUs torchao
picks the e4m3fnuz/e5m2fnuz formats itself (torchao.float8.config); on CPU ranks the casts are real and the matmul
is emulated in high precision. Where a trial's batch is symbolic (`dynamic_batch`), torchao's amax reduces in two
static-length stages (trainer.precision.symbolic_amax): the same numbers, without the slow symbolic reductions.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch.nn as nn

from trainer.options import DEFAULT_OPTIONS, TrainingOptions
from trainer.precision import symbolic_amax
from trainer.precision.plan import PrecisionPlan
from trainer.recipes import Recipe

FP8_DIM_MULTIPLE = 16  # FP8 GEMMs need both dims divisible by 16 (cuBLASLt / hipBLASLt)
HEAD_NAMES = ("output", "lm_head")


def fp8_module_filter(module: nn.Module, fqn: str, *, include_head: bool = False) -> bool:
    """Which Linear layers get FP8: only dims divisible by 16, and not the output head (accuracy: torchtitan's
    default) unless `include_head` (the grid's `fp8_lm_head`)."""
    if not isinstance(module, nn.Linear) or (fqn in HEAD_NAMES and not include_head):
        return False
    return module.in_features % FP8_DIM_MULTIPLE == 0 and module.out_features % FP8_DIM_MULTIPLE == 0


def float8_config(recipe: Recipe, *, device_type: str, sharded: bool, options: TrainingOptions) -> Any:
    """torchao's Float8LinearConfig for `recipe` and the trial's options."""
    from torchao.float8 import Float8LinearConfig

    base = Float8LinearConfig.from_recipe_name(recipe.scaling)
    return dataclasses.replace(
        base,
        enable_fsdp_float8_all_gather=recipe.fp8_all_gather and sharded,
        emulate=device_type == "cpu",
        round_scales_to_power_of_2=base.round_scales_to_power_of_2 or options.fp8_pow2_scales,
    )


def plan(
    recipe: Recipe, *, device_type: str, sharded: bool, options: TrainingOptions = DEFAULT_OPTIONS
) -> PrecisionPlan:
    from torchao.float8 import convert_to_float8_training

    config = float8_config(recipe, device_type=device_type, sharded=sharded, options=options)
    fp8_lm_head = options.fp8_lm_head

    def convert(model: nn.Module) -> None:
        symbolic_amax.install()  # a symbolic batch's amax in static-length stages: the same bits
        convert_to_float8_training(
            model, config=config, module_filter_fn=functools.partial(fp8_module_filter, include_head=fp8_lm_head)
        )

    def after_optimizer_step(model: nn.Module) -> None:
        if config.enable_fsdp_float8_all_gather:
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            # one all-reduce for every layer's amax instead of one per layer at the next all-gather
            precompute_float8_dynamic_scale_for_fsdp(model)

    return PrecisionPlan(
        recipe=recipe,
        device_type=device_type,
        sharded=sharded,
        convert=convert,
        after_optimizer_step=after_optimizer_step,
    )
