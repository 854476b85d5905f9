"""The warm-up and measurement stopping rules (trainer/stopping.py): pure, no torch."""

import random

import pytest

from trainer.stopping import Fixed, Measure, Schedule, WarmUp, ci_half_width_pct, median_ci


def feed(rule, times):
    """Add times until the rule says stop; how many it took."""
    for n, t in enumerate(times, 1):
        if rule.add(t):
            return n
    raise AssertionError(f"never stopped after {len(times)} steps")


# -- the median's confidence interval ------------------------------------------------------------


@pytest.mark.parametrize(
    "n, ranks", [(6, (1, 6)), (8, (1, 8)), (9, (2, 8)), (10, (2, 9)), (20, (6, 15)), (50, (18, 33)), (100, (40, 61))]
)
def test_median_ci_ranks_match_the_published_table(n, ranks):
    # Campbell & Gardner (BMJ 1988), table 1: the order statistics bounding the 95 % CI of a median
    data = [10.0 * i for i in range(1, n + 1)]
    random.Random(n).shuffle(data)  # the order of arrival must not matter
    assert median_ci(data) == (10.0 * ranks[0], 10.0 * ranks[1])


def test_no_interval_below_six_samples_at_95_percent():
    # with 5 samples even min..max covers the median with probability 1 - 2/32 = 93.75 % < 95 %
    assert median_ci([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    assert ci_half_width_pct([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    assert median_ci([1.0, 2.0, 3.0, 4.0, 5.0], confidence=0.9) == (1.0, 5.0)


def test_half_width_is_the_farther_end_in_percent_of_the_median():
    # n = 10: CI = x(2)..x(9) = 99..104; median = (100 + 100) / 2 = 100; farther end 104 -> 4 %
    times = [90.0, 99.0, 100.0, 100.0, 100.0, 100.0, 101.0, 102.0, 104.0, 200.0]
    assert ci_half_width_pct(times) == pytest.approx(4.0)


# -- warm-up -------------------------------------------------------------------------------------


def test_warmup_stops_once_two_successive_steps_agree():
    # compile step, a slow second one (+50 %), then steady: steps 3 and 4 are within 10 % of each other
    assert feed(WarmUp(), [30.0, 1.5, 1.00, 1.01, 1.005, 1.0, 1.0]) == 4
    assert feed(WarmUp(), [1.0, 1.0, 1.0, 1.0]) == 2  # no compile: as soon as two steps exist


def test_warmup_takes_steady_steps_that_alternate():
    # an H200's steady steps after the compile (fp8-torchao-tensorwise batch 6, session 18): 3-6 % apart, each pair
    # within 10 %: warm-up ends at the third step, where three within 2 % waited for the eleventh
    times = [14.218, 0.519, 0.549, 0.524, 0.547, 0.528, 0.542, 0.531, 0.543, 0.533, 0.543, 0.532]
    assert feed(WarmUp(), times) == 3
    assert feed(WarmUp(tolerance=0.02, window=3, min_steps=3), times) == 11


def test_warmup_a_spread_over_ten_percent_continues():
    # each pair spans 12 % until 1.01, 1.005 arrive
    times = [5.0, 1.0, 1.12, 1.0, 1.12, 1.0, 1.12, 1.0, 1.01, 1.005]
    assert feed(WarmUp(), times) == 9


def test_warmup_min_and_max():
    assert feed(WarmUp(min_steps=6), [1.0] * 10) == 6
    assert feed(WarmUp(), [1.0, 1.2] * 40) == 50  # never two in agreement: the cap
    assert feed(WarmUp(max_steps=7), [1.0, 1.2] * 40) == 7


# -- measurement ---------------------------------------------------------------------------------


def test_stable_steps_stop_at_the_first_interval():
    m = Measure()
    assert feed(m, [2.0] * 100) == 6  # n = 6 is the first with a 95 % interval, and it is 0 wide
    assert m.ci_pct == 0.0
    jitter = random.Random(1)
    m = Measure()
    n = feed(m, [1.0 + jitter.gauss(0, 0.002) for _ in range(100)])  # 0.2 % noise
    assert n < 20 and m.ci_pct <= 1.0


def test_noisy_steps_run_to_the_cap():
    noise = random.Random(2)
    m = Measure()
    assert feed(m, [noise.uniform(0.5, 1.5) for _ in range(200)]) == 100
    assert m.ci_pct > 1.0
    assert feed(Measure(max_steps=30), [noise.uniform(0.5, 1.5) for _ in range(200)]) == 30


def test_measure_minimum_is_kept():
    assert feed(Measure(min_steps=12), [2.0] * 100) == 12


def test_time_cap_stops_measurement_after_the_minimum():
    noise = random.Random(3)
    times = [noise.uniform(0.5, 1.5) for _ in range(200)]
    n = feed(Measure(time_cap_s=20.0), times)
    assert sum(times[:n]) >= 20.0 > sum(times[: n - 1])
    assert feed(Measure(time_cap_s=20.0), [60.0] * 10) == 5  # the cap never cuts below min_steps


# -- fixed counts and the schedule ---------------------------------------------------------------


def test_fixed_counts():
    assert feed(Fixed(3), [1.0, 9.0, 0.1, 5.0]) == 3
    assert Fixed(0).done


def test_schedule_fixed_counts_are_exact_and_need_no_agreement():
    s = Schedule(1, 3)
    assert not s.adaptive
    phases = [s.add(t) for t in (9.0, 1.0, 5.0, 0.1)]
    assert phases == ["measure", "measure", "measure", "done"]
    assert s.warmup.times == [9.0] and s.measure.times == [1.0, 5.0, 0.1]
    with pytest.raises(RuntimeError):
        s.add(1.0)
    assert Schedule(0, 2).phase == "measure"


def test_schedule_auto_and_a_follower_end_on_the_same_step():
    leader, follower = Schedule("auto", "auto"), Schedule("auto", "auto")
    assert leader.adaptive
    steps = iter([20.0, 1.2, 1.0, 1.0, 1.0] + [1.0] * 200)
    follower_times = iter([25.0, 3.0, 1.3, 2.0, 1.1] + [0.5, 1.5] * 100)  # never stable on its own
    while leader.phase != "done":
        follower.follow(next(follower_times), leader.add(next(steps)))
    assert follower.phase == "done"
    assert (len(leader.warmup.times), len(leader.measure.times)) == (4, 6)  # 1.2 then 1.0: 20 % apart
    assert (len(follower.warmup.times), len(follower.measure.times)) == (4, 6)
    assert leader.times == [20.0, 1.2, 1.0, 1.0] + [1.0] * 6


def test_schedule_auto_max_stops_noisy_steps_there_and_leaves_counts_alone():
    noisy = [1.0, 1.3] * 200  # warm-up never agrees, measurement never tightens: the rules' maxima (50, 100)
    s = Schedule("auto", "auto")
    while s.phase != "done":
        s.add(noisy[len(s.times)])
    assert (len(s.warmup.times), len(s.measure.times)) == (50, 100)
    capped = Schedule("auto", "auto", auto_max=(8, 16))  # a tune's final (sweep.search.fastest.cost.final_auto_max)
    while capped.phase != "done":
        capped.add(noisy[len(capped.times)])
    assert (len(capped.warmup.times), len(capped.measure.times)) == (8, 16)
    # stable steps stop before the maxima as before; a maximum under a rule's minimum keeps the minimum
    stable = Schedule("auto", "auto", auto_max=(8, 16))
    while stable.phase != "done":
        stable.add(1.0)
    assert (len(stable.warmup.times), len(stable.measure.times)) == (2, 6)
    least = Schedule("auto", "auto", auto_max=(1, 1))
    while least.phase != "done":
        least.add(noisy[len(least.times)])
    assert (len(least.warmup.times), len(least.measure.times)) == (2, 5)
    fixed = Schedule(2, 30, auto_max=(8, 16))  # counts are what they say
    while fixed.phase != "done":
        fixed.add(1.0)
    assert (len(fixed.warmup.times), len(fixed.measure.times)) == (2, 30)
