"""TFLOP/s and MFU in another tool's FLOP convention (``--flops megatron|torchtitan``).

Rows store TFLOP/s counted as sweep counts (``trainer.flops``: 6·N + 12·L·H·D·T, N = every parameter).
Megatron-LM and torchtitan count fewer FLOPs for the same step, so their TFLOP/s for the same speed are
lower, and a table compared with theirs must count as they do. Each row's figures are scaled by

    r = FLOPs per token in the convention / the FLOPs per token the row was computed with

from the row's own model spec (``model_spec``, JSON) and seq_len: the speed is unchanged, only what a
token is said to cost. ``mfu`` scales by the same r (same divisor). The spec of a row written without one
is looked up in the model registry by name.
"""

from __future__ import annotations

import json

import pyarrow as pa

from sweep.errors import UserError
from sweep.results.scan import Relation
from trainer.flops import CONVENTIONS, convention_flops_per_token, spec_flops_per_token

COLUMNS = ("model", "model_spec", "seq_len", "flops_per_token")  # what recount reads beside the metrics


def _spec(label: str, spec_json: str | None, convention: str):
    from trainer.models.specs import REGISTRY, ModelSpec

    if spec_json:
        return ModelSpec(**json.loads(spec_json))
    if label in REGISTRY:
        return REGISTRY[label]
    raise UserError(
        f"--flops {convention}: rows of model {label!r} carry no model spec and {label!r} is not in the "
        f"registry, so their FLOPs cannot be recounted (leave them out: --where model!={label})"
    )


def recount(rows: Relation, convention: str) -> Relation:
    """``rows`` (with COLUMNS, tflops_per_gpu, mfu: an Arrow table or a ``scan.Rows`` view) with TFLOP/s and MFU
    counted in ``convention``."""
    if convention == "sweep":
        return rows
    from sweep.results.query import run_sql

    shapes = run_sql("SELECT DISTINCT model, model_spec, seq_len FROM rows", rows=rows).to_pylist()
    for s in shapes:
        spec = _spec(s["model"], s["model_spec"], convention)
        s["fpt"] = convention_flops_per_token(convention, spec, s["seq_len"])
        s["sweep_fpt"] = spec_flops_per_token(spec, s["seq_len"])  # for a row that lacks its own figure
    factors = pa.Table.from_pylist(
        shapes,
        schema=pa.schema(
            [
                ("model", pa.string()),
                ("model_spec", pa.string()),
                ("seq_len", pa.int32()),
                ("fpt", pa.float64()),
                ("sweep_fpt", pa.float64()),
            ]
        ),
    )
    order = ", ".join(f'r."{c}"' for c in rows.column_names if c not in ("tflops_per_gpu", "mfu", "flops_per_token"))

    def select(source: str) -> str:
        return f"""
        SELECT {order},
          r.tflops_per_gpu * k.fpt / coalesce(r.flops_per_token, k.sweep_fpt) AS tflops_per_gpu,
          r.mfu * k.fpt / coalesce(r.flops_per_token, k.sweep_fpt) AS mfu,
          k.fpt AS flops_per_token
        FROM {source} r JOIN factors k ON r.model = k.model AND r.model_spec IS NOT DISTINCT FROM k.model_spec
          AND r.seq_len = k.seq_len"""

    if isinstance(rows, pa.Table):
        return run_sql(select("rows"), rows=rows, factors=factors)
    rows.redefine(select, factors=factors)  # a scan.Rows view: recounted as each statement reads it
    return rows


def caption(convention: str) -> str:
    """The table note naming the convention (every table says how its TFLOP/s were counted)."""
    return f"FLOPs: {convention}"


def formula(convention: str) -> tuple[str, str]:
    """(name, formula in words) for the markdown footer."""
    return convention, CONVENTIONS[convention][1]
