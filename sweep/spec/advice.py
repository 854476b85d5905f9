"""Warnings for grids that run but mislead, said before any GPU time (`sweep plan`, `sweep run`). Pure.

Each warning is one line a user can act on; none stops a run, except the size gate (`needs_confirmation`):
a grid of more than LARGE_GRID trials runs only with `--yes`, since a typo in one axis can multiply the
bill by a thousand.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from sweep.spec.trial import Trial
from trainer.recipes import RECIPES

LARGE_GRID = 1000  # trials; past this `sweep run` asks for --yes

# torchao's scaling casts (amax, scale, cast to float8) are separate kernels unless inductor fuses them into
# the neighbouring ops, so eager torchao FP8 understates what FP8 trains at.
_TORCHAO_EAGER = (
    "torchao FP8 with compile: none ({n} trial{s}): its scaling casts run as separate kernels, "
    "so it measures slower than it trains when compiled; use compile: regional or full to "
    "compare FP8 with bf16"
)


def discouraged(precision: str, *, is_gpu: bool) -> dict[str, set[str]]:
    """Option values the plan warns against for `precision`, or that cannot run on these ranks (option -> values): a
    fastest-configuration search never probes them unless the grid names them itself (sweep.search.fastest.space)."""
    if not is_gpu:  # CPU ranks have SDPA's flash and math kernels only (trainer.kernels); torchao only emulates FP8
        return {"attention": {"cudnn", "efficient"}}
    return {"compile": {"none"}} if RECIPES[precision].backend == "torchao" else {}


def plan_warnings(trials: Sequence[Trial], *, is_gpu: bool) -> list[str]:
    """Lines for `sweep plan` and `sweep run` to print under the trials."""
    warnings = []
    eager_torchao = [
        t
        for t in trials
        if "none" in discouraged(t.precision, is_gpu=is_gpu).get("compile", ()) and t.compile == "none"
    ]
    if eager_torchao:
        n = len(eager_torchao)
        warnings.append(_TORCHAO_EAGER.format(n=n, s="s" * (n != 1)))
    if needs_confirmation(trials):
        by_axis = Counter(
            {
                axis: len({getattr(t, axis) for t in trials})
                for axis in ("precision", "batch_size", "seq_len", "gpus", "compile", "ac", "grad_accum")
            }
        )
        widest = ", ".join(f"{n} {axis}" for axis, n in by_axis.most_common(3) if n > 1)
        warnings.append(
            f"{len(trials)} trials (more than {LARGE_GRID}; widest axes: {widest}): `sweep run` "
            f"needs --yes to start them"
        )
    return warnings


def needs_confirmation(trials: Sequence[Trial]) -> bool:
    return len(trials) > LARGE_GRID
