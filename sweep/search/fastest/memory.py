"""Where a tune's candidate fits in memory, from what the search's probes measured. Pure: no torch, no Ray.

A probe that runs out of memory costs its group of rank processes (the scheduler retires it: a new group
starts, imports and compiles again) and, under `compile: full`, minutes of compilation first: on 2xH200,
GPT-1.5B torchao's tune spent 248 of its 351 s of attempts on such probes (session 9): the fit's own at 67,
then four around the batch it had found with 1.9 GiB of 141 to spare, 66 (66 x 8 micro-batches, `compile: none`
at 66 and at 49, `compile: full` at 66 after 170 s of compiling). Two things are known before such a probe runs:

- accumulation (`fitted`): more than one micro-batch per step keeps the sharded fp32 gradients of one
  micro-batch's backward through the next one's forward, which a single micro-batch has freed by then: the
  peak of its twin with one micro-batch plus GRAD_BYTES per local parameter (measured on 2xH200: +15.0 GiB =
  4 B x 4.0e9 local parameters for Llama3-8B over 2 ranks, +5.8 GiB = 4 B x 1.56e9 for GPT-1.5B on one);
- a compile mode's memory, until a probe measures it (`with_headroom`), can be a lot more: `compile: none`
  +18.5 % on GPT-1.5B bf16 at batch 32 (`full` +4.5 %), and a compile probe lost to memory is the costliest
  (`full` compiles for minutes first). Its first probe (a neighbour of the baseline) runs where the fit left
  HEADROOM of the memory free; its effect is measured against the fit's probe at that batch, and the waves
  may take it higher after. (The FP8 head adds as much, +16.8 % on Llama3-8B torchao at batch 4, but there
  it thrashed rather than failed, a cheap probe after which the search tries it lower: sweep.search.fastest.search,
  explore.)

What the search has measured (`measured`) gives the rest: what a rank may use (`usable`: the device's memory,
or less where the grid's options ran out of memory), and the candidates moved below a batch that ran out of
memory (`rebatched`) or thrashed (`unthrashed`, `needs`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from sweep.search.fastest.space import (
    Config,
    Row,
    Space,
    at_least_as_heavy,
    heavy_class,
    no_lighter,
    one_option_effects,
)

# What the probes say of memory (`measured`): the most parameters a rank holds, the options' bytes per sample, per
# ac level the grid options' peak bytes by batch, per ac level the memory a rank may use.
Memory = tuple[float | None, dict[tuple[str, Any], float], dict[str, dict[int, float]], dict[str, float | None]]

GIB = 1024**3
GRAD_BYTES = 4  # an fp32 gradient element (the master weights' dtype) per local parameter
HEADROOM = 0.2  # above the largest one-option memory change measured (compile: none, +18.5 %)
UNKNOWN_MEMORY = ("compile",)  # options whose memory a first probe measures with headroom


def memory_effects(space: Space, probes: list[tuple[Config, float]], ref: Config) -> dict[tuple[str, Any], float]:
    """Bytes per sample each option value adds to the peak against `ref`'s value, from pairs of clean probes
    (config, peak bytes) at one batch and ac that differ in that option alone (the mean over pairs; accumulation's
    bytes are not per sample: `fitted` adds them)."""
    points = [(space.coords(c), peak / c.batch_size) for c, peak in probes]
    return one_option_effects(points, space.coords(ref), skip=("ac_batch", "grad_accum"))


def fitted(
    space: Space,
    c: Config,
    ref: Config,
    ref_peaks: dict[int, float],
    effects: dict[tuple[str, Any], float],
    *,
    capacity: float | None,
    params_local: float | None,
    snap: bool = False,
) -> Config:
    """`c` at the largest batch where its predicted peak is within the capacity, if it is not at its own: the peak of
    `ref` (the grid's options at c's ac) on the line through its two largest clean probes, plus the measured bytes
    per sample of each option `c` changes (an unmeasured one as none: the prediction is then a bound from below),
    plus GRAD_BYTES per local parameter if `c` accumulates and `ref` does not. `c` as it is where nothing is known
    (no capacity, fewer than two clean probes of `ref`) and under global_batch_tokens (there the batch and
    accumulation come in splits; pruning by OOMs covers them). `snap`: only to a batch `ref` ran at (a first probe
    of an option: its effect is measured against that probe)."""
    if capacity is None or space.samples or len(ref_peaks) < 2:
        return c
    slope, intercept = _peak_line(ref_peaks)
    coords, ref_coords = space.coords(c), space.coords(ref)
    per_sample = slope + sum(effects.get((k, v), 0.0) for k, v in coords.items() if v != ref_coords[k])
    accumulates = c.grad_accum > 1 and ref.grad_accum == 1  # (else `ref`'s peaks hold them)
    fixed = intercept + (GRAD_BYTES * params_local if accumulates and params_local else 0.0)
    if per_sample <= 0 or fixed + per_sample * c.batch_size <= capacity:
        return c
    batch = min(c.batch_size - 1, math.floor((capacity - fixed) / per_sample))
    if snap:
        batch = max((b for b in ref_peaks if b <= batch), default=0)
    return space.at_batch(c, batch) if batch >= 1 else c


def _peak_line(ref_peaks: dict[int, float]) -> tuple[float, float]:
    """(bytes per sample, bytes at batch 0) of the line through the two largest batches' peaks (two or more)."""
    (b0, m0), (b1, m1) = sorted(ref_peaks.items())[-2:]
    slope = (m1 - m0) / (b1 - b0)
    return slope, m1 - slope * b1


