"""Where a sweep's GPU time went: the arithmetic (sweep.record.cost, pure) and what `sweep run` and `results show`
print."""

from __future__ import annotations

import re

import pytest
from conftest import result_row, rows_folder

from sweep.record import store
from sweep.record.cost import attempt_seconds, gpu_seconds, measured_share, percents, summary_line
from sweep.results.render import sig

FIVE = ["measured steps", "warm-up", "compile", "start-up", "OOM attempts"]


def _ok(**over) -> dict:
    """An ok attempt on 2 ranks: 10 s held, compile 1 s, 2 warm-up steps of 0.5 s, 3 s of measured steps."""
    times = {"trial_wall_s": 10.0, "compile_time_s": 1.0, "warmup_steps": 2, "step_time_s": 0.5, "steps_time_s": 3.0}
    return result_row(**{"world_size": 2, **times, **over})


def test_an_ok_attempt_splits_its_wall_and_the_rest_is_start_up():
    parts = attempt_seconds(_ok())
    assert (parts["measured steps"], parts["warm-up"], parts["compile"], parts["start-up"]) == (3.0, 1.0, 1.0, 5.0)
    assert sum(parts.values()) == 10.0


def test_a_fresh_groups_wait_for_its_graphs_compiled_ahead_is_compile_not_start_up():
    """precompile_s (trainer.precompile) lies inside the first trial's start-up on the worker's clock: it is compile."""
    parts = attempt_seconds(_ok(trial_wall_s=14.0, precompile_s=4.0))
    assert (parts["compile"], parts["start-up"], parts["measured steps"]) == (5.0, 5.0, 3.0)


def test_without_warm_up_the_first_measured_step_carries_compile_and_it_is_counted_once():
    parts = attempt_seconds(_ok(warmup_steps=0, steps_time_s=4.0))
    assert (parts["measured steps"], parts["warm-up"], parts["compile"], parts["start-up"]) == (3.0, 0.0, 1.0, 6.0)


def test_worker_times_past_the_driver_wall_leave_no_negative_start_up():
    parts = attempt_seconds(_ok(trial_wall_s=4.9))
    assert parts["start-up"] == 0.0 and measured_share(_ok(trial_wall_s=4.9)) == pytest.approx(3 / 5)


@pytest.mark.parametrize(
    "status,part", [("oom", "OOM attempts"), ("error", "failed attempts"), ("timeout", "failed attempts")]
)
def test_a_failed_attempt_is_all_waste(status, part):
    parts = attempt_seconds({"status": status, "world_size": 4, "trial_wall_s": 7.0})
    assert parts[part] == 7.0 and sum(parts.values()) == 7.0
    assert measured_share({"status": status, "trial_wall_s": 7.0}) == 0.0


def test_gpu_seconds_are_wall_times_world_size_and_unsupported_costs_nothing():
    rows = [_ok(), {"status": "oom", "world_size": 4, "trial_wall_s": 5.0}, {"status": "unsupported", "world_size": 8}]
    seconds = gpu_seconds(rows)
    assert seconds["measured steps"] == 6.0 and seconds["start-up"] == 10.0 and seconds["OOM attempts"] == 20.0
    assert sum(seconds.values()) == 40.0
    assert measured_share({"status": "unsupported"}) is None


def test_percents_are_whole_and_add_up_to_100():
    assert percents({"a": 1.0, "b": 1.0, "c": 1.0}) == {"a": 34, "b": 33, "c": 33}
    assert percents({"a": 2.0, "b": 0.0}) == {"a": 100, "b": 0}
    assert percents({"a": 0.0}) == {}


def test_summary_line():
    line = summary_line([_ok(), {"status": "oom", "world_size": 2, "trial_wall_s": 5.0}])
    # 30 GPU-s: measured 6, warm-up 2, compile 2, start-up 10, OOM 10
    assert (
        line
        == "GPU time: 30 GPU-s held — measured steps 20 %, warm-up 7 %, compile 7 %, start-up 33 %, OOM attempts 33 %"
    )
    assert "failed attempts 50 %" in summary_line([_ok(), {"status": "timeout", "world_size": 2, "trial_wall_s": 10.0}])
    assert summary_line([_ok(world_size=8, trial_wall_s=3600.0)]).startswith("GPU time: 8.0 GPU-h held")
    assert summary_line([{"status": "unsupported"}]) is None


