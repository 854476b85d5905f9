"""When to stop warming up and when to stop measuring. Pure: no torch, no Ray.

A fixed step count is too many for a stable 8B step and too few for a noisy small model. The `auto`
rules stop when the numbers say so, as `torch.utils.benchmark.Timer.adaptive_autorange` and NVIDIA
nvbench do:

- warm-up (`WarmUp`): until the last two step times agree within 10 % (the slower at most 10 % above
  the faster), at least 2 and at most 50 steps. What warm-up must leave out (a compile, autotuning, first-touch
  allocations) costs a step many times a steady one; steady steps themselves alternate by 3-5 % on an H200
  (0.519, 0.549, 0.524, 0.547 s ...), so three within 2 % took 5-14 steps there for no better median.
  Replayed on 25 GPU rows no rule was set on (sessions 17-19, 13-40 steps each), the median of the steps after
  this warm-up (3 steps) is within ±0.25 % of the row's own (benchmarks/RESULTS.md "Cold sweep");
- measurement (`Measure`): until the 95 % confidence interval of the median step time lies within ±1 %
  of the median, at least 5 and at most 100 steps, or until the measured steps have taken `time_cap_s`.

`Schedule(..., auto_max=(w, m))` lowers those maxima to w warm-up and m measured steps: a grid's
`steps.measure_max` (8 by default: steady steps that alternate a few % apart meet ±1 % only after 10-25 steps, where 8
steps' median is as close to a 30-step one, sweep.spec.grid.MEASURE_MAX_DEFAULT), and a tune's finals, whose GPU time
its cost cap has to know in advance (sweep.search.fastest.cost.FINAL_AUTO_MAX). A step stopped at the maximum keeps
the confidence interval it reached in its row (step_time_ci_pct; ci_target_met false).

`Fixed(n)` has the same interface, so that a loop need not care which it has. `Schedule` chains a
warm-up rule and a measurement rule; in a multi-rank trial only rank 0 feeds it (`add`) and the others
`follow` the phase rank 0 broadcasts, so that every rank stops on the same step.
"""

from __future__ import annotations

import math
import statistics
from typing import Literal

StepsSpec = int | Literal["auto"]
PHASES = ("warmup", "measure", "done")  # a phase's index is what rank 0 broadcasts

WARMUP_MAX_STEPS = 50  # the most warm-up steps `auto` runs
MEASURE_MAX_STEPS = 100  # the most measured steps `auto` runs (a grid lowers it: sweep.spec.grid.Steps.measure_max)
MEASURE_CI_LEAST = 6  # the fewest measured steps whose median has a 95 % interval (median_ci: none under 6)
MEASURE_TIME_CAP_S = 300.0  # auto measurement stops after this many seconds of measured steps (min_steps first)
MEASURE_TARGET_PCT = 1.0  # auto measurement stops once the median's 95 % interval is within ± this % of it


