"""The probes a max-batch search may spend: at most 2·⌈log₂ B⌉ + 2 for a limit B, on any memory curve.

A search's state is a bracket: every batch below `lo` (and `lo` itself) fits, `hi` does not, and the limit
B is one of lo .. hi - 1. Finishing means narrowing the bracket to one candidate, one probe per split, so a
way to finish is a binary tree over the candidates in order, and B's depth in it is what B still costs.
The search keeps its bound for every B while such a tree exists whose depth at each B is at most
`allowance(B) - spent`. By Kraft's inequality (the allowance grows with B, so a tree with those depths
keeps the candidates in order), it does exactly when the candidates' weights 2^(spent - allowance(B))
sum to at most 1; and a probe x keeps it, whatever x shows, exactly when the weights on each side of x
sum to at most 1/2. `window` is the range of such x: a search may probe anywhere in it (a guess of its
memory model, a doubling, a midpoint) and never loses its bound. Pure arithmetic, exact (fractions).
"""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction

HALF = Fraction(1, 2)


def allowance(limit: int) -> int:
    """The probes a search may take to find `limit` (0: not even batch 1 fits, found by probing 1)."""
    return 1 if limit == 0 else 2 * (limit - 1).bit_length() + 2  # (n - 1).bit_length() is ⌈log₂ n⌉


def _runs(lo: int, hi: int) -> Iterator[tuple[int, int, int]]:
    """[lo, hi) as runs of one allowance: (first, count, allowance); ⌈log₂⌉ changes past each power of 2."""
    b = lo
    while b < hi:
        last = b if b <= 1 else 1 << (b - 1).bit_length()
        count = min(last, hi - 1) - b + 1
        yield b, count, allowance(b)
        b += count


def weight(lo: int, hi: int, spent: int) -> Fraction:
    """The candidates lo .. hi - 1's summed weight after `spent` probes (at most 1: the bound still holds)."""
    return sum((count * Fraction(2) ** (spent - a) for _, count, a in _runs(lo, hi)), Fraction(0))


def _reach(lo: int, hi: int, spent: int, budget: Fraction) -> int:
    """The largest x in [lo, hi] whose candidates lo .. x - 1 weigh at most `budget`."""
    for first, count, a in _runs(lo, hi):
        each = Fraction(2) ** (spent - a)
        if count * each > budget:
            return first + int(budget / each)
        budget -= count * each
    return hi


def window(lo: int, hi: int, spent: int) -> tuple[int, int]:
    """The probes in (lo, hi) that keep the bound whatever they show, as (smallest, largest); needs hi - lo >= 2.

    A bracket already past its bound (weight over 1: probes chosen without this, e.g. by an older search
    whose rows --resume reuses) gets the split that halves its weight, the least it can lose from there."""
    total = weight(lo, hi, spent)
    side = max(HALF, total / 2)
    largest = _reach(lo, hi, spent, side)  # below it, at most `side`
    below = _reach(lo, hi, spent, total - side)  # from the smallest x with at most `side` above it
    smallest = below if weight(lo, below, spent) >= total - side else below + 1
    smallest, largest = sorted((smallest, largest))
    return min(max(smallest, lo + 1), hi - 1), min(max(largest, lo + 1), hi - 1)
