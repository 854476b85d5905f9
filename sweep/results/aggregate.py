"""Aggregation: one row per config, the largest batch that fits, and ratios against a baseline.

Rules (one place for all commands):

- A config is ``query.CONFIG_KEYS`` (cluster, model, precision, compile, ac, batch_size, seq_len,
  world_size, the training options and the memory cap). Attempts of one config, from any number of runs,
  aggregate to the median of their ``ok`` attempts, with min, max and counts beside it.
- A config with no ``ok`` attempt keeps its failure as its status (``oom``, ``error/timeout``, ...)
  and null metrics: never zeros, never dropped. A config with both keeps ``ok`` and counts the rest.

The work is SQL in DuckDB over Arrow tables; the results are small Arrow tables (one row per config
or per group) that ``render`` and ``plot`` format.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pyarrow as pa

from sweep.errors import UserError
from sweep.record.schema import STATUSES
from sweep.results import energy
from sweep.results.query import CONFIG_KEYS, load, run_sql, when_ok
from sweep.results.scan import Relation

METRICS = ("tflops_per_gpu", "mfu", "step_time_s", "tokens_per_s_per_gpu", "peak_mem_gib")
# Beside the speed: a recipe that runs fast and does not train is no result (median over ok attempts too)
LOSSES = ("loss_first", "loss_last")
FAILURES = tuple(s for s in STATUSES if s != "ok")
# What an attempt's GPU time bought (`sweep.record.cost`, the `time measured` column of `results show`)
TIMES = ("trial_wall_s", "steps_time_s", "compile_time_s", "warmup_steps")
# The median's interval and whether `steps: auto` reached its target (`results show` and `export` print them)
INTERVALS = ("step_time_ci_pct", "ci_target_met")
LOAD_COLUMNS = (
    *CONFIG_KEYS,
    "run_id",
    "status",
    "error",
    "finished_at",
    *METRICS,
    *LOSSES,
    "alloc_retries",
    *TIMES,
    *INTERVALS,
    *energy.MEDIANS,
    "energy_source",
)
# Each ok attempt's loss per step and the tokens trained at each (`loss_at`: losses at the same tokens trained)
LOSS_CURVES = ("loss_curve", "loss_curve_tokens")
# max-batch groups: a config without its batch size.
BATCH_GROUP = tuple(k for k in CONFIG_KEYS if k != "batch_size")
# What `compare --by` can divide by (text-valued config keys), with the default baseline: the fair
# reference for precisions, no compile / no checkpointing, and the training options' defaults. Clusters
# have no natural baseline: the user names one.
COMPARE_BY: dict[str, str | int | None] = {
    "precision": "bf16",
    "cluster": None,
    "compile": "none",
    "ac": "none",
    "reduce_dtype": "fp32",
    "grad_sync": "micro_batch",
    "tp": 1,
    "dp_replicate": 1,
    "dynamic_batch": False,  # a symbolic batch against static shapes (each batch compiled)
}  # layouts: against FSDP over the same ranks


def failure_text(count: str) -> str:
    """SQL for 'oom' / 'error/timeout': the failure statuses whose ``count`` expression is > 0."""
    return "concat_ws('/', " + ", ".join(f"CASE WHEN {count.format(s)} > 0 THEN '{s}' END" for s in FAILURES) + ")"


def _config_aggregates(reached: bool) -> dict[str, str]:
    """Every column of ``config_table`` past the config keys, as its SQL aggregate, in the table's order."""
    from sweep.results.curves import REACHED

    ok = "FILTER (WHERE status = 'ok')"
    return {
        "status": f"""CASE WHEN count(*) {ok} > 0 THEN 'ok'
           ELSE {failure_text("count(*) FILTER (WHERE status = '{}')")} END""",
        "n_attempts": "count(*)",
        "n_ok": f"count(*) {ok}",
        # the runs a config's attempts came from: count(DISTINCT) is a second hash table over every key and the
        # run (+0.6 s of CPU at 10⁶ rows); a list of the config's run ids, deduplicated, is the same number (+0.15 s)
        "n_runs": "len(list_distinct(list(run_id)))::BIGINT",
        **{f"n_{s}": f"count(*) FILTER (WHERE status = '{s}')" for s in FAILURES},
        **{m: when_ok("median", m) for m in (*METRICS, *LOSSES)},
        **energy.config_aggregates(when_ok),
        "alloc_retries": when_ok("max", "alloc_retries"),
        "step_time_ci_pct": when_ok("max", "step_time_ci_pct"),
        "ci_target_met": when_ok("bool_and", "ci_target_met"),
        "tflops_min": when_ok("min", "tflops_per_gpu"),
        "tflops_max": when_ok("max", "tflops_per_gpu"),
        "spread_pct": f"""100 * ({when_ok("max", "tflops_per_gpu")} - {when_ok("min", "tflops_per_gpu")}) / 2
          / nullif({when_ok("median", "tflops_per_gpu")}, 0)""",
        "error": "first(error ORDER BY finished_at DESC NULLS LAST) "
        "FILTER (WHERE status <> 'ok' AND error IS NOT NULL)",
        **({"loss_reached": REACHED} if reached else {}),
    }


