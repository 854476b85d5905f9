"""`sweep tune --vary tp` on two real gloo CPU ranks (issue 33 item 5): one search per layout, each of whose probes
ran at its layout, and a verdict per layout that names it. The search's logic is tested in tests/test_tune_layouts.py
against a simulated runner; here the claims are the ones a user checks in what was written."""

from __future__ import annotations

import json

import pyarrow.dataset as ds
import pytest

pytestmark = pytest.mark.integration


def test_tune_vary_tp_searches_each_layout_apart(ray_session, cli, tmp_path):
    out = tmp_path / "out"
    # llama-tiny on 2 ranks: tp 1 and tp 2 split it (its 4 heads, 2 kv heads); budget 4: a probe, two finals, a profile
    result = cli(
        "tune",
        "--model",
        "llama-tiny",
        "--precision",
        "fp32",
        "--gpus",
        "2",
        "--seq-len",
        "64",
        "--compile",
        "none",
        "--vary",
        "tp",
        "--budget",
        "4",
        "--start",
        "2",
        "--warmup",
        "1",
        "--measure",
        "2",
        "--cluster",
        "local",
        "--output",
        out,
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    (path,) = (out / "_search").glob("*.json")
    verdicts = json.loads(path.read_text())
    assert sorted((v["dp_replicate"], v["tp"]) for v in verdicts) == [(1, 1), (1, 2)]
    rows = ds.dataset(out, format="parquet").to_table().to_pylist()
    for v in verdicts:
        assert v["aborted"] is None and v["allowed"] == ["tp"], v
        probes = [r for r in rows if r["search_id"] == v["search_id"]]
        assert probes and len(probes) == v["probes"] <= 4
        assert {(r["tp"], r["dp_shard"]) for r in probes} == {(v["tp"], 2 // v["tp"])}
        assert all(r["status"] == "ok" for r in probes), [r["error"] for r in probes]
        (best,) = [r for r in probes if r["trial_id"] == v["best_trial_id"]]
        assert best["tflops_per_gpu"] == v["tflops_at_best"]
    assert {r["search_id"] for r in rows} == {v["search_id"] for v in verdicts}
    assert "llama-tiny tp 2" in result.stdout  # the verdict table names the layout
