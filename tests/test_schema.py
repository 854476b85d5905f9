"""The result schema is code: a round trip through Parquet keeps every column, type and the version."""

from __future__ import annotations

import typing
from datetime import datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import result_row

from sweep.errors import UserError
from sweep.record import store
from sweep.record.schema import COLUMNS, RESULT_SCHEMA, SCHEMA_VERSION, TRAINING_DEFAULTS, VERSION_KEY, Row, to_table

# Two CPU ranks, FSDP over both: the columns a test here reads back, on `result_row`'s ok trial.
_TWO_RANKS = {"world_size": 2, "dp_shard": 2, "tflops_per_gpu": 1.5, "node_ids": ["a", "b"], "params_local": [10, 10]}


def _row(**changes) -> dict:
    return result_row(**{**_TWO_RANKS, **changes})


def _python_type(typ: pa.DataType) -> object:
    """What a value of an Arrow type reads as in Python (`to_pylist`)."""
    if pa.types.is_list(typ):
        return list[_python_type(typ.value_type)]
    for test, python in (
        (pa.types.is_string, str),
        (pa.types.is_boolean, bool),
        (pa.types.is_integer, int),
        (pa.types.is_floating, float),
        (pa.types.is_timestamp, datetime),
    ):
        if test(typ):
            return python
    raise AssertionError(f"no Python type for {typ}")


def test_row_typeddict_is_the_schema_column_for_column():
    """`Row` cannot drift from RESULT_SCHEMA: the same keys in the same order, each typed as its column reads
    (None included: every column is nullable)."""
    hints = typing.get_type_hints(Row)
    assert list(hints) == list(COLUMNS)
    assert all(field.nullable for field in RESULT_SCHEMA)
    assert {name: hints[name] for name in COLUMNS} == {f.name: _python_type(f.type) | None for f in RESULT_SCHEMA}
    assert Row.__total__ is False  # a row may leave a column out: it is written null


@pytest.mark.parametrize(
    "row",
    [
        _row(),
        _row(trial_id="t2", status="oom", error="CUDA out of memory", step_time_s=None),
        _row(trial_id="t3", status="unsupported", error="needs TE", node_ids=None),
        _row(trial_id="t4", grad_accum=8, grad_clip=0.0, fp8_lm_head=True, reduce_dtype="bf16", grad_sync="step"),
        _row(
            trial_id="t9",
            attention="cudnn",
            fp8_attention=True,
            compile_mode="max-autotune-no-cudagraphs",
            fp8_pow2_scales=True,
        ),
        _row(
            trial_id="t5",
            profile_gemm_pct=50.0,
            profile_attention_pct=10.0,
            profile_comm_exposed_pct=5.0,
            profile_optimizer_pct=5.0,
            profile_other_pct=30.0,
            trace_file="cluster=local/run=r1/_traces/t5.pt.trace.json.gz",
        ),
        _row(
            trial_id="t6",
            init_time_s=9.5,
            trial_wall_s=14.0,
            process_start_s=2.5,
            import_s=3.0,
            process_setup_s=1.5,
            model_build_s=4.0,
        ),
        _row(trial_id="t7", group_trial_index=1, actor_reused=True, model_build_s=1.25),
        _row(
            trial_id="t8",
            step_time_ci_pct=12.5,
            ci_target_met=False,
            loss_curve=[6.25, 6.0, 5.5],
            loss_curve_tokens=[0, 512, 1024],
        ),
    ],
)
def test_round_trip(tmp_path, row):
    path = store.write_row(tmp_path, row)
    assert pq.read_schema(path).metadata[VERSION_KEY] == SCHEMA_VERSION.encode()
    (back,) = store.read_table(tmp_path).to_pylist()
    assert back == {c: row.get(c) for c in COLUMNS}


def test_a_1_8_file_reads_back_with_the_1_9_columns_null(tmp_path):
    added = ["ci_target_met", "loss_curve", "loss_curve_tokens"]
    old = to_table([_row(step_time_ci_pct=12.5)]).drop_columns(added).replace_schema_metadata({VERSION_KEY: b"1.8"})
    pq.write_table(old, tmp_path / "old.parquet")
    store.write_row(tmp_path, _row(trial_id="t2", ci_target_met=True, loss_curve=[6.0], loss_curve_tokens=[0]))
    rows = {r["trial_id"]: r for r in store.read_table(tmp_path).to_pylist()}
    assert [rows["t1"][c] for c in added] == [None, None, None] and rows["t1"]["step_time_ci_pct"] == 12.5
    assert [rows["t2"][c] for c in added] == [True, [6.0], [0]]
    assert tuple(map(int, SCHEMA_VERSION.split("."))) >= (1, 9)


