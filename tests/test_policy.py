"""Retry and search policy: pure logic, no Ray, no torch."""

from __future__ import annotations

import math

import pytest

from sweep.grid import OomPolicy, parse_grid, expand
from sweep.policy import GridPlan, MaxBatchPlan, MaxBatchSearch, infra_retry, next_batch_after_oom


@pytest.mark.parametrize("policy,failed,ok,expected", [
    ("halve", 16, set(), 8),
    ("halve", 1, set(), None),  # below min_batch
    ("next", 16, set(), 15),
    ("next", 1, set(), None),
    ("bisect", 16, {4}, 10),
    ("bisect", 16, set(), 8),
    ("none", 16, set(), None),
])
def test_next_batch_after_oom(policy, failed, ok, expected):
    assert next_batch_after_oom(OomPolicy(policy=policy), failed, ok=ok, tried={failed}) == expected


def test_min_batch_is_respected():
    assert next_batch_after_oom(OomPolicy(policy="halve", min_batch=4), 6, ok=set(), tried={6}) is None


def _trials(batches, **extra):
    grid = parse_grid({"models": ["gpt-tiny"], "batch_sizes": batches, "compile": "none", **extra})
    return expand(grid, cluster="local")


def test_grid_plan_retries_lower_and_links_the_attempt():
    plan = GridPlan(_trials([16]), OomPolicy())
    (first,) = plan.initial()
    (retry,) = plan.on_result(first, "oom")
    assert retry.batch_size == 8 and retry.attempt == 2 and retry.parent_trial_id == first.trial_id
    assert plan.on_result(retry, "ok") == []


def test_a_lower_batch_already_in_the_grid_is_not_run_twice():
    plan = GridPlan(_trials([4, 8]), OomPolicy(policy="halve"))
    four, eight = plan.initial()
    assert plan.on_result(eight, "oom") == []  # 8 // 2 = 4 is the grid's own trial
    (two,) = plan.on_result(four, "oom")
    assert two.batch_size == 2


@pytest.mark.parametrize("policy,batches,chain", [
    ("next", [16], [15, 14]),  # one smaller each time
    ("next", [7, 8], []),  # 8 -> 7 is the grid's own trial: not run twice
    ("halve", [16], [8, 4]),
    ("bisect", [16], [8, 4]),  # nothing known to fit: halve
])
def test_grid_plan_follows_each_policy(policy, batches, chain):
    plan = GridPlan(_trials(batches), OomPolicy(policy=policy))
    trial = plan.initial()[-1]
    got = []
    for _ in chain:
        (trial,) = plan.on_result(trial, "oom")
        got.append(trial.batch_size)
    assert got == chain
    if not chain:
        assert plan.on_result(trial, "oom") == []


def test_infrastructure_failures_are_retried_once_and_nothing_else_is():
    (trial,) = _trials([2])
    retry = infra_retry(trial, "error", infrastructure=True)
    assert retry is not None and retry.retry == 1 and retry.trial_id != trial.trial_id
    assert infra_retry(retry, "error", infrastructure=True) is None
    for status in ("oom", "timeout", "unsupported"):
        assert infra_retry(trial, status, infrastructure=True) is None
    assert infra_retry(trial, "error", infrastructure=False) is None


def _simulate(limit: int, *, start: int = 1, capacity: float | None = None, per_sample: float = 10.0,
              base: float = 100.0, step: int = 1) -> MaxBatchSearch:
    """Drive a search against a device where `limit` samples fit (memory = base + per_sample * batch)."""
    search = MaxBatchSearch(start=start, capacity_bytes=capacity, step=step)
    while (batch := search.next_probe()) is not None:
        assert batch not in search.probes, "a batch is never probed twice"
        fits = batch <= limit
        search.record(batch, "ok" if fits else "oom", peak_mem_bytes=base + per_sample * batch if fits else None,
                      tokens_per_s=1000.0 * batch / (1 + max(0, batch - limit + 3)))
    return search


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 7, 8, 13, 31, 64, 100, 257, 1000])
def test_max_batch_search_is_exact_in_log_probes(limit):
    search = _simulate(limit)
    assert search.largest_ok == limit and search.smallest_failed == limit + 1
    assert len(search.probes) <= 2 * math.ceil(math.log2(limit + 1)) + 1


@pytest.mark.parametrize("limit", [5, 37, 100, 999])
def test_memory_prediction_cuts_probes(limit):
    per_sample, base = 10.0, 100.0
    capacity = base + per_sample * (limit + 0.5)  # the device holds `limit` samples
    predicted = _simulate(limit, capacity=capacity, per_sample=per_sample, base=base)
    blind = _simulate(limit)
    assert predicted.largest_ok == limit and predicted.smallest_failed == limit + 1
    assert len(predicted.probes) <= 5 and len(predicted.probes) <= len(blind.probes)


def test_coarse_step_stops_within_the_step():
    search = _simulate(50, start=8, step=8)
    assert search.largest_ok <= 50 < search.smallest_failed <= search.largest_ok + 8


def test_first_probe_failing_searches_down():
    search = _simulate(3, start=16)
    assert search.largest_ok == 3 and search.smallest_failed == 4


def test_fastest_batch_differs_from_largest():
    search = _simulate(10)
    assert search.largest_ok == 10 and search.fastest() < 10


def test_non_memory_failure_aborts_the_search():
    search = MaxBatchSearch()
    search.record(1, "ok", peak_mem_bytes=1.0, tokens_per_s=1.0)
    search.record(2, "error")
    assert search.next_probe() is None and search.aborted == "error"


def test_max_batch_plan_runs_one_search_per_config():
    trials = _trials([1], precisions=["bf16", "fp32"])
    plan = MaxBatchPlan(trials, capacity_bytes=None)
    first = plan.initial()
    assert len(first) == 2 and len({t.search_id for t in first}) == 2
    follow = plan.on_result(first[0], "ok", row={"peak_mem_gib": 0.1, "tokens_per_s_per_gpu": 10.0})
    assert [t.batch_size for t in follow] == [2] and follow[0].search_id == first[0].search_id
    (verdict, _) = plan.verdicts()
    assert verdict["max_batch"] == 1 and verdict["probes"] == 1


def test_max_batch_searches_apart_per_training_option():
    """grad_accum 1 and 8 are different questions: two searches, each verdict naming its options."""
    plan = MaxBatchPlan(_trials([2], grad_accum=[1, 8]), capacity_bytes=None)
    first = plan.initial()
    assert len({t.search_id for t in first}) == 2
    assert sorted(v["options"] for v in plan.verdicts()) == ["", "grad_accum=8"]
