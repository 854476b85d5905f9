"""What searches concluded, as tables: the verdicts of a max-batch search (`sweep max-batch`) and of a
fastest-configuration search (`search: fastest`, `sweep.search.fastest.search`), and each precision at its best
(`sweep results compare --best`).

A search prints its verdicts when it ends and saves them in ``<output>/_search/<run_id>.json`` (a JSON
list, ``store.write_verdicts``); ``load`` reads them back for ``sweep results verdicts`` and for
``compare --best``, which prefers a search's fully measured best to the fastest row.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sweep.errors import UserError
from sweep.record.schema import TRAINING_DEFAULTS
from sweep.results.render import (
    CONFIG_HEADERS,
    DASH,
    RATIO_SIGNIFICANT,
    TFLOPS,
    Col,
    base_tflops,
    config_cols,
    loss_at_cols,
    num,
    ratio_text,
    sig,
    stdout_console,
)

# The configuration a search starts from and `compare --best` describes others against: no compile, no
# activation checkpointing, the training options' defaults (the batch is always said).
DEFAULT_CONFIG = {"compile": "none", "ac": "none", **TRAINING_DEFAULTS}
# Where a fastest search's best spends its step (the row's profile_* columns: trainer.profiling.SHARE_KEYS)
PROFILE_PARTS = (
    ("gemm_pct", "GEMM"),
    ("attention_pct", "attention"),
    ("comm_exposed_pct", "exposed comm"),
    ("optimizer_pct", "optimizer"),
    ("other_pct", "other"),
)


def load(directory: Path) -> list[dict]:
    """Every verdict saved under ``directory/_search/`` (oldest run file first), each with ``kind``.

    A search resumed (``--resume``) saves its verdict again, under the new run: only the latest verdict of
    each ``search_id`` counts (the earlier one is of the search cut short). Files saved before verdicts had
    a kind hold max-batch verdicts. A file that is not a JSON list of objects is a UserError naming it.
    """
    verdicts = []
    for path in sorted((Path(directory) / "_search").glob("*.json")):
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"{path}: not a saved search verdict ({e})") from None
        if not isinstance(saved, list) or not all(isinstance(v, dict) for v in saved):
            raise UserError(f"{path}: not a saved search verdict (expected a JSON list of objects)")
        verdicts += [{"kind": "max_batch", **v} for v in saved]
    latest = {v["search_id"]: i for i, v in enumerate(verdicts) if v.get("search_id")}
    return [v for i, v in enumerate(verdicts) if latest.get(v.get("search_id"), i) == i]


def config_text(config: dict | None, against: dict = DEFAULT_CONFIG) -> str:
    """'batch 3 · accum 8 · reduce bf16 · grad sync step': the batch, then each option whose value differs
    from ``against`` (what a tuned configuration changed, or what a row runs beyond the defaults)."""
    if not config:
        return DASH
    parts = [] if config.get("batch_size") is None else [f"batch {config['batch_size']}"]
    for key, value in config.items():
        if key != "batch_size" and key in CONFIG_HEADERS and value is not None and value != against.get(key):
            parts.append(f"{CONFIG_HEADERS[key]} {_value(value)}")
    return " · ".join(parts) or DASH


def _value(value: object) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _opt(value: Any, text: Callable[[Any], str] = str, missing: str = "–") -> str:
    return missing if value is None else text(value)


def print_tables(verdicts: list[dict]) -> None:
    """Each kind's table, as the search printed it when it ended: max-batch verdicts, then
    fastest-configuration ones."""
    max_batch = [v for v in verdicts if v["kind"] == "max_batch"]
    fastest = [v for v in verdicts if v["kind"] == "fastest"]
    if max_batch:
        verdict_table(max_batch)
    if fastest:
        tune_table(fastest)


def verdict_table(verdicts: list[dict]) -> None:
    """The max-batch verdicts `sweep max-batch` prints after its search (on stdout, every cell whole)."""
    from rich.table import Table

    table = Table(title="max-batch verdicts", title_justify="left")
    thrash = any(v.get("allocator") for v in verdicts)
    for col in [
        "model",
        "precision",
        "compile",
        "seq",
        "gpus",
        "max batch",
        "first OOM",
        "fastest batch",
        "TFLOP/s/GPU @fastest",
        "alloc retries @max",
        "alloc retries @fastest",
        "probes",
        "search s",
        "cost (x one trial)",
    ] + (["allocator"] if thrash else []):
        table.add_column(col)
    for v in verdicts:
        precision = v["precision"] + (f" ({v['options']})" if v.get("options") else "")  # e.g. grad_accum=8
        table.add_row(
            v["model"],
            precision,
            v["compile"],
            str(v["seq_len"]),
            str(v["gpus"]),
            str(v["max_batch"]),
            str(v["first_failing_batch"]),
            str(v["fastest_batch"]),
            _opt(v.get("tflops_at_fastest"), lambda x: f"{x:.4g}"),
            _opt(v.get("alloc_retries_at_max")),
            _opt(v.get("alloc_retries_at_fastest")),
            str(v["probes"]),
            _opt(v.get("search_wall_s"), lambda x: f"{x:.1f}")
            + (f" [red]aborted: {v['aborted']}[/red]" if v.get("aborted") else ""),
            _opt(v.get("cost_vs_one_trial"), lambda x: f"{x:.1f}x"),
            *([f"[yellow]{v.get('allocator') or ''}[/yellow]"] if thrash else []),
        )
    stdout_console().print(table)


TUNE_COLUMNS = [
    "model",
    "precision",
    "seq",
    "gpus",
    "best (vs baseline)",
    "TFLOP/s/GPU @best",
    "baseline",
    "baseline TFLOP/s/GPU",
    "speedup",
    "probes / budget",
    "cost (x one trial)",
    "numerics allowed",
]  # tune_table's columns, between the cluster (several clusters only) and the global batch (when one was held)


def tune_table(verdicts: list[dict]) -> None:
    """The fastest-configuration verdicts (``kind: "fastest"``) a search prints when it ends, one row per model,
    precision, seq_len and GPUs: the best configuration (what it changed from the baseline, and its batch)
    and its TFLOP/s/GPU, the baseline's, the speedup, the probes used of the budget, the cost against one
    measured trial and the numerics-changing options the search was allowed. An aborted search says why.
    Under the table, for each best that was profiled, where its step time goes."""
    from rich.markup import escape
    from rich.table import Table

    clusters = len({v.get("cluster") for v in verdicts}) > 1
    global_batch = any(v.get("global_batch_tokens") for v in verdicts)
    table = Table(title="fastest configuration per model × precision", title_justify="left")
    for col in (["cluster"] if clusters else []) + TUNE_COLUMNS + (["global batch (tokens)"] if global_batch else []):
        table.add_column(col, justify="right" if "TFLOP" in col or col in ("seq", "gpus", "speedup") else "left")
    for v in verdicts:
        baseline = v.get("baseline") or {}
        best = (
            f"[red]aborted: {escape(str(v['aborted']))}[/red]"
            if v.get("aborted")
            else escape(config_text(v.get("best"), {**DEFAULT_CONFIG, **baseline}))
        )
        table.add_row(
            *([str(v.get("cluster"))] if clusters else []),
            _model_at_layout(v),
            v["precision"],
            str(v["seq_len"]),
            str(v["gpus"]),
            best,
            _opt(v.get("tflops_at_best"), sig, DASH),
            escape(config_text(baseline)),
            _opt(v.get("baseline_tflops"), sig, DASH),
            ratio_text("speedup")(v),
            f"{v.get('probes', DASH)} / {v.get('budget', DASH)}",
            _opt(v.get("cost_vs_one_trial"), lambda x: f"{x:.1f}x", DASH),
            ", ".join(v.get("numerics_allowed") or []) or "none",
            *([_opt(v.get("global_batch_tokens"), lambda x: f"{x:,}", DASH)] if global_batch else []),
        )
    console = stdout_console()
    console.print(table)
    for v in verdicts:
        if v.get("profile"):
            console.print(escape(profile_line(v)), soft_wrap=True)
        if v.get("skipped_for_cost"):
            console.print(escape(skipped_line(v)), soft_wrap=True)


def _model_at_layout(v: dict) -> str:
    """`llama-tiny tp 2`: the model, and the layout its search ran at when the search varied it."""
    layout = " x ".join(f"{a} {v[a]}" for a in ("dp_replicate", "tp") if (v.get(a) or 1) != 1)
    return f"{v['model']} {layout}" if layout else v["model"]


def profile_line(v: dict) -> str:
    """'llama3-8b fp8-te T4096 ×2, the best's step: GEMM 61.2 %, attention 14.0 %, ... · trace run1/x.json'."""
    p = v["profile"]
    shares = ", ".join(
        f"{name} {_opt(p.get(key), lambda x: sig(x, RATIO_SIGNIFICANT), DASH)} %" for key, name in PROFILE_PARTS
    )
    trace = f" · trace {p['trace_file']}" if p.get("trace_file") else ""
    return f"{_model_at_layout(v)} {v['precision']} T{v['seq_len']} ×{v['gpus']}, the best's step: {shares}{trace}"


