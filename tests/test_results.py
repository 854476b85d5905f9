"""`sweep results`: aggregation, comparisons, exports, plot and query over a synthetic dataset.

The dataset is written with ``sweep.record.store.write_row`` exactly as ``sweep run`` writes it: two
clusters, three runs each, two models, three precisions, batches 1..16, with OOMs above each
model's limit, a precision unsupported on one cluster, a timeout, and two configs where one repeat
failed among ok ones. Expected numbers are computed here, in plain Python, from the rows.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import random
import statistics
import sys
import types
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import invoke

from sweep.record.schema import TRAINING_DEFAULTS
from sweep.record.store import write_row
from sweep.results import aggregate, query

KEYS = tuple(k for k in query.CONFIG_KEYS if k != "memory_cap_gib")  # the synthetic rows have no cap
GROUP = tuple(k for k in KEYS if k != "batch_size")
DEFAULT_OPTIONS = tuple(TRAINING_DEFAULTS.values())  # grad_accum, grad_clip, fp8_lm_head, ...
PEAK = {"h200": 989.0, "mi300x": 1307.0}
SPEED = {"h200": 420.0, "mi300x": 470.0}
PREC = {"bf16": 1.0, "fp8-te": 1.12, "fp8-torchao": 1.07}
LIMIT = {("llama3-8b", "bf16"): 4, ("llama3-70b", "bf16"): 2}  # fp8 fits twice the bf16 batch
FLOPS_PER_TOKEN = {"llama3-8b": 6 * 8.0e9, "llama3-70b": 6 * 70.6e9}
SEQ = 2048


def _limit(model: str, precision: str) -> int:
    bf16 = LIMIT[(model, "bf16")]
    return bf16 if precision == "bf16" else 2 * bf16


def make_rows() -> list[dict]:
    rng = random.Random(7)
    rows, n = [], 0
    t0 = dt.datetime(2025, 6, 2, 9, 0, tzinfo=dt.timezone.utc)
    for cluster in ("h200", "mi300x"):
        for run in (1, 2, 3):
            for model in ("llama3-8b", "llama3-70b"):
                for precision in PREC:
                    for batch in (1, 2, 4, 8, 16):
                        n += 1
                        limit = _limit(model, precision)
                        status, error = "ok", None
                        if batch > limit:
                            status, error = "oom", f"CUDA out of memory. Tried to allocate {batch * 0.5:.2f} GiB"
                        if cluster == "mi300x" and precision == "fp8-torchao":
                            status, error = "unsupported", "torchao float8 needs sm89+, got gfx942"
                        if cluster == "mi300x" and model == "llama3-8b" and precision == "bf16" and batch == 16:
                            status, error = "timeout", "trial exceeded 900 s"
                        if (
                            cluster == "h200"
                            and model == "llama3-8b"
                            and precision == "fp8-te"
                            and batch == 8
                            and run == 3
                        ):
                            status, error = "oom", "CUDA out of memory (fragmentation)"  # flaky: 2 ok + 1 oom
                        if (
                            cluster == "h200"
                            and model == "llama3-70b"
                            and precision == "bf16"
                            and batch == 1
                            and run == 2
                        ):
                            status, error = "error", "NCCL watchdog timeout\nrank 3 ...\n"
                        row = {
                            "run_id": f"{cluster}-run{run}",
                            "trial_id": f"t{n:05d}",
                            "attempt": 1,
                            "grid_name": "fp8-vs-bf16",
                            "cluster": cluster,
                            "accelerator": cluster,
                            "world_size": 8,
                            "nodes": 1,
                            "hostname": f"{cluster}-node0",
                            "model": model,
                            "precision": precision,
                            "compile": "none",
                            "ac": "none",
                            "batch_size": batch,
                            "seq_len": SEQ,
                            "warmup_steps": 3,
                            "measure_steps": 10,
                            **TRAINING_DEFAULTS,
                            "status": status,
                            "error": error,
                            "gpu_name": cluster.upper(),
                            "started_at": t0 + dt.timedelta(minutes=n),
                            "finished_at": t0 + dt.timedelta(minutes=n, seconds=50),
                        }
                        if status == "ok":
                            tf = SPEED[cluster] * PREC[precision] * (1 - 0.25 / batch) * rng.uniform(0.96, 1.04)
                            if precision == "fp8-torchao" and batch == limit:
                                tf *= 0.8  # at its limit torchao slows down: its fastest batch is smaller
                            tokens = tf * 1e12 / FLOPS_PER_TOKEN[model]
                            row.update(
                                tflops_per_gpu=tf,
                                mfu=tf / PEAK[cluster],
                                tokens_per_s_per_gpu=tokens,
                                step_time_s=batch * SEQ / tokens,
                                peak_mem_gib=12.0 + 9.5 * batch + rng.random(),
                                peak_tflops=PEAK[cluster],
                                flops_per_token=FLOPS_PER_TOKEN[model],
                            )
                        rows.append(row)
    return rows


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("results")
    rows = make_rows()
    for row in rows:
        write_row(out, row)
    return out, rows


def expected_configs(rows: list[dict]) -> dict[tuple, dict]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[tuple(r.get(k) for k in KEYS)].append(r)
    out = {}
    for key, rs in groups.items():
        ok = [r for r in rs if r["status"] == "ok"]
        e = {"n": len(rs), "n_ok": len(ok), **{f"n_{s}": sum(r["status"] == s for r in rs) for s in aggregate.FAILURES}}
        if ok:
            e["status"] = "ok"
            for m in aggregate.METRICS:
                e[m] = statistics.median(r[m] for r in ok)
            tf = [r["tflops_per_gpu"] for r in ok]
            e["spread_pct"] = 100 * (max(tf) - min(tf)) / 2 / e["tflops_per_gpu"]
        else:
            e["status"] = "/".join(s for s in aggregate.FAILURES if e[f"n_{s}"])
            e.update({m: None for m in aggregate.METRICS})
        out[key] = e
    return out


def sweep_results(*args: str):
    """``sweep results ARGS`` through the real CLI: an import failure of sweep.cli fails the test."""
    return invoke("results", *args)


# --- aggregation -----------------------------------------------------------------------------------


def test_configs_median_counts_and_failures(dataset):
    out, rows = dataset
    got = {tuple(r.get(k) for k in KEYS): r for r in aggregate.configs(out).to_pylist()}
    want = expected_configs(rows)
    assert got.keys() == want.keys()  # every config, failed ones included
    for key, e in want.items():
        g = got[key]
        assert g["status"] == e["status"], key
        assert (g["n_attempts"], g["n_ok"]) == (e["n"], e["n_ok"])
        for s in aggregate.FAILURES:
            assert g[f"n_{s}"] == e[f"n_{s}"]
        for m in aggregate.METRICS:
            assert g[m] == (pytest.approx(e[m], rel=1e-12) if e[m] is not None else None), (key, m)
    flaky = got[("h200", "llama3-8b", "fp8-te", "none", "none", 8, SEQ, 8, *DEFAULT_OPTIONS)]
    assert (flaky["status"], flaky["n_ok"], flaky["n_oom"], flaky["error"]) == (
        "ok",
        2,
        1,
        "CUDA out of memory (fragmentation)",
    )


def test_max_batch_largest_oom_and_fastest(dataset):
    out, rows = dataset
    want = expected_configs(rows)
    got = {tuple(r[k] for k in GROUP): r for r in aggregate.max_batch(out).to_pylist()}
    assert len(got) == 2 * 2 * 3
    for group, g in got.items():
        mine = {
            k[KEYS.index("batch_size")]: e for k, e in want.items() if tuple(k[KEYS.index(c)] for c in GROUP) == group
        }
        ok = [b for b, e in mine.items() if e["n_ok"]]
        if not ok:
            assert g["max_ok_batch"] is None and g["status"] == "unsupported" and g["tflops_per_gpu"] is None
            continue
        largest = max(ok)
        fastest = max(ok, key=lambda b: mine[b]["tflops_per_gpu"])
        ooms = [b for b, e in mine.items() if e["n_oom"] and b > largest]
        assert g["max_ok_batch"] == largest
        assert g["oom_batch"] == (min(ooms) if ooms else None)
        assert g["fastest_batch"] == fastest
        assert g["tflops_per_gpu"] == pytest.approx(mine[fastest]["tflops_per_gpu"])
        assert g["mfu"] == pytest.approx(mine[fastest]["mfu"])
    # spot checks of the rules against the generator
    h200_8b = lambda p: got[("h200", "llama3-8b", p, "none", "none", SEQ, 8, *DEFAULT_OPTIONS)]  # noqa: E731
    assert (h200_8b("bf16")["max_ok_batch"], h200_8b("bf16")["oom_batch"]) == (4, 8)
    assert (h200_8b("fp8-te")["max_ok_batch"], h200_8b("fp8-te")["oom_batch"]) == (8, 16)  # 2 of 3 ok at 8
    assert h200_8b("fp8-torchao")["fastest_batch"] == 4  # slower at its limit of 8
    mi_8b_bf16 = got[("mi300x", "llama3-8b", "bf16", "none", "none", SEQ, 8, *DEFAULT_OPTIONS)]
    assert (mi_8b_bf16["max_ok_batch"], mi_8b_bf16["oom_batch"]) == (4, 8)  # 16 timed out, 8 is the OOM


def test_compare_precision_ratios(dataset):
    out, rows = dataset
    want = expected_configs(rows)
    table = aggregate.compare(out, "bf16").to_pylist()
    assert {r["precision"] for r in table} == {"fp8-te", "fp8-torchao"}
    assert len(table) == 2 * 2 * 2 * 5
    for r in table:
        key = tuple(r.get(k) for k in KEYS)
        base = want[tuple("bf16" if k == "precision" else r.get(k) for k in KEYS)]
        mine = want[key]
        assert r["base_status"] == base["status"]
        if mine["tflops_per_gpu"] is not None and base["tflops_per_gpu"] is not None:
            assert r["ratio"] == pytest.approx(mine["tflops_per_gpu"] / base["tflops_per_gpu"])
        else:
            assert r["ratio"] is None


def test_compare_clusters_with_costs(dataset):
    out, rows = dataset
    want = expected_configs(rows)
    costs = {"h200": 3.5, "mi300x": None}
    table = aggregate.compare_table(aggregate.configs(out), "h200", "cluster", {"h200": 3.5, "mi300x": 2.1})
    r = next(r for r in table.to_pylist() if (r["model"], r["precision"], r["batch_size"]) == ("llama3-8b", "bf16", 2))
    mi, h = (want[(c, "llama3-8b", "bf16", "none", "none", 2, SEQ, 8, *DEFAULT_OPTIONS)] for c in ("mi300x", "h200"))
    assert r["cluster"] == "mi300x"
    assert r["ratio"] == pytest.approx(mi["tflops_per_gpu"] / h["tflops_per_gpu"])
    assert r["tok_s_per_usd_h"] == pytest.approx(mi["tokens_per_s_per_gpu"] / 2.1)
    assert r["cost_ratio"] == pytest.approx((mi["tokens_per_s_per_gpu"] / 2.1) / (h["tokens_per_s_per_gpu"] / 3.5))
    unknown = aggregate.compare_table(aggregate.configs(out), "h200", "cluster", costs).to_pylist()
    assert all(r["cost_ratio"] is None for r in unknown)


def test_cluster_costs_tolerate_missing_profiles(monkeypatch):
    def load_profile(name):
        if name == "h200":
            return types.SimpleNamespace(cost_per_gpu_hour=3.5)
        if name == "nocost":
            return types.SimpleNamespace()
        raise KeyError(name)

    monkeypatch.setitem(sys.modules, "clusters", types.SimpleNamespace(load_profile=load_profile))
    assert aggregate.cluster_costs(["h200", "nocost", "mi300x"]) == {"h200": 3.5, "nocost": None, "mi300x": None}


def test_where_filters(dataset):
    out, rows = dataset
    table = query.load(
        out, ["precision=bf16,fp8-te", "batch_size>=4", "status!=ok"], ["precision", "batch_size", "status"]
    )
    expect = [r for r in rows if r["precision"] in ("bf16", "fp8-te") and r["batch_size"] >= 4 and r["status"] != "ok"]
    assert table.num_rows == len(expect) > 0
    assert query.load(out, ["started_at<2025-06-02T09:03:30"], ["trial_id"]).column("trial_id").to_pylist() == [
        "t00001",
        "t00002",
        "t00003",
    ]


# --- exports: the same numbers as the rows ---------------------------------------------------------

HEADER_KEYS = {
    "cluster": "cluster",
    "model": "model",
    "precision": "precision",
    "compile": "compile",
    "ac": "ac",
    "batch": "batch_size",
    "seq": "seq_len",
    "GPUs": "world_size",
    "accum": "grad_accum",
    "clip": "grad_clip",
    "fp8 head": "fp8_lm_head",
    "reduce": "reduce_dtype",
    "grad sync": "grad_sync",
    "dyn batch": "dynamic_batch",
    "fp8 attn": "fp8_attention",
    "compile mode": "compile_mode",
    "pow2 scales": "fp8_pow2_scales",
    "replicas": "dp_replicate",
}
PARSE = {
    "batch_size": int,
    "seq_len": int,
    "world_size": int,
    "grad_accum": int,
    "grad_clip": float,
    "dp_replicate": int,
    "tp": int,
    "cp": int,
    "fp8_lm_head": lambda text: text == "True",
    "dynamic_batch": lambda text: text == "True",
    "fp8_attention": lambda text: text == "True",
    "fp8_pow2_scales": lambda text: text == "True",
}


def _parse_markdown(text: str) -> list[dict]:
    lines = [line for line in text.splitlines() if line.strip()]
    constant = {}
    if lines[0].startswith("_"):
        constant = dict(part.split(" ", 1) for part in lines[0].strip("_").split(" · "))
        lines = lines[1:]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert set(lines[1].replace("|", "").replace("-", "").replace(":", "")) <= {""}
    table = [line for line in lines[2:] if line.startswith("|")]
    assert lines[2 : 2 + len(table)] == table  # the table, then its provenance (tests/test_results_provenance.py)
    return [{**constant, **dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))} for line in table]


def _key(row: dict) -> tuple:
    by_key = {HEADER_KEYS.get(h, h): v for h, v in row.items()}
    # training options at their default are left out of tables and captions
    return tuple(PARSE.get(k, str)(by_key[k] if k in by_key else str(TRAINING_DEFAULTS[k])) for k in KEYS)


def test_export_markdown_carries_row_numbers(dataset):
    out, rows = dataset
    res = sweep_results("export", out, "--format", "md")
    assert res.exit_code == 0, res.output
    want = expected_configs(rows)
    parsed = _parse_markdown(res.stdout)
    assert len(parsed) == len(want)
    for row in parsed:
        e = want[_key(row)]
        assert row["n"] == str(e["n"])
        if e["status"] != "ok":
            assert row["status"] == row["TFLOP/s/GPU"] == e["status"]  # the status text, never a zero
            assert row["MFU"] == row["tok/s/GPU"] == "—"
            continue
        failed = [f"{e[f'n_{s}']} {s}" for s in aggregate.FAILURES if e[f"n_{s}"]]
        assert row["status"] == (f"ok ({', '.join(failed)})" if failed else "ok")
        assert _shows(row["TFLOP/s/GPU"], e["tflops_per_gpu"])
        assert _shows(row["MFU"], e["mfu"] * 100, " %")
        assert _shows(row["tok/s/GPU"], e["tokens_per_s_per_gpu"])
        assert _shows(row["step (s)"], e["step_time_s"])
        assert _shows(row["peak mem (GiB)"], e["peak_mem_gib"])
        assert row["spread"] == "—" if e["n_ok"] < 2 else _shows(row["spread"].removeprefix("±"), e["spread_pct"], " %")


def _shows(cell: str, value: float, suffix: str = "") -> bool:
    """``cell`` is ``value`` to 3 significant figures or more (no digit left of the point dropped)."""
    assert cell.endswith(suffix), cell
    text = cell.removesuffix(suffix).replace(",", "")
    figures = text.lstrip("+-").lstrip("0.").replace(".", "")
    return len(figures) >= 3 and float(text) == pytest.approx(value, rel=5e-3, abs=0)


def test_export_csv_carries_row_numbers(dataset, tmp_path):
    out, rows = dataset
    target = tmp_path / "sub" / "export.csv"
    res = sweep_results("export", out, "--format", "csv", "--out", target)
    assert res.exit_code == 0, res.output
    want = expected_configs(rows)
    parsed = list(csv.DictReader(io.StringIO(target.read_text())))
    assert len(parsed) == len(want)
    for row in parsed:
        e = want[_key(row)]
        assert (row["status"], int(row["n_attempts"]), int(row["n_ok"])) == (e["status"], e["n"], e["n_ok"])
        for m in aggregate.METRICS:
            assert (float(row[m]) if row[m] else None) == (pytest.approx(e[m], rel=1e-12) if e[m] is not None else None)


def test_export_md_and_csv_agree(dataset):
    out, _ = dataset
    md = {_key(r): r for r in _parse_markdown(sweep_results("export", out).stdout)}
    for row in csv.DictReader(io.StringIO(sweep_results("export", out, "-f", "csv").stdout)):
        cell = md[_key(row)]["TFLOP/s/GPU"]
        assert _shows(cell, float(row["tflops_per_gpu"])) if row["tflops_per_gpu"] else cell == row["status"]


# --- the other commands ----------------------------------------------------------------------------


def test_compare_by_a_training_option(tmp_path):
    """--by grad_sync: each config against its twin at the default (micro_batch), everything else equal."""
    base = {
        "run_id": "r",
        "attempt": 1,
        "cluster": "h200",
        "accelerator": "h200",
        "world_size": 2,
        "model": "llama3-8b",
        "precision": "fp8-te-delayed",
        "compile": "none",
        "ac": "none",
        "batch_size": 2,
        "seq_len": 4096,
        **TRAINING_DEFAULTS,
        "grad_accum": 8,
        "status": "ok",
    }
    rows = [
        ("t1", "fp32", "micro_batch", 782.9),
        ("t2", "fp32", "step", 728.7),
        ("t3", "bf16", "micro_batch", 792.2),
        ("t4", "bf16", "step", 871.9),
    ]
    for trial_id, reduce, sync, tflops in rows:
        write_row(
            tmp_path,
            {**base, "trial_id": trial_id, "reduce_dtype": reduce, "grad_sync": sync, "tflops_per_gpu": tflops},
        )
    table = {r["reduce_dtype"]: r for r in aggregate.compare(tmp_path, "micro_batch", "grad_sync").to_pylist()}
    assert table["fp32"]["ratio"] == pytest.approx(728.7 / 782.9)
    assert table["bf16"]["ratio"] == pytest.approx(871.9 / 792.2)
    res = sweep_results("compare", tmp_path, "--by", "grad_sync", "-f", "csv")  # the default baseline: micro_batch
    assert res.exit_code == 0, res.output
    import csv
    import io

    ratios = {r["reduce_dtype"]: float(r["ratio"]) for r in csv.DictReader(io.StringIO(res.stdout))}
    assert ratios == {"fp32": pytest.approx(728.7 / 782.9), "bf16": pytest.approx(871.9 / 792.2)}
    res = sweep_results("compare", tmp_path, "--by", "reduce_dtype")
    assert res.exit_code == 0 and "vs fp32" in res.stdout


def test_show_and_max_batch_and_compare_print(dataset):
    out, _ = dataset
    res = sweep_results("show", out, "--where", "status!=ok", "--limit", "500")
    assert res.exit_code == 0 and "unsupported" in res.stdout and "NCCL watchdog timeout" in res.stdout
    res = sweep_results("max-batch", out, "--format", "md", "--where", "cluster=h200")
    assert res.exit_code == 0 and "| llama3-8b | fp8-te | ok | 8 | 16 | 8 |" in res.stdout
    res = sweep_results("compare", out, "--baseline", "bf16", "--where", "model=llama3-8b")
    assert res.exit_code == 0 and "vs bf16" in res.stdout and "baseline oom" in res.stdout
    res = sweep_results("compare", out, "--by", "cluster", "--baseline", "h200", "-f", "csv")
    assert res.exit_code == 0 and res.stdout.startswith("model,precision,")


def test_plot_writes_png(dataset, tmp_path):
    out, _ = dataset
    png = tmp_path / "fig.png"
    res = sweep_results("plot", out, "--out", png)
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_query_count(dataset):
    out, rows = dataset
    res = sweep_results("query", out, "SELECT count(*) AS n FROM results", "--format", "csv")
    assert res.exit_code == 0 and res.stdout == f"n\n{len(rows)}\n"
    res = sweep_results("query", out, "SELECT precision, count(*) AS n FROM results GROUP BY ALL ORDER BY 1")
    assert res.exit_code == 0 and "fp8-torchao" in res.stdout


# --- bad input: exit 2, one line, no traceback -----------------------------------------------------


def _one_error_line(res) -> str:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


def _foreign(path: Path) -> None:
    (path / "cluster=x" / "run=y").mkdir(parents=True)
    pq.write_table(pa.table({"a": [1]}), path / "cluster=x" / "run=y" / "t.parquet")


def _garbage(path: Path) -> None:
    (path / "t.parquet").write_bytes(b"not parquet at all")


@pytest.mark.parametrize(
    "args, setup, message",
    [
        (["show", "{empty}"], None, "no sweep results found"),
        (["export", "{empty}"], _foreign, "not a sweep result file"),
        (["max-batch", "{empty}"], _garbage, "not a readable Parquet file"),
        (["show", "{data}", "--where", "precison=bf16"], None, "unknown column 'precison'; valid columns: run_id"),
        (["show", "{data}", "--where", "batch_size>=four"], None, "batch_size takes an integer"),
        (["export", "{data}", "--where", "precision=fp9"], None, "precision values: bf16, fp8-te, fp8-torchao"),
        (["query", "{data}", "SELEC 1"], None, "SQL: Parser Error"),
        (["query", "{data}", "SELECT nope FROM results"], None, "SQL: Binder Error"),
        (["compare", "{data}", "--baseline", "fp16"], None, "valid: bf16, fp8-te, fp8-torchao"),
        (["compare", "{data}", "--by", "cluster", "--baseline", "b200"], None, "valid: h200, mi300x"),
        (["compare", "{data}", "--by", "cluster"], None, "needs --baseline"),
    ],
)
def test_bad_input_is_one_line_exit_2(dataset, tmp_path, args, setup, message):
    if setup:
        setup(tmp_path)
    args = [a.format(empty=tmp_path, data=dataset[0]) for a in args]
    assert message in _one_error_line(sweep_results(*args))


@pytest.mark.parametrize(
    "statement",
    [
        "COPY results TO '{out}/out.csv'",
        "COPY (SELECT * FROM results) TO '{out}/cluster=x/run=y/t.parquet' (FORMAT parquet)",
        "EXPORT DATABASE '{out}/export'",
        "ATTACH '{out}/other.duckdb'",
    ],
)
def test_query_cannot_write_files(dataset, tmp_path, statement):
    out, _ = dataset
    line = _one_error_line(sweep_results("query", out, statement.format(out=tmp_path)))
    assert "SQL: Permission Error" in line and "reads the table `results` only" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT * FROM read_csv('/etc/passwd', sep = ':')",
        "SELECT * FROM read_text('/etc/hostname')",
        "SELECT * FROM glob('/etc/*')",
        "SELECT * FROM read_parquet('{first}')",  # a result file, but not through the dataset
        "SET lock_configuration = false",  # the sandbox cannot be undone from inside
        "SELECT count(*) FROM dataset",  # no Python variables by name (DuckDB's replacement scan)
    ],
)
def test_query_reads_the_dataset_only(dataset, statement):
    out, _ = dataset
    first = sorted(out.rglob("*.parquet"))[0]
    line = _one_error_line(sweep_results("query", out, statement.format(first=first)))
    assert line.startswith("error: SQL: ")
    assert "root:" not in line


def _damaged_pages(path: Path) -> None:
    """A result file whose footer reads but whose ``status`` pages are overwritten (a column every command reads:
    DuckDB reads only the columns a statement needs)."""
    dst = path / "cluster=h200" / "run=damaged" / "t.parquet"
    dst.parent.mkdir(parents=True)
    write_row(path, {**make_rows()[0], "run_id": "damaged", "trial_id": "t"})
    meta = pq.ParquetFile(dst).metadata
    chunk = meta.row_group(0).column(meta.schema.names.index("status"))
    data = bytearray(dst.read_bytes())
    data[chunk.data_page_offset : chunk.data_page_offset + chunk.total_compressed_size] = (
        b"\xab" * chunk.total_compressed_size
    )
    dst.write_bytes(bytes(data))


def _truncated(path: Path) -> None:
    src = next(path.rglob("*.parquet"))
    (path / "truncated.parquet").write_bytes(src.read_bytes()[:-100])


BAD_FILES = {
    "cluster=x/run=y/t.parquet": _foreign,
    "t.parquet": _garbage,
    "cluster=h200/run=damaged/t.parquet": _damaged_pages,
    "truncated.parquet": _truncated,
}
COMMANDS = [
    ["show", "--limit", "500"],
    ["max-batch", "-f", "csv"],
    ["compare", "-f", "csv"],
    ["export", "-f", "csv"],
    ["plot", "--out", "{tmp}/fig.png"],
    ["query", "SELECT count(*) AS n FROM results", "-f", "csv"],
]


@pytest.fixture(scope="module")
def tree_with_bad_files(dataset, tmp_path_factory) -> Path:
    """The synthetic dataset plus a foreign, a garbage, a damaged and a truncated .parquet file."""
    import shutil

    tree = tmp_path_factory.mktemp("bad") / "results"
    shutil.copytree(dataset[0], tree)
    for make in BAD_FILES.values():
        make(tree)
    return tree


@pytest.mark.parametrize("name, make", BAD_FILES.items(), ids=list(BAD_FILES))
def test_a_bad_file_is_named_in_one_line(dataset, tmp_path, name, make):
    import shutil

    tree = tmp_path / "results"
    shutil.copytree(dataset[0], tree)
    make(tree)
    line = _one_error_line(sweep_results("export", tree))
    assert line.startswith(f"error: {tree / name}: ") and line.endswith(
        f"(move it out of {tree}, or pass --skip-bad to `sweep results` to read the rest)"
    )


@pytest.mark.parametrize("args", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_skip_bad_reads_the_rest_and_names_what_it_skipped(dataset, tree_with_bad_files, tmp_path, args):
    args = [a.format(tmp=tmp_path) for a in args]
    without = sweep_results(args[0], tree_with_bad_files, *args[1:])
    assert "more such file(s)" in _one_error_line(without)
    clean = sweep_results(args[0], dataset[0], *args[1:])
    res = sweep_results(args[0], tree_with_bad_files, *args[1:], "--skip-bad")
    assert res.exit_code == 0, res.output
    warnings = res.stderr.splitlines()
    skipped = sorted(line.split(": ")[1].removeprefix("skipped ") for line in warnings if line.startswith("warning: "))
    assert skipped == sorted(str(tree_with_bad_files / name) for name in BAD_FILES), res.stderr
    if args[0] == "plot":
        assert res.stderr.splitlines()[-1] == f"wrote {tmp_path / 'fig.png'}" and clean.exit_code == 0
    else:
        assert _cells(res.stdout) == _cells(clean.stdout) != []


def _cells(text: str) -> list[list[str]]:
    """The cells of a Rich table or the lines of a CSV, without titles and rules (their width varies)."""
    return [
        [c.strip() for c in line.split("│")]
        for line in text.splitlines()
        if line.strip() and not set(line.strip()) & set("━─┏┗┡└") and "/" not in line.split("│")[0]
    ]


def test_skip_bad_with_nothing_readable_is_an_error(tmp_path):
    _garbage(tmp_path)
    res = sweep_results("show", tmp_path, "--skip-bad")
    assert res.exit_code == 2 and "Traceback" not in res.output
    warning, error = res.stderr.splitlines()
    assert warning.startswith(f"warning: skipped {tmp_path / 't.parquet'}: not a readable Parquet file (")
    assert error == f"error: {tmp_path}: no readable sweep results (1 file(s) skipped)"


def test_small_numbers_keep_their_significant_figures(tmp_path):
    """CPU-rank TFLOP/s (0.0105 vs 0.0144) must not both print 0.01, nor a 0.00664 baseline 0.01."""
    (row,) = [r for r in make_rows() if r["status"] == "ok"][:1]
    for trial_id, precision, tflops in (("a", "bf16", 0.00664), ("b", "fp8-te", 0.0105), ("c", "fp8-torchao", 0.0144)):
        write_row(
            tmp_path,
            {
                **row,
                "trial_id": trial_id,
                "precision": precision,
                "tflops_per_gpu": tflops,
                "mfu": tflops / 989.0,
                "peak_mem_gib": 0.0913,
                "step_time_s": 1.2345,
            },
        )
    res = sweep_results("export", tmp_path)
    assert res.exit_code == 0, res.output
    cells = {r["precision"]: r for r in _parse_markdown(res.stdout)}
    assert [cells[p]["TFLOP/s/GPU"] for p in ("bf16", "fp8-te", "fp8-torchao")] == ["0.006640", "0.01050", "0.01440"]
    assert (cells["fp8-te"]["MFU"], cells["fp8-te"]["peak mem (GiB)"], cells["fp8-te"]["step (s)"]) == (
        "0.001062 %",
        "0.09130",
        "1.234",
    )
    res = sweep_results("compare", tmp_path, "-f", "md")
    assert res.exit_code == 0, res.output
    cells = {r["precision"]: r for r in _parse_markdown(res.stdout)}
    assert cells["fp8-te"]["bf16 TFLOP/s/GPU"] == "0.006640"
    assert cells["fp8-te"]["vs bf16"] == "1.58× (+58.1 %)" and cells["fp8-torchao"]["vs bf16"] == "2.17× (+117 %)"


def test_results_command_imports_nothing_heavy():
    import subprocess

    code = (
        "import sys, sweep.commands.results; "
        "print(sorted(m for m in ('duckdb', 'matplotlib', 'pyarrow') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_memory_cap_is_its_own_config(tmp_path):
    """Rows under `--memory-cap 80GiB` answer another question than rows on the whole card."""
    (row,) = [r for r in make_rows() if r["status"] == "ok"][:1]
    write_row(tmp_path, {**row, "trial_id": "uncapped"})
    write_row(tmp_path, {**row, "trial_id": "capped", "memory_cap_gib": 80.0, "tflops_per_gpu": 1.0})
    got = aggregate.configs(tmp_path).to_pylist()
    assert sorted((r["memory_cap_gib"] is None, r["tflops_per_gpu"]) for r in got) == [
        (False, 1.0),
        (True, row["tflops_per_gpu"]),
    ]


def test_perf_per_dollar_uses_the_cost_stored_in_the_rows(tmp_path):
    """`compare --by cluster` on profiles given by path (in no registry): the rows carry their cost."""
    (row,) = [r for r in make_rows() if r["status"] == "ok"][:1]
    for trial_id, cluster, cost, tokens in (
        ("a", "my-a", 2.0, 100.0),
        ("b", "my-b", 4.0, 300.0),
        ("c", "old", None, 50.0),
    ):
        write_row(
            tmp_path,
            {
                **row,
                "trial_id": trial_id,
                "cluster": cluster,
                "cost_per_gpu_hour": cost,
                "tokens_per_s_per_gpu": tokens,
            },
        )
    res = sweep_results("compare", tmp_path, "--by", "cluster", "--baseline", "my-a", "-f", "csv")
    assert res.exit_code == 0, res.output
    got = {r["cluster"]: r for r in csv.DictReader(io.StringIO(res.stdout))}
    assert (got["my-b"]["cost_per_gpu_hour"], got["my-b"]["base_cost_per_gpu_hour"]) == ("4.0", "2.0")
    assert float(got["my-b"]["cost_ratio"]) == pytest.approx((300.0 / 4.0) / (100.0 / 2.0))
    assert got["old"]["cost_ratio"] == ""  # rows written before sweep stored costs: unknown, not zero
    res = sweep_results("compare", tmp_path, "--by", "cluster", "--baseline", "my-a", "-f", "md")
    assert res.exit_code == 0, res.output
    assert "perf/$ vs my-a" in res.stdout and "1.50× (+50.0 %)" in res.stdout
    assert "no cost per GPU-hour for: old" in res.stdout


def test_compare_by_dynamic_batch_against_static_shapes(tmp_path):
    """--by dynamic_batch: each symbolic-batch config against its static-shape twin (the default baseline, false),
    or the other way with --baseline true; a baseline that is not true or false is one line and exit 2."""
    base = {
        "run_id": "r",
        "attempt": 1,
        "cluster": "h100x1",
        "accelerator": "h100",
        "world_size": 1,
        "model": "held-out-2.1b",
        "precision": "fp8-torchao-tensorwise",
        "compile": "regional",
        "ac": "none",
        "seq_len": 4096,
        **TRAINING_DEFAULTS,
        "status": "ok",
    }
    trials = [("s2", 2, False, 600.0), ("d2", 2, True, 594.0), ("s4", 4, False, 690.0), ("d4", 4, True, 697.0)]
    for trial_id, batch, dynamic, tflops in trials:
        row = {"trial_id": trial_id, "batch_size": batch, "dynamic_batch": dynamic, "tflops_per_gpu": tflops}
        write_row(tmp_path, {**base, **row})
    res = sweep_results("compare", tmp_path, "--by", "dynamic_batch", "-f", "csv")
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert {r["batch_size"]: float(r["ratio"]) for r in rows} == {
        "2": pytest.approx(594.0 / 600.0),
        "4": pytest.approx(697.0 / 690.0),
    }
    res = sweep_results("compare", tmp_path, "--by", "dynamic_batch", "--baseline", "true", "-f", "csv")
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert {r["batch_size"]: float(r["ratio"]) for r in rows} == {
        "2": pytest.approx(600.0 / 594.0),
        "4": pytest.approx(690.0 / 697.0),
    }
    res = sweep_results("compare", tmp_path, "--by", "dynamic_batch")
    assert res.exit_code == 0 and "vs dynamic_batch=false" in res.stdout and "False" not in res.stdout, res.stdout
    static = tmp_path / "static"  # the static side alone: nothing to compare, said as --baseline says it
    write_row(static, {**base, "trial_id": "s2", "batch_size": 2, "dynamic_batch": False, "tflops_per_gpu": 600.0})
    alone = sweep_results("compare", static, "--by", "dynamic_batch")
    assert alone.exit_code == 2 and f"every config in {static} has dynamic_batch false" in alone.output, alone.output
    bad = sweep_results("compare", tmp_path, "--by", "dynamic_batch", "--baseline", "static")
    assert bad.exit_code == 2 and "--baseline 'static': --by dynamic_batch is true or false" in bad.output
    assert "Traceback" not in bad.output


def test_compare_s_baseline_help_names_every_default_baseline():
    """`--baseline`'s help lists each --by key's default (COMPARE_BY) as --baseline takes it. It is written out in the
    command (the CLI does not import pyarrow to build it), so a key added to COMPARE_BY must be named there too."""
    res = sweep_results("compare", "--help")
    assert res.exit_code == 0, res.output
    help_text = " ".join(res.stdout.replace("│", " ").split())
    defaults = {k: v for k, v in aggregate.COMPARE_BY.items() if v is not None}  # cluster has none
    named = [f"{k} {str(v).lower() if isinstance(v, bool) else v}" for k, v in defaults.items() if k != "precision"]
    assert f"Default: {defaults['precision']}" in help_text, help_text  # the precision's named bare
    assert [n for n in named if n not in help_text] == [], help_text
