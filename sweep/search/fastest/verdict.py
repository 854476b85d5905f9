"""The verdict of one `search: fastest` group (sweep.search.fastest.search.GroupSearch): what it found, against what,
at what cost. Pure: no torch, no Ray."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any

from sweep.record.cost import fresh_trial_s
from sweep.search.fastest.cost import spent_s
from sweep.search.fastest.ledger import Learned, Ledger, Row, Rung
from sweep.search.fastest.space import Config, Space
from sweep.spec.grid import NUMERICS_CHANGING, Trial
from sweep.spec.layout import LAYOUT_VARY

PROFILE_KEYS = ("gemm_pct", "attention_pct", "comm_exposed_pct", "optimizer_pct", "other_pct")


@dataclass
class FastestVerdict:
    """A `search: fastest` group's verdict (README, Tune), saved as `to_json()` under `_search/`: its best and
    baseline fully measured, what it tried and cost. Implements sweep.search.plan.Verdict."""

    search_id: str | None
    """The search's id (always set; typed as sweep.search.plan.Verdict's): every probe row of it carries it
    (sweep.search.fastest.plan.fastest_search_id)."""
    model: str
    """The group's model label."""
    precision: str
    """The group's precision recipe."""
    seq_len: int
    """The group's sequence length."""
    gpus: int
    """The group's ranks."""
    cluster: str
    """The cluster profile it ran on."""
    allowed: list[str]
    """The options tune.vary let the search change."""
    numerics_allowed: list[str]
    """Of those, the ones that change the numerics (sweep.spec.grid.NUMERICS_CHANGING)."""
    global_batch_tokens: int | None
    """The global batch every probe kept (None: the batch was free)."""
    budget: int
    """The most attempts the search could make."""
    max_cost: float | None
    """Its cost cap, in one-trial costs (None: none)."""
    best: Config | None
    """The fastest final that ran ok (None: none did)."""
    baseline: Config | None
    """The grid's options at the batch their fit found."""
    tflops_at_best: float | None
    """The best's final's TFLOP/s per GPU (never its profile trial's)."""
    baseline_tflops: float | None
    """The baseline's final's TFLOP/s per GPU (None: it did not run ok)."""
    speedup: float | None
    """tflops_at_best / baseline_tflops, when both are known."""
    best_trial_id: str | None
    """The trial id of the best's final."""
    baseline_trial_id: str | None
    """The trial id of the baseline's final, if it ran ok."""
    candidates: int
    """The configs the search could have probed, plus those it tried."""
    tried: int
    """The distinct configs it asked for."""
    skipped_for_cost: list[Config]
    """Probes skipped for good: predicted past max_cost."""
    probes: int
    """Every attempt it made (retries and the profile trial too)."""
    search_wall_s: float
    """The GPU time its attempts took, in wall seconds."""
    cost_vs_one_trial: float | None
    """search_wall_s against measuring the best once on fresh processes."""
    aborted: str | None
    """Why there is no best (None: there is one)."""
    profile: dict[str, Any] | None
    """Where the best's step time goes, from its profile trial, and its trace file."""
    layout: dict[str, int] = field(default_factory=dict)
    """The layout it ran at (tp, dp_replicate), when tune.vary names a layout axis; else empty."""
    kind: str = "fastest"
    """Always "fastest" (sweep.search.plan.Verdict)."""

    def to_json(self) -> dict[str, Any]:
        """The saved object: the keys and their order every earlier release wrote."""
        configs = {
            "best": _config(self.best),
            "baseline": _config(self.baseline),
            "skipped_for_cost": [c._asdict() for c in self.skipped_for_cost],
        }
        out: dict[str, Any] = {"kind": self.kind}
        for f in fields(self):
            if f.name not in ("kind", "layout"):
                out[f.name] = configs[f.name] if f.name in configs else getattr(self, f.name)
        return {**out, **self.layout}


def _config(c: Config | None) -> dict[str, Any] | None:
    return c._asdict() if c is not None else None