def test_a_1_11_file_reads_back_as_fsdp_over_every_rank(tmp_path):
    """Rows before the layout columns (1.12) sharded over all their ranks: tp, cp, dp_replicate 1, dp_shard the
    world size; so `compare --by tp` and `--where tp=1` take them as the FSDP-only layout they were."""
    added = ["dp_replicate", "tp", "cp", "dp_shard"]
    old = to_table([_row(world_size=4)]).drop_columns(added).replace_schema_metadata({VERSION_KEY: b"1.11"})
    pq.write_table(old, tmp_path / "old.parquet")
    store.write_row(tmp_path, _row(trial_id="t2", world_size=4, tp=2, dp_shard=2))
    rows = {r["trial_id"]: r for r in store.read_table(tmp_path).to_pylist()}
    assert [rows["t1"][c] for c in added] == [1, 1, 1, 4]
    assert [rows["t2"][c] for c in added] == [1, 2, 1, 2]


def test_contract_columns_exist():
    needed = """run_id trial_id attempt parent_trial_id cluster accelerator world_size model precision compile
    batch_size seq_len status error step_time_s step_time_p10_s step_time_p90_s tokens_per_s_per_gpu tflops_per_gpu mfu
    peak_tflops flops_per_token peak_mem_gib loss_first loss_last torch_version ray_version hostname git_sha started_at
    finished_at alloc_retries reserved_mem_gib te_version torchao_version gpu_name driver_version cuda_version
    compile_time_s init_time_s node_ids hosts""".split()
    assert not set(needed) - set(RESULT_SCHEMA.names)


def test_unknown_column_or_status_is_a_bug():
    with pytest.raises(KeyError):
        to_table([{**_row(), "tflops": 1.0}])  # past result_row, which refuses the typo itself
    with pytest.raises(ValueError):
        to_table([_row(status="great")])


def test_a_trial_is_written_once(tmp_path):
    store.write_row(tmp_path, _row())
    with pytest.raises(FileExistsError):
        store.write_row(tmp_path, _row())
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".")]  # no temp files left


def test_foreign_and_newer_files_are_refused(tmp_path):
    import pyarrow as pa

    pq.write_table(pa.table({"x": [1]}), tmp_path / "foreign.parquet")
    with pytest.raises(UserError, match="not a sweep result"):
        store.read_table(tmp_path)
    (tmp_path / "foreign.parquet").unlink()
    table = to_table([_row()]).replace_schema_metadata({VERSION_KEY: b"99.0"})
    pq.write_table(table, tmp_path / "future.parquet")
    with pytest.raises(UserError, match="99.0"):
        store.read_table(tmp_path)
    (tmp_path / "future.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(UserError, match="not a readable Parquet"):
        store.read_table(tmp_path)


def test_older_minor_version_reads_with_new_columns_null(tmp_path):
    newer = [
        "reserved_mem_gib",
        "profile_gemm_pct",
        "trace_file",  # columns of 1.0's successors (1.7: profiles)
        "process_start_s",
        "model_build_s",  # 1.8: start-up phases
        "ci_target_met",
        "loss_curve",
        "loss_curve_tokens",
    ]  # 1.9
    old = to_table([_row()]).drop_columns(newer).replace_schema_metadata({VERSION_KEY: b"1.0"})
    pq.write_table(old, tmp_path / "old.parquet")
    (back,) = store.read_table(tmp_path).to_pylist()
    assert [back[c] for c in newer] == [None] * len(newer) and back["tflops_per_gpu"] == 1.5


def test_options_a_row_predates_read_as_their_defaults(tmp_path):
    """A 1.2 row has no training-option columns: it ran with the defaults, so it reads (and filters) as such."""
    from sweep.results.query import load

    options = list(TRAINING_DEFAULTS)
    old = to_table([_row()]).drop_columns(options).replace_schema_metadata({VERSION_KEY: b"1.2"})
    pq.write_table(old, tmp_path / "old.parquet")
    store.write_row(tmp_path, _row(trial_id="t9", grad_accum=4, reduce_dtype="bf16"))
    rows = {r["trial_id"]: r for r in store.read_table(tmp_path).to_pylist()}
    assert {k: rows["t1"][k] for k in options} == TRAINING_DEFAULTS
    assert (rows["t9"]["grad_accum"], rows["t9"]["reduce_dtype"]) == (4, "bf16")
    assert load(tmp_path, ["grad_accum=1", "grad_sync=micro_batch"]).column("trial_id").to_pylist() == ["t1"]
