"""What a `search: fastest` probe will cost before it runs, against what the search may spend (`tune.max_cost`,
in measured trials of its leader). GPU time is the user's money, and one probe can cost ten of another: on one
H200 the GPT-1.5B torchao search's probe of `compile: full` compiled for 167.5 s where its other probes took
10-47 s, and took the search to 14.1x one trial (RESULTS.md, session 10). Pure: no torch, no Ray.

A probe's seconds are predicted as its compile plus its steps:
  compile  the most a probe of its compile mode compiled in this search (the first compile is the dear one: later
           ones load inductor's cache), else regional's most times COMPILE_VS_REGIONAL (a mode not run yet);
  steps    its warm-up and measured steps, each the leader's step time scaled by the samples a step trains.
One trial: the leader (the fastest clean short probe) measured once on fresh processes (sweep.record.cost.fresh_trial_s)
at the finals' steps (`auto`: at least AUTO_LEAST). Unknown (rows without step times) means no cap.
The finals are reserved at the most they may take: `auto` steps run at most final_auto_max in a tune's final (the
trainer stops there: trainer.stopping.Schedule), so the cap holds however noisy a final's steps are.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import cast

from sweep.record.cost import fresh_trial_s
from sweep.search.fastest.space import SHORT, Config, Row, Steps
from trainer.stopping import MEASURE_CI_LEAST

# A compile mode's first compile against regional's. On one H200, GPT-1.5B: full 70.1 s against regional 11.8 s
# in bf16 (5.9x), 167.5 against 22.0 and ~170 against 17.2 in torchao FP8 (7.6x, 9.9x) (RESULTS.md, sessions 9
# and 10): the most measured, rounded up. `none` compiles nothing.
COMPILE_VS_REGIONAL = {"none": 0.0, "regional": 1.0, "full": 10.0}
AUTO_LEAST = (3, 5)  # `auto` steps run at least this many (warm-up, measured): sweep.spec.grid.Steps
# ...and in a tune's final at most this many micro-batches' worth (final_auto_max). The most any final has taken on
# 2xH200 is 4 + 12 steps of one micro-batch (Llama3-8B TE, bf16 reduce); the same search's fp32-reduce baseline
# final then ran past 170 s, probably at the trainer's own maxima (50 + 100 steps), and took the search's GPU time
# past its cap (RESULTS.md, session 11). Twice the most seen; a step of 8 micro-batches is as steady as 8 steps
# (tune_space.probe_steps), so it runs auto's least, but 6 measured steps, the fewest a median's 95 % interval
# has (trainer.stopping.median_ci): the row keeps the interval reached, and says how far a maximum cut it short.
FINAL_AUTO_MAX = (8, 16)


def final_auto_max(grad_accum: int) -> tuple[int, int]:
    """The most warm-up and measured steps an `auto` final of `grad_accum` micro-batches a step runs."""
    warmup, measure = (math.ceil(most / grad_accum) for most in FINAL_AUTO_MAX)
    return max(AUTO_LEAST[0], warmup), max(MEASURE_CI_LEAST, measure)


def _steps(steps: Steps, auto: tuple[int, int] = AUTO_LEAST) -> int:
    n: int = sum(auto[i] if s == "auto" else s for i, s in enumerate(steps))
    return n


def one_trial_s(leader: Row | None, rows: Iterable[Row], final_steps: Steps) -> float | None:
    """Seconds to measure the leader's row once on fresh processes at the finals' steps; None if unknown."""
    # the leader's own compile, not a fresh process's: the cap the recorded searches were replayed on
    # (tests/test_tune_replay.py); a verdict tells its cost against the fresh estimate, compile included
    fresh: float | None = fresh_trial_s(leader, rows, recompile=False) if leader else None
    if fresh is None or not leader:
        return None
    step, warmup = leader.get("step_time_s"), leader.get("warmup_steps")
    if not step or warmup is None:
        return None
    ran: int = warmup + cast(int, leader["measure_steps"])  # a row that has warm-up steps has measured ones
    return fresh + max(0, _steps(final_steps) - ran) * step


def final_s(leader: tuple[Config, Row], rows: Iterable[Row], final_steps: Steps) -> float | None:
    """The most a final of the leader (config, row) may take: one trial with its `auto` steps at their most
    (final_auto_max)."""
    lead, row = leader
    least = one_trial_s(row, rows, final_steps)
    extra = _steps(final_steps, final_auto_max(lead.grad_accum)) - _steps(final_steps)
    if least is None:
        return None
    step = cast(float, row["step_time_s"])  # (known: least is)
    return least + extra * step


def spent_s(rows: Iterable[Row]) -> float:
    """What a search's attempts took (driver wall seconds; fsum: one sum in any order): its verdict's
    search_wall_s, and what `affordable` counts as spent."""
    return math.fsum(r.get("trial_wall_s") or 0.0 for r in rows)


def compile_times(probes: list[tuple[Config, Row]]) -> dict[str, float]:
    """The most any attempt (config, row) of each compile mode compiled for: its first compile's, since later
    ones load inductor's cache."""
    compiled: dict[str, float] = {}
    for p, r in probes:
        if (compile_s := r.get("compile_time_s")) is not None:
            compiled[p.compile] = max(compiled.get(p.compile, 0.0), compile_s)
    return compiled


