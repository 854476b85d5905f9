"""The candidate space of `search: fastest` (sweep.search.fastest.search): which configurations one group may run. Pure.

A configuration is the options TUNABLE names (a `Config`). Each option in `tune.vary` ranges over
its grid axis when the grid lists several values for it, else over all of its values (ALL_VALUES); an
option not in vary stays at the grid's first value, so the options that change numerics
(NUMERICS_CHANGING) move only when vary names them. `fold_options` turns a configuration into the one the
trial really runs: two that fold to the same are one candidate. The batch is not enumerated here: a
LevelFit per `ac` level (sweep.search.fastest.level_fit) finds the batches that fit, and the search
(sweep.search.fastest.search) passes them in.

Under `global_batch_tokens` G, batch and accumulation come in pairs (splits) with
batch_size * grad_accum * ranks * seq_len == G, so grad_accum follows from the batch.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import replace
from typing import Any, NamedTuple, get_args

from sweep.errors import UserError
from sweep.record.schema import Row
from sweep.spec.expand import fold_options
from sweep.spec.grid import AC_MEMORY, TUNABLE, GridSpec, Trial, TuneSpec
from trainer.job import AC_MODES, COMPILE_SCOPES
from trainer.kernels import refused_everywhere
from trainer.options import OPTION_DEFAULTS, option_types
from trainer.recipes import RECIPES

# re-exported: the ac levels' memory order, for the search's stages; an attempt's row, as the search reads it
__all__ = ["AC_MEMORY", "Row"]

Steps = tuple[Any, Any]  # (warm-up, measured) steps: counts, or `auto`


class Config(NamedTuple):
    """One configuration of the options a search may change (TUNABLE's order), as the trial runs it."""

    batch_size: int
    ac: str
    compile: str
    grad_accum: int
    reduce_dtype: str
    grad_sync: str
    fp8_lm_head: bool
    # the kernel options (issue 34), at their default unless named: a configuration written before them is the same
    attention: str = OPTION_DEFAULTS["attention"]
    compile_mode: str = OPTION_DEFAULTS["compile_mode"]
    fp8_attention: bool = OPTION_DEFAULTS["fp8_attention"]
    fp8_pow2_scales: bool = OPTION_DEFAULTS["fp8_pow2_scales"]
    loss: str = "full"  # not a numerics option: the chunked loss is the full one within rounding (trainer/loss.py)


assert Config._fields == TUNABLE  # one list of tunables: the grid's

# Every value of an option in vary whose grid axis lists one value (the batch: 1 up to what fits, probed).
ALL_VALUES = {
    "ac": AC_MODES,
    "compile": COMPILE_SCOPES,
    "grad_accum": (1, 2, 4, 8),
    "reduce_dtype": ("fp32", "bf16"),
    "grad_sync": ("micro_batch", "step"),
    "fp8_lm_head": (False, True),
    "attention": get_args(option_types()["attention"]),
    "compile_mode": get_args(option_types()["compile_mode"]),
    "fp8_attention": (False, True),
    "fp8_pow2_scales": (False, True),
    "loss": ("full", "chunked"),
}
_FOLDED = TUNABLE[3:]  # the training options among TUNABLE (after batch_size, ac and compile)
SHORT = (2, 3)  # a search's short probe: warm-up 2 (a compile), measure 3: enough to rank candidates
LONGER = (3, 9)  # its rung: three times the measured steps to separate the close ones
# (both in micro-batches for a candidate that accumulates: probe_steps)


def probe_steps(steps: tuple[int, int], grad_accum: int) -> tuple[int, int]:
    """SHORT or LONGER steps for a candidate of `grad_accum` micro-batches a step: as many micro-batches,
    whole steps, at least one warm-up and one measured step (two for the rung, so it differs from a short probe).
    A step of 8 micro-batches is 8 times as long and as steady as one: on 2xH200, Llama3-8B torchao, 4 x 8
    micro-batches stepped 8.43 s (p10..p90 8.43..8.45 s over its 3 measured steps) and its 5 SHORT steps were
    ~42 s of the probe's 46.5. A first step compiles on its first micro-batch and runs the others warm."""
    warmup, measure = (math.ceil(n / grad_accum) for n in steps)
    return max(1, warmup), max(1 if steps == SHORT else 2, measure)


# What, besides batch, ac and accumulation, sets a micro-batch's footprint (grad_sync: step keeps gradients
# unsharded; attention kernels keep their own workspaces and saved statistics, FP8 attention saves FP8, an
# autotuned compile may pick kernels with other workspaces; power-of-2 scales change no tensor's size).
# Accumulation is ordered by `at_least_as_heavy`.
# The loss by equality alone: full holds 6·B·T·V, chunked a fixed V x E more (sweep.memory.model), so which needs
# more depends on the batch (at Llama 3's dims and T 4096 chunked is heavier at batch 1, far lighter at 4).
MEMORY_CLASS = (
    "compile",
    "reduce_dtype",
    "grad_sync",
    "fp8_lm_head",
    "attention",
    "compile_mode",
    "fp8_attention",
    "loss",
)


def heavy_class(c: Config) -> tuple[Any, ...]:
    """The memory class without the options whose effect on memory is small (compile, reduce_dtype,
    fp8_lm_head): a batch limit found for one value of those is a good first guess for the others (a
    guess only: pruning needs each option of MEMORY_CLASS no lighter). grad_sync: step keeps whole gradients; a
    chunked loss does not hold the B·T·V logits (a batch that fits it may be past what the full loss fits)."""
    return (c.grad_sync, c.loss)


# An fp32 reduce needs no less memory than a bf16 one: FSDP2 reduces (and under grad_sync: step accumulates
# the unsharded gradients) in the reduce dtype. 2xH200, 8 micro-batches with step: bf16 ran and fp32 ran out of
# memory at the same batch (Llama3-8B torchao batch 4, bf16 batch 3); once per micro-batch the two peaked alike.
REDUCE_MEMORY = {"bf16": 0, "fp32": 1}


def no_lighter(option: str, value: Any, than: Any) -> bool:
    """Whether `option` at `value` needs at least the memory it needs at `than`: the same value, or for the
    reduce dtype one no lighter (REDUCE_MEMORY)."""
    return REDUCE_MEMORY[value] >= REDUCE_MEMORY[than] if option == "reduce_dtype" else value == than


def at_least_as_heavy(c: Config, oom: Config) -> bool:
    """Whether `c` needs at least the memory of `oom` (so it would run out of memory too): each option of its
    memory class no lighter (`no_lighter`). More than one micro-batch per step needs more than one, however
    many: the gradients of the micro-batches before stay through the next one's backward (2xH200, Llama3-8B
    torchao batch 4: 122.6 GiB at 2, 4 and 8, 107.6 at 1)."""
    return (
        all(no_lighter(k, getattr(c, k), getattr(oom, k)) for k in MEMORY_CLASS)
        and AC_MEMORY[c.ac] >= AC_MEMORY[oom.ac]
        and c.batch_size >= oom.batch_size
        and (c.grad_accum > 1) >= (oom.grad_accum > 1)
    )


def one_option_effects(
    points: list[tuple[dict[str, Any], float]], ref: dict[str, Any], skip: tuple[str, ...] = ()
) -> dict[tuple[str, Any], float]:
    """Each option value's mean effect on a quantity against `ref`'s value of that option, from every pair of
    points (a config's coordinates, the quantity) that differ in that option alone (not one in `skip`)."""
    samples: defaultdict[tuple[str, Any], list[float]] = defaultdict(list)
    for p, vp in points:
        for q, vq in points:
            diff = [k for k in p if p[k] != q[k]]
            if len(diff) == 1 and diff[0] not in skip and q[diff[0]] == ref[diff[0]]:
                samples[(diff[0], p[diff[0]])].append(vp - vq)
    return {k: sum(v) / len(v) for k, v in samples.items()}


def thrashes(status: str, row: Row) -> bool:
    """Whether a probe fit only by the allocator freeing its cache and retrying (the row's alloc_retries):
    it ran, at the memory's limit."""
    return status == "ok" and (row.get("alloc_retries") or 0) > 0


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


class Space:
    """The configurations of one (model, precision, seq_len, ranks) group, from its first trial."""

    def __init__(self, template: Trial, spec: GridSpec, tune: TuneSpec, *, avoid: dict[str, set[Any]] | None = None):
        """`avoid`: option values the plan warns against for this group (sweep.spec.advice.discouraged): left out of
        the values an option in vary ranges over unless the grid's own axis lists them."""
        self.template, self.vary, self.avoid = template, list(tune.vary), avoid or {}
        axes = {"batch_size": [template.batch_size], **{n: list(getattr(spec, n)) for n in TUNABLE[1:]}}
        self.values = {n: self._range(n, axes[n]) for n in TUNABLE[1:]}
        self.grid = Config(**{n: axes[n][0] for n in TUNABLE})  # the baseline's options (unfolded)
        self.tokens = tune.global_batch_tokens
        self.samples = self._samples_per_step() if self.tokens else None  # samples per rank per step under G
        self.splits = self._splits(axes) if self.tokens else None

    def _range(self, name: str, axis: list[Any]) -> list[Any]:
        """An option's values: the grid's axis if it lists several, else all (the grid's first) but those to avoid."""
        if name not in self.vary:
            return axis[:1]
        if len(axis) > 1:  # listed by the grid: each value named, so none is avoided
            return axis
        # and values no accelerator runs with this recipe and model (a search would only record them unsupported)
        t = self.template
        refused = refused_everywhere(t.options(), name, ALL_VALUES[name], recipe=RECIPES[t.precision], model=t.model)
        avoided = (self.avoid.get(name, set()) | refused) - {axis[0]}
        return list(dict.fromkeys([axis[0], *(v for v in ALL_VALUES[name] if v not in avoided)]))

    def _samples_per_step(self) -> int:
        t, tokens = self.template, self.tokens
        assert tokens is not None  # called under global_batch_tokens only
        per = t.gpus * t.seq_len
        if tokens % per:
            raise UserError(
                f"tune.global_batch_tokens: {self.tokens} is not a multiple of ranks x seq_len "
                f"({t.gpus} x {t.seq_len} = {per}) for {t.model.label} {t.precision}; no micro-batch "
                f"x grad_accum split can hold it"
            )
        return tokens // per

    def _splits(self, axes: dict[str, list[Any]]) -> list[tuple[int, int]]:
        """(batch, grad_accum) pairs that hold G: any batch if batch_size varies (else the grid's one), any
        accumulation if grad_accum varies and the grid lists one value (else the listed ones)."""
        batch_ok = (lambda b: True) if "batch_size" in self.vary else (lambda b: b == axes["batch_size"][0])
        accums = None if "grad_accum" in self.vary and len(axes["grad_accum"]) == 1 else set(self.values["grad_accum"])
        samples = self.samples
        assert samples is not None  # called under global_batch_tokens only
        splits = [
            (b, samples // b) for b in _divisors(samples) if batch_ok(b) and (accums is None or samples // b in accums)
        ]
        if not splits:
            t = self.template
            batches = "any" if "batch_size" in self.vary else axes["batch_size"][0]
            raise UserError(
                f"tune.global_batch_tokens: {self.tokens} tokens = {self.samples} samples per rank per step "
                f"(ranks {t.gpus} x seq_len {t.seq_len}) for {t.model.label} {t.precision}, but no allowed "
                f"batch_size ({batches}) x grad_accum ({sorted(accums) if accums else 'any'}) makes {self.samples}; "
                f"add batch_size and grad_accum to tune.vary or change the global batch"
            )
        return splits

    def batch_choices(self) -> list[int] | None:
        """The batches a probe may run, smallest first; None: any (1 up to what fits, found by probing)."""
        if self.splits is not None:
            return [b for b, _ in self.splits]
        return None if "batch_size" in self.vary else [self.grid.batch_size]

    def accums(self, batch: int) -> list[int]:
        return [self.samples // batch] if self.samples else self.values["grad_accum"]

    def fold(self, c: Config) -> Config:
        """The configuration the trial really runs (options that do nothing here back at their default)."""
        t = self.template
        options = {**t.as_dict(), **{k: getattr(c, k) for k in _FOLDED}}
        folded = fold_options(options, model=t.model, precision=t.precision, gpus=t.gpus, compile=c.compile)
        return c._replace(**{k: folded[k] for k in _FOLDED})

    def baseline(self, ac: str, batch: int) -> Config:
        """The grid's options at this ac and batch (under G, the accumulation that batch needs)."""
        return self.at_batch(self.grid._replace(ac=ac), batch)

    def smaller_batch(self, c: Config) -> Config | None:
        """`c` at the next smaller batch to try after it ran out of memory: the next allowed split under G,
        else three quarters (a step that keeps most of the batch; pruning stops a repeat at a batch that
        failed). None if the batch is fixed or already 1."""
        allowed = self.batch_choices()
        if allowed is None:
            batch = min(c.batch_size - 1, c.batch_size * 3 // 4)
        else:
            batch = max((b for b in allowed if b < c.batch_size), default=0)
        return self.at_batch(c, batch) if batch >= 1 else None

    def at_batch(self, c: Config, batch: int) -> Config:
        """`c` at another batch (under G with the accumulation that batch needs)."""
        accum = self.samples // batch if self.samples else c.grad_accum
        return self.fold(c._replace(batch_size=batch, grad_accum=accum))

    def configs(self, batches: dict[str, list[int]]) -> list[Config]:
        """Every distinct configuration, given the batches each ac level may run, in a stable order."""
        v = self.values
        out: dict[Config, None] = {}
        for ac, ac_batches in batches.items():
            for batch in ac_batches:
                for scope, accum, *rest in itertools.product(
                    v["compile"], self.accums(batch), *(v[n] for n in _FOLDED[1:])
                ):
                    out.setdefault(self.fold(Config(batch, ac, scope, accum, *rest)), None)
        return list(out)

    def coords(self, c: Config) -> dict[str, Any]:
        """The dimensions candidates differ in: ac and batch as one (each ac level has its own batches),
        grad_accum only where it is free (under G it follows from the batch)."""
        out = {
            "ac_batch": (c.ac, c.batch_size),
            "compile": c.compile,
            "reduce_dtype": c.reduce_dtype,
            "grad_sync": c.grad_sync,
            **{n: getattr(c, n) for n in _FOLDED[1:]},  # reduce_dtype, grad_sync, fp8_lm_head, attention, ...
        }
        return out if self.samples else {**out, "grad_accum": c.grad_accum}

    def levels(self) -> list[str]:
        """The ac values to search, the grid's first, then from most memory to least (what fits with more
        memory fits with less: a lighter level's search starts where the heavier one's fitted)."""
        rest = sorted((a for a in self.values["ac"] if a != self.grid.ac), key=lambda a: -AC_MEMORY[a])
        return [self.grid.ac, *rest]

    def as_trial(self, c: Config) -> Trial:
        """`c` as the template's trial, for what depends on its configuration alone (its predicted memory)."""
        return replace(self.template, **c._asdict())

    def trial(
        self,
        c: Config,
        steps: Steps,
        *,
        profiled: bool,
        search_id: str,
        auto_max: tuple[int, int] | None = None,
        time_limit_s: float | None = None,
    ) -> Trial:
        """`c` as a trial; `time_limit_s` lowers the grid's timeout_s (not part of the trial id), `auto_max` the
        grid's most `auto` steps (steps.measure_max)."""
        limit = min(self.template.timeout_s, time_limit_s or math.inf)
        grids = self.template.auto_max if "auto" in steps else None  # a probe's counts are what they say
        if auto_max and grids:
            auto_max = (min(auto_max[0], grids[0]), min(auto_max[1], grids[1]))
        return replace(
            self.template,
            **c._asdict(),
            warmup_steps=steps[0],
            measure_steps=steps[1],
            profiled=profiled,
            search_id=search_id,
            auto_max=auto_max or grids,
            timeout_s=limit,
        )
