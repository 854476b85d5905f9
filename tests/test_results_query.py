"""`sweep results query` within bounds: a row limit pushed into the query, a memory limit, a timeout, Ctrl-C,
one statement at a time. Rows are written with ``sweep.store.write_row`` as ``sweep run`` writes them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweep.schema import TRAINING_DEFAULTS
from sweep.store import write_row

CROSS_JOIN = "SELECT count(*) FROM range(100000000) a, range(100000000) b"  # 10^16 rows: runs for days


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("query")
    for n, batch in enumerate((1, 2, 4, 1, 2, 4)):
        write_row(out, {"run_id": f"r{n // 3}", "trial_id": f"t{n}", "attempt": 1, "cluster": "local", "accelerator": "cpu",
                        "world_size": 1, "model": "gpt-tiny", "precision": "bf16", "compile": "none", "ac": "none",
                        "batch_size": batch, "seq_len": 128, **TRAINING_DEFAULTS, "status": "ok", "tflops_per_gpu": 0.01})
    return out


def _error(res) -> str:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    (line,) = res.stderr.strip().splitlines()
    return line


def _sweep(*args: object, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sweep", "results", "query", *map(str, args)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ}, **kwargs)


def test_the_limit_is_part_of_the_query(folder):
    """`-n 5` over 10^11 rows prints 5 at once (it used to grow memory for a minute first)."""
    start = time.monotonic()
    proc = _sweep(folder, "SELECT * FROM range(100000000000)", "-n", 5)
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert time.monotonic() - start < 30
    cells = [line.strip("│ ") for line in out.splitlines() if line.startswith("│")]
    assert cells == ["0", "1", "2", "3", "4"]
    assert "first 5 rows" in " ".join(out.split())


def test_limit_keeps_the_order_and_0_prints_all(cli, folder):
    res = cli("results", "query", folder, "SELECT batch_size FROM results ORDER BY batch_size DESC", "-n", 3)
    assert res.exit_code == 0, res.output
    assert [line.strip("│ ") for line in res.stdout.splitlines() if line.startswith("│")] == ["4", "4", "2"]
    res = cli("results", "query", folder, "SELECT batch_size FROM results", "-n", 0)
    assert res.exit_code == 0, res.output
    assert len([line for line in res.stdout.splitlines() if line.startswith("│")]) == 6
    assert "first" not in res.stdout


def test_a_statement_past_the_timeout_stops_with_one_line(cli, folder):
    start = time.monotonic()
    line = _error(cli("results", "query", folder, CROSS_JOIN, "--timeout", "1s"))
    assert line == "error: query stopped: ran past the 1 s timeout (--timeout)"
    assert time.monotonic() - start < 20


def test_a_statement_past_the_memory_limit_stops_with_one_line(cli, folder):
    line = _error(cli("results", "query", folder, "SELECT list(range) FROM range(300000000)", "--memory-limit", "100MB"))
    assert line == "error: query stopped: ran past the memory limit 100MB (--memory-limit)"


def test_the_memory_limit_cannot_be_lifted_from_inside(cli, folder):
    line = _error(cli("results", "query", folder, "SET memory_limit = '100GB'"))
    assert line.startswith("error: SQL: ") and "configuration" in line.lower()


@pytest.mark.parametrize("statement, message", [
    ("", "SQL: no statement"),
    ("  ;  ", "SQL: no statement"),
    ("/* a comment */", "SQL: no statement"),
    ("SELECT 1; SELECT 2", "SQL: 2 statements; `sweep results query` runs one at a time"),
])
def test_one_statement_at_a_time(cli, folder, statement, message):
    assert message in _error(cli("results", "query", folder, statement))


@pytest.mark.parametrize("args, message", [
    (["--timeout", "soon"], "--timeout 'soon': expected a duration"),
    (["--memory-limit", "2"], "--memory-limit '2': expected a size with a unit"),
])
def test_bad_bounds_are_one_line(cli, folder, args, message):
    assert message in _error(cli("results", "query", folder, "SELECT 1", *args))


def test_ctrl_c_cancels_the_statement(folder):
    proc = _sweep(folder, CROSS_JOIN, "--timeout", "0")
    try:
        time.sleep(4)  # imports, then DuckDB at work
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip() == "query cancelled (Ctrl-C)"