def probe_s(c: Config, steps: Steps, leader: tuple[Config, Row], compiled: dict[str, float]) -> float | None:
    """Predicted seconds of probing `c` at `steps`, from the leader's step time and the compile times measured
    (`compile_times`); None if nothing says."""
    lead, row = leader
    step = row.get("step_time_s")
    if not step:
        return None
    if c.compile in compiled:
        compile_s = compiled[c.compile]
    elif "regional" in compiled:
        compile_s = compiled["regional"] * COMPILE_VS_REGIONAL[c.compile]
    else:
        return None
    samples = (c.batch_size * c.grad_accum) / (lead.batch_size * lead.grad_accum)
    # `auto` steps are a final's (a runner-up's): at their most
    return compile_s + _steps(steps, final_auto_max(c.grad_accum)) * step * samples


# A probe is stopped (status timeout: a row, and the search goes on) past HANG_X times the seconds predicted for it
# on fresh processes (one trial of the leader, plus its own compile and steps), and never before HANG_FLOOR_S, where
# the grid's timeout_s (default 30 min) would hold a hung group for half an hour. Every attempt of the tunes recorded
# on 2xH200 that the search still makes ran within its limit (tests/test_tune_replay.py);
# the longest attempt recorded, a first `compile: full` (178.3 s, RESULTS.md session 10), is predicted at regional's
# compile x 10 and would be stopped only past 3x that.
HANG_X = 3.0
HANG_FLOOR_S = 300.0


def time_limit_s(
    c: Config, steps: Steps, leader: tuple[Config, Row] | None, probes: list[tuple[Config, Row]], final_steps: Steps
) -> float | None:
    """How long probing `c` at `steps` may run before it is stopped; None when nothing says what it costs (no clean
    probe yet, no step times): the grid's timeout_s then."""
    if leader is None:
        return None
    unit = one_trial_s(leader[1], [r for _, r in probes], final_steps)
    own = probe_s(c, steps, leader, compile_times(probes))
    return None if unit is None or own is None else max(HANG_FLOOR_S, HANG_X * (unit + own))


def affordable(
    wave: list[Config],
    steps: list[Steps],
    *,
    leader: tuple[Config, Row] | None,
    finals: int,
    max_cost: float | None,
    probes: list[tuple[Config, Row]],
    final_steps: Steps,
) -> tuple[list[Config], list[Config]]:
    """(kept, skipped): the probes of `wave` (each at its `steps`) in order while their predicted seconds leave
    room, under `max_cost` one-trial costs of the leader, for what every attempt so far took (`probes`: config
    and row of each; the verdict's search_wall_s), the `finals` full measurements (at their most: final_s) and the
    leader's profile. All kept when nothing says what a trial costs (no leader, no step times, no cap)."""
    rows = [r for _, r in probes]
    unit = one_trial_s(leader[1], rows, final_steps) if leader and max_cost else None
    if unit is None or leader is None or max_cost is None:  # (unit is None then already)
        return wave, []
    compiled = compile_times(probes)
    profile = probe_s(leader[0], SHORT, leader, compiled) or 0.0
    final = final_s(leader, rows, final_steps)
    assert final is not None  # the unit is known: so is the leader's final
    room = max_cost * unit - spent_s(rows) - finals * final - profile
    kept: list[Config] = []
    skipped: list[Config] = []
    for c, at in zip(wave, steps, strict=True):
        cost = probe_s(c, at, leader, compiled) or 0.0
        if cost > room:
            skipped.append(c)
        else:
            room -= cost
            kept.append(c)
    return kept, skipped