def config_table(rows: Relation, columns: Sequence[str] | None = None) -> pa.Table:
    """Rows (any columns including LOAD_COLUMNS) -> one row per config, sorted by config; with ``columns``, only
    those (and the config keys): DuckDB then computes no other aggregate (a median of a million rows costs, and
    DuckDB does not drop an aggregate that an outer SELECT leaves out).

    ``alloc_retries`` is the most of any ok attempt: one thrashing repeat is enough to warn of. Likewise
    ``step_time_ci_pct`` is the widest interval of its ok attempts, and ``ci_target_met`` false when any of them
    missed `steps: auto`'s target (null when none had one).
    """
    keys = ", ".join(CONFIG_KEYS)
    # `compare` reads each config's loss curves' reach here, in the same read (asked for by name)
    wanted = columns is not None and "loss_reached" in columns
    if columns is not None and wanted and not set(LOSS_CURVES) <= set(rows.column_names):  # read without curves
        columns = [c for c in columns if c != "loss_reached"]
    aggregates = _config_aggregates(wanted and columns is not None and "loss_reached" in columns)
    if columns is not None:
        aggregates = {name: sql for name, sql in aggregates.items() if name in columns}
    listed = ",\n      ".join(f"{sql} AS {name}" for name, sql in aggregates.items())
    sql = f"""
    SELECT {keys}{", " if listed else ""}{listed}
    FROM rows GROUP BY {keys} ORDER BY {keys}
    """
    if columns is not None:
        sql = f"SELECT {', '.join(dict.fromkeys((*CONFIG_KEYS, *columns)))} FROM ({sql}) ORDER BY {keys}"
    return run_sql(sql, rows=rows)


def show_rows(rows: Relation, limit: int) -> tuple[list[dict], int | None, int, list[dict]]:
    """`results show`'s first ``limit`` rows (0: all) by config and start time, with their loss curves; the
    largest token count every ok row's curve reached (``curves.count_and_tokens``), the number of rows, and
    stand-ins for the configs of every row for the caption (``curves.key_spans``)."""
    from sweep.results import curves

    order = ", ".join((*CONFIG_KEYS, "started_at", "filename", "file_row_number"))
    printed = run_sql(
        f"SELECT * EXCLUDE ({', '.join(LOSS_CURVES)}) FROM rows ORDER BY {order}"
        + (f" LIMIT {int(limit)}" if limit else ""),
        rows=rows,
    ).to_pylist()
    printed = curves.row_curves(rows, printed)
    # after the rows are read: a damaged file left out is not counted
    total, tokens, configs = curves.count_and_tokens(rows, CONFIG_KEYS)
    return printed, tokens, total, configs


