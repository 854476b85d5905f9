"""The test suite's own machinery (tests/conftest.py): the factories, the marks it enforces, the Ray guard."""

from __future__ import annotations

import os
import shutil
import subprocess
from types import SimpleNamespace

import pytest
import yaml
from conftest import ROOT, mark_errors, result_row, tiny_grid

from sweep.record import store
from sweep.record.schema import COLUMNS, TRAINING_DEFAULTS
from sweep.spec.grid import parse_grid


def test_a_result_row_has_every_column_and_round_trips(tmp_path):
    row = result_row(trial_id="t2", batch_size=8)
    assert tuple(row) == COLUMNS
    assert row["batch_size"] == 8 and row["status"] == "ok" and row["energy_j"] is None
    assert {k: row[k] for k in TRAINING_DEFAULTS} == TRAINING_DEFAULTS
    store.write_row(tmp_path, row)
    (back,) = store.read_table(tmp_path).to_pylist()
    assert back["trial_id"] == "t2" and back["batch_size"] == 8 and back["started_at"] == row["started_at"]


def test_a_result_row_refuses_a_column_the_schema_does_not_have():
    with pytest.raises(KeyError, match="batch"):
        result_row(batch=8)


def test_a_tiny_grid_parses_and_takes_keys_or_leaves_them_out():
    grid = parse_grid(yaml.safe_load(tiny_grid(precisions=["fp32"], gpus=2)))
    assert (grid.batch_sizes, grid.seq_len, grid.steps.warmup, grid.steps.measure) == ([2], [32], 1, 2)
    assert "steps" not in yaml.safe_load(tiny_grid(steps=None))


def _item(name: str, *fixtures: str, marks: tuple[str, ...] = (), function=None):
    return SimpleNamespace(
        nodeid=f"tests/test_x.py::{name}",
        fixturenames=list(fixtures),
        function=function,
        iter_markers=lambda: [SimpleNamespace(name=m) for m in marks],
    )


def _looks_for_a_gpu():
    import torch

    return torch.cuda.is_available()


def test_a_test_that_starts_ray_or_ranks_or_needs_a_gpu_without_its_mark_is_named():
    items = [
        _item("ray", "ray_session", "tmp_path"),
        _item("ranks", "run_ranks"),
        _item("ok_ray", "ray_session", marks=("integration",)),
        _item("unit", "tmp_path"),
        _item("te", "te"),
        _item("te_ok", "te", marks=("gpu",)),
        _item("cuda", function=_looks_for_a_gpu),
    ]
    errors = mark_errors(items)
    assert [e.split(":")[2] for e in errors] == ["ray", "ranks", "te", "cuda"]
    assert "ray_session" in errors[0] and "@pytest.mark.integration" in errors[0]
    assert "@pytest.mark.gpu" in errors[2]


def test_ray_init_raises_in_a_test_without_the_integration_mark():
    import ray

    with pytest.raises(RuntimeError, match="not marked integration"):
        ray.init(address="local")


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (inductor's CPU compiler)")
def test_the_compiler_cache_gives_a_build_of_the_same_inputs_back_and_builds_anything_else(tmp_path):
    """tests/tools/cached-g++ (conftest's CXX for the session): the same source and flags built again come from the
    cache, even with the compiler gone; another source, or another flag, is built by the compiler."""
    wrapper, source, cache, compiler = (tmp_path / name for name in ("cached-g++", "k.cpp", "cache", "cxx"))
    shutil.copy(ROOT / "tests" / "tools" / "cached-g++", wrapper)
    source.write_text('extern "C" int k() { return 1; }\n')
    compiler.write_text('#!/bin/sh\nexec g++ "$@"\n')
    compiler.chmod(0o755)
    env = {**os.environ, "SWEEP_TEST_CXX_CACHE": str(cache), "SWEEP_TEST_REAL_CXX": str(compiler)}

    def build(out: str, *flags: str) -> int:
        cmd = [str(wrapper), str(source), "-shared", "-fPIC", *flags, "-o", str(tmp_path / out)]
        return subprocess.run(cmd, env=env, capture_output=True).returncode

    assert build("a.so", "-O1") == 0 and len(list(cache.iterdir())) == 1
    compiler.write_text("#!/bin/sh\nexit 1\n")  # the compiler gone: only the cache can answer
    assert build("b.so", "-O1") == 0 and (tmp_path / "b.so").read_bytes() == (tmp_path / "a.so").read_bytes()
    assert build("c.so", "-O2") == 1  # another flag: built
    source.write_text('extern "C" int k() { return 2; }\n')
    assert build("d.so", "-O1") == 1  # another source: built
    assert len(list(cache.iterdir())) == 1  # a failed build leaves nothing


def test_the_default_compile_cache_is_under_the_session_s_own_home_not_the_user_s():
    """`_private_home`: the built-in `local` profile keeps the default compile cache, which ranks reach as ${HOME}/...;
    in a test session that is a folder of the session's own, so no test reads or writes the user's ~/.cache/sweep."""
    import pwd

    from clusters.registry import load_profile

    home = os.environ["HOME"]
    assert os.path.basename(home).startswith("sweep-test-home-") and os.path.isdir(home)
    assert home != pwd.getpwuid(os.getuid()).pw_dir
    cache = os.path.expandvars(load_profile("local").compile_cache_env)
    assert cache == os.path.join(home, ".cache", "sweep", "inductor")
