"""Merging result files (sweep.record.compact): the same rows in fewer files, never a row lost or read twice,
whatever point a merge was stopped at; `sweep results compact` through the CLI. (That `sweep run` merges its
attempts when it ends: tests/test_integration.py; every results command printing the same after merging:
tests/test_results_golden.py.)"""

from __future__ import annotations

import fcntl
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import invoke
from results_golden_rows import make_rows, old_rows

from sweep.record import compact, journal, store
from sweep.record.schema import VERSION_KEY, to_table


def _rows(out: Path) -> list[dict]:
    return sorted(store.read_table(out).to_pylist(), key=lambda r: r["trial_id"])


def _folder(tmp_path: Path) -> Path:
    """Two clusters: h200 with one run written one file per attempt (as `sweep run` writes) and five runs of one
    file each, b200 with three runs, plus an old (schema 1.2) file."""
    out = tmp_path / "results"
    rows = [r for r in make_rows() if r["cluster"] in ("h200", "b200")]
    by_run: dict[str, list[dict]] = {}
    for r in rows:
        by_run.setdefault(r["run_id"], []).append(r)
    runs = sorted(by_run)
    for r in by_run[runs[0]][:40]:
        store.write_row(out, r)
    for n, run in enumerate(runs[1:]):
        for k, part in enumerate((by_run[run][:30], by_run[run][30:60]) if n < 5 else (by_run[run][:30],)):
            path = out / f"cluster={part[0]['cluster']}" / f"run={run}-{k}" / "part-0.parquet"
            path.parent.mkdir(parents=True)
            pq.write_table(to_table([{**r, "run_id": f"{run}-{k}"} for r in part]), path)
    old = out / "cluster=h200" / "run=h200-old" / "old.parquet"
    old.parent.mkdir(parents=True)
    pq.write_table(old_rows(), old)
    return out


def _runs_files(folder: Path) -> list[Path]:
    """A cluster's level-0 files: the one file of each run folder that holds one."""
    runs = [store.result_files(run) for run in sorted(folder.glob("run=*"))]
    return [files[0] for files in runs if len(files) == 1]


@pytest.fixture
def fan_in_2(monkeypatch):
    monkeypatch.setattr(compact, "FAN_IN", 2)


def test_merging_keeps_every_row_in_fewer_files(tmp_path, fan_in_2):
    out = _folder(tmp_path)
    before, files = _rows(out), store.result_files(out)
    done = compact.compact(out)
    after = store.result_files(out)
    assert _rows(out) == before  # every column of every row, the old file's read at its defaults as before
    assert len(after) < len(files) and done.merged == len(files) - len(after) + len(done.written)
    # the attempts' run merged (L0), runs two at a time (L1), L1s two at a time (L2)
    assert {0, 1, 2} <= {compact.level(f) for f in done.written}, done.written
    assert {1, 2} <= {compact.level(f) for f in after}
    for f in after:
        assert pq.read_schema(f).metadata[VERSION_KEY] == store.SCHEMA_VERSION.encode()
    again = compact.compact(out)  # a second pass finds nothing more to merge, and keeps the rows
    assert (again.merged, _rows(out)) == (0, before)
    assert not list(out.rglob(journal.JOURNAL))  # the first pass's entries dropped


def _interrupted_merge(out: Path, renamed: bool) -> tuple[Path, list[Path]]:
    """The state a merge of h200's runs leaves when stopped after the journal was written: merged file renamed
    into place with the inputs not yet deleted (``renamed``), or still a temp file."""
    folder = out / "cluster=h200"
    inputs = _runs_files(folder)[:2]
    done = compact.Compaction()
    real_unlink = Path.unlink

    class Stop(Exception):
        pass

    def stop(self, missing_ok=False):
        if self in inputs:
            raise Stop
        return real_unlink(self, missing_ok=missing_ok)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Path, "unlink", stop)
        if not renamed:  # the journal is written (renamed into place too), the merged file is not renamed
            real_replace = store.os.replace

            def replace(src, dst):
                if str(dst).endswith(".parquet"):
                    raise Stop
                real_replace(src, dst)

            mp.setattr(store.os, "replace", replace)
        with pytest.raises(Stop):
            compact._merge(folder, inputs, folder, 1, done)
    merged = folder / json.loads((folder / journal.JOURNAL).read_text())["merges"][-1]["output"]
    return merged, inputs


@pytest.mark.parametrize("renamed", [True, False], ids=["after-rename", "before-rename"])
def test_a_merge_stopped_midway_reads_each_row_once(tmp_path, renamed):
    out = _folder(tmp_path)
    before = _rows(out)
    merged, inputs = _interrupted_merge(out, renamed)
    (merged.parent / f".{merged.name}.4242.tmp").write_bytes(b"a temp file a killed merge left")
    assert merged.exists() == renamed and all(p.exists() for p in inputs)
    files = store.result_files(out)
    assert (merged in files) == renamed and all((p in files) != renamed for p in inputs)
    assert _rows(out) == before  # never both the merged file and its inputs
    compact.compact(out)  # the next compaction finishes (or forgets) it
    assert all(not p.exists() for p in inputs) == renamed
    assert _rows(out) == before and not list(out.rglob(".merged-*.tmp"))