def with_headroom(space: Space, c: Config, center: Config, mine: dict[int, float], *, capacity: float | None) -> Config:
    """A neighbour `c` of `center` that changes an option in UNKNOWN_MEMORY, at the largest batch where the
    center's options peaked (clean; `mine`: batch -> peak bytes) within the capacity less HEADROOM, when the
    center's own batch is above that; `c` as it is otherwise."""
    changed = {k for k, v in c._asdict().items() if getattr(center, k) != v} - {"batch_size", "grad_accum"}
    if capacity is None or not changed & set(UNKNOWN_MEMORY):
        return c
    line = capacity * (1 - HEADROOM)
    if mine.get(center.batch_size, 0.0) <= line:
        return c
    safe = [b for b, peak in mine.items() if b < c.batch_size and peak <= line]
    return space.at_batch(c, max(safe)) if safe else c


def measured(
    space: Space, clean: list[tuple[Config, Row]], rows: Iterable[Row], ooms: list[Config], *, capacity: float | None
) -> Memory:
    """What a search's clean short probes (config, row), its attempts' rows and its out-of-memory probes say of
    memory: the most parameters a rank holds (any row's), the options' bytes per sample (memory_effects), per ac
    level the grid options' peak bytes by batch, and per ac level the memory a rank may use (`usable`)."""
    params = next((max(local) for r in rows if (local := r.get("params_local"))), None)
    probes = [(f, gib * GIB) for f, row in clean if (gib := row.get("peak_mem_gib"))]
    peaks: dict[str, dict[int, float]] = defaultdict(dict)
    for f, peak in probes:
        if f == space.baseline(f.ac, f.batch_size):
            peaks[f.ac][f.batch_size] = peak
    failed: defaultdict[str, list[int]] = defaultdict(list)
    for o in ooms:
        if o == space.baseline(o.ac, o.batch_size):
            failed[o.ac].append(o.batch_size)
    room = {ac: usable(capacity, peaks[ac], failed[ac]) for ac in peaks}
    return params, memory_effects(space, probes, space.grid), peaks, room


def usable(capacity: float | None, ref_peaks: dict[int, float], oom_batches: list[int]) -> float | None:
    """What a rank may use: the device's capacity, or, where the grid options ran out of memory, the most they
    peaked at clean below that batch: the limit lies between that peak, which ran, and the one their line puts at
    the batch that failed, which did not. A device's memory_gib is its datasheet's (an H200's 141 GiB is 140.4 to
    torch: clusters/accelerators.yaml), less the CUDA context and NCCL's buffers. On one H200, GPT-1.5B torchao
    ran out of memory at batch 67, where the line puts 139.7 GiB, and 66 peaked at 137.9; then at 64 x 8
    micro-batches, predicted at 140.1 under 141 (RESULTS.md, session 10), and at 63 x 2, predicted at 138.3 under
    the line's 139.7 (session 11): a micro-batch's peak alone says nothing of the allocator's fragments."""
    if capacity is None or not oom_batches:
        return capacity
    below = [peak for b, peak in ref_peaks.items() if b < min(oom_batches)]
    return min(capacity, max(below)) if below else capacity


def needs(c: Config, t: Config, center: Config, space: Space) -> bool:
    """Whether `c` needs at least the memory of `t`: as heavy by `at_least_as_heavy`, or making every change `t`
    made to `center` at its ac and a batch no smaller, with accumulation if `t` had it (how many micro-batches
    does not matter: `at_least_as_heavy`), e.g. grad_sync: step with an FP8 head, after grad_sync: step thrashed
    alone."""
    mine, theirs, base = space.coords(c), space.coords(t), space.coords(center)
    made = [(k, v) for k, v in theirs.items() if v != base[k] and k not in ("ac_batch", "grad_accum")]
    return at_least_as_heavy(c, t) or (
        t.ac == c.ac
        and c.batch_size >= t.batch_size
        and (c.grad_accum > 1) >= (t.grad_accum > 1)
        and all(no_lighter(k, mine[k], v) for k, v in made)
    )


def unthrashed(c: Config, thrashed: Iterable[Config], center: Config, space: Space) -> Config:
    """`c` at smaller batches until it needs less memory than every probe that thrashed (`needs`); at batch 1
    (under G, the smallest split) as it is."""
    while (smaller := space.smaller_batch(c)) is not None and any(needs(c, t, center, space) for t in thrashed):
        c = smaller
    return c


def rebatched(c: Config, ooms: list[Config], fits: list[Config], space: Space) -> Config:
    """`c` at the largest batch that one like it (heavy_class, same ac) ran clean at (`fits`) below the smallest
    at which one like it ran out of memory, when that is at `c`'s batch or below; as it is otherwise."""
    like = [o.batch_size for o in ooms if heavy_class(o) == heavy_class(c) and o.ac == c.ac]
    if not like or c.batch_size < min(like):
        return c
    below = [
        f.batch_size for f in fits if heavy_class(f) == heavy_class(c) and f.ac == c.ac and f.batch_size < min(like)
    ]
    return space.at_batch(c, max(below)) if below else c
