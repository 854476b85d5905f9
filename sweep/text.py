"""Counts and quantities in messages: `1 attempt`, `3 attempts`; `0.0001 s`, `1,800 s`. Pure, no imports
beyond the standard library, so the scheduler and the commands share them cheaply."""

from __future__ import annotations

import math


def plural(n: int, noun: str) -> str:
    """'1 attempt', '2 attempts', '0 ranks', '1,200 trials': the count, then the noun agreeing with it."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def seconds(value: float, digits: int = 3) -> str:
    """A duration to `digits` significant figures, trailing zeros dropped, never an exponent: '0.0001 s',
    '1.5 s', '1,800 s' (a limit of 0.0001 s printed as '0 s' reads as no limit at all)."""
    if not value or not math.isfinite(value):
        return f"{value:g} s"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    text = format(round(value, decimals), f",.{decimals}f")
    return (text.rstrip("0").rstrip(".") if "." in text else text) + " s"
