"""`sweep results` at a year's scale (issue 31): a command reads only the files its `--where cluster=` / `run_id=`
filters leave (their `cluster=` / `run=` folders), and only the columns it prints: a million rows never pass
through Python. The output itself is the golden test's (tests/test_results_golden.py)."""

from __future__ import annotations

import shutil

import pytest
from conftest import invoke
from results_golden_rows import write_folder


def _invoke(*args):
    return invoke("results", *args)


def _damage_pages(path) -> None:
    """Overwrite every data page of a result file: its footer still reads, its rows do not."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata.row_group(0)
    data = bytearray(path.read_bytes())
    for i in range(meta.num_columns):
        chunk = meta.column(i)
        start = chunk.dictionary_page_offset or chunk.data_page_offset
        data[start : start + chunk.total_compressed_size] = b"\xab" * chunk.total_compressed_size
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp("scale") / "results")


@pytest.mark.parametrize("column, value", [("cluster", "h200"), ("run_id", "h200-run1")])
def test_a_cluster_or_run_filter_reads_no_other_folder(folder, tmp_path, column, value):
    """A damaged file of another cluster is not read at all under `--where cluster=h200` (nor under a run's
    filter); without the filter it is named."""
    tree = tmp_path / "results"
    shutil.copytree(folder, tree)
    _damage_pages(tree / "cluster=b200" / "run=b200-run1" / "part-0.parquet")
    res = _invoke("export", tree, "--where", f"{column}={value}")
    assert res.exit_code == 0, res.output
    assert "| h200 |" in res.stdout or "cluster h200" in res.stdout
    res = _invoke("export", tree)
    assert res.exit_code == 2 and "cluster=b200/run=b200-run1/part-0.parquet: not a readable Parquet file" in res.stderr


def test_show_reads_the_curves_of_the_printed_rows_only(folder, tmp_path):
    """The loss curves, the largest columns, are read for the rows `show` prints: a file whose curves are damaged
    but whose rows are not printed does not stop it, and `loss @ tokens` still reads every selected row's reach."""
    import pyarrow.parquet as pq

    tree = tmp_path / "results"
    shutil.copytree(folder, tree)
    path = tree / "cluster=mi300x" / "run=mi300x-run3" / "part-0.parquet"
    table = pq.read_table(path)
    pq.write_table(table, path, row_group_size=len(table))
    meta = pq.ParquetFile(path).metadata.row_group(0)
    names = [meta.column(i).path_in_schema for i in range(meta.num_columns)]
    chunk = meta.column(names.index("loss_curve.list.element"))
    data = bytearray(path.read_bytes())
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data[start : start + chunk.total_compressed_size] = b"\xab" * chunk.total_compressed_size
    path.write_bytes(bytes(data))
    res = _invoke("show", tree, "--limit", "5")  # the first rows by config are b200's
    assert res.exit_code == 0, res.output
    assert "5 of 960 rows" in res.stdout


def test_a_file_without_its_arrow_schema_reads_by_its_parquet_columns(folder, tmp_path):
    """The columns of a file come from the Arrow schema pyarrow keeps in its footer; a file another writer wrote
    (DuckDB here: no Arrow schema) is read by its Parquet schema: a column it lacks reads as null, as it does in a
    file with an Arrow schema."""
    import duckdb
    import pyarrow.parquet as pq

    from sweep.record.schema import VERSION_KEY

    outputs = []
    for writer in ("pyarrow", "duckdb"):
        tree = tmp_path / writer
        shutil.copytree(folder, tree)
        path = tree / "cluster=h200" / "run=h200-run1" / "part-0.parquet"
        version = pq.read_metadata(path).metadata[VERSION_KEY].decode()
        rows = pq.read_table(path).drop_columns(["tflops_per_gpu"])  # an older writer's file, without the column
        if writer == "pyarrow":
            pq.write_table(rows, path)
        else:
            path.unlink()
            duckdb.sql(
                f"COPY (SELECT * FROM rows) TO '{path}' (FORMAT parquet, KV_METADATA {{'{VERSION_KEY.decode()}': "
                f"'{version}'}})"
            )
        assert (b"ARROW:schema" in pq.read_metadata(path).metadata) is (writer == "pyarrow")
        res = _invoke("export", tree, "-f", "csv")
        assert res.exit_code == 0, res.output
        outputs.append(res.stdout)
    assert outputs[0] == outputs[1]
    assert outputs[0] != _invoke("export", folder, "-f", "csv").stdout  # the h200 run's speeds are gone


@pytest.mark.parametrize(
    "caps, folded",
    [((80.0, 80.0, 80.0), "memory_cap_gib 80"), ((80.0, None, 80.0), None), ((80.0, 120.0, 80.0), None)],
    ids=["one-cap", "some-uncapped", "two-caps"],
)
def test_show_folds_a_key_into_the_caption_only_when_every_selected_row_has_it(tmp_path_factory, caps, folded):
    """`show --limit 1` prints one row, and its caption speaks of every selected row: a memory cap that one unprinted
    row lacks, or sets otherwise, stays a column, as it did when the caption read the distinct configs."""
    from conftest import result_row, rows_folder

    rows = [result_row(trial_id=f"t{i}", batch_size=2**i, memory_cap_gib=cap) for i, cap in enumerate(caps)]
    res = _invoke("show", rows_folder(tmp_path_factory, "caps", rows), "--limit", "1")
    assert res.exit_code == 0, res.output
    assert ("cap (GiB)" not in res.stdout) is (folded is not None), res.stdout
    if folded:
        assert folded in res.stdout