def skipped_line(v: dict) -> str:
    """'gpt2-1.5b fp8-torchao-tensorwise T1024 ×1, not probed (predicted past max_cost 10x one trial): batch 32 ·
    compile full': what a fastest search skipped for cost (sweep.search.fastest.cost)."""
    base = {**DEFAULT_CONFIG, **(v.get("baseline") or {})}
    said = "; ".join(config_text(c, base) for c in v["skipped_for_cost"])
    return (
        f"{_model_at_layout(v)} {v['precision']} T{v['seq_len']} ×{v['gpus']}, not probed (predicted past max_cost "
        f"{v.get('max_cost'):g}x one trial): {said}"
    )


def finalists(verdicts: list[dict]) -> list[tuple[str | None, str]]:
    """(cluster, trial_id) of each fastest search's best: a fully measured finalist, not a short probe."""
    return [
        (v.get("cluster"), v["best_trial_id"])
        for v in verdicts
        if v["kind"] == "fastest" and not v.get("aborted") and v.get("best_trial_id")
    ]


def _config(row: dict, prefix: str = "") -> str:
    return config_text({k: row.get(prefix + k) for k in ("batch_size", *DEFAULT_CONFIG)})


def best_cols(baseline: str, tokens_column: bool = False) -> list[Col]:
    """`compare --best`: each precision's best (``best.best_table``) against the baseline precision's best, and
    each side's loss at the same tokens trained (``best.best_losses``; `tokens_column` as ``loss_at_cols``)."""
    picked: dict[bool | None, str] = {True: "search's best", False: "fastest ok"}
    return [
        *config_cols(("cluster", "model", "seq_len", "world_size", "memory_cap_gib", "precision")),
        Col("config", "best config", _config, numeric=False),
        Col("tflops_per_gpu", "TFLOP/s/GPU", TFLOPS),
        Col("tuned", "from", lambda r: picked.get(r.get("tuned"), DASH), numeric=False),
        Col("base_config", f"{baseline} best config", lambda r: _config(r, "base_"), numeric=False),
        Col("base_tflops_per_gpu", f"{baseline} TFLOP/s/GPU", base_tflops),
        Col("ratio", f"vs {baseline}", ratio_text("ratio")),
        Col("loss_last", "last loss", num("loss_last")),
        Col("base_loss_last", f"{baseline} last loss", num("base_loss_last")),
        *loss_at_cols(baseline, tokens_column),
    ]
