"""The verdict of one `search: fastest` group (sweep.search.fastest.search.GroupSearch): what it found, against what, at what
cost. Pure: no torch, no Ray."""

from __future__ import annotations

from collections import Counter

from sweep.record.cost import fresh_trial_s
from sweep.search.fastest.cost import spent_s
from sweep.spec.grid import NUMERICS_CHANGING
from sweep.spec.layout import LAYOUT_VARY

PROFILE_KEYS = ("gemm_pct", "attention_pct", "comm_exposed_pct", "optimizer_pct", "other_pct")


def best_final(search) -> tuple:
    """(config, row) of the fastest final that ran ok (a tie: the one asked first), else (None, None): the best,
    for the verdict and for the search's profile stage alike."""
    finals = [(c, row) for c in search.final_asked or [] if (row := search._ok_row(c, 2))]
    return max(finals, key=lambda x: x[1]["tflops_per_gpu"] or 0.0, default=(None, None))


def fastest_verdict(search) -> dict:
    """A search's verdict (README, Tune): its best and baseline fully measured, what it tried and cost (every
    attempt's row, the best's profile trial too: GPU time the search spent)."""
    t, space = search.space.template, search.space
    best, best_row = best_final(search)
    base_row = search._ok_row(search.baseline, 2)
    at_best = best_row["tflops_per_gpu"] if best_row else None
    at_base = base_row["tflops_per_gpu"] if base_row else None
    # against measuring the best once on fresh processes (its final may have run warm)
    one_trial = fresh_trial_s(best_row, search.results.values()) if best_row else None
    wall = spent_s(search.results.values())
    tried = {c for c, _ in search.asked}
    return {"kind": "fastest", "search_id": search.sid, "model": t.model.label, "precision": t.precision,
            "seq_len": t.seq_len, "gpus": t.gpus, "cluster": t.cluster, "allowed": list(space.vary),
            "numerics_allowed": [o for o in NUMERICS_CHANGING if o in space.vary],
            "global_batch_tokens": space.tokens, "budget": search.budget, "max_cost": search.max_cost,
            "best": best._asdict() if best else None,
            "baseline": search.baseline._asdict() if search.baseline else None,
            "tflops_at_best": at_best, "baseline_tflops": at_base,
            "speedup": at_best / at_base if at_best and at_base else None,
            "best_trial_id": search.asked.get((best, 2)) if best else None,
            "baseline_trial_id": search.asked.get((search.baseline, 2)) if base_row else None,
            "candidates": len({*search._space(), *tried}), "tried": len(tried),
            "skipped_for_cost": [c._asdict() for c in search.unaffordable],
            "probes": len(search.results), "search_wall_s": wall,
            "cost_vs_one_trial": wall / one_trial if one_trial else None,
            "aborted": None if best else _why_none(search), "profile": _profile(search._ok_row(best, 3)),
            **_layout(t, space.vary)}


def _layout(t, vary: list[str]) -> dict:
    """The layout a search ran at, when tune.vary names a layout axis (one search per layout: sweep.search.fastest.plan)."""
    return {a: getattr(t, a) for a in LAYOUT_VARY} if set(vary) & set(LAYOUT_VARY) else {}


def _why_none(search) -> str:
    counts = Counter(row["status"] for row in search.results.values())
    said = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    if not counts:
        return "nothing ran: the search was stopped before its first probe"
    if not counts.get("ok"):
        return f"nothing fits: every probe ran out of memory ({said})" if set(counts) == {"oom"} else \
            f"nothing ran: no probe completed ({said})"
    return f"no full measurement completed ({said})"


def _profile(row: dict | None) -> dict | None:
    """Where the best's step time goes, from its profile trial's row (rung 3: a short probe's steps, profile=True;
    its TFLOP/s are never the best's figure, the final's are), if the trainer recorded it."""
    if not row or all(row.get(f"profile_{k}") is None for k in PROFILE_KEYS):
        return None
    return {**{k: row.get(f"profile_{k}") for k in PROFILE_KEYS}, "trace_file": row.get("trace_file")}
