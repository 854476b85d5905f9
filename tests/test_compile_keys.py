"""One graph, one cache key in every process (trainer.compile_keys): torchao's FP8 graphs in AOTAutograd's cache.

Real processes on a shared inductor cache, as a side process compiling ahead and the rank after it are: torchao's
emulated FP8 (CPU) through torch.compile, per block as `compile: regional` compiles. The second process finds the
first one's AOTAutograd entry (it does not trace the forward and backward again) and computes the same gradients; with
torch alone it bypasses that cache for the same graph. Each process is benchmarks/compile_keys_probe.py's step, whose
seconds RESULTS.md has for CPU; what it saves on a GPU is measured there.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchao")

from trainer import compile_keys  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def _probe():
    """benchmarks/compile_keys_probe.py: its `run` is one fresh process's step on a cache."""
    spec = importlib.util.spec_from_file_location("compile_keys_probe", ROOT / "benchmarks" / "compile_keys_probe.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _step(cache: Path, recipe: str, ours: bool) -> dict:
    return _probe().run(cache, recipe, "cpu", ours)


@pytest.mark.integration
def test_a_torchao_graph_compiled_in_one_process_is_found_whole_by_the_next(tmp_path):
    first = _step(tmp_path / "cache", "fp8-torchao-rowwise", ours=True)
    assert first["aot"].get("autograd_cache_saved") == 1, first  # the blocks' one graph, keyed and stored
    second = _step(tmp_path / "cache", "fp8-torchao-rowwise", ours=True)
    assert second["aot"].get("autograd_cache_hit") == 1 and not second["aot"].get("autograd_cache_miss"), second
    assert second["grads"] == first["grads"]

    # torch's keys, on that same cache: the entry is there, and torch alone still bypasses AOTAutograd's cache for
    # the graph (its inductor kernels may load from the FX graph cache, which spares this process their compile)
    alone = _step(tmp_path / "cache", "fp8-torchao-rowwise", ours=False)
    assert alone["aot"].get("autograd_cache_bypass") == 1, alone
    assert not alone["aot"].get("autograd_cache_hit"), alone
    assert alone["grads"] == first["grads"]


def _trampoline(function: type):
    """What dynamo puts in a graph for an allow_in_graph autograd Function (torch._dynamo.variables.misc)."""
    from torch._dynamo.variables.misc import produce_trampoline_autograd_apply

    return produce_trampoline_autograd_apply(function)


def test_the_key_of_a_torchao_function_names_it_torchaos_version_and_the_amax_it_traces(monkeypatch):
    from torchao.float8.float8_linear import matmul_with_hp_or_float8_args

    from trainer.precision import symbolic_amax

    monkeypatch.setattr(symbolic_amax, "_original", None)
    key = compile_keys.function_key("fn", _trampoline(matmul_with_hp_or_float8_args))
    assert key is not None
    assert "torchao.float8.float8_linear.matmul_with_hp_or_float8_args.apply" in key
    assert compile_keys.torchao_fingerprint() in key and "torchao's amax" in key
    monkeypatch.setattr(symbolic_amax, "_original", object())  # sweep's amax replaced torchao's: another trace
    assert compile_keys.function_key("fn", _trampoline(matmul_with_hp_or_float8_args)) != key


def test_other_globals_are_left_to_torch():
    import torch

    class Mine(torch.autograd.Function):
        pass

    assert compile_keys.function_key("fn", _trampoline(Mine)) is None  # not torchao's: torch bypasses it, as before
    assert compile_keys.function_key("relu", torch.relu) is None
    assert compile_keys.function_key("f", lambda: None) is None


def test_install_is_idempotent_and_keeps_what_others_marked():
    import torch._inductor.config as inductor_config
    import torch.fx.graph_module as graph_module

    with inductor_config.patch(unsafe_marked_cacheable_functions={"my.function": "1"}):
        compile_keys.install()
        compile_keys.install()
        marked = inductor_config.unsafe_marked_cacheable_functions
        assert marked["my.function"] == "1"
        assert all(marked[name] == compile_keys.torchao_fingerprint() for name in compile_keys.TORCHAO_IN_GRAPH)
    wrapper = graph_module._format_import_statement
    assert hasattr(wrapper, "sweep_original") and not hasattr(wrapper.sweep_original, "sweep_original")  # wrapped once
