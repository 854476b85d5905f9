"""Formatting aggregated tables: each column's text (the table itself, Rich, markdown or CSV: ``table_out``).

The input is always a small table (one row per config or group, from ``aggregate``), so formatting
loops over its rows in Python. Config columns that hold one value in every row are pulled out of
the table into a caption line ("seq_len 4096 · world_size 8") so a pasted table stays narrow.

A config with no ok attempt shows its status text ("oom", "unsupported") in the TFLOP/s cell and
"—" in the other metrics: a failure never reads as a zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import cast

import pyarrow as pa

from sweep.record.cost import measured_share
from sweep.record.schema import Row
from sweep.results.aggregate import BATCH_GROUP, FAILURES
from sweep.results.query import CONFIG_KEYS
from sweep.results.table_out import (  # noqa: F401
    CONFIG_HEADERS,
    DASH,
    Col,
    csv_table,
    csv_text,
    markdown,
    rich_table,
    says_nothing,
    split_constant,
    stdout_console,
)

SIGNIFICANT = 4  # measurements: 871.9 vs 867.0 TFLOP/s stay apart, 0.01050 and 0.01440 too
RATIO_SIGNIFICANT = 3  # ratios and percentages: 1.58× (+58.1 %), ±10.6 %


def sig(value: float, digits: int = SIGNIFICANT, sign: bool = False) -> str:
    """``value`` to ``digits`` significant figures, never fewer (digits 4: 0.01050, 0.006640, 42.19, 782.9, 12,345).

    Digits left of the point are all kept (no 1.23e+04), with thousands separators. Fixed decimals per
    column would print CPU-rank TFLOP/s (0.0105, 0.0144) alike as 0.01.
    """
    if not value or not math.isfinite(value):
        return format(value, "+g" if sign else "g")
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    text = format(value, f"{'+' if sign else ''},.{decimals}f")
    if decimals and abs(float(text.replace(",", ""))) >= 10 ** (digits - decimals):
        text = format(value, f"{'+' if sign else ''},.{decimals - 1}f")  # 0.09996 rounds up to 0.100, not 0.1000
    return text


def num(key: str, scale: float = 1.0, suffix: str = "", failed: bool = False) -> Callable[[dict], str]:
    """Format ``row[key]`` (times ``scale``) with ``sig``; null becomes the row's status when ``failed`` (else "—")."""

    def text(row: dict) -> str:
        value = row.get(key)
        if value is None:
            return status_text(row, short=True) if failed and row.get("status") not in (None, "ok") else DASH
        return sig(value * scale) + suffix

    return text


def status_text(row: dict, short: bool = False) -> str:
    """'ok', 'oom', 'error/oom', or 'ok (1 oom)' when some attempts of an ok config failed."""
    status = row.get("status") or DASH
    if short or status != "ok":
        return status
    failed = [f"{row[f'n_{s}']} {s}" for s in FAILURES if row.get(f"n_{s}")]
    return f"ok ({', '.join(failed)})" if failed else "ok"


def ratio_text(key: str, base_status_key: str = "base_status") -> Callable[[dict], str]:
    def text(row: dict) -> str:
        value = row.get(key)
        if value is not None:
            return f"{sig(value, RATIO_SIGNIFICANT)}× ({sig((value - 1) * 100, RATIO_SIGNIFICANT, sign=True)} %)"
        if row.get("status") != "ok":
            return row.get("status") or DASH
        if row.get(base_status_key) != "ok":
            return f"baseline {row.get(base_status_key) or 'not run'}"
        return DASH  # both ran: a cost is unknown

    return text


def setting(value: float) -> str:
    """A number the user set (a memory cap in GiB), to ``sig``'s figures less the zeros a measurement keeps:
    `--memory-cap 1500MiB` is 1.465, not 1.46484375; 80 GiB is 80."""
    text = sig(value)
    return text.rstrip("0").rstrip(".") if "." in text else text


def config_value(key: str, value: object) -> str:
    if value is None:
        return DASH
    return setting(cast(float, value)) if key == "memory_cap_gib" else str(value)


def config_cols(keys: Sequence[str]) -> list[Col]:
    return [
        Col(k, CONFIG_HEADERS[k], _cell(k, config_value), k in ("batch_size", "seq_len", "world_size"), of_value=True)
        for k in keys
    ]


def _cell(key: str, text: Callable[[str, object], str]) -> Callable[[dict], str]:
    """A column's text: `text` of the key and the row's value at it (a lambda in a loop would share the key)."""
    return lambda row: text(key, row.get(key))


def short_error(text: str | None, width: int = 60) -> str:
    if not text:
        return ""
    line = " ".join(text.strip().splitlines()[0].split()) if text.strip() else ""  # first line, spaces squeezed
    return line if len(line) <= width else line[: width - 1] + "…"


TFLOPS = num("tflops_per_gpu", failed=True)
MFU = num("mfu", 100, " %")
PEAK_MEM = num("peak_mem_gib")
STEP = num("step_time_s")
TOKENS = num("tokens_per_s_per_gpu")


