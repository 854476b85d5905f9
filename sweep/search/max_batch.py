"""`search: max_batch` (`sweep max-batch`): the largest batch that fits, and the fastest, per config. Pure logic.

A search's probes are placed by the memory model when it has one, else by doubling and bisection, within the
probe budget of sweep.search.probe_budget (tests/test_policy.py, tests/test_max_batch_bound.py).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from sweep.record.schema import int_range
from sweep.search import probe_budget
from sweep.search.max_batch_verdict import MaxBatchVerdict
from sweep.search.plan import Verdict
from sweep.search.policy import infra_retry, is_predicted_oom
from sweep.spec.grid import Trial

# The largest batch_size a row can record (its Arrow type): no search proposes a batch past it, whatever its
# start, max_batch or memory model says (a user's own sizes are checked against the schema before Ray starts).
MAX_BATCH = int_range("batch_size")[1]

GUIDED_MISSES = 2  # the memory model wrong this often (an OOM where it said fit, or the reverse): set aside
# Unbounded (the tune fit's search), the model picks at most this many probes: batch 1 after a failed
# start, a jump from one fitting batch, the predicted limit L, L + step, and a correction each way.
GUIDED_PROBES = 6


class Probe(NamedTuple):
    """A search's next probe, and who picked it."""

    batch: int
    """The batch to probe."""
    guided: bool
    """The memory model picked it."""
    fits: bool | None
    """What the model said it would do (None: no claim)."""


