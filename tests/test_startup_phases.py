"""Where a trial's start-up goes: the rows' process_start_s, import_s, process_setup_s and model_build_s.

Through `sweep run` on the session's real Ray (FSDP2 over gloo, 2 CPU ranks, a tiny model): a fresh group's
first trial pays every phase, a warm trial only its own model build, and the phases, which follow one another,
fit inside the wall time the driver saw and (in the rank) inside init_time_s.
"""

from __future__ import annotations

import pytest

from sweep.record import store
from sweep.results.render import sig

pytestmark = pytest.mark.integration

GRID = """
models: [gpt-tiny]
precisions: [bf16]
batch_sizes: [1, 2, 3]
compile: none
seq_len: 32
gpus: 2
steps: {warmup: 1, measure: 2}
"""
PROCESS = ("process_start_s", "import_s", "process_setup_s")  # paid by a group's first trial only
PHASES = (*PROCESS, "model_build_s")


def _run(cli, grid, out, *options) -> list[dict]:
    result = cli("run", grid, "--cluster", "local", "--output", out, "--no-progress", *options)
    assert result.exit_code == 0, result.output
    rows = sorted(store.read_table(out).to_pylist(), key=lambda r: r["started_at"])
    assert [r["status"] for r in rows] == ["ok"] * len(rows), [r["error"] for r in rows]
    return rows


def _fits(row: dict) -> None:
    """The phases follow one another: their sum, and the measured steps after them, fit in the driver's wall;
    the in-rank ones fit in init_time_s (the same rank's clock, from the actor's start or the trial's)."""
    phases = [row[p] or 0.0 for p in PHASES]
    assert sum(phases) + row["steps_time_s"] <= row["trial_wall_s"], row
    assert sum(phases[1:]) <= row["init_time_s"], row


@pytest.mark.timeout(240)
def test_a_fresh_group_pays_every_phase_and_a_warm_trial_only_its_model_build(ray_session, cli, write_grid, tmp_path):
    grid = write_grid(GRID)
    warm = _run(cli, grid, tmp_path / "warm", "--max-concurrent", 1)
    assert [r["group_trial_index"] for r in warm] == [0, 1, 2]
    first, *later = warm
    assert all(first[p] > 0 for p in PHASES), {p: first[p] for p in PHASES}
    for row in later:  # the processes, their imports and their process group are the group's
        assert [row[p] for p in PROCESS] == [None] * len(PROCESS) and row["model_build_s"] > 0, row
    for row in warm:
        _fits(row)
    # a warm trial's init_time_s is its model build (and the release before it), nothing of the process's
    assert all(r["model_build_s"] <= r["init_time_s"] for r in later)

    # two trials are enough here: the second is one a warm group would have run
    fresh = _run(cli, write_grid(GRID.replace("[1, 2, 3]", "[1, 2]"), "two.yaml"), tmp_path / "fresh", "--fresh-actors")
    assert [r["group_trial_index"] for r in fresh] == [0, 0]
    for row in fresh:
        assert all(row[p] > 0 for p in PHASES), {p: row[p] for p in PHASES}
        _fits(row)

    # `results show` has a column per phase, with the row's seconds
    shown = cli("results", "show", tmp_path / "warm")
    assert shown.exit_code == 0, shown.output
    assert all(header in shown.output for header in ("spawn (s)", "import (s)", "setup (s)", "build (s)")), shown.output
    # the first trial's four phases, on one line of the table (each alone could match some other cell)
    assert [line for line in shown.output.splitlines() if all(sig(first[p]) in line for p in PHASES)], shown.output


def test_rows_older_than_the_phases_read_null_and_show_without_them(cli, tmp_path):
    """A file of schema 1.7 has no phase columns: they read as null, and `results show` leaves them out."""
    import pyarrow.parquet as pq
    from test_schema import _row

    from sweep.record.schema import VERSION_KEY, to_table

    old = to_table([_row(init_time_s=3.0, trial_wall_s=5.0)]).drop_columns(list(PHASES))
    old = old.replace_schema_metadata({VERSION_KEY: b"1.7"})
    pq.write_table(old, tmp_path / "old.parquet")
    (back,) = store.read_table(tmp_path).to_pylist()
    assert [back[p] for p in PHASES] == [None] * len(PHASES) and back["init_time_s"] == 3.0
    shown = cli("results", "show", tmp_path)
    assert shown.exit_code == 0 and "gpt-tiny" in shown.output and "time measured" in shown.output, shown.output
    assert not any(header in shown.output for header in ("spawn (s)", "import (s)", "setup (s)", "build (s)"))