# -- `results show`: the same line over the rows a folder holds, summed in DuckDB (sweep.results.gpu_time) ----------


def _attempts_of_every_kind() -> list[dict]:
    """Attempts of every status, each edge of cost.attempt_seconds among them (trial ids tell which)."""
    return [
        _ok(trial_id="warm"),  # the warm-up step carried compile: measured steps are steps_time_s
        _ok(trial_id="cold", warmup_steps=0, steps_time_s=4.0),  # the first measured step compiled: less compile
        _ok(trial_id="short", warmup_steps=0, steps_time_s=0.5, compile_time_s=2.0),  # measured clamped at 0
        _ok(trial_id="ahead", trial_wall_s=14.0, precompile_s=4.0),  # waited for graphs compiled ahead: compile
        _ok(trial_id="over", trial_wall_s=4.9),  # the workers' clocks past the driver's wall: start-up clamped at 0
        # nulls count as 0, an unknown world size as one rank, and so does 0
        _ok(trial_id="nulls", compile_time_s=None, warmup_steps=None, step_time_s=None, world_size=None),
        _ok(trial_id="zero-ranks", world_size=0),
        result_row(trial_id="oom", status="oom", world_size=4, trial_wall_s=5.0, step_time_s=None),
        result_row(trial_id="error", status="error", world_size=2, trial_wall_s=7.0, step_time_s=None),
        result_row(trial_id="timeout", status="timeout", world_size=1, trial_wall_s=9.0, step_time_s=None),
        result_row(trial_id="unsupported", status="unsupported", world_size=8, trial_wall_s=3.0, step_time_s=None),
    ]


def _write_old_file(folder, row: dict) -> None:
    """`row` as schema 1.13 wrote it: without precompile_s and the columns that came with it."""
    import pyarrow.parquet as pq

    from sweep.record.schema import VERSION_KEY, to_table

    added = ["precompile_s", "precompiled_graphs", "compile_cache_hits", "compile_cache_misses"]
    old = to_table([row]).drop_columns(added).replace_schema_metadata({VERSION_KEY: b"1.13"})
    path = folder / "cluster=local" / "run=old" / "old.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(old, path)


def test_results_show_sums_the_gpu_time_in_sql_as_cost_gpu_seconds_does(tmp_path_factory):
    from sweep.results import aggregate, gpu_time

    rows = _attempts_of_every_kind()
    folder = rows_folder(tmp_path_factory, "kinds", rows)
    old = _ok(run_id="old", trial_id="old", precompile_s=None)  # a file older than precompile_s reads it as null
    _write_old_file(folder, old)
    summed = gpu_time.gpu_seconds(aggregate.load_rows(folder, extra=gpu_time.COLUMNS))
    assert summed == pytest.approx(gpu_seconds([*rows, old]), rel=1e-12)
    assert all(summed.values()), summed  # every part has time: none agrees by being 0 on both sides
    assert gpu_time.summary_line(aggregate.load_rows(folder, extra=gpu_time.COLUMNS)) == summary_line([*rows, old])
    only_unsupported = aggregate.load_rows(folder, ["status=unsupported"], extra=gpu_time.COLUMNS)
    assert gpu_time.summary_line(only_unsupported) is None


