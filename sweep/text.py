"""Counts and quantities in messages: `1 attempt`, `3 attempts`; `0.0001 s`, `1,800 s`; `8.03B` parameters.
Pure, no imports beyond the standard library, so the scheduler and the commands share them cheaply."""

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


_PARAM_UNITS = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K"))


def param_count(n: int) -> str:
    """8.03B, 124M, 198K, 5.15P: a parameter count at a glance, three significant figures and never an
    exponent (5.15e+06B for 5.15 x 10^15 reads as a typo)."""
    rounded = float(f"{n:.3g}")  # first, so that 999.7B is 1T, not 1e+03B
    for scale, unit in _PARAM_UNITS:
        if rounded >= scale:
            value = rounded / scale
            return f"{value:,.0f}{unit}" if value >= 1000 else f"{value:.3g}{unit}"
    return str(n)
