"""What to run next after an attempt: OOM retry, infrastructure retry, max-batch search. Pure logic.

Plans turn results into follow-up trials; the runner executes whatever they return. Nothing here
imports torch or Ray, so every decision is unit-tested on its own (tests/test_policy.py).
"""

from __future__ import annotations

import hashlib
import math
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


# The memory model picks at most this many probes: batch 1 after a failed start, a jump from one fitting
# batch, the predicted limit L, L + step, and room for a correction each way.
GUIDED_PROBES = 6
GUIDED_MISSES = 2  # wrong this often (an OOM where it said fit, or the reverse), the model is set aside


@dataclass
class MaxBatchSearch:
    """Find the largest batch that fits (B ok, B+1 oom, or B+step with a coarser `step`) for one config.

    An OOM probe costs most (its rank processes are retired and the next probe starts fresh ones; a
    fitting probe leaves them warm), so with a known `capacity_bytes` the probes are ordered to fit:
      1. `start`; if that fails, batch 1 (if 1 fails, nothing fits). Halving could fail several times.
      2. From one fitting batch B with peak m: B·capacity/m, the largest batch that cannot pass the
         capacity whatever part of m is fixed (for peak = a + b·batch with a, b >= 0, peak/batch does not
         grow with batch).
      3. From two fitting batches, the line peak ≈ a + b·batch through the two largest predicts the limit
         L: probe L, then L + step. On a linear curve L fits and L + step does not, and that is the
         verdict. If L itself fails (the usable memory is a little under the capacity), L - step next.
    On a linear curve (a, b >= 0) under the stated capacity a search takes at most 5 probes, of which at
    most 2 OOM: `start` if it is too large, and L + step. Off such a curve the model is set aside after
    GUIDED_MISSES wrong calls or GUIDED_PROBES probes; from then on (and with no capacity, e.g. an
    uncapped CPU) the batch grows by twice its last gain (doubling from one fit) until the first OOM, and
    the bracket is bisected, jumping no further than that growth would. At most GUIDED_PROBES + 2 +
    2·ceil(log2(max(start, limit) + 2)) probes in all (tests/test_policy.py checks both bounds).
    """

    start: int = 1
    step: int = 1
    capacity_bytes: float | None = None
    max_batch: int = 1 << 16
    ok: dict[int, dict] = field(default_factory=dict)  # batch -> {"peak_mem_bytes", "tokens_per_s"}
    failed: dict[int, str] = field(default_factory=dict)  # batch -> status
    probes: list[int] = field(default_factory=list)
    aborted: str | None = None
    guided: int = 0  # probes the memory model picked
    misses: int = 0  # of those, how many went the other way than it said

    @property
    def largest_ok(self) -> int | None:
        return max(self.ok, default=None)

    @property
    def smallest_failed(self) -> int | None:
        return min(self.failed, default=None)

    def record(self, batch: int, status: str, *, peak_mem_bytes: float | None = None,
               tokens_per_s: float | None = None) -> None:
        choice = self._choice() if self.probes else None
        if choice is not None and choice[0] == batch and choice[1]:
            self.guided += 1
            self.misses += choice[2] is not None and (status == "ok") != choice[2]
        self.probes.append(batch)
        if status == "ok":
            self.ok[batch] = {"peak_mem_bytes": peak_mem_bytes, "tokens_per_s": tokens_per_s}
        elif status == "oom":
            self.failed[batch] = status
        else:  # error / timeout / unsupported: the limit is not memory; stop and say why
            self.aborted = status

    def next_probe(self) -> int | None:
        choice = self._choice()
        return None if choice is None else choice[0]

    def _choice(self) -> tuple[int, bool, bool | None] | None:
        """The next batch; whether the memory model picked it; whether it said the batch fits (None: no
        claim). None when the search is over."""
        if self.aborted:
            return None
        lo, hi = self.largest_ok, self.smallest_failed
        if lo is None and hi is None:
            return self.start, False, None
        if lo is None:  # even the first probe failed: go down
            return None if hi <= 1 else self._guided(lo, hi) or (hi // 2, False, None)
        if (hi is not None and hi - lo <= self.step) or (hi is None and lo >= self.max_batch):
            return None
        guided = self._guided(lo, hi)
        if guided is not None:
            return guided
        # Gallop: twice the last gain (from one fit: double it), so growth after the model's small steps
        # starts small. Bisect a bracket, but never jump further than that: a wide bracket (left by a
        # failed `start` or a wrong model) is crossed with probes that are likely to fit.
        fits = sorted(self.ok)
        jump = 2 * (lo - fits[-2]) if len(fits) > 1 else lo
        if hi is None:
            return min(lo + jump, self.max_batch), False, None
        return lo + max(self.step, min(jump, (hi - lo) // 2) // self.step * self.step), False, None

    def _guided(self, lo: int | None, hi: int | None) -> tuple[int, bool, bool | None] | None:
        """The probe the memory model picks inside (lo, hi), as _choice; None when it has nothing to go on
        (no capacity, no peak) or has had its turn."""
        if self.capacity_bytes is None or self.guided >= GUIDED_PROBES or self.misses >= GUIDED_MISSES:
            return None
        if lo is None:
            return 1, True, True
        top = self.max_batch if hi is None else hi - self.step
        limit = self._predicted_limit()
        if limit is not None:  # the predicted limit; if that is lo, the next batch up (it should OOM)
            batch = min(max(limit, lo + self.step), top)
            return batch, True, batch <= limit
        peak = self.ok[lo].get("peak_mem_bytes")
        if not peak:
            return None
        # a bound, not an estimate: a batch past it may fit as well
        safe = math.floor(lo * self.capacity_bytes / peak)
        batch = min(max(safe, lo + self.step), top)
        return batch, True, True if batch <= safe else None

    def _predicted_limit(self) -> int | None:
        """The largest batch under the capacity on the line through the two largest fitting batches."""
        points = [(b, v["peak_mem_bytes"]) for b, v in sorted(self.ok.items()) if v.get("peak_mem_bytes")]
        if len(points) < 2:
            return None
        (b0, m0), (b1, m1) = points[-2], points[-1]
        slope = (m1 - m0) / (b1 - b0)
        if slope <= 0:
            return None
        # a peak exactly at the capacity fits; rounding must not turn that limit L into L - 1
        return math.floor(b1 + (self.capacity_bytes - m1) / slope + 1e-9)

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
            out.append({"kind": "max_batch", "search_id": t.search_id, "model": t.model.label, "precision": t.precision,
                        "compile": t.compile, "ac": t.ac, "seq_len": t.seq_len, "gpus": t.gpus,
                        "options": t.options_text(), "max_batch": search.largest_ok, "first_failing_batch": search.smallest_failed,
                        "fastest_batch": search.fastest(), "probes": len(search.probes),
                        "probe_batches": list(search.probes), "aborted": search.aborted})
        return out
