"""What to run next after an attempt: OOM retry, infrastructure retry, max-batch search. Pure logic.

Plans turn results into follow-up trials; the runner executes whatever they return. Nothing here
imports torch or Ray, so every decision is unit-tested on its own (tests/test_policy.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

from sweep.grid import OomPolicy, Trial

INFRA_RETRIES = 1  # a dead rank process or lost node is retried once; OOM/unsupported/timeout never


def next_batch_after_oom(policy: OomPolicy, failed: int, *, ok: set[int], tried: set[int]) -> int | None:
    """The batch to retry after `failed` ran out of memory, or None to stop.

    halve:  failed // 2
    next:   failed - 1 (the next smaller batch: the exact limit, one attempt at a time)
    bisect: midway between the largest batch known to fit and `failed` (none known: halve)
    """
    if policy.policy == "none":
        return None
    if policy.policy == "halve":
        candidate = failed // 2
    elif policy.policy == "next":
        candidate = failed - 1
    else:
        fits = [b for b in ok if b < failed]
        candidate = (max(fits) + failed) // 2 if fits else failed // 2
    if candidate < policy.min_batch or candidate in tried or candidate >= failed:
        return None
    return candidate


def infra_retry(trial: Trial, status: str, infrastructure: bool) -> Trial | None:
    if status == "error" and infrastructure and trial.retry < INFRA_RETRIES:
        return trial.child(retry=trial.retry + 1)
    return None


class GridPlan:
    """Run every trial of the grid; after an OOM, retry the same config at a lower batch."""

    def __init__(self, trials: list[Trial], oom: OomPolicy):
        self.trials = trials
        self.oom = oom
        self._grid_batches: dict[tuple, list[int]] = {}
        for t in trials:
            self._grid_batches.setdefault(t.config_key, []).append(t.batch_size)
        self._ok: dict[tuple, set[int]] = {}
        self._tried: dict[tuple, set[int]] = {}

    def initial(self) -> list[Trial]:
        return list(self.trials)

    def on_result(self, trial: Trial, status: str, infrastructure: bool = False, row: dict | None = None) -> list[Trial]:
        key = trial.config_key
        self._tried.setdefault(key, set()).add(trial.batch_size)
        if status == "ok":
            self._ok.setdefault(key, set()).add(trial.batch_size)
        retry = infra_retry(trial, status, infrastructure)
        if retry is not None:
            return [retry]
        if status != "oom":
            return []
        grid_batches = self._grid_batches.get(key, [])
        # A lower batch that the grid runs anyway is not run twice: the grid's own trial covers it.
        tried = self._tried[key] | set(grid_batches)
        batch = next_batch_after_oom(self.oom, trial.batch_size, ok=self._ok.get(key, set()), tried=tried)
        return [] if batch is None else [trial.child(batch_size=batch, retry=0)]


@dataclass
class MaxBatchSearch:
    """Find the largest batch that fits (B ok, B+1 oom, or B+step with a coarser `step`) for one config.

    Exponential growth from `start` until the first OOM brackets the limit, then bisection. Peak memory of
    the successful probes is close to linear in batch; with two of them and a known `capacity_bytes` the
    search predicts the limit and probes next to it first, which often ends the search in two probes.
    """

    start: int = 1
    step: int = 1
    capacity_bytes: float | None = None
    max_batch: int = 1 << 16
    ok: dict[int, dict] = field(default_factory=dict)  # batch -> {"peak_mem_bytes", "tokens_per_s"}
    failed: dict[int, str] = field(default_factory=dict)  # batch -> status
    probes: list[int] = field(default_factory=list)
    aborted: str | None = None

    @property
    def largest_ok(self) -> int | None:
        return max(self.ok, default=None)

    @property
    def smallest_failed(self) -> int | None:
        return min(self.failed, default=None)

    def record(self, batch: int, status: str, *, peak_mem_bytes: float | None = None,
               tokens_per_s: float | None = None) -> None:
        self.probes.append(batch)
        if status == "ok":
            self.ok[batch] = {"peak_mem_bytes": peak_mem_bytes, "tokens_per_s": tokens_per_s}
        elif status == "oom":
            self.failed[batch] = status
        else:  # error / timeout / unsupported: the limit is not memory; stop and say why
            self.aborted = status

    def _predicted_limit(self) -> int | None:
        points = [(b, v["peak_mem_bytes"]) for b, v in sorted(self.ok.items()) if v.get("peak_mem_bytes")]
        if self.capacity_bytes is None or len(points) < 2:
            return None
        (b0, m0), (b1, m1) = points[-2], points[-1]
        slope = (m1 - m0) / (b1 - b0)
        if slope <= 0:
            return None
        return int(b1 + (self.capacity_bytes - m1) / slope)

    def next_probe(self) -> int | None:
        if self.aborted:
            return None
        lo, hi = self.largest_ok, self.smallest_failed
        if lo is None and hi is None:
            return self.start
        if lo is None:  # even the first probe failed: go down
            candidate = hi // 2
            return candidate if candidate >= 1 and candidate not in self.failed else None
        if hi is None:  # still growing
            if lo >= self.max_batch:
                return None
            guess = self._predicted_limit()
            grow = lo * 2
            if guess is not None and guess > lo:
                # probe just past the predicted limit: an OOM there brackets it tightly, an ok moves on
                return min(max(guess + self.step, lo + self.step), self.max_batch)
            return min(grow, self.max_batch)
        if hi - lo <= self.step:
            return None
        guess = self._predicted_limit()
        if guess is not None and lo < guess < hi:
            # the limit is most likely guess: probe it, and guess+step next, unless already known
            for candidate in (guess, guess + self.step):
                if lo < candidate < hi:
                    return candidate
        return lo + max(self.step, ((hi - lo) // 2) // self.step * self.step)

    def fastest(self) -> int | None:
        rated = {b: v["tokens_per_s"] for b, v in self.ok.items() if v.get("tokens_per_s")}
        return max(rated, key=rated.get) if rated else None


def search_id(trial: Trial) -> str:
    """The search for one config (not one run): a resumed search keeps its id and its probes."""
    return hashlib.sha256(repr(trial.config_key).encode()).hexdigest()[:12]


class MaxBatchPlan:
    """One MaxBatchSearch per (model, precision, compile, ac, seq_len, ranks); each probe is a trial."""

    def __init__(self, seeds: list[Trial], *, capacity_bytes: float | None, step: int = 1):
        self.templates: dict[tuple, Trial] = {}
        self.searches: dict[tuple, MaxBatchSearch] = {}
        for t in seeds:
            if t.config_key in self.templates:
                continue
            sid = search_id(t)
            self.templates[t.config_key] = replace(t, search_id=sid)
            self.searches[t.config_key] = MaxBatchSearch(start=t.batch_size, step=step, capacity_bytes=capacity_bytes)

    def _probe(self, key: tuple) -> list[Trial]:
        batch = self.searches[key].next_probe()
        if batch is None:
            return []
        template = self.templates[key]
        return [replace(template, batch_size=batch)]

    def initial(self) -> list[Trial]:
        return [t for key in self.searches for t in self._probe(key)]

    def on_result(self, trial: Trial, status: str, infrastructure: bool = False, row: dict | None = None) -> list[Trial]:
        retry = infra_retry(trial, status, infrastructure)
        if retry is not None:
            return [retry]
        search = self.searches[trial.config_key]
        row = row or {}
        peak = row.get("peak_mem_gib")
        search.record(trial.batch_size, status, peak_mem_bytes=peak * 1024**3 if peak is not None else None,
                      tokens_per_s=row.get("tokens_per_s_per_gpu"))
        return self._probe(trial.config_key)

    def verdicts(self) -> list[dict]:
        out = []
        for key, search in self.searches.items():
            t = self.templates[key]
            out.append({"search_id": t.search_id, "model": t.model.label, "precision": t.precision,
                        "compile": t.compile, "ac": t.ac, "seq_len": t.seq_len, "gpus": t.gpus,
                        "options": t.options_text(), "max_batch": search.largest_ok, "first_failing_batch": search.smallest_failed,
                        "fastest_batch": search.fastest(), "probes": len(search.probes),
                        "probe_batches": list(search.probes), "aborted": search.aborted})
        return out
