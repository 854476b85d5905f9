"""The batches that fit at one `ac` level of a tune (sweep.search.fastest.search's fit stage). Pure."""

from __future__ import annotations

import math

from sweep.record.schema import Row
from sweep.search.fastest.space import thrashes
from sweep.search.max_batch import MaxBatchSearch
from sweep.search.oom_demand import oom_demand_bytes

FIT_PROBES = 6  # per ac level: a linear memory curve needs at most 5 (sweep.search.max_batch.MaxBatchSearch)
# A failed first probe whose OOM message says the step needed at most this much past the capacity ran out near the
# edge: one H200, TE FP8 Llama3-8B dims, 8 layers: calibrated limit 11 needed >= 142.8 GiB of 141 (10 fitted), the
# uncalibrated 16 >= 155.0 (the limit was 10, 5 GiB a sample past batch 1's fixed 45 GiB).
NEAR_EDGE = 0.05


class LevelFit:
    """The batches that fit at one ac level (the grid's other options): a MaxBatchSearch whose probes
    are snapped to the allowed batches (None: any), and stay under `ceiling` (a known OOM's batch)."""

    def __init__(
        self,
        ac: str,
        *,
        start: int,
        allowed: list[int] | None,
        ceiling: int | None,
        capacity_bytes: float | None,
        need: float | None = None,
        predicted: int | None = None,
    ):
        """`predicted`: the memory model's largest batch for this level's config (sweep.memory.predictor), its first
        probe in place of `start` (kept under `ceiling`); None or 0: from `start`."""
        self.ac, self.allowed, self.ceiling, self.need = ac, allowed, ceiling, need
        start = start if ceiling is None else min(start, ceiling - 1)
        if predicted and ceiling is not None:
            predicted = min(predicted, ceiling - 1)
        self.search = MaxBatchSearch(
            start=max(1, start),
            capacity_bytes=capacity_bytes,
            bounded=False,
            predicted=predicted if predicted and predicted >= 1 else None,
        )
        self.tflops: dict[int, float] = {}
        self.thrashed: set[int] = set()  # batches that fit only by the allocator freeing its cache (retries)
        self.demand: dict[int, float] = {}  # failed batch -> what its OOM message says it needed, at least

    def next_batch(self) -> int | None:
        if len(self.search.probes) >= FIT_PROBES or self._hopeless():
            return None
        batch = self._below_the_edge() or self.search.next_probe()
        if batch is None or self.allowed is None:
            return batch
        lo, hi = self.search.largest_ok or 0, self.search.smallest_failed or math.inf
        inside = [b for b in self.allowed if lo < b < hi]
        below = [b for b in inside if b <= batch]
        return below[-1] if below else (inside[0] if inside else None)

    def _below_the_edge(self) -> int | None:
        """The batch below one that met memory's edge, where the search would bisect or go to batch 1:
        - the first that fitted only with allocator retries (thrashed): the largest batch without them is most likely
          the one below (one H200, bf16 Llama3-8B dims, 8 layers: 15 predicted, fitted with 4 retries; the fit went to
          batch 1 and 3, and the tune's best was 3; TE FP8: 1, 3 and 10 with 1 retry, and the best was 3). Once the
          one below thrashed too, the search bisects: a step at a time down a wide band of retries costs a probe a
          batch;
        - a failed first probe (the memory model's limit) whose OOM message says the step was within NEAR_EDGE of
          the capacity when it failed, where batch 1 would measure only what the model already knows."""
        search = self.search
        clean = search.largest_ok or 0
        edge = min(self.thrashed) if len(self.thrashed) == 1 else None
        if edge is None and search.probes == [search.predicted] and search.capacity_bytes:
            need = self.demand.get(search.probes[0])
            edge = search.probes[0] if need is not None and need <= search.capacity_bytes * (1 + NEAR_EDGE) else None
        below = None if edge is None else edge - 1
        if below is None or below <= clean or below < 1 or below in search.probes:
            return None
        return below

    def _hopeless(self) -> bool:
        """Whether the first probe ran slower than `need`: the speed at which a larger batch could still
        beat the fastest level (more checkpointing recomputes: slower at the same batch)."""
        first = self.tflops.get(self.search.probes[0]) if self.search.probes else None
        return self.need is not None and first is not None and first < self.need

    def batch_gain(self) -> float | None:
        """How much faster than its largest fitting batch any batch could run here (None: unknown). A step
        takes t0 + batch * t1 (a fixed part: optimizer, launches, exposed communication), so 1/speed is a
        line in 1/batch through the two largest fitting batches, and no batch beats 1/t1."""
        points = sorted((b, tf) for b, tf in self.tflops.items() if b not in self.thrashed)[-2:]
        if len(points) < 2 or not all(s for _, s in points):
            return None
        (b1, s1), (b2, s2) = points
        t0 = (1 / s1 - 1 / s2) / (1 / b1 - 1 / b2)
        t1 = 1 / s2 - t0 / b2
        return 0.0 if t0 <= 0 else (1 / t1 / s2 - 1 if t1 > 0 else None)

    def record(self, batch: int, status: str, row: Row) -> None:
        peak = row.get("peak_mem_gib")
        thrashed = thrashes(status, row)
        # For the search, memory ends where the allocator starts retrying: a larger batch would only thrash
        # more, so the fit looks for the largest batch without retries, not the largest that squeezes in.
        self.search.record(
            batch,
            "oom" if thrashed else status,
            tokens_per_s=row.get("tokens_per_s_per_gpu"),
            peak_mem_bytes=peak * 1024**3 if peak is not None else None,
        )
        if status == "ok":
            self.tflops[batch] = row.get("tflops_per_gpu") or 0.0
        elif status == "oom" and (need := oom_demand_bytes(row.get("error"))) is not None:
            self.demand[batch] = need
        if thrashed:
            self.thrashed.add(batch)
        if self.ceiling is not None:  # after the first probe: before it, the search would not start at `start`
            self.search.failed.setdefault(self.ceiling, "oom")

    def fastest(self) -> int | None:
        """The fastest batch without allocator retries (else the fastest with them); a tie: the larger."""
        clean = {b: tf for b, tf in self.tflops.items() if b not in self.thrashed} or self.tflops
        return max(sorted(clean, reverse=True), key=lambda b: clean[b], default=None)

    def choices(self) -> list[int]:
        """The batches this level's candidates run: the largest that fits without allocator retries (else
        the smallest that fitted with them) and the fastest (allowed batches: the two largest that fit, a smaller
        micro-batch being the other split of G). A batch that fits only by the allocator freeing its cache
        runs slowly and erratically (on 2xH200 Llama3-8B torchao batch 5: 430 TFLOP/s/GPU, 6 retries, batch 4:
        817), and any option that adds memory there only thrashes more."""
        top = self.search.largest_ok  # without retries (record); else the least bad that fitted with them
        top = top if top is not None else min(self.thrashed, default=None)
        if top is None:
            return []
        if self.allowed is not None:
            return [b for b in self.allowed if b <= top][-2:][::-1]
        fastest = self.fastest()  # some batch ran ok: top is one
        return list(dict.fromkeys([top] if fastest is None else [top, fastest]))
