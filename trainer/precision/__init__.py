"""Precision stacks side by side: one module per stack, each turning a recipe into a `PrecisionPlan`.

  - `native`: torch alone (fp32; bf16 through FSDP2's MixedPrecisionPolicy, or autocast on one rank);
  - `torchao_fp8`: torchao's float8 Linear swapped in before sharding;
  - `te`: Transformer Engine's layers and its FP8 autocast.

Each has one function, `plan(recipe, *, device_type, sharded, options)` (`plan.Stack`); what differs
between the recipes of one stack is data in the recipe table (`trainer.recipes.RECIPES`). A stack's module
is imported when a recipe of it is asked for, so torchao and TE are loaded only where they are used.
"""

from __future__ import annotations

import importlib

from trainer.options import DEFAULT_OPTIONS, TrainingOptions
from trainer.precision.plan import PrecisionPlan, Stack
from trainer.recipes import RECIPES

__all__ = ["PrecisionPlan", "STACKS", "precision_plan"]

STACKS = {
    "torch": "trainer.precision.native",
    "torchao": "trainer.precision.torchao_fp8",
    "te": "trainer.precision.te",
}  # a recipe's `backend` -> its stack's module


def precision_plan(
    name: str, *, device_type: str, sharded: bool = True, options: TrainingOptions = DEFAULT_OPTIONS
) -> PrecisionPlan:
    """The plan for recipe `name` on `device_type` ('cuda' or 'cpu'); the recipe must be supported. `options`: the
    trial's, of which a stack reads its own (fp8_lm_head, fp8_pow2_scales, fp8_attention), folded where they do
    nothing (sweep.spec.expand.fold_options)."""
    recipe = RECIPES[name]
    stack: Stack = importlib.import_module(STACKS[recipe.backend])
    return stack.plan(recipe, device_type=device_type, sharded=sharded, options=options)
