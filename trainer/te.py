"""The Transformer Engine side of the `*-te` precision recipes: TE's recipe objects and autocast.

`te_plan(recipe)` is what `trainer.precision.precision_plan` returns for a recipe whose backend is "te":
  - `model_backend="te"`: the model is built from TE layers (`trainer.models.te.build_te_model`);
  - `forward_context`: `transformer_engine.pytorch.autocast(enabled=True, recipe=...)` around the forward
    (TE >= 2.8 name; `fp8_autocast(enabled=..., fp8_recipe=...)` before that, deprecated since);
    `bf16-te` runs the same TE layers with no FP8 at all: the fair baseline for TE FP8;
  - `mp_policy()`: the torch recipes' own: FSDP2 gathers bf16 copies of the fp32 master weights,
    reduce-scatters gradients in the grid's `reduce_dtype` (fp32 by default) and does not cast forward
    inputs (the fp32 RoPE angles stay fp32).

The amax reduction group is left as None: TE then reduces DelayedScaling amaxes over the default
(world) group, which is FSDP's data-parallel group here (seed 000 passed that group explicitly).
Transformer Engine is imported lazily: this module imports on a CPU machine without it.
"""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Callable

import torch

from trainer.precision import PrecisionPlan
from trainer.recipes import TE_INSTALL_HINT, Recipe

# Recipe name -> TE recipe object, built from `transformer_engine.common.recipe` (passed in, so the
# mapping is testable without TE). None: TE layers in bf16, no FP8.
TE_RECIPES: dict[str, Callable[[ModuleType], object] | None] = {
    "bf16-te": None,
    # seed 000: E4M3 forward / E5M2 backward, scale from the max of the last 16 amaxes
    "fp8-te-delayed": lambda r: r.DelayedScaling(fp8_format=r.Format.HYBRID, amax_history_len=16,
                                                 amax_compute_algo="max"),
    "fp8-te-current": lambda r: r.Float8CurrentScaling(fp8_format=r.Format.HYBRID),
    "fp8-te-block": lambda r: r.Float8BlockScaling(),  # 1x128 activations/grads, 128x128 weights, E4M3
    "fp8-te-mxfp8": lambda r: r.MXFP8BlockScaling(),  # 32-element blocks, E8M0 scales (Blackwell)
}


def import_te(what: str = "this") -> ModuleType:
    """`transformer_engine.pytorch`, or an ImportError that says how to install it."""
    try:
        import transformer_engine.pytorch as te_pytorch
    except ImportError as e:
        raise ImportError(f"{what} needs Transformer Engine, which is not importable here ({e}): "
                          f"{TE_INSTALL_HINT}") from e
    return te_pytorch


def te_recipe(name: str, recipe_module: ModuleType) -> object | None:
    """The TE recipe object for sweep recipe `name` (None for bf16-te). Raises KeyError naming the valid ones."""
    if name not in TE_RECIPES:
        raise KeyError(f"no Transformer Engine recipe for '{name}'; valid: {', '.join(TE_RECIPES)}")
    factory = TE_RECIPES[name]
    return None if factory is None else factory(recipe_module)


def autocast_factory(te_pytorch: ModuleType,
                     fp8_recipe: object | None) -> Callable[[], contextlib.AbstractContextManager]:
    """A no-argument callable that opens TE's FP8 region for `fp8_recipe` (nullcontext when None)."""
    if fp8_recipe is None:
        return contextlib.nullcontext
    autocast = getattr(te_pytorch, "autocast", None)  # TE >= 2.8
    if autocast is not None:
        return lambda: autocast(enabled=True, recipe=fp8_recipe)
    return lambda: te_pytorch.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe)


def te_plan(recipe: Recipe, *, te_pytorch: ModuleType | None = None,
            recipe_module: ModuleType | None = None) -> PrecisionPlan:
    """The plan for a TE recipe. `te_pytorch` / `recipe_module` default to the installed TE (for tests)."""
    if recipe.backend != "te":
        raise ValueError(f"te_plan got '{recipe.name}', whose backend is {recipe.backend}, not te")
    if te_pytorch is None:
        te_pytorch = import_te(recipe.name)
    if recipe_module is None:
        from transformer_engine.common import recipe as recipe_module
    fp8_recipe = te_recipe(recipe.name, recipe_module)
    return PrecisionPlan(recipe=recipe, model_backend="te", param_dtype=torch.bfloat16,
                         forward_context=autocast_factory(te_pytorch, fp8_recipe))
