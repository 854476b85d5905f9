"""What `sweep results` says about the rows it reads: captions true of every selected row, the filter that
emptied a selection, `nothing to compare`, `--out` a folder, `-n 0`, a memory cap's figures, plot ticks; and
`results query` within bounds (a row limit pushed into the query, a memory limit, a timeout, Ctrl-C, one
statement at a time).

Rows are written with ``sweep.record.store.write_row`` as ``sweep run`` writes them: a max-batch search of gpt-tiny
on CPU ranks under `--memory-cap 1500MiB` (probes 1, 38, 2039, ..., limit 981), and a small grid of two
models × two precisions × three batches.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import result_row

from sweep.record.store import write_row
from sweep.results import aggregate, render
from sweep.results import plot as plotting

CAP_GIB = 1500 * 2**20 / 2**30  # --memory-cap 1500MiB: 1.46484375
PROBES = (1, 38, 2039, 2040, 1020, 510, 765, 852, 926, 963, 981, 990, 985, 983, 982)  # limit 981
T0 = dt.datetime(2025, 7, 1, 8, 0, tzinfo=dt.timezone.utc)


# gpt-tiny on one CPU rank, on `result_row`'s trial; what an attempt measured is set below, for an ok one only.
_TINY = {
    "batch_size": 1,
    "seq_len": 128,
    "warmup_steps": 3,
    "measure_steps": 10,
    "step_time_s": None,
    "step_time_p10_s": None,
    "step_time_p90_s": None,
    "tokens_per_s_per_gpu": None,
}


def _row(n: int, **fields) -> dict:
    timing = {"started_at": T0 + dt.timedelta(minutes=n), "finished_at": T0 + dt.timedelta(minutes=n, seconds=30)}
    row = result_row(**{**_TINY, "trial_id": f"t{n:04d}", **timing, **fields})
    if row["status"] == "ok":
        row.update(
            tflops_per_gpu=0.01 * (1 - 0.5 / (row["batch_size"] + 1)),
            step_time_s=0.5,
            tokens_per_s_per_gpu=400.0,
            peak_mem_gib=0.001 * row["batch_size"],
        )
    return row


@pytest.fixture(scope="module")
def search(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("search")
    for n, batch in enumerate(PROBES):
        status = "oom" if batch > 981 else "ok"
        write_row(
            out,
            _row(
                n,
                batch_size=batch,
                memory_cap_gib=CAP_GIB,
                status=status,
                error="CUDA out of memory" if status == "oom" else None,
            ),
        )
    return out


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    """gpt-tiny and llama-tiny × bf16 and fp8-te × batches 1, 2, 4; no bf16 attempt failed, one fp8-te did."""
    out = tmp_path_factory.mktemp("grid")
    for n, (model, precision, batch) in enumerate(
        itertools.product(("gpt-tiny", "llama-tiny"), ("bf16", "fp8-te"), (1, 2, 4))
    ):
        failed = (model, precision, batch) == ("llama-tiny", "fp8-te", 4)
        write_row(
            out,
            _row(
                n,
                model=model,
                precision=precision,
                batch_size=batch,
                status="oom" if failed else "ok",
                error="CUDA out of memory" if failed else None,
            ),
        )
    return out


def _error(res) -> str:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    (line,) = res.stderr.strip().splitlines()
    return line


def _caption(stdout: str) -> str:
    """The text under a Rich table (its caption), on one line."""
    lines = stdout.splitlines()
    end = max(i for i, line in enumerate(lines) if line.startswith("└"))
    return " ".join(" ".join(lines[end + 1 :]).split())


def _header(stdout: str) -> list[str]:
    line = next(line for line in stdout.splitlines() if line.startswith("┃"))
    return [c.strip() for c in line.strip("┃").split("┃")]


# --- item 7: captions true of every selected row ---------------------------------------------------


def test_show_folds_only_what_every_selected_row_shares(cli, grid):
    """The first 3 rows are all gpt-tiny bf16: the caption must not say so of the 12 selected."""
    res = cli("results", "show", grid, "-n", 3)
    assert res.exit_code == 0, res.output
    caption = _caption(res.stdout)
    assert "model" not in caption and "precision" not in caption and "batch_size" not in caption
    assert "cluster local" in caption and "seq_len 128" in caption
    assert {"model", "precision", "batch"} <= set(_header(res.stdout))
    assert "9 more rows not printed" in caption


def test_a_one_row_table_folds_its_config_into_the_caption(cli, grid):
    """As the table at the end of a one-trial `sweep run` (`render.rich_table` over SHOW_COLS, as `show`)."""
    res = cli(
        "results", "show", grid, "--where", "model=llama-tiny", "--where", "precision=fp8-te", "--where", "batch_size=4"
    )
    assert res.exit_code == 0, res.output
    assert _header(res.stdout)[0] == "status"
    assert "model llama-tiny · precision fp8-te · compile none · ac none · batch_size 4" in _caption(res.stdout)


def test_max_batch_caption_holds_for_the_rows_it_does_not_print(cli, grid):
    res = cli("results", "max-batch", grid, "-n", 1)
    assert res.exit_code == 0, res.output
    assert "model" in _header(res.stdout) and "precision" in _header(res.stdout)
    assert "3 more rows not printed" in _caption(res.stdout)


# --- item 8: messages that point the right way -----------------------------------------------------


def test_no_match_names_the_filter_that_emptied_the_selection(cli, grid):
    line = _error(cli("results", "show", grid, "--where", "precision=bf16", "--where", "status!=ok"))
    assert line == (
        f"error: {grid}: no results match --where 'status!=ok' (after --where 'precision=bf16': status values: ok)"
    )
    line = _error(cli("results", "show", grid, "--where", "batch_size>=2", "--where", "batch_size<2"))
    assert line.endswith("(after --where 'batch_size>=2': batch_size values: 2 to 4)")


def test_compare_by_an_option_with_one_value_has_nothing_to_compare(cli, tmp_path):
    """Every row grad_sync step: no --baseline was given, so none may be blamed (micro_batch is the default)."""
    for n, batch in enumerate((1, 2)):
        write_row(tmp_path, _row(n, batch_size=batch, grad_sync="step"))
    line = _error(cli("results", "compare", tmp_path, "--by", "grad_sync"))
    assert line == f"error: nothing to compare: every config in {tmp_path} has grad_sync step"


def test_compare_without_the_default_baseline_says_it_was_the_default(cli, grid, tmp_path):
    for n, precision in enumerate(("fp8-te", "fp8-torchao")):
        write_row(tmp_path, _row(n, precision=precision))
    line = _error(cli("results", "compare", tmp_path))
    assert "the default baseline bf16; pass --baseline, one of: fp8-te, fp8-torchao" in line


@pytest.mark.parametrize("command", ["plot", "export"])
def test_out_an_existing_folder_is_refused_and_nothing_written(cli, search, tmp_path, command):
    folder = tmp_path / "figs"
    folder.mkdir()
    line = _error(cli("results", command, search, "--out", folder))
    assert line.startswith(f"error: --out {folder}: is a folder; give a file name, e.g. --out {folder}/")
    assert list(tmp_path.iterdir()) == [folder] and list(folder.iterdir()) == []


# --- item 9: -n 0 is all, for every results command -----------------------------------------------


@pytest.mark.parametrize("command", ["show", "max-batch", "compare"])
def test_limit_0_prints_every_row(cli, grid, command):
    res = cli("results", command, grid, "-n", 0)
    assert res.exit_code == 0, res.output
    assert "not printed" not in res.stdout


def test_show_limit_0_prints_all_rows(cli, search):
    res = cli("results", "show", search, "-n", 0)
    assert res.exit_code == 0, res.output
    assert len([line for line in res.stdout.splitlines() if line.startswith("│")]) == len(PROBES)


# --- item 10: a memory cap to the figures everything else has -------------------------------------


def test_a_memory_cap_prints_with_significant_figures(cli, search):
    res = cli("results", "show", search)
    assert res.exit_code == 0, res.output
    assert "memory_cap_gib 1.465 ·" in _caption(res.stdout) and "1.4648" not in res.stdout
    configs = aggregate.configs(search)
    fig = plotting.figure(configs, aggregate.max_batch_table(configs))
    assert "cap 1.465 GiB" in fig.get_suptitle() and "1.4648" not in fig.get_suptitle()
    assert [render.setting(v) for v in (CAP_GIB, 80.0, 0.5)] == ["1.465", "80", "0.5"]


# --- item 12: plot ticks --------------------------------------------------------------------------


def _figure(folder: Path, where=()):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    configs = aggregate.configs(folder, where)
    fig = plotting.figure(configs, aggregate.max_batch_table(configs))
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    return fig, renderer


def test_close_probes_leave_room_between_their_numbers(search):
    """852, 926, 963, 981: the numbers printed are at least half an em apart, first and last among them."""
    fig, renderer = _figure(search)
    top = fig.axes[0]
    labels = [t for t in top.get_xticklabels() if t.get_text()]
    em = labels[0].get_fontsize() * fig.dpi / 72
    boxes = [t.get_window_extent(renderer) for t in labels]
    assert all(right.x0 - left.x1 >= em / 2 for left, right in zip(boxes, boxes[1:])), [t.get_text() for t in labels]
    assert labels[0].get_text() == "1" and labels[-1].get_text() == "2040"


def test_the_bar_chart_has_whole_batch_ticks_when_the_largest_is_1(search):
    """A batch is whole: the max-batch panel writes each bar's batch as a whole number, and has no axis numbers
    (no 0.2 ticks when the largest is 1)."""
    fig, _ = _figure(search, ["batch_size<=1"])
    bars = fig.axes[1]
    assert not bars.xaxis.get_visible()
    notes = [t.get_text() for t in bars.texts if t.get_ha() == "left"]
    assert notes and all(n.removeprefix("≥ ").isdigit() for n in notes), notes


# --- item 6: `results query` within bounds --------------------------------------------------------

CROSS_JOIN = "SELECT count(*) FROM range(100000000) a, range(100000000) b"  # 10^16 rows: runs for days


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("query")
    for n, batch in enumerate((1, 2, 4, 1, 2, 4)):
        write_row(out, _row(n, batch_size=batch))
    return out


def _sweep(*args: object, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sweep", "results", "query", *map(str, args)],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ},
        **kwargs,
    )


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
    line = _error(
        cli("results", "query", folder, "SELECT list(range) FROM range(300000000)", "--memory-limit", "100MB")
    )
    assert line == "error: query stopped: ran past the memory limit 100MB (--memory-limit)"


def test_the_memory_limit_cannot_be_lifted_from_inside(cli, folder):
    line = _error(cli("results", "query", folder, "SET memory_limit = '100GB'"))
    assert line.startswith("error: SQL: ") and "configuration" in line.lower()


@pytest.mark.parametrize(
    "statement, message",
    [
        ("", "SQL: no statement"),
        ("  ;  ", "SQL: no statement"),
        ("/* a comment */", "SQL: no statement"),
        ("SELECT 1; SELECT 2", "SQL: 2 statements; `sweep results query` runs one at a time"),
    ],
)
def test_one_statement_at_a_time(cli, folder, statement, message):
    assert message in _error(cli("results", "query", folder, statement))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--timeout", "soon"], "--timeout 'soon': expected a duration"),
        (["--memory-limit", "2"], "--memory-limit '2': expected a size with a unit"),
    ],
)
def test_bad_bounds_are_one_line(cli, folder, args, message):
    assert message in _error(cli("results", "query", folder, "SELECT 1", *args))


def _sigint_as_at_a_terminal() -> None:
    # a job started in the background by a non-interactive shell (`bash .ci/run &`) runs with SIGINT ignored,
    # and a Python started with it ignored never raises KeyboardInterrupt: the Ctrl-C a user presses
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_cancels_the_statement(folder):
    proc = _sweep(folder, CROSS_JOIN, "--timeout", "0", preexec_fn=_sigint_as_at_a_terminal)
    try:
        time.sleep(4)  # imports, then DuckDB at work
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip() == "query cancelled (Ctrl-C)"


def test_an_interrupt_sent_before_the_statement_runs_is_repeated_until_it_stops():
    """DuckDB's interrupt reaches only a running statement: one sent while the worker thread is still binding it
    is lost, and a Ctrl-C (or the timeout) then waited for a statement that never ends (seen on a loaded CI
    machine). A connection that starts executing 0.3 s after the interrupt comes still stops."""
    import threading

    import duckdb

    from sweep.results.query import _bounded

    class SlowToStart:
        def __init__(self):
            self.running, self.stopped = threading.Event(), threading.Event()

        def interrupt(self):
            if self.running.is_set():
                self.stopped.set()

        def work(self):
            time.sleep(0.3)  # parsing and binding: an interrupt now is dropped
            self.running.set()
            if not self.stopped.wait(10):
                return "ran to its end"
            raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")

    con = SlowToStart()
    began = time.monotonic()
    with pytest.raises(duckdb.InterruptException):
        _bounded(con, con.work, timeout_s=0.05)
    assert time.monotonic() - began < 5
