"""Where a sweep's GPU time went. Pure arithmetic over result rows: no Ray, no torch.

An attempt holds `world_size` GPUs for its `trial_wall_s` (the driver's clock: from its group's placement,
or on a warm group from the trial's start, to the trial's end), so it costs wall × world_size GPU-seconds.
An ok attempt's wall splits into

    measured steps  steps_time_s, less compile_time_s when there was no warm-up step to carry it
    warm-up         warmup_steps × step_time_s (the median measured step: warm-up steps' own times are not kept)
    compile         compile_time_s (the first step's time beyond a steady step), and precompile_s (a fresh
                    group's first trial waiting for the group's graphs compiled ahead: trainer.precompile)
    start-up        the rest: placement, process start and imports, model build and sharding, teardown (and
                    a profiled trial's extra steps after the measured ones)

An attempt that ran out of memory is all `OOM attempts`; an error or a timeout is all `failed attempts`.
Unsupported attempts never ran and cost nothing.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from sweep.record.schema import Row

PARTS = ("measured steps", "warm-up", "compile", "start-up", "OOM attempts", "failed attempts")
_ALWAYS = PARTS[:5]  # the summary line names these even at 0 %; failed attempts only when there were some


def compile_seconds(row: Row) -> float:
    """What an ok attempt spent compiling: its first step's excess (compile_time_s) and, on a fresh group that
    compiled ahead, its wait for those graphs (precompile_s)."""
    return (row.get("compile_time_s") or 0.0) + (row.get("precompile_s") or 0.0)


def attempt_seconds(row: Row) -> dict[str, float]:
    """Wall-clock seconds of one attempt, by part (PARTS; per rank, not yet × world_size)."""
    parts = dict.fromkeys(PARTS, 0.0)
    wall = row.get("trial_wall_s") or 0.0
    status = row.get("status")
    if status == "oom":
        parts["OOM attempts"] = wall
    elif status in ("error", "timeout"):
        parts["failed attempts"] = wall
    elif status == "ok":
        compile_s = row.get("compile_time_s") or 0.0
        warmup_steps = row.get("warmup_steps") or 0
        parts["compile"] = compile_seconds(row)
        parts["warm-up"] = warmup_steps * (row.get("step_time_s") or 0.0)
        # with no warm-up step, the first measured step compiled: its excess is counted once, as compile
        parts["measured steps"] = max(0.0, (row.get("steps_time_s") or 0.0) - (compile_s if warmup_steps == 0 else 0.0))
        # the workers' clocks run inside the driver's wall; should they round past it, start-up is 0, not negative
        parts["start-up"] = max(0.0, wall - parts["compile"] - parts["warm-up"] - parts["measured steps"])
    return parts


def gpu_seconds(rows: Iterable[Row]) -> dict[str, float]:
    """GPU-seconds of all `rows` by part: each attempt's seconds × its world_size."""
    total = dict.fromkeys(PARTS, 0.0)
    for row in rows:
        for part, seconds in attempt_seconds(row).items():
            total[part] += seconds * (row.get("world_size") or 1)
    return total


def percents(seconds: dict[str, float]) -> dict[str, int]:
    """Whole percents of the total that add up to exactly 100 (largest remainders round up); {} for no time."""
    total = sum(seconds.values())
    if total <= 0:
        return {}
    exact = {k: 100 * v / total for k, v in seconds.items()}
    whole = {k: int(v) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: exact[k] - whole[k], reverse=True)[: 100 - sum(whole.values())]:
        whole[k] += 1
    return whole


def measured_share(row: Row) -> float | None:
    """The part of one attempt's wall spent in measured steps (0 for a failed one); None when it never ran."""
    parts = attempt_seconds(row)
    held = sum(parts.values())
    return parts["measured steps"] / held if held > 0 else None


def summary_line(rows: Iterable[Row]) -> str | None:
    """'GPU time: 412 GPU-s held — measured steps 31 %, warm-up 9 %, ...', or None when nothing ran."""
    return seconds_line(gpu_seconds(rows))


def seconds_line(seconds: dict[str, float]) -> str | None:
    """``summary_line`` of GPU-seconds by part: ``gpu_seconds``' answer, or the same sums made elsewhere (`results
    show` sums a million rows in DuckDB, ``sweep.results.gpu_time``): one wording for both."""
    shares = percents(seconds)
    if not shares:
        return None
    total = sum(seconds.values())
    held = (
        f"{total / 3600:,.1f} GPU-h"
        if total >= 3600
        else f"{total:,.0f} GPU-s"
        if total >= 10
        else f"{total:.2g} GPU-s"
    )
    named = [p for p in PARTS if p in _ALWAYS or seconds[p] > 0]
    return f"GPU time: {held} held — " + ", ".join(f"{p} {shares[p]} %" for p in named)


def fresh_trial_s(answer: Row, rows: Iterable[Row], *, recompile: bool = True) -> float | None:
    """What measuring `answer` (a search's answer row) once on fresh rank processes costs, in driver wall
    seconds: its own wall if it ran on a fresh group. Run on a warm group, its wall with two parts swapped for what
    a fresh group's processes paid in the same search (its ok attempts on fresh groups, the median of each):
    its model build for their start-up (torch imports, CUDA and process-group set-up, model build: init_time_s;
    placement and the process spawn before it are left out, so the estimate is low and the cost it divides, if
    anything, high), and its compile, where theirs of the same graphs (model, precision, compile, sequence) took
    longer: a warm group may have run graphs an earlier probe compiled (a symbolic batch: 0.1 s where the first
    probe took 25 s on one H200), which a fresh process compiles again. A search's cost is told against this:
    against a warm attempt's wall, which has no start-up and may have no compile, any search would look dear.
    `recompile=False` keeps the answer's own compile (a tune's cost cap: the budget its replays were set on)."""
    wall = answer.get("trial_wall_s")
    if not wall:
        return None
    if not answer.get("group_trial_index"):
        return wall
    fresh = [r for r in rows if r.get("status") == "ok" and not r.get("group_trial_index")]
    # a fresh group that compiled ahead waited inside its start-up for its graphs: that wait is its compile
    inits = [init - (r.get("precompile_s") or 0.0) for r in fresh if (init := r.get("init_time_s")) is not None]
    if not inits:
        return None
    own_compile = answer.get("compile_time_s") or 0.0
    compiles = [compile_seconds(r) for r in fresh if recompile and _same_graphs(r, answer)]
    compile_s = max(own_compile, statistics.median(compiles)) if compiles else own_compile
    return wall - (answer.get("init_time_s") or 0.0) + statistics.median(inits) - own_compile + compile_s


def _same_graphs(row: Row, other: Row) -> bool:
    """Whether two attempts compile the same graphs but for the batch size."""
    return all(row.get(k) == other.get(k) for k in ("model", "precision", "compile", "seq_len", "ac", "compile_mode"))