def test_a_cluster_being_compacted_elsewhere_is_skipped(tmp_path, fan_in_2):
    out = _folder(tmp_path)
    folder = out / "cluster=h200"
    files = store.result_files(folder)
    with open(folder / compact._LOCK, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process's compaction (flock locks are per open file)
        assert compact.compact(out, [folder]).merged == 0
        assert store.result_files(folder) == files
    assert compact.compact(out, [folder]).merged > 0


def test_a_short_read_keeps_the_inputs(tmp_path, monkeypatch):
    out = _folder(tmp_path)
    folder = out / "cluster=h200"
    inputs = _runs_files(folder)[:2]
    monkeypatch.setattr(pq, "read_metadata", lambda p: type("M", (), {"num_rows": 10**9})())
    with pytest.raises(RuntimeError, match="read .* of 2000000000 rows"):
        compact._merge(folder, inputs, folder, 1, compact.Compaction())
    assert all(p.exists() for p in inputs) and not list(folder.glob("merged-*")) and not list(folder.glob(".*tmp"))


def test_compact_through_the_cli(tmp_path, fan_in_2):
    out = _folder(tmp_path)
    before, n = _rows(out), len(store.result_files(out))
    result = invoke("results", "compact", out)
    assert result.exit_code == 0, result.output
    now = len(store.result_files(out))
    assert f"result file(s) now (were {n})" in result.stdout and f"{now} result file(s) now" in result.stdout
    assert now < n and _rows(out) == before
    empty = invoke("results", "compact", tmp_path / "nothing")
    assert empty.exit_code == 2 and "no sweep results found" in empty.output and "Traceback" not in empty.output


def test_merged_files_are_ordinary_result_files(tmp_path):
    """What every reader relies on: a merged file is a sweep result file of the current schema with its inputs'
    rows sorted by config (compact.SORTED_BY: a statement after a few configs skips the other row groups), in
    row groups of ROW_GROUP rows, and an emptied run folder stays (a run still writing may have just made it)."""
    out = _folder(tmp_path)
    folder = out / "cluster=b200"
    inputs = _runs_files(folder)[:3]
    rows = pa.concat_tables([store._read([f]) for f in inputs]).to_pylist()
    done = compact.Compaction()
    compact._merge(folder, inputs, folder, 1, done)
    (merged,) = done.written
    assert compact.level(merged) == 1 and merged.parent == folder and merged in store.result_files(out)
    back = pq.read_table(merged).to_pylist()
    order = lambda r: tuple(r[k] for k in compact.SORTED_BY)  # noqa: E731
    assert back == sorted(rows, key=order)  # (a stable sort: ties keep the inputs' order)
    assert pq.read_schema(merged).metadata[VERSION_KEY] == store.SCHEMA_VERSION.encode()
    assert all(not f.exists() and f.parent.is_dir() for f in inputs)


def test_a_big_merge_streams_its_inputs_in_row_groups(tmp_path, monkeypatch):
    out = _folder(tmp_path)
    folder = out / "cluster=h200"
    inputs = _runs_files(folder)[:3]
    rows = pa.concat_tables([store._read([f]) for f in inputs]).column("trial_id").to_pylist()
    monkeypatch.setattr(compact, "SORT_ROWS", 10)  # too many to sort: streamed in the inputs' order
    monkeypatch.setattr(compact, "ROW_GROUP", 16)
    done = compact.Compaction()
    compact._merge(folder, inputs, folder, 1, done)
    meta = pq.read_metadata(done.written[0])
    assert pq.read_table(done.written[0]).column("trial_id").to_pylist() == rows
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert max(sizes) <= 16 and sum(sizes) == len(rows) and len(sizes) > 2, sizes


def test_a_folder_of_many_unmerged_files_notes_that_compact_merges_them(tmp_path, fan_in_2, monkeypatch):
    """Over scan.UNMERGED_NOTE attempt files (here 10; the folder has 40 of one killed run and 10 of others) a
    command prints its output and one note naming `sweep results compact`; after it, no note."""
    from sweep.results import scan

    monkeypatch.setattr(scan, "UNMERGED_NOTE", 10)
    monkeypatch.setattr(scan, "_noted", set())
    out = _folder(tmp_path)
    shown = invoke("results", "compare", out, "--baseline", "bf16")  # a command that selects twice notes once
    assert shown.exit_code == 0, shown.output
    unmerged = sum(compact.level(f) is None for f in store.result_files(out))
    assert [line for line in shown.stderr.splitlines() if line.startswith("note:")] == [
        (
            f"note: {unmerged:,} result files in {out} are not merged (each slows every command); "
            f"`sweep results compact {out}` merges them, keeping every row"
        )
    ]
    assert invoke("results", "compact", out).exit_code == 0
    monkeypatch.setattr(scan, "_noted", set())  # a new process
    again = invoke("results", "compare", out, "--baseline", "bf16")
    assert again.exit_code == 0 and "note:" not in again.stderr and again.stdout == shown.stdout