def load_rows(
    directory: Path,
    where: Iterable[str] = (),
    skip_bad: bool = False,
    extra: Iterable[str] = (),
    flops: str = "sweep",
    row_id: bool = False,
) -> Relation:
    """The rows under ``directory`` passing ``where``, with LOAD_COLUMNS and ``extra``, their TFLOP/s and MFU
    counted in the FLOP convention ``flops`` (``recount``): a ``scan.Rows`` view that each statement reads."""
    from sweep.results.recount import COLUMNS, recount

    extra = (*extra, *(COLUMNS if flops != "sweep" else ()))
    return recount(load(directory, where, list(dict.fromkeys((*LOAD_COLUMNS, *extra))), skip_bad, row_id), flops)


def configs(directory: Path, where: Iterable[str] = (), skip_bad: bool = False) -> pa.Table:
    """One row per config of the results under ``directory`` (see ``config_table``)."""
    return config_table(load_rows(directory, where, skip_bad))


# what max_batch_table and compare_table read of config_table's columns
MAX_BATCH_INPUTS = (
    "batch_size",
    "n_ok",
    *(f"n_{s}" for s in FAILURES),
    "n_attempts",
    "tflops_per_gpu",
    "mfu",
    "alloc_retries",
    "peak_mem_gib",
)
# what `export --format md` prints of config_table (render.EXPORT_COLS, energy_view.EXPORT_COLS)
EXPORT_INPUTS = (
    "status",
    *(f"n_{s}" for s in FAILURES),
    "tflops_per_gpu",
    "spread_pct",
    "n_ok",
    "mfu",
    "step_time_s",
    *INTERVALS,
    "tokens_per_s_per_gpu",
    "tokens_per_kwh",
    "tflops_per_watt",
    "avg_power_w",
    "joules_per_token",
    "peak_mem_gib",
    *LOSSES,
    "n_attempts",
)
COMPARE_INPUTS = (
    "status",
    "tflops_per_gpu",
    "tokens_per_s_per_gpu",
    "n_ok",
    "n_attempts",
    "loss_last",
    "loss_reached",
    *energy.COMPARE_INPUTS,
)


def max_batch_table(configs: pa.Table) -> pa.Table:
    """Per BATCH_GROUP: the largest ok batch, the smallest OOM batch above it, the fastest batch.

    ``fastest_batch`` has the highest median TFLOP/s/GPU; ``tflops_per_gpu`` and ``mfu`` are its.
    ``peak_mem_gib`` is the median peak memory at ``max_ok_batch``. ``alloc_retries_at_max`` and
    ``alloc_retries_at_fastest``: the caching allocator's retries there (a batch that fits only by freeing
    and retrying runs slower than it would on a card with room). A group without an ok batch has status
    'oom' (or whatever failed) and ``oom_batch`` its smallest OOM batch.
    """
    group = ", ".join(BATCH_GROUP)
    # arg_max skips rows whose value is null: pick a struct of the wanted values, so that one row gives all
    # (a null MFU on CPU ranks must not take another batch's)
    sql = f"""
    WITH c AS (
      SELECT *, max(CASE WHEN n_ok > 0 THEN batch_size END) OVER (PARTITION BY {group}) AS max_ok
      FROM configs),
    g AS (
      SELECT {group},
        CASE WHEN any_value(max_ok) IS NOT NULL THEN 'ok'
             ELSE {failure_text("sum(n_{})")} END AS status,
        any_value(max_ok) AS max_ok_batch,
        min(batch_size) FILTER (WHERE n_oom > 0 AND batch_size > coalesce(max_ok, 0)) AS oom_batch,
        arg_max({{'batch': batch_size, 'tflops': tflops_per_gpu, 'mfu': mfu, 'retries': alloc_retries}},
                tflops_per_gpu) FILTER (WHERE n_ok > 0) AS fast,
        arg_max({{'mem': peak_mem_gib, 'retries': alloc_retries}}, batch_size) FILTER (WHERE n_ok > 0) AS at_max,
        count(*) AS n_batches,
        sum(n_attempts)::BIGINT AS n_attempts
      FROM c GROUP BY {group})
    SELECT {group}, status, max_ok_batch, oom_batch, fast.batch AS fastest_batch, fast.tflops AS tflops_per_gpu,
      fast.mfu AS mfu, at_max.mem AS peak_mem_gib, n_batches, n_attempts,
      at_max.retries AS alloc_retries_at_max, fast.retries AS alloc_retries_at_fastest
    FROM g ORDER BY {group}
    """
    return run_sql(sql, configs=configs)