def _spread(row: dict) -> str:
    if row.get("spread_pct") is None or (row.get("n_ok") or 0) < 2:
        return DASH  # one measurement has no spread
    return f"±{sig(row['spread_pct'], RATIO_SIGNIFICANT)} %"


def _loss(row: dict) -> str:
    """'10.83 → 7.214': the loss fell, so the step trains (FP8 speed means nothing if it does not)."""
    first, last = row.get("loss_first"), row.get("loss_last")
    if first is None and last is None:
        return DASH
    return f"{DASH if first is None else sig(first)} → {DASH if last is None else sig(last)}"


LOSS = Col("loss_last", "loss first → last", _loss)  # reads loss_first too
# each row's loss at the one token count the command chose (`loss_at`; `loss_at.note` says which): `show`, `compare`
LOSS_AT = Col("loss_at", "loss @ tokens", num("loss_at"), optional=True)
MISSED = "!"  # after a step time's interval: `steps: auto` stopped short of its target (`intervals.ci_note`)


def _ci(row: dict) -> str:
    """'±12.3 %', '±12.3 % !' where `steps: auto` missed its target, '—' without an interval."""
    ci = row.get("step_time_ci_pct")
    if ci is None:
        return DASH
    return f"±{sig(ci, RATIO_SIGNIFICANT)} %" + (f" {MISSED}" if row.get("ci_target_met") is False else "")


# beside the step time: the median's 95 % confidence interval (left out when no row has one: fixed counts under 6)
STEP_CI = Col("step_time_ci_pct", "step ±CI", _ci, optional=True)


def _measured(row: dict) -> str:
    """The attempt's wall time in measured steps (`sweep.record.cost`): 0 % for a failed attempt, — for one
    never run."""
    share = measured_share(cast(Row, row))  # a result row: `results show` prints them
    return DASH if share is None else f"{sig(share * 100, RATIO_SIGNIFICANT)} %"


MEASURED = Col("steps_time_s", "time measured", _measured)  # reads aggregate.TIMES and step_time_s too
# The start-up in the order it happens (`sweep.record.schema`): a fresh group's first trial pays all four, a warm
# one only its build (the rest "—")
STARTUP = [
    Col(key, header, num(key), optional=True)
    for key, header in (
        ("process_start_s", "spawn (s)"),
        ("import_s", "import (s)"),
        ("process_setup_s", "setup (s)"),
        ("model_build_s", "build (s)"),
    )
]

SHOW_COLS = [
    *config_cols(CONFIG_KEYS),
    Col("status", "status", lambda r: r.get("status") or DASH, numeric=False),
    Col("tflops_per_gpu", "TFLOP/s/GPU", TFLOPS),
    Col("mfu", "MFU", MFU),
    Col("step_time_s", "step (s)", STEP),
    STEP_CI,
    MEASURED,
    *STARTUP,
    Col("peak_mem_gib", "peak mem (GiB)", PEAK_MEM),
    LOSS,
    LOSS_AT,
    Col("error", "error", lambda r: short_error(r.get("error")), numeric=False),
]

EXPORT_COLS = [
    *config_cols(CONFIG_KEYS),
    Col("status", "status", status_text, numeric=False),
    Col("tflops_per_gpu", "TFLOP/s/GPU", TFLOPS),
    Col("spread_pct", "spread", _spread),
    Col("mfu", "MFU", MFU),
    Col("step_time_s", "step (s)", STEP),
    STEP_CI,
    Col("tokens_per_s_per_gpu", "tok/s/GPU", TOKENS),
    Col("peak_mem_gib", "peak mem (GiB)", PEAK_MEM),
    LOSS,
    Col("n_attempts", "n", lambda r: str(r["n_attempts"])),
]


def _max_ok(row: dict) -> str:
    return DASH if row.get("max_ok_batch") is None else str(row["max_ok_batch"])


def thrashes(batch: int | None, retries: int | None) -> str:
    """'batch 2 fits, but the allocator thrashes (40 retries)' when the allocator retried there, else ''.

    A retry is a cudaMalloc that failed until the caching allocator freed its cache and tried again: the
    batch fits, but only by stalling, so its speed is not what the card does with room to spare.
    """
    if not retries:
        return ""
    return f"batch {batch} fits, but the allocator thrashes ({retries} {'retry' if retries == 1 else 'retries'})"


def thrash_note(
    max_batch: int | None, retries_at_max: int | None, fastest: int | None, retries_at_fastest: int | None
) -> str:
    """`thrashes` for the largest batch and, when another, the fastest one; '' when neither retried."""
    notes = [thrashes(max_batch, retries_at_max)] + (
        [thrashes(fastest, retries_at_fastest)] if fastest != max_batch else []
    )
    return "; ".join(n for n in notes if n)


def _thrash_note(row: dict) -> str:
    return thrash_note(
        row.get("max_ok_batch"),
        row.get("alloc_retries_at_max"),
        row.get("fastest_batch"),
        row.get("alloc_retries_at_fastest"),
    )


def _count(key: str) -> Callable[[dict], str]:
    return lambda r: DASH if r.get(key) is None else f"{r[key]:,}"


