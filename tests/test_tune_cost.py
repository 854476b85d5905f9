"""What a tune probe will cost before it runs, and what the search may still spend (sweep.search.fastest.cost). Pure.
The search's use of it, replayed on the GPUs' rows, is in tests/test_tune_replay.py; through the CLI in
tests/test_tune_cli.py."""

from __future__ import annotations

import pytest

from sweep.search.fastest.cost import (
    COMPILE_VS_REGIONAL,
    FINAL_AUTO_MAX,
    HANG_FLOOR_S,
    HANG_X,
    affordable,
    compile_times,
    final_auto_max,
    final_s,
    one_trial_s,
    probe_s,
    time_limit_s,
)
from sweep.search.fastest.space import SHORT, Config


def cfg(batch=32, compile="regional", accum=1) -> Config:
    return Config(batch, "none", compile, accum, "fp32", "micro_batch", False)


def row(wall, step=1.0, compile_s=20.0, fresh=True, init=15.0, steps=SHORT) -> dict:
    return {
        "status": "ok",
        "trial_wall_s": wall,
        "step_time_s": step,
        "compile_time_s": compile_s,
        "init_time_s": init if fresh else 0.5,
        "group_trial_index": 0 if fresh else 2,
        "warmup_steps": steps[0],
        "measure_steps": steps[1],
    }


def test_one_trial_is_the_leader_fresh_at_the_finals_steps():
    fresh = row(40.0, step=2.0)
    # auto steps run at least 3 + 5: three more steps than the probe's 2 + 3
    assert one_trial_s(fresh, [fresh], ("auto", "auto")) == pytest.approx(40.0 + 3 * 2.0)
    assert one_trial_s(fresh, [fresh], (3, 10)) == pytest.approx(40.0 + 8 * 2.0)
    warm = row(20.0, step=2.0, fresh=False)  # its start-up swapped for a fresh group's (15 s, sweep.record.cost)
    assert one_trial_s(warm, [fresh, warm], (2, 3)) == pytest.approx(20.0 - 0.5 + 15.0)
    assert one_trial_s({**fresh, "step_time_s": None}, [fresh], (3, 10)) is None
    assert one_trial_s(None, [], (3, 10)) is None


def test_a_final_is_reserved_at_the_most_auto_steps_it_may_run():
    fresh = row(40.0, step=2.0)
    # at most FINAL_AUTO_MAX (8 + 16) micro-batches' steps: 16 more than one trial's least (3 + 5)
    assert FINAL_AUTO_MAX == (8, 16) and final_auto_max(1) == (8, 16)
    assert final_s((cfg(), fresh), [fresh], ("auto", "auto")) == pytest.approx(40.0 + 3 * 2.0 + 16 * 2.0)
    assert final_s((cfg(), fresh), [fresh], (3, 10)) == one_trial_s(fresh, [fresh], (3, 10))  # counts are counts
    assert final_s((cfg(), fresh), [fresh], (2, "auto")) == pytest.approx(40.0 + (2 + 16 - 5) * 2.0)
    # a step of 8 micro-batches averages 8: it runs auto's least warm-up, and the 6 measured steps a median's
    # interval needs (one more than auto's least); 2 micro-batches no more than 4 + 8
    assert final_auto_max(8) == (3, 6) and final_auto_max(2) == (4, 8) and final_auto_max(16) == (3, 6)
    assert final_s((cfg(accum=8), fresh), [fresh], ("auto", "auto")) == pytest.approx(
        one_trial_s(fresh, [fresh], ("auto", "auto")) + 2.0
    )
    assert final_s((cfg(), None), [], ("auto", "auto")) is None