def max_batch(directory: Path, where: Iterable[str] = (), skip_bad: bool = False) -> pa.Table:
    return max_batch_table(configs(directory, where, skip_bad))


def compare_table(
    configs: pa.Table,
    baseline: str,
    by: str = "precision",
    costs: Mapping[str, float | None] | None = None,
    prices: pa.Table | None = None,
) -> pa.Table:
    """Each config against the config that differs only in ``by``, where ``by`` is ``baseline``.

    ``ratio`` is tflops_per_gpu / the baseline's (null when either side has no ok attempt; the
    statuses say why); ``loss_last`` and ``base_loss_last`` show whether both sides trained alike. With
    ``costs`` (cluster -> $ per GPU-hour, None when unknown) the table adds
    ``tok_s_per_usd_h`` = tokens/s/GPU per $/GPU-hour, the baseline's, and their ratio, and $ per million tokens
    (``energy.cost_sql``: with the power bill where ``prices``, from ``energy.cluster_prices``, has a price).
    Perf per watt (``tflops_per_watt``, the baseline's, ``watt_ratio``) stands beside the speed.
    Raises UserError when ``baseline`` is not a value of ``by`` in the results.
    """
    if by not in COMPARE_BY:
        raise UserError(f"--by {by!r}: compare by one of {', '.join(COMPARE_BY)}")
    check_baseline(configs, baseline, by)
    keys = [k for k in CONFIG_KEYS if k != by]
    on = " AND ".join(f"c.{k} IS NOT DISTINCT FROM b.{k}" for k in keys)
    cost_cols, cost_join = "", ""
    if costs is not None:
        cost_table = pa.table({"cluster": list(costs), "cost": pa.array(list(costs.values()), pa.float64())})
        cost_cols = """,
      cc.cost AS cost_per_gpu_hour, bc.cost AS base_cost_per_gpu_hour,
      c.tokens_per_s_per_gpu / cc.cost AS tok_s_per_usd_h,
      b.tokens_per_s_per_gpu / bc.cost AS base_tok_s_per_usd_h,
      (c.tokens_per_s_per_gpu / cc.cost) / (b.tokens_per_s_per_gpu / bc.cost) AS cost_ratio"""
        cost_join = "LEFT JOIN costs cc ON cc.cluster = c.cluster LEFT JOIN costs bc ON bc.cluster = b.cluster"
        usd_cols, usd_join = energy.cost_sql()
        cost_cols, cost_join = cost_cols + usd_cols, f"{cost_join} {usd_join}"
    else:
        cost_table = pa.table({"cluster": pa.array([], pa.string())})
    sql = f"""
    SELECT {", ".join(f"c.{k}" for k in keys)}, c.{by},
      c.status, c.tflops_per_gpu, c.tokens_per_s_per_gpu, c.n_ok, c.n_attempts,
      b.status AS base_status, b.tflops_per_gpu AS base_tflops_per_gpu,
      b.tokens_per_s_per_gpu AS base_tokens_per_s_per_gpu,
      c.loss_last, b.loss_last AS base_loss_last,
      c.tflops_per_gpu / b.tflops_per_gpu AS ratio{energy.watt_sql()}{cost_cols}
    FROM configs c LEFT JOIN configs b ON b.{by} = $baseline AND {on} {cost_join}
    WHERE c.{by} <> $baseline
    ORDER BY {", ".join(f"c.{k}" for k in keys)}, c.{by}
    """
    if prices is None:
        prices = energy.cluster_prices(pa.table({"cluster": pa.array([], pa.string())}))
    return run_sql(sql, {"baseline": baseline}, configs=configs, costs=cost_table, prices=prices)


