"""`tune.vary` naming tp or dp_replicate (issue 33 item 5): one search per layout
(sweep.spec.layout.searched_layouts, sweep.search.fastest.plan). Pure: the plan is driven by a simulated runner, as in
tests/test_tune.py; the real run on CPU ranks is in tests/test_tune_layouts_run.py."""

from __future__ import annotations

import hashlib
from collections import deque

import pytest
from conftest import verdicts_json

from sweep.errors import UserError
from sweep.search.fastest.plan import TunePlan, fastest_search_id, search_group
from sweep.spec.expand import expand
from sweep.spec.grid import parse_grid

GIB = 1024**3


def grid(**extra):
    # llama-tiny: 4 heads, 2 kv heads, ffn 192, vocab 512: tp 1 and 2 split it, tp 4 does not (2 kv heads)
    data = {
        "models": ["llama-tiny"],
        "precisions": ["bf16"],
        "batch_sizes": [2],
        "gpus": 4,
        "seq_len": 64,
        "compile": "none",
        "search": "fastest",
        "steps": {"warmup": 1, "measure": 2},
        "tune": {"vary": ["batch_size"], "budget": 6},
        **extra,
    }
    spec = parse_grid(data)
    return spec, expand(spec, cluster="local")


def plan(ranks_per_node=None, **extra) -> TunePlan:
    spec, trials = grid(**extra)
    return TunePlan(trials, spec, capacity_bytes=40 * GIB, ranks_per_node=ranks_per_node)


def layouts(p: TunePlan) -> list[tuple[int, int]]:
    return [(s.space.template.dp_replicate, s.space.template.tp) for s in p.searches.values()]


def test_vary_tp_searches_each_divisor_of_the_ranks_that_splits_the_model():
    p = plan(tune={"vary": ["batch_size", "tp"], "budget": 6})
    assert layouts(p) == [(1, 1), (1, 2)]  # tp 4 does not divide llama-tiny's 2 kv heads
    assert {t.tp for t in p.initial()} == {1, 2}


def test_vary_dp_replicate_and_tp_search_the_layouts_that_divide_the_ranks():
    p = plan(tune={"vary": ["tp", "dp_replicate"], "budget": 6})
    assert layouts(p) == [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2)]  # 4 x 2 is 8 ranks: not within 4


def test_vary_tp_keeps_to_the_grids_list_when_it_lists_several():
    assert layouts(plan(tp=[1, 2], tune={"vary": ["batch_size", "tp"], "budget": 6})) == [(1, 1), (1, 2)]
    assert layouts(plan(tp=[2, 1], tune={"vary": ["batch_size", "tp"], "budget": 6})) == [(1, 2), (1, 1)]


def test_tp_not_named_in_vary_stays_at_the_grids_first_value():
    assert layouts(plan(tp=[1, 2])) == [(1, 1)]
    assert layouts(plan(tp=[2, 1])) == [(1, 2)]


def test_a_layout_the_recipe_does_not_build_or_a_node_cannot_hold_is_not_searched():
    # torchao float8 with tensor parallel is not built (sweep.spec.layout.layout_unsupported)
    assert layouts(plan(precisions=["fp8-torchao-tensorwise"], tune={"vary": ["tp"], "budget": 6})) == [(1, 1)]
    # 4 ranks over nodes of 1: a TP group would span nodes
    assert layouts(plan(ranks_per_node=1, tune={"vary": ["tp"], "budget": 6})) == [(1, 1)]
    assert layouts(plan(ranks_per_node=2, tune={"vary": ["tp"], "budget": 6})) == [(1, 1), (1, 2)]


def test_vary_names_an_unknown_option_in_one_line():
    with pytest.raises(UserError, match="cp"):
        grid(tune={"vary": ["cp"]})


def run(p: TunePlan, tflops) -> list:
    """The runner's loop (sweep.execution.runner): every probe fits; `tflops(trial)` is its speed."""
    queue, asked = deque(p.initial()), []
    while queue:
        t = queue.popleft()
        asked.append(t)
        row = {
            "trial_id": t.trial_id,
            "status": "ok",
            "tflops_per_gpu": tflops(t),
            "tokens_per_s_per_gpu": 1.0,
            "peak_mem_gib": 1.0 + t.batch_size / t.tp,
            "alloc_retries": 0,
        }
        queue.extend(p.on_result(t, "ok", False, row))
    return asked


def test_each_layout_is_searched_apart_and_its_verdict_names_it():
    p = plan(tune={"vary": ["batch_size", "tp"], "budget": 6})
    asked = run(p, lambda t: t.batch_size * (2.0 if t.tp == 2 else 1.0))
    verdicts = verdicts_json(p)
    assert [(v["dp_replicate"], v["tp"]) for v in verdicts] == [(1, 1), (1, 2)]
    assert len({v["search_id"] for v in verdicts}) == 2
    for v in verdicts:  # a search's probes all ran at its layout, within its own budget
        probes = [t for t in asked if t.search_id == v["search_id"]]
        assert probes and {t.tp for t in probes} == {v["tp"]} and v["probes"] == len(probes) <= 6
        assert v["best"] is not None and v["aborted"] is None
    assert verdicts[1]["tflops_at_best"] > verdicts[0]["tflops_at_best"]


def test_a_search_that_does_not_vary_a_layout_keeps_its_id():
    """A resumed search finds its probes by its id: the layout enters it only off the default."""
    spec, trials = grid()
    t = trials[0]
    before = hashlib.sha256(repr((search_group(t), spec.tune.vary, None)).encode()).hexdigest()[:12]
    assert fastest_search_id(t, spec.tune) == before
    spec2, trials2 = grid(tp=2)
    assert fastest_search_id(trials2[0], spec2.tune) != fastest_search_id(t, spec.tune)
    assert "tp" not in verdicts_json(TunePlan(trials, spec, capacity_bytes=None))[0]