@dataclass
class MaxBatchSearch:
    """Find the largest batch that fits (B ok, B+1 oom, or B+step with a coarser `step`) for one config.

    Bound: at most 2·⌈log₂ B⌉ + 2 probes for a limit B (one more when `start` is past it) on any memory
    curve that grows with the batch, whatever the memory model guesses: every probe is taken inside
    sweep.search.probe_budget.window, the probes that keep that bound whichever way they come out.
    Inside it, an OOM probe costs most (its rank processes are retired and the next probe starts fresh
    ones; a fitting probe leaves them warm), so with a known `capacity_bytes` the probes are ordered to fit:
      1. `start`; if that fails, batch 1 (if 1 fails, nothing fits). Halving could fail several times.
      2. From one fitting batch B with peak m: B·capacity/m, the largest batch that cannot pass the
         capacity whatever part of m is fixed (for peak = a + b·batch with a, b >= 0, peak/batch does not
         grow with batch). From batch 1 the bound allows only 2 (the limit may be 1).
      3. From two fitting batches, the line peak ≈ a + b·batch through the two largest predicts the limit
         L: probe L, then L + step. On a linear curve L fits and L + step does not, and that is the verdict.
    On a linear curve (a, b >= 0) under the stated capacity a search takes at most 5 probes, of which at
    most 2 OOM: `start` if it is too large, and L + step. A failed batch is an upper bound: a line (or
    bound) that says it fits is wrong there and guesses nothing more until a new fit refits it (where
    the line overshot: the parabola through the three largest fits); the bracket is bisected meanwhile,
    never probed next to the failed guess. The model is set aside after
    GUIDED_MISSES wrong calls; from then on (and with no capacity, e.g. an uncapped CPU) the batch grows
    by twice its last gain (doubling from one fit) until the first OOM, and the bracket is bisected.
    The bound is tight: after 1 and 2 fit, a wrong guess of L leaves no probe to spare, and the search
    doubles from 3 and bisects as a search without a model would (tests/test_max_batch_bound.py checks
    the bound on many curves and limits).
    """

    start: int = 1
    """The first batch to probe (without a prediction)."""
    step: int = 1
    """Granularity: the search ends at B ok and B + step oom."""
    capacity_bytes: float | None = None
    """Memory a rank may use (None: unknown, e.g. an uncapped CPU: no memory model then)."""
    predicted: int | None = None
    """The memory model's largest batch under the capacity (sweep.memory.predictor): the first probe in place of
    `start`, and, when it fits, its neighbour next (a right prediction is found in 2 probes); a failed one is
    `start`'s one probe past the bound, and from there on the search goes as from a failed start."""
    max_batch: int = 1 << 16
    """Where growth stops without an OOM (an uncapped CPU); MAX_BATCH bounds it."""
    peak_model: Callable[[int], float] | None = None
    """The memory model's peak at a batch, uncalibrated (sweep.memory.model): once the prediction has fitted, the
    model scaled by measured / predicted at that batch places the next probe (one fit draws no line). On one H200
    the uncalibrated model put a torchao FP8 limit at 12; scaled by batch 12's peak it says 14, which is the limit,
    where the neighbour 13 would have cost a probe. None: no model (CPU ranks, --no-predict)."""
    headroom: float = 0.0
    """The fraction of capacity_bytes a probe the model calls fitting leaves free: a GPU's declared memory is more
    than torch can allocate (the CUDA context; sweep.memory.capacity.GPU_HEADROOM). An OOM ends the rank group, so
    the probe after it pays a fresh start: a probe at the edge is better taken last. It orders the probes, never
    decides the answer (a limit is always B ok and B + step oom, both probed)."""
    bounded: bool = True
    """False: the tune fit's ordering from before the bound (sweep.search.fastest.level_fit.LevelFit): at most
    FIT_PROBES probes there, so no bound to keep; a failed L is followed by L - step (on 2xH200 GPT torchao 67
    failed and 66 fitted, rows the tune replays reuse), and a wide bracket is crossed no faster than growth."""
    ok: dict[int, dict[str, float | None]] = field(default_factory=dict)
    """Fitting batch -> {"peak_mem_bytes", "tokens_per_s"}."""
    failed: dict[int, str] = field(default_factory=dict)
    """Failed batch -> status."""
    probes: list[int] = field(default_factory=list)
    """The batches probed, in order."""
    aborted: str | None = None
    """The status that stopped the search (error, timeout, unsupported: the limit is not memory)."""
    guided: int = 0
    """Probes the memory model picked."""
    misses: int = 0
    """Of those, how many went the other way than it said."""

    @property
    def largest_ok(self) -> int | None:
        return max(self.ok, default=None)

    @property
    def smallest_failed(self) -> int | None:
        return min(self.failed, default=None)

    def record(
        self, batch: int, status: str, *, peak_mem_bytes: float | None = None, tokens_per_s: float | None = None
    ) -> None:
        choice = self._choice()
        if choice is not None and choice.batch == batch and choice.guided:
            self.guided += 1
            self.misses += choice.fits is not None and (status == "ok") != choice.fits
        self.probes.append(batch)
        if status == "ok":
            self.ok[batch] = {"peak_mem_bytes": peak_mem_bytes, "tokens_per_s": tokens_per_s}
        elif status == "oom":
            self.failed[batch] = status
        else:  # error / timeout / unsupported: the limit is not memory; stop and say why
            self.aborted = status

    def next_probe(self) -> int | None:
        choice = self._choice()
        return None if choice is None else choice.batch

    def _choice(self) -> Probe | None:
        """The next probe, or None when the search is over: the model's guess (else growth or bisection),
        moved into the window of probes that keep the bound."""
        if self.aborted:
            return None
        top = min(self.max_batch, MAX_BATCH)
        lo, hi = self.largest_ok, self.smallest_failed
        if lo is None and hi is None:
            if self.predicted is not None:
                return Probe(min(max(self.predicted, 1), top), True, True)
            return Probe(min(self.start, MAX_BATCH), False, None)
        if (hi is not None and hi - (lo or 0) <= (self.step if lo else 1)) or (lo is not None and lo >= top):
            return None
        wanted = self._guided(lo, hi, top) or self._blind(lo, hi, top)
        smallest, largest = (
            probe_budget.window(lo or 0, min(hi or top + 1, top + 1), self._spent()) if self.bounded else (1, MAX_BATCH)
        )
        batch = min(max(wanted.batch, smallest), largest)
        # moved down, a batch said to fit still does; moved up, one said to fail still fails
        kept = (
            batch == wanted.batch
            or (batch < wanted.batch and wanted.fits)
            or (batch > wanted.batch and wanted.fits is False)
        )
        fits = wanted.fits if kept else None
        return Probe(batch, wanted.guided, fits)

    def _spent(self) -> int:
        """Probes counted against the bound: a failed `start` above 1 is the one probe past it."""
        return len(self.probes) - (self.probes[0] > 1 and self.probes[0] in self.failed)

    def _blind(self, lo: int | None, hi: int | None, top: int) -> Probe:
        """Without the model: grow by twice the last gain (from one fit: double), so growth after the
        model's small steps starts small; bisect a bracket between the largest fit and the smallest OOM."""
        if lo is None:
            assert hi is not None  # neither known is the first probe, taken before this
            return Probe(hi // 2, False, None)
        fits = sorted(self.ok)
        jump = 2 * (lo - fits[-2]) if len(fits) > 1 else lo
        if hi is None:
            return Probe(min(lo + jump, top), False, None)
        half = (hi - lo) // 2 if self.bounded else min(jump, (hi - lo) // 2)
        return Probe(lo + max(self.step, half // self.step * self.step), False, None)

    def _guided(self, lo: int | None, hi: int | None, top: int) -> Probe | None:
        """The probe the memory model picks inside (lo, hi); None when it has nothing to go on (no
        capacity, no peak, a fit that a failed batch contradicts) or has had its turn."""
        spent = not self.bounded and self.guided >= GUIDED_PROBES
        if self.capacity_bytes is None or self.misses >= GUIDED_MISSES or spent:
            return None
        capacity = self.capacity_bytes * (1 - self.headroom)
        if lo is None:
            return Probe(1, True, True)
        if self.probes == [lo] and lo == self.predicted:  # the prediction fitted
            scaled = self._scaled_limit(lo, top, capacity)
            if scaled is not None and scaled > lo:
                return Probe(scaled, True, True)
            return Probe(min(lo + self.step, top), True, False)  # its neighbour says if it is the limit
        limit, past = self._model_limit(lo, hi, capacity)
        if limit is None:
            return None
        batch = min(max(limit, lo + self.step), top if hi is None else hi - self.step)
        return Probe(batch, True, True if batch <= limit else past)

    def _model_limit(self, lo: int, hi: int | None, capacity: float) -> tuple[int | None, bool | None]:
        """The largest batch the memory model puts under the capacity, and what it says of the batch past
        it (False: fails; None: no claim). A failed batch is an upper bound: a model that says it fits is
        wrong there and names nothing, and the search bisects until a new fit refits it."""
        points = self._peaks()
        line = _line_limit(points[-2:], capacity)
        if line is not None and hi is not None and line >= hi and self.bounded:
            # the line through the two largest fits overshot, as it does where memory grows faster than
            # the batch: the parabola through the three largest bends down with it
            line = _curve_limit(points[-3:], capacity)
            return (line, False) if line is not None and line < hi else (None, None)
        if line is not None:
            return line, False
        peak = self.ok[lo].get("peak_mem_bytes")
        if not peak:
            return None, None
        # a bound, not an estimate: a batch past it may fit as well
        safe = math.floor(lo * capacity / peak)
        # next to a failed batch it would be a probe beside a failure: the bracket is bisected instead
        return (safe, None) if hi is None or safe < hi - self.step or not self.bounded else (None, None)

    def _scaled_limit(self, lo: int, top: int, capacity: float) -> int | None:
        """The largest batch lo + k·step (<= top) that the memory model, scaled by measured / predicted at the fit
        `lo`, puts under `capacity`; None without a model or a measured peak."""
        peak = self.ok[lo].get("peak_mem_bytes")
        if self.peak_model is None or not peak:
            return None
        model, ratio = self.peak_model, peak / self.peak_model(lo)

        def fits(k: int) -> bool:
            return model(lo + k * self.step) * ratio <= capacity

        good, bad = 0, 1  # fits(0) holds (lo's own peak): double k until it does not, then bisect
        while lo + bad * self.step <= top and fits(bad):
            good, bad = bad, 2 * bad
        while bad - good > 1:
            mid = (good + bad) // 2
            good, bad = (mid, bad) if lo + mid * self.step <= top and fits(mid) else (good, mid)
        return lo + good * self.step

    def _peaks(self) -> list[tuple[int, float]]:
        """(batch, peak bytes) of the fitting batches whose peak was measured, smallest batch first."""
        return [(b, peak) for b, v in sorted(self.ok.items()) if (peak := v.get("peak_mem_bytes"))]

    def fastest(self) -> int | None:
        """The fitting batch of most tokens per second (a tie: the one probed first)."""
        rated = {b: speed for b, v in self.ok.items() if (speed := v.get("tokens_per_s"))}
        return max(rated, key=lambda b: rated[b]) if rated else None


def _line_limit(points: list[tuple[int, float]], capacity: float) -> int | None:
    """The largest batch under `capacity` on the line through two (batch, peak) points; None: fewer, or flat."""
    if len(points) < 2:
        return None
    (b0, m0), (b1, m1) = points
    slope = (m1 - m0) / (b1 - b0)
    if slope <= 0:
        return None
    # a peak exactly at the capacity fits; rounding must not turn that limit L into L - 1
    return math.floor(b1 + (capacity - m1) / slope + 1e-9)


def _curve_limit(points: list[tuple[int, float]], capacity: float) -> int | None:
    """The largest batch under `capacity` on the parabola through three (batch, peak) points, when it bends
    up (memory growing faster than the batch); None otherwise."""
    if len(points) < 3:
        return None
    (b0, m0), (b1, m1), (b2, m2) = points
    near, far = (m2 - m1) / (b2 - b1), (m1 - m0) / (b1 - b0)
    bend = (near - far) / (b2 - b0)  # peak = m2 + near·t + bend·t·(t + b2 - b1), t = batch - b2
    if bend <= 0 or near <= 0:
        return None
    linear, room = bend * (b2 - b1) + near, max(capacity - m2, 0.0)
    return math.floor(b2 + 2 * room / (linear + math.sqrt(linear * linear + 4 * bend * room)) + 1e-9)


def max_batch_search_id(trial: Trial) -> str:
    """The search for one config (not one run): a resumed search keeps its id and its probes."""
    return hashlib.sha256(repr(trial.config_key).encode()).hexdigest()[:12]


class MaxBatchPlan:
    """One MaxBatchSearch per (model, precision, compile, ac, seq_len, ranks); each probe is a trial.
    `predicted_max`: the memory model's largest batch of a config (its point estimate), where the search starts;
    `peak_model`: the model's uncalibrated peak per batch of a config (MaxBatchSearch.peak_model); `headroom`:
    MaxBatchSearch.headroom. Each probe compiles as its config's trials do (the grid's `dynamic_batch`, folded per
    recipe): torchao rowwise's static shapes recompile at every batch (11-15 s a probe of a 2.5 B model on one H200),
    because a symbolic batch, which would compile once, ran it 25 % slower: a verdict's fastest batch and its speed
    must be what a user's own run of it measures."""

    def __init__(
        self,
        seeds: list[Trial],
        *,
        capacity_bytes: float | None,
        step: int = 1,
        predicted_max: Callable[[Trial], int | None] | None = None,
        peak_model: Callable[[Trial], Callable[[int], float] | None] | None = None,
        headroom: float = 0.0,
    ):
        self.templates: dict[tuple[Any, ...], Trial] = {}
        self.searches: dict[tuple[Any, ...], MaxBatchSearch] = {}
        for t in seeds:
            if t.config_key in self.templates:
                continue
            sid = max_batch_search_id(t)
            self.templates[t.config_key] = replace(t, search_id=sid)
            predicted = predicted_max(t) if predicted_max else None  # None: start from the seed's batch
            self.searches[t.config_key] = MaxBatchSearch(
                start=t.batch_size,
                step=step,
                capacity_bytes=capacity_bytes,
                predicted=predicted,
                peak_model=peak_model(t) if peak_model and predicted is not None else None,
                headroom=headroom,
            )

    def _probe(self, key: tuple[Any, ...]) -> list[Trial]:
        batch = self.searches[key].next_probe()
        if batch is None:
            return []
        template = self.templates[key]
        return [replace(template, batch_size=batch)]

    def initial(self) -> list[Trial]:
        return [t for key in self.searches for t in self._probe(key)]

    def on_result(
        self, trial: Trial, status: str, infrastructure: bool = False, row: Mapping[str, Any] | None = None
    ) -> list[Trial]:
        retry = infra_retry(trial, status, infrastructure)
        if retry is not None:
            return [retry]
        search = self.searches[trial.config_key]
        if status == "unsupported" and is_predicted_oom(row):  # the model said it fails, without GPU time: an OOM
            status = "oom"
        row = row or {}
        # what the caching allocator held, where recorded: it is what must fit the device (on one H200 a torchao
        # batch 14 peaked at 130.6 GiB allocated and 134.8 reserved; 15, on the line at 137.8 allocated, ran out)
        peaks = [p for p in (row.get("peak_mem_gib"), row.get("reserved_mem_gib")) if p is not None]
        peak = max(peaks) if peaks else None
        search.record(
            trial.batch_size,
            status,
            peak_mem_bytes=peak * 1024**3 if peak is not None else None,
            tokens_per_s=row.get("tokens_per_s_per_gpu"),
        )
        return self._probe(trial.config_key)

    def verdicts(self) -> list[Verdict]:
        out: list[Verdict] = []
        for key, search in self.searches.items():
            t = self.templates[key]
            out.append(
                MaxBatchVerdict(
                    search_id=t.search_id,
                    model=t.model.label,
                    precision=t.precision,
                    compile=t.compile,
                    ac=t.ac,
                    seq_len=t.seq_len,
                    gpus=t.gpus,
                    options=t.options_text(),
                    max_batch=search.largest_ok,
                    first_failing_batch=search.smallest_failed,
                    fastest_batch=search.fastest(),
                    probes=len(search.probes),
                    probe_batches=tuple(search.probes),
                    aborted=search.aborted,
                )
            )
        return out