MAX_BATCH_COLS = [
    *config_cols(BATCH_GROUP),
    Col("status", "status", lambda r: r.get("status") or DASH, numeric=False),
    Col("max_ok_batch", "max ok batch", _max_ok),
    Col("oom_batch", "OOM at", lambda r: DASH if r.get("oom_batch") is None else str(r["oom_batch"])),
    Col(
        "fastest_batch", "fastest batch", lambda r: DASH if r.get("fastest_batch") is None else str(r["fastest_batch"])
    ),
    Col("tflops_per_gpu", "TFLOP/s/GPU @fastest", TFLOPS),
    Col("mfu", "MFU @fastest", MFU),
    Col("peak_mem_gib", "peak mem @max (GiB)", PEAK_MEM),
    Col("alloc_retries_at_max", "alloc retries @max", _count("alloc_retries_at_max")),
    Col("alloc_retries_at_fastest", "alloc retries @fastest", _count("alloc_retries_at_fastest")),
]
THRASH_COL = Col("thrash", "allocator", _thrash_note, numeric=False)


def max_batch_cols(rows: list[dict]) -> list[Col]:
    """MAX_BATCH_COLS, and the 'fits, but the allocator thrashes' column when a batch in ``rows`` thrashes."""
    return MAX_BATCH_COLS + ([THRASH_COL] if any(_thrash_note(r) for r in rows) else [])


def base_tflops(row: dict) -> str:
    if row.get("base_tflops_per_gpu") is not None:
        return sig(row["base_tflops_per_gpu"])
    return row.get("base_status") or "not run"


def loss_at_cols(baseline: str, tokens_column: bool) -> list[Col]:
    """`compare`'s and `compare --best`'s loss at the same tokens trained; `tokens_column`: each pair at its own
    count."""
    return [
        *([Col("loss_at_tokens", "at tokens", _count("loss_at_tokens"), optional=True)] if tokens_column else []),
        LOSS_AT,
        Col("base_loss_at", f"{baseline} loss @ tokens", num("base_loss_at"), optional=True),
    ]


def compare_cols(by: str, baseline: str, with_cost: bool, tokens_column: bool = False) -> list[Col]:
    """`tokens_column`: as ``loss_at_cols``."""
    keys = [k for k in CONFIG_HEADERS if k != by] + [by]
    cols = [
        *config_cols(keys),
        Col("tflops_per_gpu", "TFLOP/s/GPU", TFLOPS),
        Col("base_tflops_per_gpu", f"{baseline} TFLOP/s/GPU", base_tflops),
        Col("ratio", f"vs {baseline}", ratio_text("ratio")),
        Col("loss_last", "last loss", num("loss_last")),
        Col("base_loss_last", f"{baseline} last loss", num("base_loss_last")),
        *loss_at_cols(baseline, tokens_column),
    ]
    if with_cost:
        cols += [
            Col("tokens_per_s_per_gpu", "tok/s/GPU", TOKENS),
            Col("cost_per_gpu_hour", "$/GPU-h", num("cost_per_gpu_hour")),
            Col("tok_s_per_usd_h", "tok/s per $/GPU-h", num("tok_s_per_usd_h")),
            Col("base_tok_s_per_usd_h", f"{baseline} tok/s per $/GPU-h", num("base_tok_s_per_usd_h")),
            Col("cost_ratio", f"perf/$ vs {baseline}", ratio_text("cost_ratio")),
        ]
    return cols


def value_text(value: object) -> str:
    """Any SQL result value as short text: floats to 6 significant digits, null as empty."""
    if value is None:
        return ""
    if isinstance(value, float):
        return format(value, ".6g")
    if isinstance(value, (list, tuple)):
        return ", ".join(value_text(v) for v in value)
    return str(value)


def generic_cols(schema: pa.Schema) -> list[Col]:
    """Columns for an arbitrary Arrow schema (``sweep results query``)."""
    return [
        Col(
            f.name,
            f.name,
            _cell(f.name, lambda _, value: value_text(value)),
            pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type),
        )
        for f in schema
    ]


# --- the table `sweep plan` prints before a run (the verdicts after a search: `verdicts`) ------------


def plan_table(rows: list[dict], title: str, reasons: dict[str, int]) -> None:
    """`sweep plan`'s trials (cells may hold Rich markup), then the values every trial shares, then what each
    numbered reason a trial cannot run here says."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # Columns with one value in every trial are said once under the table, as `sweep results show`
    # does: the table keeps what varies and stays readable in an 80-column terminal.
    constant = [c for c in rows[0] if c not in ("trial_id", "runs") and len({r[c] for r in rows}) == 1]
    table = Table(title=title)
    for col in (c for c in rows[0] if c not in constant):
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*(v for c, v in row.items() if c not in constant))
    console = Console()
    console.print(table)
    shared = " · ".join(f"{c} {rows[0][c]}".replace("\n", " ") for c in constant if rows[0][c] != "-")
    if shared:
        console.print(f"every trial: {escape(shared)}", soft_wrap=True)
    for reason, n in reasons.items():
        console.print(f"[yellow]({n}) unsupported:[/yellow] {escape(reason)}")
