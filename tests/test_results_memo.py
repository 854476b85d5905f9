"""The answers `sweep results` keeps under a results folder (sweep/results/memo.py): a command run again prints what
it printed, byte for byte; a file added, changed or taken away is read again; a torn entry, a folder that cannot
be written and two processes writing at once change nothing that a user sees."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import invoke
from results_golden_rows import write_folder
from test_results_golden import CASES, GOLDEN, PLOTS, _figure_data

from sweep.results import memo

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def keep_all(monkeypatch):
    """Every statement kept, however quick (the golden folder's take milliseconds)."""
    monkeypatch.setattr(memo, "SLOW_S", 0.0)


@pytest.fixture(scope="module")
def golden_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("memo-golden")
    write_folder(root / "results")
    return root


def _entries(folder: Path) -> list[Path]:
    return sorted((folder / memo.FOLDER).glob("*.arrow"))


def _run(*args) -> str:
    res = invoke("results", *args)
    assert res.exit_code == 0, res.output
    return res.stdout


@pytest.mark.parametrize("name", [n for n in CASES if not n.endswith("-empty")])
def test_a_kept_answer_prints_the_golden_output(golden_folder, name, keep_all, monkeypatch):
    monkeypatch.chdir(golden_folder)
    golden = (GOLDEN / f"{name}.txt").read_text()
    for _ in range(2):  # the first run keeps its answers, the second prints from them
        res = invoke("results", *CASES[name])
        assert f"exit {res.exit_code}\n--- stdout\n{res.stdout}--- stderr\n{res.stderr}" == golden
    assert _entries(golden_folder / "results")


@pytest.mark.parametrize("name", PLOTS)
def test_a_kept_answer_plots_the_golden_figure(golden_folder, name, keep_all, monkeypatch):
    import json

    from sweep.results import plot

    monkeypatch.chdir(golden_folder)
    drawn = []
    figure = plot.figure
    monkeypatch.setattr(plot, "figure", lambda *a, **k: drawn.append(figure(*a, **k)) or drawn[-1])
    for _ in range(2):
        res = invoke("results", "plot", "results", "--out", "fig.png", *PLOTS[name])
        text = f"exit {res.exit_code}\n--- stdout\n{res.stdout}--- stderr\n{res.stderr}"
        text += json.dumps(_figure_data(drawn[-1]), indent=1, ensure_ascii=False) + "\n"
        assert text == (GOLDEN / f"{name}.txt").read_text()


def test_a_kept_answer_is_read_back_not_recomputed(golden_folder, keep_all, monkeypatch):
    monkeypatch.chdir(golden_folder)
    _run("export", "results", "-f", "csv")
    ran = []
    real = memo.put
    monkeypatch.setattr(memo, "put", lambda *a: ran.append(a) or real(*a))
    _run("export", "results", "-f", "csv")
    assert ran == [], "the second run recomputed (and kept again) what the first kept"


def _folder(tmp_path: Path) -> Path:
    out = tmp_path / "results"
    write_folder(out)
    return out


def test_a_file_added_is_read(tmp_path, keep_all):
    out = _folder(tmp_path)
    before = _run("export", str(out), "-f", "csv")
    first = next(out.glob("cluster=h200/run=*/part-0.parquet"))
    extra = out / "cluster=h200" / "run=h200-copy" / "part-0.parquet"
    extra.parent.mkdir()
    extra.write_bytes(first.read_bytes())  # the same attempts again: every count of that run's configs grows
    after = _run("export", str(out), "-f", "csv")
    assert after != before
    extra.unlink()
    assert _run("export", str(out), "-f", "csv") == before


def test_a_file_changed_in_place_is_read(tmp_path, keep_all):
    out = _folder(tmp_path)
    before = _run("export", str(out), "-f", "csv")
    path = next(out.glob("cluster=b200/run=*/part-0.parquet"))
    table = pq.read_table(path)
    column = table.schema.get_field_index("tflops_per_gpu")
    stat = path.stat()
    pq.write_table(table.set_column(column, "tflops_per_gpu", pc.multiply(table.column(column), 2.0)), path)
    # the same inode (rewritten in place) and the mtime put back: the change time still says it changed
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_ino == stat.st_ino and path.stat().st_mtime_ns == stat.st_mtime_ns
    assert _run("export", str(out), "-f", "csv") != before


def test_a_torn_entry_is_a_miss_and_is_removed(tmp_path, keep_all):
    out = _folder(tmp_path)
    before = _run("max-batch", str(out), "-f", "csv")
    for entry in _entries(out):
        entry.write_bytes(entry.read_bytes()[:100])  # a disk that filled up
    assert _run("max-batch", str(out), "-f", "csv") == before
    assert all(_reads(e) for e in _entries(out)), "a torn entry was left in place"


def _reads(path: Path) -> bool:
    try:
        pa.ipc.open_file(str(path)).read_all()
    except pa.ArrowException:
        return False
    return True


def test_a_folder_that_cannot_be_written_keeps_nothing(tmp_path, keep_all):
    out = _folder(tmp_path)
    (out / "_cache").write_text("not a folder")  # mkdir fails as on a read-only folder (root writes anywhere)
    first = _run("compare", str(out), "-f", "csv")
    assert _run("compare", str(out), "-f", "csv") == first
    assert (out / "_cache").read_text() == "not a folder"


def test_entries_stay_within_their_bound(tmp_path, keep_all, monkeypatch):
    monkeypatch.setattr(memo, "MOST_ENTRIES", 2)
    out = _folder(tmp_path)
    _run("export", str(out), "-f", "csv")
    _run("compare", str(out), "-f", "csv")
    assert len(_entries(out)) == 2


def test_two_processes_keeping_at_once_print_the_same(tmp_path):
    out = _folder(tmp_path)
    code = (
        "import sys; from sweep.results import memo; memo.SLOW_S = 0.0; from sweep.cli import app; "
        f"app(['results', 'export', {str(out)!r}, '-f', 'csv'])"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    printed = [run.communicate(timeout=120) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [p[1][-500:] for p in printed]
    assert printed[0][0] == printed[1][0] == _run("export", str(out), "-f", "csv").encode()
    assert _entries(out) and not list((out / memo.FOLDER).glob("*.part")), "a temporary file was left"


def test_a_file_damaged_after_its_footer_was_kept_is_named(tmp_path, keep_all):
    out = _folder(tmp_path)
    _run("export", str(out), "-f", "csv")
    bad = next(out.glob("cluster=mi300x/run=*/part-0.parquet"))
    bad.write_bytes(b"not parquet")
    res = invoke("results", "export", str(out), "-f", "csv")
    assert res.exit_code == 2 and str(bad) in res.stderr and "Traceback" not in res.output, res.output
    res = invoke("results", "export", str(out), "-f", "csv", "--skip-bad")
    assert res.exit_code == 0 and f"warning: skipped {bad}" in res.stderr, res.output