def test_a_probe_costs_its_compile_and_its_steps():
    leader = (cfg(66), row(36.0, step=1.2, compile_s=16.0))
    compiled = compile_times([(cfg(32), row(47.0, compile_s=22.0)), leader])
    # regional measured: its most (the first compile; later ones load the cache), plus 5 steps scaled by samples
    assert probe_s(cfg(33), SHORT, leader, compiled) == pytest.approx(22.0 + 5 * 1.2 * 33 / 66)
    # full never ran: regional's compile times COMPILE_VS_REGIONAL; none compiles nothing
    assert probe_s(cfg(32, "full"), SHORT, leader, compiled) == pytest.approx(
        22.0 * COMPILE_VS_REGIONAL["full"] + 5 * 1.2 * 32 / 66
    )
    assert probe_s(cfg(32, "none"), SHORT, leader, compiled) == pytest.approx(5 * 1.2 * 32 / 66)
    # once full has run, its own compile counts; a step of 8 micro-batches trains 8 times the samples
    ran_full = compile_times(
        [(cfg(32), row(47.0, compile_s=22.0)), leader, (cfg(32, "full"), row(178.0, compile_s=167.5))]
    )
    assert probe_s(cfg(59, "full"), SHORT, leader, ran_full) == pytest.approx(167.5 + 5 * 1.2 * 59 / 66)
    assert probe_s(cfg(59, accum=8), (1, 1), leader, compiled) == pytest.approx(22.0 + 2 * 1.2 * 59 * 8 / 66)
    assert probe_s(cfg(32, "full"), SHORT, leader, compile_times([(cfg(66), {"trial_wall_s": 1.0})])) is None
    # `auto` steps are a final's (a runner-up's, _final_stage): at their most, 8 + 16 of one micro-batch
    assert probe_s(cfg(66), ("auto", "auto"), leader, compiled) == pytest.approx(22.0 + 24 * 1.2)


def test_probes_are_kept_in_order_while_the_finals_keep_their_room():
    leader = (cfg(66), row(36.0, step=1.0, compile_s=20.0))
    probes = [leader]  # 36 s spent; one trial: 36 + 3 steps = 39 s
    wave = [cfg(32, "none"), cfg(32, "full"), cfg(59, accum=8), cfg(30, "none")]
    steps = [SHORT, SHORT, (1, 1), SHORT]
    kept, skipped = affordable(
        wave, steps, leader=leader, finals=2, max_cost=10, probes=probes, final_steps=("auto", "auto")
    )
    # room: 390 - 36 - 2 finals at their most (39 + 16 steps) - the profile (20 + 5) = 219 s: full (200 + 2.4)
    # fits, 59 x 8 (20 + 14.3) then not, 30 x none (2.3) does
    assert kept == [cfg(32, "none"), cfg(32, "full"), cfg(30, "none")] and skipped == [cfg(59, accum=8)]
    kept, skipped = affordable(
        wave, steps, leader=leader, finals=2, max_cost=12, probes=probes, final_steps=("auto", "auto")
    )
    assert kept == wave and skipped == []  # 468 - 36 - 110 - 25 = 297 s: all 241.4 s of them
    # a third final reserved (finals=3): 55 s less, and full no longer fits
    kept, skipped = affordable(
        wave, steps, leader=leader, finals=3, max_cost=10, probes=probes, final_steps=("auto", "auto")
    )
    assert skipped == [cfg(32, "full")]
    kept, skipped = affordable(
        wave, steps, leader=leader, finals=2, max_cost=5, probes=probes, final_steps=("auto", "auto")
    )
    assert cfg(32, "full") in skipped and cfg(32, "none") in kept
    # nothing says what a trial costs, or no cap: all kept
    for leader_, cap in ((None, 10), (leader, None), ((cfg(66), {**leader[1], "step_time_s": None}), 10)):
        assert affordable(
            wave, steps, leader=leader_, finals=3, max_cost=cap, probes=probes, final_steps=("auto", "auto")
        ) == (wave, [])


def test_a_probe_may_run_a_few_times_its_prediction_on_fresh_processes_before_it_is_stopped():
    leader = (cfg(66), row(36.0, step=1.2, compile_s=16.0))
    probes = [(cfg(32), row(47.0, compile_s=22.0)), leader]
    unit = one_trial_s(leader[1], [r for _, r in probes], ("auto", "auto"))  # 36 + 3 x 1.2
    # a first compile: full, predicted at regional's 22 s x 10 plus its steps, on top of one fresh trial
    full = probe_s(cfg(32, "full"), SHORT, leader, compile_times(probes))
    assert time_limit_s(cfg(32, "full"), SHORT, leader, probes, ("auto", "auto")) == pytest.approx(
        HANG_X * (unit + full)
    )
    assert HANG_X * (unit + full) > 178.3  # session 10's such probe, all of it (RESULTS.md)
    # a cheap probe: the floor
    assert time_limit_s(cfg(32, "none"), SHORT, leader, probes, ("auto", "auto")) == HANG_FLOOR_S
    # nothing known: the grid's timeout_s stands
    assert time_limit_s(cfg(32), SHORT, None, probes, ("auto", "auto")) is None
    assert time_limit_s(cfg(32), SHORT, (cfg(66), {**leader[1], "step_time_s": None}), probes, ("auto", "auto")) is None
