"""Sizes past what a result column holds: refused as the user's mistake (one line, exit 2) before anything runs,
by every command that takes them, and never an empty run folder left behind. Through the real CLI."""

from __future__ import annotations

import pytest

from sweep.record import store
from sweep.record.schema import int_range

INT32_MAX = int_range("batch_size")[1]
INT64_MAX = int_range("n_params")[1]
# --memory-cap 1B: the trial cannot run here, so even a sweep that got past the checks would start no Ray (it
# would record an `unsupported` row: what used to crash in the Arrow conversion)
CHEAP = ["--memory-cap", "1B", "--cluster", "local", "--no-progress"]


def test_the_bounds_come_from_the_columns_arrow_types():
    assert int_range("batch_size") == (-(2**31), 2**31 - 1)  # int32
    assert int_range("n_params") == (-(2**63), 2**63 - 1)  # int64
    with pytest.raises(TypeError, match="not an integer"):
        int_range("step_time_s")


@pytest.mark.parametrize(
    "args, named",
    [
        (["run", "--model", "gpt-tiny", "--batch-size", 3_000_000_000, *CHEAP], "batch_sizes: 3000000000"),
        (
            ["run", "--model", "gpt-tiny", "--batch-size", 1, "--seq-len", INT32_MAX + 1, *CHEAP],
            f"seq_len: {INT32_MAX + 1}",
        ),
        (["run", "--model", "gpt-tiny", "--batch-size", 1, "--grad-accum", 2**40, *CHEAP], f"grad_accum: {2**40}"),
        (["max-batch", "--model", "gpt-tiny", "--start", 1_000_000_000_000, *CHEAP], "--start: 1000000000000"),
        (["max-batch", "--model", "gpt-tiny", "--measure", INT32_MAX + 1, *CHEAP], f"steps.measure: {INT32_MAX + 1}"),
        (["tune", "--model", "gpt-tiny", "--start", INT32_MAX + 1, *CHEAP], f"--start: {INT32_MAX + 1}"),
        (["tune", "--model", "gpt-tiny", "--warmup", 2**33, *CHEAP], f"steps.warmup: {2**33}"),
        (
            ["plan", "--model", "gpt-tiny", "--batch-size", 3_000_000_000, "--cluster", "local"],
            "batch_sizes: 3000000000",
        ),
    ],
)
def test_a_size_past_its_column_is_one_line_exit_2_and_nothing_written(cli, tmp_path, monkeypatch, args, named):
    monkeypatch.chdir(tmp_path)  # where a default --output would land
    result = cli(*args, *(["--output", tmp_path / "out"] if args[0] != "plan" else []))
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and named in line, line
    assert f"at most {INT32_MAX}" in line and "int32" in line, line
    assert result.stdout == ""
    assert list(tmp_path.iterdir()) == [], "nothing written, not even an empty run folder"


def test_a_grid_files_sizes_are_checked_too(cli, write_grid, tmp_path):
    huge = "{arch: gpt, name: huge, n_layers: 100000000, d_embd: 1000000000, n_heads: 1, vocab_size: 10}"
    grid = write_grid(f"models: [{huge}]\nbatch_sizes: [1]\n")
    result = cli("plan", grid, "--cluster", "local")
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert "models: " in line and f"(n_params is int64: at most {INT64_MAX})" in line, line
    grid = write_grid(f"models: [gpt-tiny]\nbatch_sizes: [1]\nsteps: {{warmup: 1, measure: {INT32_MAX + 1:d}}}\n")
    result = cli("plan", grid, "--cluster", "local")
    assert result.exit_code == 2 and f"steps.measure: {INT32_MAX + 1} is more than" in result.stderr, result.output


def test_the_largest_size_a_column_holds_is_accepted(cli):
    result = cli("plan", "--model", "gpt-tiny", "--batch-size", INT32_MAX, "--cluster", "local")
    assert result.exit_code == 0, result.output
    assert str(INT32_MAX) in result.stdout


def test_a_row_that_cannot_be_stored_leaves_no_folder_and_no_temp_file(tmp_path):
    row = {"run_id": "r1", "trial_id": "t1", "cluster": "local", "status": "ok", "alloc_retries": 2**70}
    with pytest.raises(OverflowError):  # pyarrow: 2**70 does not fit alloc_retries' int64
        store.write_row(tmp_path / "out", row)
    assert not (tmp_path / "out").exists()
