"""Losses compared at the same number of tokens trained. Pure: no pyarrow, no DuckDB.

`loss_last` is the loss after however many steps a trial ran: an `auto` trial may stop after 6 measured steps and
its neighbour after 28, and with grad_accum a step is several micro-batches, so two last losses say nothing of two
recipes' numerics. Each row's loss curve (`loss_curve`, with `loss_curve_tokens`: the tokens trained when each
step's loss was computed, `sweep.record.schema`) lets every side be read at one token count instead:

- the count is the largest that every curve reached (the smallest of their last token counts), so no side is
  read past its end;
- a side is read there by linear interpolation between the two steps around it (exact where a step lies on it,
  as it does for every side when the sides train the same tokens per step). Taking the last step at or below it
  instead would read a side of larger steps up to one step earlier in its training, higher on a falling curve;
- a side of several attempts (repeats of one config) is the median of its attempts' losses there, as its other
  figures are medians.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Curve:
    """One attempt's loss per step and the tokens trained when each was computed (ascending)."""

    tokens: tuple[int, ...]
    losses: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.losses):
            raise ValueError(f"a loss curve of {len(self.losses)} losses has {len(self.tokens)} token counts")

    @classmethod
    def of(cls, row: dict) -> Curve | None:
        """The row's curve; None for a row without one (it ran no steps, or predates schema 1.9)."""
        tokens, losses = row.get("loss_curve_tokens"), row.get("loss_curve")
        if not tokens or not losses:
            return None
        return cls(tuple(tokens), tuple(losses))

    @property
    def reached(self) -> int:
        return self.tokens[-1]

    def at(self, tokens: int) -> float | None:
        """The loss at `tokens` trained, interpolated between the steps around it; None outside the curve."""
        if not self.tokens[0] <= tokens <= self.reached:
            return None
        right = bisect.bisect_left(self.tokens, tokens)
        if self.tokens[right] == tokens:
            return self.losses[right]
        (t0, t1), (l0, l1) = self.tokens[right - 1 : right + 1], self.losses[right - 1 : right + 1]
        return l0 + (l1 - l0) * (tokens - t0) / (t1 - t0)


def row_at(row: dict, tokens: int | None) -> float | None:
    """One row's loss at `tokens` trained; None without a curve, a count, or when its curve ends before it."""
    curve = Curve.of(row)
    return None if curve is None or tokens is None else curve.at(tokens)


def common_tokens(curves: Iterable[Curve]) -> int | None:
    """The largest token count every curve reached; None without a curve."""
    return min((c.reached for c in curves), default=None)


def median_at(curves: Sequence[Curve], tokens: int | None) -> float | None:
    """The median over `curves` of their losses at `tokens`; None when none reached it (or no count is given)."""
    if tokens is None:
        return None
    losses = [loss for c in curves if (loss := c.at(tokens)) is not None]
    return statistics.median(losses) if losses else None


@dataclass(frozen=True, slots=True)
class LossAt:
    """Two sides of a comparison read at the same tokens trained."""

    tokens: int | None  # None: a side has no loss curve
    loss: float | None
    base_loss: float | None


def compare(side: Sequence[Curve], base: Sequence[Curve]) -> LossAt:
    """Each side (its attempts' curves) at the largest token count all of them reached."""
    tokens = common_tokens([*side, *base]) if side and base else None
    return LossAt(tokens, median_at(side, tokens), median_at(base, tokens))


def note(tokens: set[int], reached_by: str = "both sides") -> str:
    """What a table's `loss @ tokens` means: the one count every row was read at, or its `at tokens` column's."""
    if not tokens:
        return ""
    at = f"{next(iter(tokens)):,} tokens trained" if len(tokens) == 1 else "the `at tokens` column's count"
    return f"loss @ tokens: at {at}, the most {reached_by} reached (interpolated between steps)"