def test_results_show_ends_with_where_the_selected_rows_gpu_time_went(cli, tmp_path_factory):
    """Over every row --where selects, --limit or not: bf16 and fp8-te ok attempts of 20 GPU-s each (measured 6,
    warm-up 2, compile 2, start-up 10), a bf16 OOM of 10 GPU-s, an unsupported attempt that cost nothing."""
    folder = rows_folder(
        tmp_path_factory,
        "show",
        [
            _ok(trial_id="bf16"),
            _ok(trial_id="fp8", precision="fp8-te"),
            result_row(trial_id="oom", status="oom", batch_size=8, world_size=2, trial_wall_s=5.0, step_time_s=None),
            result_row(trial_id="unsupported", status="unsupported", precision="fp8-te", batch_size=64, world_size=2),
        ],
    )
    every = cli("results", "show", folder)
    assert every.exit_code == 0, every.output
    assert every.stdout.splitlines()[-1] == (
        "GPU time: 50 GPU-s held — measured steps 24 %, warm-up 8 %, compile 8 %, start-up 40 %, OOM attempts 20 %"
    )
    bf16 = cli("results", "show", folder, "--where", "precision=bf16", "--limit", "1")
    assert bf16.exit_code == 0, bf16.output
    assert "1 of 2 rows" in bf16.stdout  # the OOM row is not printed, and counts
    assert bf16.stdout.splitlines()[-1] == (
        "GPU time: 30 GPU-s held — measured steps 20 %, warm-up 7 %, compile 7 %, start-up 33 %, OOM attempts 33 %"
    )
    never_ran = cli("results", "show", folder, "--where", "status=unsupported")
    assert never_ran.exit_code == 0, never_ran.output
    assert "GPU time" not in never_ran.stdout


# -- through the CLI: a real 2-rank sweep on CPU ranks ----------------------------------------------------

# Logits dominate memory: batch 2 fits under a 128 MiB cap per rank, batch 64 does not
GRID = """
models: [{arch: gpt, name: wide-vocab, n_layers: 1, d_embd: 64, n_heads: 4, vocab_size: 4096, max_seq_len: 128}]
precisions: [bf16]
batch_sizes: [2, 64]
compile: none
seq_len: 128
gpus: 2
steps: {warmup: 1, measure: 2}
on_oom: {policy: none}
"""


@pytest.mark.integration
def test_sweep_run_says_where_the_gpu_time_went_and_results_show_has_the_measured_share(
    ray_session, cli, write_grid, tmp_path
):
    out = tmp_path / "out"
    result = cli(
        "run", write_grid(GRID), "--cluster", "local", "--memory-cap", "128MiB", "--output", out, "--no-progress"
    )
    assert result.exit_code == 0, result.output
    rows = {r["batch_size"]: r for r in store.read_table(out).to_pylist()}
    assert rows[2]["status"] == "ok" and rows[64]["status"] == "oom"

    (line,) = [x for x in result.stdout.splitlines() if x.startswith("GPU time:")]
    held, parts = re.fullmatch(r"GPU time: ([\d.,]+) GPU-s held — (.*)", line).groups()
    shares = {name: int(pct) for name, pct in re.findall(r"([a-zA-Z -]+?) (\d+) %(?:, |$)", parts)}
    assert list(shares) == FIVE and sum(shares.values()) == 100, line
    total = sum(r["trial_wall_s"] * r["world_size"] for r in rows.values())
    assert float(held.replace(",", "")) == pytest.approx(total, abs=0.5, rel=0.05)
    # the shares are the rows' (measured steps may round to 0 % on a busy machine: 2 steps of a tiny model)
    assert shares["measured steps"] == pytest.approx(100 * 2 * rows[2]["steps_time_s"] / total, abs=1)
    assert shares["OOM attempts"] == pytest.approx(100 * 2 * rows[64]["trial_wall_s"] / total, abs=1)
    assert shares["start-up"] > 0 and shares["OOM attempts"] > 0, line

    shown = cli("results", "show", out)
    assert shown.exit_code == 0, shown.output
    assert "time measured" in shown.stdout
    share = 100 * rows[2]["steps_time_s"] / rows[2]["trial_wall_s"]  # warm-up ran, so compile is not in it
    assert 0 < share < 100
    table_lines = [x for x in shown.stdout.splitlines() if x.startswith("│")]  # the caption may say "ok" too
    (ok_line,) = [x for x in table_lines if " ok " in x]
    (oom_line,) = [x for x in table_lines if " oom " in x]
    assert re.search(rf"│\s+{re.escape(sig(share, 3))} % │", ok_line), ok_line
    assert re.search(r"│\s+0 % │", oom_line), oom_line


