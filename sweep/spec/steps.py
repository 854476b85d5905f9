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


class Steps(BaseModel):
    """A count of steps, or `auto`: warm up until two successive steps agree within 10 % (2..50 steps),
    measure until the median's 95 % confidence interval is within ±1 % (5..`measure_max` steps, or a time cap)."""

    model_config = STRICT
    warmup: Annotated[StepsSpec, _steps(0)] = Field(
        default=3, description="untimed steps first (compile, allocator warm-up), or auto"
    )
    measure: Annotated[StepsSpec, _steps(1)] = Field(default=10, description="timed steps, or auto")
    measure_max: int = Field(
        default=MEASURE_MAX_DEFAULT,
        ge=MEASURE_CI_LEAST,
        le=MEASURE_MAX_STEPS,
        description="with measure: auto, the most steps it measures (a wider interval than ±1 % where it stops)",
    )

    @model_validator(mode="after")
    def _measure_max_with_auto(self) -> Steps:
        if "measure_max" in self.model_fields_set and self.measure != "auto":
            raise ValueError(f"measure_max applies to measure: auto; measure: {self.measure} measures that many steps")
        return self

    @property
    def auto_max(self) -> tuple[int, int] | None:
        """The most warm-up and measured steps `auto` runs in this grid's trials (trainer.stopping.Schedule); None
        for a fixed measured count."""
        return (WARMUP_MAX_STEPS, self.measure_max) if self.measure == "auto" else None
