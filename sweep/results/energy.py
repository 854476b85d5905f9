"""Energy in `sweep results`: the SQL of perf per watt and $ per million tokens (`energy_view` formats them).

The row's figures are `sweep.record.energy`'s; here they are aggregated per config (the median of ok attempts, as the
speed is) and priced. `compare --by cluster`, per config:

    $/Mtok, GPU     = cost_per_gpu_hour / 3600 / tokens_per_s_per_gpu × 1e6
    $/Mtok, energy  = joules_per_token × 1e6 / 3.6e6 × PUE × power_cost_per_kwh   (PUE 1 where the profile has none)
    $/Mtok          = GPU + energy where the profile prices power (null when that row measured no energy), else GPU

with the cost, price and PUE the rows were written with (as `cost_per_gpu_hour` is: history is not rewritten).
Every energy column is folded away from a table where no row has it (CPU ranks, rows before schema 1.10).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa

from sweep.record.energy import ENERGY_COLUMNS
from sweep.results.query import run_sql

# medians over a config's ok attempts (`aggregate.config_table`)
MEDIANS = tuple(c for c in ENERGY_COLUMNS if c != "energy_source")  # every energy column but the text one
PRICES = ("power_cost_per_kwh", "pue")
COMPARE_INPUTS = ("tflops_per_watt", "joules_per_token", "avg_power_w")  # the config columns watt_sql and cost_sql read
FOOTER = ("power_limit_w", "sm_clock_mhz", "sm_clock_max_mhz", "energy_source")


def config_aggregates(ok: Callable[[str, str], str]) -> dict[str, str]:
    """The aggregates `aggregate.config_table` adds, by column: medians, the plot's error bars, the source (any
    sampled attempt makes the config's 'sampled'); ``ok(function, column)``: that aggregate over the ok attempts
    (``query.when_ok``)."""
    return {
        **{m: ok("median", m) for m in MEDIANS},
        "tokens_per_kwh_min": ok("min", "tokens_per_kwh"),
        "tokens_per_kwh_max": ok("max", "tokens_per_kwh"),
        "energy_source": ok("max", "energy_source"),
    }


def watt_sql() -> str:
    """`aggregate.compare_table`'s perf-per-watt columns (c: the config, b: its baseline)."""
    return """,
      c.tflops_per_watt, b.tflops_per_watt AS base_tflops_per_watt,
      c.tflops_per_watt / b.tflops_per_watt AS watt_ratio, c.joules_per_token, c.avg_power_w"""


def _usd_per_mtok(side: str, cost: str, price: str) -> tuple[str, str]:
    gpu = f"{cost}.cost / 3600 / {side}.tokens_per_s_per_gpu * 1e6"
    power = f"{side}.joules_per_token * 1e6 / 3.6e6 * coalesce({price}.pue, 1) * {price}.power_cost_per_kwh"
    return gpu, f"CASE WHEN {price}.power_cost_per_kwh IS NULL THEN {gpu} ELSE {gpu} + {power} END"


def cost_sql() -> tuple[str, str]:
    """`compare_table`'s $ per million tokens (select list, joins), beside its tok/s per $/GPU-h."""
    gpu, total = _usd_per_mtok("c", "cc", "cp")
    _, base_total = _usd_per_mtok("b", "bc", "bp")
    energy = "c.joules_per_token * 1e6 / 3.6e6 * coalesce(cp.pue, 1) * cp.power_cost_per_kwh"
    select = f""",
      cp.power_cost_per_kwh, cp.pue, {gpu} AS usd_per_mtok_gpu, {energy} AS usd_per_mtok_energy,
      {total} AS usd_per_mtok, {base_total} AS base_usd_per_mtok, ({total}) / ({base_total}) AS usd_per_mtok_ratio"""
    joins = "LEFT JOIN prices cp ON cp.cluster = c.cluster LEFT JOIN prices bp ON bp.cluster = b.cluster"
    return select, joins


# each cluster's power price and PUE, the latest its rows were written with, as a select list over GROUP BY cluster
PRICES_SQL = (
    "first(power_cost_per_kwh ORDER BY finished_at DESC NULLS LAST) "
    """FILTER (WHERE power_cost_per_kwh IS NOT NULL)
          AS power_cost_per_kwh,
        first(pue ORDER BY finished_at DESC NULLS LAST) FILTER (WHERE pue IS NOT NULL) AS pue"""
)


def cluster_prices(rows: pa.Table) -> pa.Table:
    """Each cluster's power price and PUE, the latest its rows were written with (null where none set them)."""
    if rows.num_rows == 0:
        return pa.table(
            {
                "cluster": pa.array([], pa.string()),
                "power_cost_per_kwh": pa.array([], pa.float64()),
                "pue": pa.array([], pa.float64()),
            }
        )
    return run_sql(f"SELECT cluster, {PRICES_SQL} FROM rows GROUP BY cluster", rows=rows)


def drop_empty(
    table: pa.Table,
    columns: Sequence[str] = (
        *MEDIANS,
        "tokens_per_kwh_min",
        "tokens_per_kwh_max",
        "energy_source",
        "watt_ratio",
        "base_tflops_per_watt",
    ),
) -> pa.Table:
    """``table`` without the energy columns that are null in every row (CSV: absent, as the tables fold them)."""
    empty = [c for c in columns if c in table.column_names and table.column(c).null_count == table.num_rows]
    return table.drop_columns(empty)


# `sweep results plot --metric`: (median, min, max, axis label)
PLOT_METRICS = {
    "tflops": ("tflops_per_gpu", "tflops_min", "tflops_max", "TFLOP/s/GPU (median)"),
    "tokens-per-kwh": ("tokens_per_kwh", "tokens_per_kwh_min", "tokens_per_kwh_max", "tokens per kWh (median)"),
}