def best_final(ledger: Ledger, finals: list[Config] | None) -> tuple[Config | None, Row | None]:
    """(config, row) of the fastest final that ran ok (a tie: the one asked first), else (None, None): the best,
    for the verdict and for the search's profile stage alike."""
    ran = [(c, row) for c in finals or [] if (row := ledger.ok_row(c, Rung.FINAL))]
    best: tuple[Config | None, Row | None] = max(ran, key=lambda x: x[1]["tflops_per_gpu"] or 0.0, default=(None, None))
    return best


def fastest_verdict(
    space: Space,
    ledger: Ledger,
    learned: Learned,
    *,
    sid: str,
    budget: int,
    max_cost: float | None,
    baseline: Config | None,
    finals: list[Config] | None,
    candidates: list[Config],
) -> FastestVerdict:
    """A search's verdict: its best and baseline fully measured, what it tried and cost (every attempt's row, the
    best's profile trial too: GPU time the search spent). `candidates`: the configs it could still probe."""
    t = space.template
    best, best_row = best_final(ledger, finals)
    base_row = ledger.ok_row(baseline, Rung.FINAL)
    at_best = best_row["tflops_per_gpu"] if best_row else None
    at_base = base_row["tflops_per_gpu"] if base_row else None
    # against measuring the best once on fresh processes (its final may have run warm)
    one_trial = fresh_trial_s(best_row, ledger.results.values()) if best_row else None
    wall = spent_s(ledger.results.values())
    tried = ledger.tried()
    return FastestVerdict(
        search_id=sid,
        model=t.model.label,
        precision=t.precision,
        seq_len=t.seq_len,
        gpus=t.gpus,
        cluster=t.cluster,
        allowed=list(space.vary),
        numerics_allowed=[o for o in NUMERICS_CHANGING if o in space.vary],
        global_batch_tokens=space.tokens,
        budget=budget,
        max_cost=max_cost,
        best=best,
        baseline=baseline,
        tflops_at_best=at_best,
        baseline_tflops=at_base,
        speedup=at_best / at_base if at_best and at_base else None,
        best_trial_id=ledger.asked.get((best, Rung.FINAL)) if best else None,
        baseline_trial_id=ledger.asked.get((baseline, Rung.FINAL)) if base_row and baseline else None,
        candidates=len({*candidates, *tried}),
        tried=len(tried),
        skipped_for_cost=list(learned.unaffordable),
        probes=len(ledger.results),
        search_wall_s=wall,
        cost_vs_one_trial=wall / one_trial if one_trial else None,
        aborted=None if best else _why_none(ledger),
        profile=_profile(ledger.ok_row(best, Rung.PROFILE)),
        layout=_layout(t, space.vary),
    )


def _layout(t: Trial, vary: list[str]) -> dict[str, int]:
    """The layout a search ran at, when tune.vary names a layout axis (one search per layout:
    sweep.search.fastest.plan)."""
    return {a: getattr(t, a) for a in LAYOUT_VARY} if set(vary) & set(LAYOUT_VARY) else {}


def _why_none(ledger: Ledger) -> str:
    counts = Counter(row["status"] for row in ledger.results.values())
    said = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    if not counts:
        return "nothing ran: the search was stopped before its first probe"
    if not counts.get("ok"):
        return (
            f"nothing fits: every probe ran out of memory ({said})"
            if set(counts) == {"oom"}
            else f"nothing ran: no probe completed ({said})"
        )
    return f"no full measurement completed ({said})"


def _profile(row: Row | None) -> dict[str, Any] | None:
    """Where the best's step time goes, from its profile trial's row (Rung.PROFILE: a short probe's steps,
    profiled=True; its TFLOP/s are never the best's figure, the final's are), if the trainer recorded it."""
    if not row or all(row.get(f"profile_{k}") is None for k in PROFILE_KEYS):
        return None
    return {**{k: row.get(f"profile_{k}") for k in PROFILE_KEYS}, "trace_file": row.get("trace_file")}
