"""The step time's confidence interval in captions and `sweep run`'s warnings. Pure: rows are dicts.

`steps: {measure: auto}` measures until the median step time's 95 % interval is within ±1 % of it, but stops at
its limit, its most steps (`steps.measure_max`, 8 unless the grid says; a tune's finals no more) or 300 s of
measured steps (`trainer.stopping`): on a noisy step it stops short, and its row says so (`ci_target_met` false).
`sweep run` warns once per such attempt (past WARN_EACH_MOST, once for them all); `results show` and `export` print
each row's interval beside its step time, marked `render.MISSED` where it fell short, and say so under the table.
The grid keys a user can turn: `steps.measure_max` (up to 100) or `steps.measure` as a count (the interval narrows
as 1/√steps), and what makes the steps steadier (a larger batch, an idle machine).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sweep.results.render import MISSED, RATIO_SIGNIFICANT, sig
from trainer.stopping import MEASURE_MAX_STEPS, MEASURE_TARGET_PCT

_TARGET = f"±{MEASURE_TARGET_PCT:g} %"
_LIMIT = "steps: auto stopped at its limit (steps.measure_max, or 300 s of steps)"


def ci_note(rows: Sequence[Mapping[str, Any]]) -> str:
    """The caption's word for MISSED, when a row carries it ('' otherwise)."""
    if not any(r.get("ci_target_met") is False for r in rows):
        return ""
    return f"{MISSED}: {_LIMIT} short of its {_TARGET} target; a larger steps.measure_max measures more"


def _more(steps: int) -> str:
    """The grid key that measures `steps` steps: auto's maximum while it allows them, else a count."""
    return f"set steps.measure_max: {steps}" if steps <= MEASURE_MAX_STEPS else f"set steps.measure to a count: {steps}"


# More attempts than this short of the target are said in one line (the table marks each): on GPUs, where a grid's
# steps are `auto` unless it says otherwise, a sweep of steady-but-alternating steps can miss on half its trials.
WARN_EACH_MOST = 3


def missed_target_warnings(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per ok attempt whose `auto` measurement missed its target: which trial, its interval after how
    many steps, and what to change in the grid; past WARN_EACH_MOST attempts, one line for them all, naming the
    widest."""
    missed = [r for r in rows if r.get("status") == "ok" and r.get("ci_target_met") is False]
    if len(missed) > WARN_EACH_MOST:
        widest = max(missed, key=lambda r: (r.get("step_time_ci_pct") is None, r.get("step_time_ci_pct") or 0.0))
        ok = sum(r.get("status") == "ok" for r in rows)
        measure = max(r.get("measure_steps") or 0 for r in missed)
        return [
            f"{len(missed)} of {ok} attempts stopped short of the {_TARGET} target (marked {MISSED}); the widest: "
            f"{_one(widest)}: {_LIMIT}; for a tighter interval {_more(4 * measure)} (4× the steps about halve it)"
        ]
    return [
        f"{_one(row)} (target {_TARGET}): {_LIMIT}; for a tighter interval {_more(4 * (row.get('measure_steps') or 0))}"
        " (4× the steps about halve it), or make the steps steadier (a larger batch, an otherwise idle machine)"
        for row in missed
    ]


def _one(row: Mapping[str, Any]) -> str:
    """`gpt-tiny bf16 bsz 2 (trial 01234567): step time ±12.3 % after 50+100 steps`"""
    ci = row.get("step_time_ci_pct")
    interval = "no interval" if ci is None else f"±{sig(ci, RATIO_SIGNIFICANT)} %"
    return (
        f"{row['model']} {row['precision']} bsz {row['batch_size']} (trial {row['trial_id'][:8]}): step time "
        f"{interval} after {row.get('warmup_steps') or 0}+{row.get('measure_steps') or 0} steps"
    )
