"""Transformer Engine's precision: TE's layers (`trainer.models.te`) and its FP8 autocast around the forward.

`plan(recipe, ...)` for a recipe whose backend is "te":
  - `model_backend="te"`: the model is built from TE layers (`trainer.models.te.build_te_model`);
  - `forward_context`: `transformer_engine.pytorch.autocast(enabled=True, recipe=...)` around the forward
    (TE >= 2.8 name; `fp8_autocast(enabled=..., fp8_recipe=...)` before that, deprecated since), the TE
    recipe object built from the recipe's `scaling` and `scaling_args` (and `fp8_dpa` with the trial's
    `fp8_attention`: `te_recipe_args`); `bf16-te` (no scaling) runs the same TE layers with no FP8 at all: the
    fair baseline for TE FP8;
  - `mp_policy()`: the torch recipes' own: FSDP2 gathers bf16 copies of the fp32 master weights,
    reduce-scatters gradients in the grid's `reduce_dtype` (fp32 by default) and does not cast forward
    inputs (the fp32 RoPE angles stay fp32).

The amax reduction group is left as None: TE then reduces DelayedScaling amaxes over the default
(world) group, which is FSDP's data-parallel group here (a script may pass that group explicitly).
Transformer Engine is imported lazily: this module imports on a CPU machine without it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from trainer.options import DEFAULT_OPTIONS, TrainingOptions
from trainer.precision.plan import PrecisionPlan
from trainer.recipes import TE_INSTALL_HINT, Recipe


def import_te(what: str = "this") -> ModuleType:
    """`transformer_engine.pytorch`, or an ImportError that says how to install it."""
    try:
        import transformer_engine.pytorch as te_pytorch
    except ImportError as e:
        raise ImportError(
            f"{what} needs Transformer Engine, which is not importable here ({e}): {TE_INSTALL_HINT}"
        ) from e
    return te_pytorch


def te_recipe_args(recipe: Recipe, *, fp8_attention: bool = False) -> dict[str, Any]:
    """The arguments of TE's recipe class for `recipe`, formats by name: its `scaling_args`, and with
    `fp8_attention` `fp8_dpa=True` (TE 2.x recipes: dot-product attention in FP8, cast to it and back at its
    boundaries, in TE's fused attention only). `fp8_mha` (the QKV projection hands attention FP8 directly) is
    left off: with RoPE between them TE 2.10-2.20 keeps that projection's output in high precision anyway
    (MultiheadAttention.forward), and it is the Beta feature's further step."""
    return {**recipe.scaling_args, **({"fp8_dpa": True} if fp8_attention else {})}


def te_recipe(recipe: Recipe, recipe_module: ModuleType, *, fp8_attention: bool = False) -> object | None:
    """TE's recipe object for `recipe` (None without FP8 scaling), from `transformer_engine.common.recipe`
    (passed in, so that this is testable without TE): the class `recipe.scaling`, with `te_recipe_args` (an
    fp8_format named by its member of TE's Format)."""
    if recipe.scaling is None:
        return None
    args = {
        key: getattr(recipe_module.Format, value) if key == "fp8_format" else value
        for key, value in te_recipe_args(recipe, fp8_attention=fp8_attention).items()
    }
    return getattr(recipe_module, recipe.scaling)(**args)


def autocast_factory(
    te_pytorch: ModuleType, fp8_recipe: object | None
) -> Callable[[], contextlib.AbstractContextManager]:
    """A no-argument callable that opens TE's FP8 region for `fp8_recipe` (nullcontext when None)."""
    if fp8_recipe is None:
        return contextlib.nullcontext
    autocast = getattr(te_pytorch, "autocast", None)  # TE >= 2.8
    if autocast is not None:
        return lambda: autocast(enabled=True, recipe=fp8_recipe)
    return lambda: te_pytorch.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe)


def te_plan(
    recipe: Recipe,
    *,
    device_type: str = "cuda",
    sharded: bool = True,
    te_pytorch: ModuleType | None = None,
    recipe_module: ModuleType | None = None,
    fp8_attention: bool = False,
) -> PrecisionPlan:
    """The plan for a TE recipe. `te_pytorch` / `recipe_module` default to the installed TE (for tests)."""
    if recipe.backend != "te":
        raise ValueError(f"te_plan got '{recipe.name}', whose backend is {recipe.backend}, not te")
    if te_pytorch is None:
        te_pytorch = import_te(recipe.name)
    if recipe_module is None:
        from transformer_engine.common import recipe as installed

        recipe_module = installed
    return PrecisionPlan(
        recipe=recipe,
        device_type=device_type,
        sharded=sharded,
        forward_context=autocast_factory(te_pytorch, te_recipe(recipe, recipe_module, fp8_attention=fp8_attention)),
    )


def plan(
    recipe: Recipe, *, device_type: str, sharded: bool, options: TrainingOptions = DEFAULT_OPTIONS
) -> PrecisionPlan:
    """`te_plan` with the installed TE. `fp8_lm_head` is the model's (`trainer.models.te` keeps the head out
    of the FP8 region unless asked); the attention kernel is set by `trainer.parallelize`."""
    return te_plan(recipe, device_type=device_type, sharded=sharded, fp8_attention=options.fp8_attention)
