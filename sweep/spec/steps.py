"""A grid's `steps`: warm-up and measured steps per trial, counts or `auto` (trainer.stopping). Pure."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, model_validator

from trainer.stopping import MEASURE_CI_LEAST, MEASURE_MAX_STEPS, WARMUP_MAX_STEPS, StepsSpec

# Strict, as cluster profiles are: "4" where a number goes, or "yes" where a boolean goes, is refused
# rather than read as 4 or True; a typo must not change the benchmark silently.
STRICT = ConfigDict(extra="forbid", strict=True)


def _steps(minimum: int) -> PlainValidator:
    def check(value: Any) -> StepsSpec:
        if value == "auto":
            return "auto"
        if type(value) is not int or value < minimum:  # bool is an int subclass: `true` is not a count
            raise ValueError(f"expected a whole number >= {minimum}, or auto")
        count: int = value
        return count

    return PlainValidator(check)


# `auto` measures at most this many steps unless the grid says otherwise (steps.measure_max). Replayed on recorded
# H200 step times (the held-out model, 3 precisions x 2 batches, 30 steps each: benchmarks/steps_check.py --cap), 8
# steps' median lands within 0.84 % of the 30-step median on every trial and auto then costs less than the default
# 3 + 10 on every trial; uncapped, alternating steady steps (3-5 % apart) kept it measuring up to 25 steps for the
# same median (benchmarks/RESULTS.md "Cold sweep", session 28's replay).
MEASURE_MAX_DEFAULT = 8

# What a key the grid leaves out means (`Steps.on`). On GPUs, `auto`: replayed on recorded step times of two models
# (H200 session 18, held-out H100 session 47; benchmarks/steps_check.py), its medians land within 1 % of 30-step ones
# on all 12 rows and it costs less on 11, while 3 + 10 read one row (bf16, batch 2) 6.9 % slow, its warm-up too short
# (benchmarks/RESULTS.md "Cold sweep"). On CPU ranks, counts: their steps can vary by 10 % and more, where `auto` runs
# up to its 50 warm-up steps and its most measured steps (docs/concepts.md).
CPU_WARMUP, CPU_MEASURE = 3, 10


class Steps(BaseModel):
    """A count of steps, or `auto`: warm up until two successive steps agree within 10 % (2..50 steps),
    measure until the median's 95 % confidence interval is within ±1 % (5..`measure_max` steps, or a time cap).
    A key left out is decided by where the trials run (`on`): `auto` on GPUs, 3 + 10 on CPU ranks."""

    model_config = STRICT
    warmup: Annotated[StepsSpec, _steps(0)] = Field(
        default=CPU_WARMUP, description="untimed steps first (compile, allocator warm-up), or auto (on GPUs: auto)"
    )
    measure: Annotated[StepsSpec, _steps(1)] = Field(
        default=CPU_MEASURE, description="timed steps, or auto (on GPUs: auto)"
    )
    measure_max: int = Field(
        default=MEASURE_MAX_DEFAULT,
        ge=MEASURE_CI_LEAST,
        le=MEASURE_MAX_STEPS,
        description="with measure: auto, the most steps it measures (a wider interval than ±1 % where it stops)",
    )

    @model_validator(mode="after")
    def _measure_max_with_auto(self) -> Steps:
        given = self.model_fields_set
        if "measure_max" in given and "measure" in given and self.measure != "auto":
            raise ValueError(f"measure_max applies to measure: auto; measure: {self.measure} measures that many steps")
        return self

    def on(self, *, gpu: bool) -> Steps:
        """These steps where the trials run: a key the grid left out is `auto` on GPUs and a count on CPU ranks
        (`CPU_WARMUP`, `CPU_MEASURE`); `measure_max` alone asks for `measure: auto` everywhere."""
        given = self.model_fields_set
        warmup = self.warmup if "warmup" in given or not gpu else "auto"
        measure = self.measure if "measure" in given or not (gpu or "measure_max" in given) else "auto"
        most = {"measure_max": self.measure_max} if "measure_max" in given else {}
        return Steps.model_validate({"warmup": warmup, "measure": measure, **most})

    def text(self) -> str:
        """`warm-up auto, measured auto (at most 8)`, `warm-up 3, measured 10`: as `sweep plan` shows them."""
        most = f" (at most {self.measure_max})" if self.measure == "auto" else ""
        return f"warm-up {self.warmup}, measured {self.measure}{most}"

    @property
    def auto_max(self) -> tuple[int, int] | None:
        """The most warm-up and measured steps `auto` runs in this grid's trials (trainer.stopping.Schedule); None
        for a fixed measured count."""
        return (WARMUP_MAX_STEPS, self.measure_max) if self.measure == "auto" else None
