"""`results compare --best`: each precision at its best against the baseline precision at its best, per group
of what it ran (cluster, model, seq_len, ranks, memory cap), and each side's loss at the same tokens trained.

SQL in DuckDB over the rows, as ``aggregate``'s tables (whose rules for a config and its status it follows).
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from sweep.record.schema import TRAINING_DEFAULTS
from sweep.results.aggregate import FAILURES, LOSS_CURVES, check_baseline, failure_text
from sweep.results.query import CONFIG_KEYS, run_sql, when_ok
from sweep.results.scan import Relation

# `compare --best`: a precision's best is per this group, whatever its batch and options
BEST_GROUP = ("cluster", "model", "seq_len", "world_size", "memory_cap_gib")
BEST_CONFIG = ("batch_size", "compile", "ac", *TRAINING_DEFAULTS)


def best_table(rows: Relation, baseline: str, finalists: Iterable[tuple[str | None, str]] = ()) -> pa.Table:
    """Each precision at its best against the ``baseline`` precision at its best, per BEST_GROUP.

    A precision's best is the config (BEST_CONFIG) with the highest median TFLOP/s/GPU over its ok attempts,
    except that a fastest search's best (``finalists``: (cluster, trial_id) from its verdicts) comes first:
    it was fully measured, where the search's short probes were not. ``tuned`` says which was taken. A
    precision without an ok attempt in a group keeps its failure as its status; ``ratio`` is null then.
    ``rows`` need ``trial_id`` besides LOAD_COLUMNS; with LOSS_CURVES too, each side's ``REACHED``
    (``loss_reached``, ``base_loss_reached``) comes in the same read, for ``best_losses``.
    """
    group, config = ", ".join(BEST_GROUP), ", ".join(BEST_CONFIG)
    configs = _configs(rows, finalists)
    ran = run_sql(
        f"""SELECT {group}, precision,
        CASE WHEN sum(n_ok) > 0 THEN 'ok' ELSE {failure_text("sum(n_{})")} END AS status
      FROM configs GROUP BY ALL""",
        configs=configs,
    )
    check_baseline(ran, baseline, "precision")
    same = " AND ".join(f"c.{k} IS NOT DISTINCT FROM b.{k}" for k in BEST_GROUP)
    side = ["status", *BEST_CONFIG, "tflops_per_gpu", "tokens_per_s_per_gpu", "loss_last", "n_ok", "tuned"]
    side_reach = side + (["loss_reached"] if "loss_reached" in configs.column_names else [])
    sql = f"""
    WITH best AS (
      SELECT * EXCLUDE (pick) FROM (
        SELECT *, row_number() OVER (PARTITION BY {group}, precision
                                     ORDER BY tuned DESC, tflops_per_gpu DESC NULLS LAST, {config}) AS pick
        FROM configs WHERE n_ok > 0) WHERE pick = 1),
    s AS (
      SELECT ran.*, {", ".join(f"b.{k}" for k in side_reach if k != "status")}
      FROM ran LEFT JOIN best b ON b.precision = ran.precision
        AND {" AND ".join(f"b.{k} IS NOT DISTINCT FROM ran.{k}" for k in BEST_GROUP)})
    SELECT {", ".join(f"c.{k}" for k in BEST_GROUP)}, c.precision, {", ".join(f"c.{k}" for k in side_reach)},
      {", ".join(f"b.{k} AS base_{k}" for k in side_reach)},
      c.tflops_per_gpu / b.tflops_per_gpu AS ratio
    FROM s c LEFT JOIN s b ON b.precision = $baseline AND {same}
    WHERE c.precision <> $baseline
    ORDER BY {", ".join(f"c.{k}" for k in BEST_GROUP)}, c.precision
    """
    return run_sql(sql, {"baseline": baseline}, configs=configs, ran=ran)


def _configs(rows: Relation, finalists: Iterable[tuple[str | None, str]]) -> pa.Table:
    """Every config of ``rows`` (BEST_GROUP, precision, BEST_CONFIG) and whether it is a search's finalist (``tuned``),
    with its figures over its ok attempts and its attempts per status, in one read of the rows: what each precision
    ran per group follows from these (``best_table``'s ``ran``), with no second read of a million rows (~0.3 s of
    CPU). With LOSS_CURVES, its ``REACHED`` too (``loss_reached``)."""
    from sweep.results.curves import REACHED

    found = pa.table(
        {
            "cluster": pa.array([c for c, _ in finalists], pa.string()),
            "trial_id": pa.array([t for _, t in finalists], pa.string()),
        }
    )
    reach = [f"{REACHED} AS loss_reached"] if set(LOSS_CURVES) <= set(rows.column_names) else []
    ok = "FILTER (WHERE status = 'ok')"
    return run_sql(
        f"""
    WITH r AS (
      SELECT r.*, f.trial_id IS NOT NULL AS tuned FROM rows r
      LEFT JOIN (SELECT DISTINCT * FROM found) f ON f.cluster = r.cluster AND f.trial_id = r.trial_id)
    SELECT {", ".join(BEST_GROUP)}, precision, {", ".join(BEST_CONFIG)}, tuned,
      {when_ok("median", "tflops_per_gpu")} AS tflops_per_gpu,
      {when_ok("median", "tokens_per_s_per_gpu")} AS tokens_per_s_per_gpu,
      {when_ok("median", "loss_last")} AS loss_last, count(*) {ok} AS n_ok{"".join(", " + r for r in reach)},
      {", ".join(f"count(*) FILTER (WHERE status = '{s}') AS n_{s}" for s in FAILURES)}
    FROM r GROUP BY ALL""",
        rows=rows,
        found=found,
    )


def best_losses(
    best: list[dict],
    attempts: Relation,
    baseline: str,
    finalists: Iterable[tuple[str | None, str]] = (),
    printed: int | None = None,
) -> list[dict]:
    """``best_table``'s rows with each side's loss at the same tokens trained, as ``compare_losses`` adds them.

    A side's curves are those of the attempts its figures are the median of: its best config's ok attempts,
    and for a fastest search's best (``tuned``) its finalist's alone, not the search's shorter probes of that
    config. ``attempts``: the rows given to ``best_table``, with LOSS_CURVES and ``trial_id``. ``printed``: as
    ``curves.losses_at``."""
    from sweep.results.curves import losses_at

    key = lambda config, tuned: (*(config[k] for k in CONFIG_KEYS), bool(tuned))  # noqa: E731

    def base(pair: dict) -> tuple:
        config = {
            **{k: pair[k] for k in BEST_GROUP},
            "precision": baseline,
            **{k: pair[f"base_{k}"] for k in BEST_CONFIG},
        }
        return key(config, pair["base_tuned"])

    found = list(dict.fromkeys(finalists))
    values = ", ".join(f"({_quote(c)}, {_quote(t)})" for c, t in found) or "(NULL::VARCHAR, NULL::VARCHAR)"
    source = f"""(SELECT r.*, f.trial_id IS NOT NULL AS tuned FROM rows r
      LEFT JOIN (VALUES {values}) f(cluster, trial_id) ON f.cluster = r.cluster AND f.trial_id = r.trial_id)"""
    reached = None
    if best and "loss_reached" in best[0]:  # best_table read each side's reach: the curves are read once less
        reached = {
            **{key(p, p["tuned"]): p["loss_reached"] for p in best},
            **{base(p): p["base_loss_reached"] for p in best},
        }
    return losses_at(
        attempts, best, (*CONFIG_KEYS, "tuned"), lambda pair: key(pair, pair["tuned"]), base, source, printed, reached
    )


def _quote(text: str | None) -> str:
    return "NULL" if text is None else "'" + str(text).replace("'", "''") + "'"
