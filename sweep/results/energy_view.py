"""How `sweep results` shows energy: the columns of show, export and compare, and the provenance footer's line.

Every column is optional: folded away from a table where no row has it (CPU ranks, rows before schema 1.10).
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from sweep.results.query import run_sql
from sweep.results.render import DASH, Col, num, ratio_text, sig


def _usd(key: str) -> Callable[[dict], str]:
    return lambda r: DASH if r.get(key) is None else f"${sig(r[key])}"


TOK_KWH = Col("tokens_per_kwh", "tok/kWh", num("tokens_per_kwh"), optional=True)
PER_WATT = Col("tflops_per_watt", "TFLOP/s/W", num("tflops_per_watt"), optional=True)
POWER = Col("avg_power_w", "avg W/GPU", num("avg_power_w"), optional=True)
JOULES = Col("joules_per_token", "J/token", num("joules_per_token"), optional=True)
SHOW_COLS = [
    JOULES,
    TOK_KWH,
    PER_WATT,
    POWER,
    Col("energy_source", "energy", lambda r: r.get("energy_source") or DASH, numeric=False, optional=True),
]
EXPORT_COLS = [TOK_KWH, PER_WATT, POWER, JOULES]


def with_energy(cols: list[Col], extra: list[Col], before: str) -> list[Col]:
    """``cols`` with ``extra`` inserted before the column ``before`` (at the end when there is none)."""
    at = next((i for i, c in enumerate(cols) if c.key == before), len(cols))
    return [*cols[:at], *extra, *cols[at:]]


def compare_cols(baseline: str, with_cost: bool) -> list[Col]:
    """Perf per watt beside the speed ratio; $ per million tokens beside tok/s per $ (folded when unknown)."""
    cols = [
        PER_WATT,
        Col("base_tflops_per_watt", f"{baseline} TFLOP/s/W", num("base_tflops_per_watt"), optional=True),
        Col("watt_ratio", f"perf/W vs {baseline}", ratio_text("watt_ratio"), optional=True),
    ]
    if with_cost:
        cols += [
            Col("usd_per_mtok_gpu", "$/Mtok GPU", _usd("usd_per_mtok_gpu"), optional=True),
            Col("usd_per_mtok_energy", "$/Mtok power", _usd("usd_per_mtok_energy"), optional=True),
            Col("usd_per_mtok", "$/Mtok", _usd("usd_per_mtok"), optional=True),
            Col("base_usd_per_mtok", f"{baseline} $/Mtok", _usd("base_usd_per_mtok"), optional=True),
            Col("usd_per_mtok_ratio", f"$/Mtok vs {baseline}", ratio_text("usd_per_mtok_ratio"), optional=True),
        ]
    return cols


def footer_line(rows: pa.Table) -> str | None:
    """'- power and clocks: limit 700 W; SM clock mean 1,830 MHz (1,755–1,980 over 4 rows), max 1,980 MHz;
    energy from the counter' for the provenance footer; None when no row measured any."""
    stats = run_sql(
        """SELECT min(power_limit_w) AS lo, max(power_limit_w) AS hi, median(sm_clock_mhz) AS clock,
        min(sm_clock_mhz) AS clock_lo, max(sm_clock_mhz) AS clock_hi, max(sm_clock_max_mhz) AS clock_max,
        count(sm_clock_mhz) AS n, string_agg(DISTINCT energy_source, ', ' ORDER BY energy_source) AS sources
      FROM rows WHERE status = 'ok'""",
        rows=rows,
    ).to_pylist()[0]
    if stats["lo"] is None and stats["clock"] is None:
        return None
    parts = []
    if stats["lo"] is not None:
        parts.append(f"limit {stats['lo']:g} W" + ("" if stats["hi"] == stats["lo"] else f"–{stats['hi']:g} W"))
    if stats["clock"] is not None:
        spread = (
            "" if stats["n"] < 2 else f" ({sig(stats['clock_lo'])}–{sig(stats['clock_hi'])} over {stats['n']} rows)"
        )
        parts.append(
            f"SM clock median {sig(stats['clock'])} MHz{spread}"
            + ("" if stats["clock_max"] is None else f", max {sig(stats['clock_max'])} MHz")
        )
    if stats["sources"]:
        parts.append(f"energy from: {stats['sources']}")
    return "- power and clocks: " + "; ".join(parts)