def test_a_search_is_told_against_one_fresh_trial_of_its_answer():
    from sweep.record.cost import fresh_trial_s

    # Llama3-8B bf16 max-batch on 2xH200 (RESULTS.md): batch 1 on a fresh group, the rest warm
    probes = [
        {"status": "ok", "batch_size": 1, "group_trial_index": 0, "init_time_s": 12.5, "trial_wall_s": 24.3},
        {"status": "ok", "batch_size": 2, "group_trial_index": 1, "init_time_s": 0.5, "trial_wall_s": 7.5},
        {"status": "oom", "batch_size": 5, "group_trial_index": 3, "init_time_s": None, "trial_wall_s": 10.1},
    ]
    # the warm answer's build swapped for a fresh group's start-up
    assert fresh_trial_s(probes[1], probes) == pytest.approx(7.5 - 0.5 + 12.5)
    # the start-up is the median of the ok fresh attempts' (not their mean, nor the first's); an attempt that
    # failed on a fresh group says nothing of a start-up
    more = [
        {"status": "ok", "batch_size": 1, "group_trial_index": 0, "init_time_s": 14.5, "trial_wall_s": 26.0},
        {"status": "ok", "batch_size": 1, "group_trial_index": 0, "init_time_s": 20.0, "trial_wall_s": 31.0},
        {"status": "oom", "batch_size": 9, "group_trial_index": 0, "init_time_s": 30.0, "trial_wall_s": 40.0},
    ]
    assert fresh_trial_s(probes[1], probes + more) == pytest.approx(7.5 - 0.5 + 14.5)
    assert fresh_trial_s(probes[0], probes) == 24.3  # it ran fresh: its own wall
    assert fresh_trial_s(probes[1], probes[1:]) is None  # no fresh start-up seen: no estimate
    assert fresh_trial_s({"trial_wall_s": None}, probes) is None


def test_a_warm_answer_that_compiled_nothing_is_told_against_the_compile_a_fresh_trial_pays():
    """The held-out model's torchao max-batch on one H200 (RESULTS.md "Cold sweep", session 22): the first probe
    compiled the graphs (symbolic batch) on a fresh group, the answer ran them warm in 0.08 s; measured once on fresh
    processes it compiles again."""
    from sweep.record.cost import fresh_trial_s

    graphs = {"model": "held-out-2.5b", "precision": "fp8-torchao-tensorwise", "compile": "regional", "seq_len": 4096}
    first = {**graphs, "status": "ok", "batch_size": 12, "group_trial_index": 0, "init_time_s": 11.7}
    answer = {**graphs, "status": "ok", "batch_size": 14, "group_trial_index": 1, "init_time_s": 0.11}
    first.update(trial_wall_s=42.7, compile_time_s=20.4)
    answer.update(trial_wall_s=9.0, compile_time_s=0.08)
    assert fresh_trial_s(answer, [first, answer]) == pytest.approx(9.0 - 0.11 + 11.7 - 0.08 + 20.4)
    # a fresh attempt of other graphs (bf16) says nothing of this one's compile; an answer that compiled longer
    # than the fresh attempts keeps its own
    bf16 = {**first, "precision": "bf16", "compile_time_s": 13.3, "init_time_s": 11.7}
    assert fresh_trial_s(answer, [bf16, answer]) == pytest.approx(9.0 - 0.11 + 11.7)
    slow = {**answer, "compile_time_s": 30.0, "trial_wall_s": 40.0}
    assert fresh_trial_s(slow, [first, slow]) == pytest.approx(40.0 - 0.11 + 11.7)
    # a tune's cost cap keeps the answer's own compile
    assert fresh_trial_s(answer, [first, answer], recompile=False) == pytest.approx(9.0 - 0.11 + 11.7)