def compare_losses(
    pairs: list[dict],
    attempts: Relation,
    by: str,
    baseline: str,
    printed: int | None = None,
    configs: pa.Table | None = None,
) -> list[dict]:
    """``compare_table``'s rows with each side's loss at the same tokens trained (``curves.losses_at``):
    ``loss_at_tokens`` (the largest count every ok attempt of both sides reached), ``loss_at``, ``base_loss_at``.
    ``attempts``: the rows the configs came from, with LOSS_CURVES. ``printed``: as ``curves.losses_at``;
    ``configs``: ``config_table``'s with ``loss_reached``, so that the curves are read once less."""
    from sweep.results.curves import losses_at

    config = operator.itemgetter(*CONFIG_KEYS)  # a row's config as a tuple of its keys' values
    reached = None
    if configs is not None and "loss_reached" in configs.column_names:  # column by column: no dict per config
        keys = zip(*(configs.column(k).to_pylist() for k in CONFIG_KEYS))
        reached = dict(zip(keys, configs.column("loss_reached").to_pylist()))
    return losses_at(
        attempts,
        pairs,
        CONFIG_KEYS,
        config,
        lambda pair: config({**pair, by: baseline}),
        printed=printed,
        reached=reached,
    )


def check_baseline(table: Relation, baseline: str, by: str) -> None:
    values = run_sql(f"SELECT DISTINCT {by} AS v FROM rows", rows=table).column("v").to_pylist()
    present = sorted(v for v in values if v is not None)
    if baseline not in present:
        raise UserError(
            f"--baseline {baseline!r}: no {by} of that name in the results; valid: {', '.join(map(str, present))}"
        )


def compare_inputs(rows: pa.Table, by: str) -> tuple[pa.Table, dict[str, float | None] | None, pa.Table | None]:
    """The configs of ``rows`` (from ``load_rows`` with ``cost_per_gpu_hour`` and ``energy.PRICES``) and, for
    ``by == "cluster"``, each cluster's $ per GPU-hour and its power price (``energy.cluster_prices``, in the same
    read of the rows); None for the others, which ``compare_table`` then does not price.

    The cost is the one the rows were written with (a profile given by path is in no registry, and a
    renamed or edited profile does not rewrite history); the registry profile's only for clusters whose
    rows predate the cost column (schema < 1.2). None where neither knows it.
    """
    table = config_table(rows, COMPARE_INPUTS)
    if by != "cluster":
        return table, None, None
    latest = run_sql(
        f"""SELECT cluster, first(cost_per_gpu_hour ORDER BY finished_at DESC NULLS LAST)
                       FILTER (WHERE cost_per_gpu_hour > 0) AS cost, {energy.PRICES_SQL} FROM rows GROUP BY cluster""",
        rows=rows,
    )
    recorded = {c: v for c, v in zip(latest.column("cluster").to_pylist(), latest.column("cost").to_pylist()) if v}
    names = sorted(set(table.column("cluster").to_pylist()) - set(recorded))
    return table, {**cluster_costs(names), **recorded}, latest.select(["cluster", *energy.PRICES])


def compare(directory: Path, baseline: str, by: str = "precision", where: Iterable[str] = ()) -> pa.Table:
    table, costs, prices = compare_inputs(load_rows(directory, where, extra=("cost_per_gpu_hour", *energy.PRICES)), by)
    return compare_table(table, baseline, by, costs, prices)


def cluster_costs(names: Iterable[str]) -> dict[str, float | None]:
    """$ per GPU-hour from each cluster's profile; None where the profile or its cost is missing.

    A results directory can come from a machine that lacks some profiles, so any failure to load
    one means "cost unknown", never an error.
    """
    try:
        import clusters
    except Exception:
        return {name: None for name in names}
    costs: dict[str, float | None] = {}
    for name in names:
        try:
            cost = getattr(clusters.load_profile(name), "cost_per_gpu_hour", None)
            costs[name] = float(cost) if cost is not None and float(cost) > 0 else None
        except Exception:
            costs[name] = None
    return costs