def median_ci(times: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """The distribution-free confidence interval of the median: a pair of order statistics.

    With n sorted samples x(1) <= ... <= x(n), the count of samples below the true median is
    Binomial(n, 1/2), so [x(k), x(n-k+1)] covers the median with probability 1 - 2·P(B <= k-1). k is the
    largest rank that keeps this at least `confidence` (W. J. Conover, *Practical Nonparametric
    Statistics*, 3rd ed., Wiley 1999, section 3.2, "confidence interval for a quantile"; the ranks match
    the table of M. J. Campbell and M. J. Gardner, "Calculating confidence intervals for some
    non-parametric analyses", BMJ 296:1454, 1988: n = 10 gives x(2)..x(9), n = 100 x(40)..x(61)).
    Makes no assumption on the distribution of step times, which are skewed (a slow outlier, never a fast one).
    None when n is too small for any pair to reach `confidence` (n < 6 at 95 %).
    """
    n = len(times)
    tail = (1 - confidence) / 2
    k, below = 0, 0.0  # below = P(B <= k - 1), the probability mass left out on each side
    while k < n // 2:
        below_next = below + math.comb(n, k) / 2**n  # P(B <= k)
        if below_next > tail:
            break
        k, below = k + 1, below_next
    if k == 0:
        return None
    ordered = sorted(times)
    return ordered[k - 1], ordered[n - k]


def ci_half_width_pct(times: list[float], confidence: float = 0.95) -> float | None:
    """The interval's half-width in % of the median: its farther end's distance from the median (the
    interval of order statistics is not symmetric). None when `median_ci` has no interval."""
    ci = median_ci(times, confidence)
    if ci is None:
        return None
    median = statistics.median(times)
    return 100 * max(median - ci[0], ci[1] - median) / median


def ci_target_met(measure: StepsSpec, ci_pct: float | None) -> bool | None:
    """Whether a trial's interval (its row's step_time_ci_pct) is within `auto` measurement's target: None for a
    fixed count (it sets no target), False for an `auto` one that stopped at its maximum steps or time cap
    short of it (no interval at all included)."""
    if measure != "auto":
        return None
    return ci_pct is not None and ci_pct <= MEASURE_TARGET_PCT


class Fixed:
    """Exactly `n` steps."""

    def __init__(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"a step count must be >= 0, got {n}")
        self.n = n
        self.times: list[float] = []

    @property
    def done(self) -> bool:
        return len(self.times) >= self.n

    def add(self, step_time: float) -> bool:
        """Record one step; True when the phase is over."""
        self.times.append(step_time)
        return self.done


class WarmUp(Fixed):
    """Until the last `window` step times agree within `tolerance` (slowest / fastest - 1), between
    `min_steps` and `max_steps` steps. Agreement needs `window` steps, so fewer are never enough."""

    def __init__(
        self, *, tolerance: float = 0.10, window: int = 2, min_steps: int = 2, max_steps: int = WARMUP_MAX_STEPS
    ) -> None:
        super().__init__(max_steps)
        self.tolerance, self.window, self.min_steps = tolerance, window, min_steps

    @property
    def spread(self) -> float | None:
        """slowest / fastest - 1 over the last `window` steps; None before `window` steps."""
        if len(self.times) < self.window:
            return None
        last = self.times[-self.window :]
        return max(last) / min(last) - 1

    @property
    def done(self) -> bool:
        if len(self.times) >= self.n:
            return True
        spread = self.spread
        return len(self.times) >= self.min_steps and spread is not None and spread <= self.tolerance


class Measure(Fixed):
    """Until the `confidence` interval of the median is within ±`target_pct` % of it, between `min_steps`
    and `max_steps` steps, or until the steps recorded have taken `time_cap_s` seconds (after `min_steps`:
    fewer steps would not make a number)."""

    def __init__(
        self,
        *,
        target_pct: float = MEASURE_TARGET_PCT,
        confidence: float = 0.95,
        min_steps: int = 5,
        max_steps: int = MEASURE_MAX_STEPS,
        time_cap_s: float | None = MEASURE_TIME_CAP_S,
    ) -> None:
        super().__init__(max_steps)
        self.target_pct, self.confidence, self.min_steps, self.time_cap_s = (
            target_pct,
            confidence,
            min_steps,
            time_cap_s,
        )

    @property
    def ci_pct(self) -> float | None:
        """Half-width of the median's confidence interval, % of the median (None: too few steps yet)."""
        return ci_half_width_pct(self.times, self.confidence)

    @property
    def done(self) -> bool:
        n = len(self.times)
        if n >= self.n:
            return True
        if n < self.min_steps:
            return False
        if self.time_cap_s is not None and sum(self.times) >= self.time_cap_s:
            return True
        ci = self.ci_pct
        return ci is not None and ci <= self.target_pct


def rule(spec: StepsSpec, phase: Literal["warmup", "measure"]) -> Fixed:
    """The rule for a grid's `steps.warmup` or `steps.measure`: a count, or `auto`."""
    if spec == "auto":
        return WarmUp() if phase == "warmup" else Measure()
    return Fixed(spec)


class Schedule:
    """Warm-up, then measurement, then done. `add` decides from this rank's step times (rank 0);
    `follow` records a step and takes the phase decided elsewhere (the other ranks). `auto_max`: the most
    warm-up and measured steps an `auto` phase may run (None: the rules' own maxima)."""

    def __init__(self, warmup: StepsSpec, measure: StepsSpec, auto_max: tuple[int, int] | None = None) -> None:
        self.warmup, self.measure = rule(warmup, "warmup"), rule(measure, "measure")
        for phase, most in zip((self.warmup, self.measure), auto_max or (None, None)):
            if isinstance(phase, (WarmUp, Measure)) and most is not None:  # `auto`: a fixed count is what it says
                phase.n = max(min(phase.n, most), phase.min_steps)
        self.adaptive = "auto" in (warmup, measure)  # fixed counts need no decision shared between ranks
        self.phase = "warmup"
        self._advance()

    def _advance(self) -> None:
        if self.phase == "warmup" and self.warmup.done:
            self.phase = "measure"
        if self.phase == "measure" and self.measure.done:
            self.phase = "done"

    def add(self, step_time: float) -> str:
        """Record one step's time in the current phase; the phase for the next step."""
        self._current().times.append(step_time)
        self._advance()
        return self.phase

    def follow(self, step_time: float, phase: str) -> None:
        """Record one step's time in the current phase, then move to `phase` (rank 0's decision)."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; valid: {', '.join(PHASES)}")
        self._current().times.append(step_time)
        self.phase = phase

    def _current(self) -> Fixed:
        if self.phase == "done":
            raise RuntimeError("the schedule is done: no more steps")
        return self.warmup if self.phase == "warmup" else self.measure

    @property
    def times(self) -> list[float]:
        """Every step's time, warm-up first."""
        return self.warmup.times + self.measure.times
