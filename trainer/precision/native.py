"""torch's own precision: fp32, or bf16 (FSDP2 gathers bf16 copies of fp32 master weights; one rank computes
under bf16 autocast instead). Nothing to convert, no context of its own."""

from __future__ import annotations

from trainer.options import DEFAULT_OPTIONS, TrainingOptions
from trainer.precision.plan import PrecisionPlan
from trainer.recipes import Recipe


def plan(
    recipe: Recipe, *, device_type: str, sharded: bool, options: TrainingOptions = DEFAULT_OPTIONS
) -> PrecisionPlan:
    return PrecisionPlan(recipe=recipe, device_type=device_type, sharded=sharded)
