"""Precision recipes: which can run where, the torchao/TE plans, and FP8 training under FSDP2.

CPU: the capability check over every accelerator class; the TE plan's logic with a stand-in for
Transformer Engine (TE cannot be imported without CUDA); torchao FP8 (tensorwise, rowwise,
rowwise-gw-hp) trained for real by `trainer.worker.RankWorker` on two gloo ranks with emulated FP8
matmuls. GPU tests (marked `gpu`) run on the H200s and skip only without a GPU: on one, a TE recipe the
part can run must be supported and train (a missing Transformer Engine fails them).
"""

from __future__ import annotations

import contextlib
import sys
import types

import pytest
import torch
import torch.nn as nn

from clusters.catalog import load_catalog
from trainer.models import ModelSpec, build_model
from trainer.options import TrainingOptions
from trainer.precision import precision_plan
from trainer.precision.torchao_fp8 import fp8_module_filter
from trainer.recipes import RECIPES, unsupported_reason

TORCHAO_FP8 = ["fp8-torchao-tensorwise", "fp8-torchao-rowwise", "fp8-torchao-rowwise-gw-hp"]
TE = ["bf16-te", "fp8-te-delayed", "fp8-te-current", "fp8-te-block", "fp8-te-mxfp8"]
# What the capability check is told of each part: the catalog's entries, plus an A100 (sm_80, no FP8) as a
# profile for a part the catalog lacks would describe it.
HARDWARE = {
    name: {"vendor": a.vendor, "compute_capability": a.compute_capability, "has_fp8": a.peak_tflops["fp8"] is not None}
    for name, a in load_catalog().items()
}
HARDWARE["a100"] = {"vendor": "nvidia", "compute_capability": 8.0, "has_fp8": False}

# Every dim a multiple of 16 (FP8 GEMMs need it; trainer.precision.torchao_fp8.fp8_module_filter checks it).
FP8_SPEC = ModelSpec(
    arch="llama", name="llama-fp8-tiny", n_layers=2, d_embd=64, n_heads=4, n_kv_heads=2, ffn_hidden=192, vocab_size=512
)


# -- capability check ----------------------------------------------------------------------------


def _runs(accelerator: str, *, have_te: bool = True, have_torchao: bool = True) -> set[str]:
    return {
        name
        for name, recipe in RECIPES.items()
        if unsupported_reason(
            recipe, accelerator=accelerator, **HARDWARE[accelerator], have_te=have_te, have_torchao=have_torchao
        )
        is None
    }


def test_capability_matrix():
    everything = set(RECIPES)
    torch_only = {"bf16", "fp32"}
    assert _runs("cpu") == torch_only | set(TORCHAO_FP8)  # torchao FP8 emulated; TE has no CPU kernels
    assert _runs("a100") == torch_only | {"bf16-te"}  # sm_80: no FP8
    assert _runs("h100") == _runs("h200") == everything - {"fp8-te-mxfp8"}  # MXFP8 is Blackwell-only
    assert _runs("b200") == everything
    assert _runs("mi300x") == _runs("mi355x") == everything - {"fp8-te-block", "fp8-te-mxfp8"}
    # an AMD part without FP8 (a hypothetical one: every catalog AMD part has it) runs no FP8 recipe
    no_fp8 = unsupported_reason(RECIPES["fp8-te-delayed"], accelerator="mi250x", vendor="amd", has_fp8=False)
    assert "MI300-class" in no_fp8


def test_missing_packages_are_named_with_the_fix():
    assert _runs("h200", have_te=False) == {"bf16", "fp32"} | set(TORCHAO_FP8)
    assert _runs("h200", have_torchao=False) == {"bf16", "fp32"} | set(TE) - {"fp8-te-mxfp8"}
    reason = unsupported_reason(RECIPES["fp8-te-delayed"], accelerator="h200", **HARDWARE["h200"], have_te=False)
    assert "Transformer Engine" in reason and "pip install" in reason
    reason = unsupported_reason(
        RECIPES["fp8-torchao-rowwise"], accelerator="h200", **HARDWARE["h200"], have_torchao=False
    )
    assert "pip install torchao" in reason
    # TE present but a CPU rank: the reason is the hardware, not the package
    assert "needs a GPU" in unsupported_reason(RECIPES["bf16-te"], accelerator="cpu", vendor="cpu", have_te=True)
    assert "compute capability >= 8.9" in unsupported_reason(
        RECIPES["fp8-torchao-tensorwise"], accelerator="a100", **HARDWARE["a100"]
    )
    assert "Blackwell" in RECIPES["fp8-te-mxfp8"].summary


def test_unknown_accelerators_are_not_refused_by_capability():
    # a GPU the table does not know (a new part) is given the benefit of the doubt
    assert unsupported_reason(RECIPES["fp8-te-mxfp8"], accelerator="x300", vendor="nvidia", have_te=True) is None


# -- the recipe table drives the stacks -------------------------------------------------------------


def test_each_recipe_states_its_stack_layers_and_scaling():
    """What differs between the recipes of a stack is data in the table: FP8 recipes name their scaling, the
    others have none; TE recipes build TE layers; only the stack that all-gathers FP8 weights says so."""
    from trainer.precision import STACKS

    for recipe in RECIPES.values():
        assert recipe.backend in STACKS, recipe.name
        assert (recipe.scaling is not None) == (recipe.family == "fp8"), recipe.name
        assert recipe.layers == ("te" if recipe.backend == "te" else "torch"), recipe.name
        assert not recipe.fp8_all_gather or recipe.backend == "torchao", recipe.name
        assert not recipe.scaling_args or recipe.backend == "te", recipe.name


@pytest.mark.parametrize("sharded", [True, False])
def test_torchao_all_gathers_fp8_weights_only_where_the_recipe_says_and_ranks_shard(sharded):
    from torchao.float8.float8_linear import Float8LinearConfig

    def config(name: str) -> Float8LinearConfig:
        """The config the converted layers train with."""
        model = build_model(FP8_SPEC)
        precision_plan(name, device_type="cpu", sharded=sharded).convert(model)
        (config,) = {m.config for m in model.modules() if hasattr(m, "config") and isinstance(m, nn.Linear)}
        return config

    assert config("fp8-torchao-tensorwise").enable_fsdp_float8_all_gather is sharded
    assert all(config(name).emulate for name in TORCHAO_FP8)  # CPU ranks: emulated matmuls
    assert not any(config(name).enable_fsdp_float8_all_gather for name in TORCHAO_FP8[1:])


# -- torchao plans --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TORCHAO_FP8)
def test_torchao_convert_swaps_every_eligible_linear_but_the_head(name):
    from torchao.float8.float8_linear import Float8Linear

    model = build_model(FP8_SPEC)
    eligible = {fqn for fqn, m in model.named_modules() if fp8_module_filter(m, fqn)}
    precision_plan(name, device_type="cpu").convert(model)
    converted = {fqn for fqn, m in model.named_modules() if isinstance(m, Float8Linear)}
    assert converted == eligible and len(converted) == 7 * FP8_SPEC.n_layers  # wq wk wv wo w1 w2 w3
    assert not isinstance(model.output, Float8Linear)


def test_fp8_lm_head_converts_the_head_too():
    from torchao.float8.float8_linear import Float8Linear

    model = build_model(FP8_SPEC)
    precision_plan("fp8-torchao-tensorwise", device_type="cpu", options=TrainingOptions(fp8_lm_head=True)).convert(
        model
    )
    assert isinstance(model.output, Float8Linear)
    assert sum(isinstance(m, Float8Linear) for m in model.modules()) == 7 * FP8_SPEC.n_layers + 1


def _rank_main(jobs: list, queue) -> None:
    from trainer.worker import RankWorker

    torch.set_num_threads(1)
    for job in jobs:
        queue.put((job.trial.precision, job.rank, RankWorker().run(job)))


@pytest.mark.integration
def test_torchao_fp8_trains_under_fsdp2_on_two_cpu_ranks(rank_jobs, run_ranks):
    """Each torchao FP8 recipe, emulated, FSDP2 over gloo: 2 processes run the three recipes in turn."""
    trials = [rank_jobs(FP8_SPEC, name, world_size=2) for name in TORCHAO_FP8]
    results = {
        (name, rank): r
        for name, rank, r in run_ranks(_rank_main, [[t[r] for t in trials] for r in range(2)], timeout=240)
    }
    n = FP8_SPEC.n_params()
    for (name, rank), r in sorted(results.items()):
        assert r.status == "ok", f"{name} rank {rank}: {r.error}\n{r.traceback}"
        assert r.loss_last < r.loss_first, (name, rank, r.loss_first, r.loss_last)
        assert abs(r.params_local - n / 2) <= 0.01 * n, (name, rank, r.params_local, n)
        assert r.n_params == n


# -- Transformer Engine plan (logic, with a stand-in for TE) ---------------------------------------


class _Recipe:
    def __init__(self, **kw):
        self.kw = kw


def _fake_te(with_autocast: bool = True):
    """Stand-ins for `transformer_engine.pytorch` and `transformer_engine.common.recipe` that record calls."""
    recipe_mod = types.SimpleNamespace(
        Format=types.SimpleNamespace(HYBRID="HYBRID", E4M3="E4M3"),
        **{
            cls: type(cls, (_Recipe,), {})
            for cls in ("DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling", "MXFP8BlockScaling")
        },
    )
    calls = []

    @contextlib.contextmanager
    def record(**kw):
        calls.append(kw)
        yield

    te_pytorch = types.SimpleNamespace(fp8_autocast=lambda **kw: record(api="fp8_autocast", **kw))
    if with_autocast:
        te_pytorch.autocast = lambda **kw: record(api="autocast", **kw)
    return te_pytorch, recipe_mod, calls


EXPECTED_TE = {
    "bf16-te": None,
    "fp8-te-delayed": ("DelayedScaling", {"fp8_format": "HYBRID", "amax_history_len": 16, "amax_compute_algo": "max"}),
    "fp8-te-current": ("Float8CurrentScaling", {"fp8_format": "HYBRID"}),
    "fp8-te-block": ("Float8BlockScaling", {}),
    "fp8-te-mxfp8": ("MXFP8BlockScaling", {}),
}


@pytest.mark.parametrize("name", TE)
def test_te_plan_recipe_and_autocast(name):
    from trainer.precision.te import te_plan

    te_pytorch, recipe_mod, calls = _fake_te()
    plan = te_plan(RECIPES[name], te_pytorch=te_pytorch, recipe_module=recipe_mod)
    assert plan.model_backend == "te" and plan.param_dtype == torch.bfloat16
    with plan.forward_context():
        pass
    if EXPECTED_TE[name] is None:
        assert calls == []  # bf16-te: TE layers, no FP8 region at all
        return
    cls, kw = EXPECTED_TE[name]
    (call,) = calls
    assert call["api"] == "autocast" and call["enabled"] is True
    assert type(call["recipe"]).__name__ == cls and call["recipe"].kw == kw


def test_te_plan_falls_back_to_fp8_autocast_on_older_te():
    from trainer.precision.te import te_plan

    te_pytorch, recipe_mod, calls = _fake_te(with_autocast=False)
    plan = te_plan(RECIPES["fp8-te-delayed"], te_pytorch=te_pytorch, recipe_module=recipe_mod)
    with plan.forward_context():
        pass
    assert calls[0]["api"] == "fp8_autocast" and type(calls[0]["fp8_recipe"]).__name__ == "DelayedScaling"


def test_te_mp_policy_keeps_rope_angles_fp32():
    from trainer.precision.te import te_plan

    te_pytorch, recipe_mod, _ = _fake_te()
    policy = te_plan(RECIPES["fp8-te-delayed"], te_pytorch=te_pytorch, recipe_module=recipe_mod).mp_policy()
    assert policy.param_dtype == torch.bfloat16 and policy.reduce_dtype == torch.float32
    assert policy.cast_forward_inputs is False


def test_te_plan_rejects_other_backends_and_missing_te(monkeypatch):
    from trainer.precision.te import te_plan

    with pytest.raises(ValueError, match="backend is torchao"):
        te_plan(RECIPES["fp8-torchao-tensorwise"], te_pytorch=types.SimpleNamespace())
    monkeypatch.setitem(sys.modules, "transformer_engine", None)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", None)
    with pytest.raises(ImportError, match=r"fp8-te-current needs Transformer Engine.*pip install 'sweep\[te\]'"):
        precision_plan("fp8-te-current", device_type="cuda")


# -- GPU: the real thing (H200s) -----------------------------------------------------------------

# What each TE recipe needs, from NVIDIA's Transformer Engine documentation and written here apart from
# trainer/recipes.py and the catalog: the GPU test below checks those against the GPU it runs on, so a wrong
# entry in either fails on a GPU that runs the recipe instead of skipping it (an H200 is sm_90: all four).
TE_MIN_CAPABILITY = {"bf16-te": (8, 0), "fp8-te-delayed": (8, 9), "fp8-te-current": (8, 9), "fp8-te-block": (9, 0)}


def _catalog_entry(device_name: str):
    """The catalog's entry for a CUDA device name ('NVIDIA H200' -> h200, 'NVIDIA H100 PCIe' -> h100-pcie)."""
    squeezed = device_name.lower().replace(" ", "").replace("-", "")
    names = sorted(load_catalog(), key=len, reverse=True)  # the most specific name first: h100-pcie before h100
    name = next((n for n in names if n.replace("-", "") in squeezed), None)
    return name and load_catalog()[name]


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(TE_MIN_CAPABILITY))
@pytest.mark.parametrize("arch", ["llama", "gpt"])
def test_te_recipes_train_on_a_gpu(run_one_rank, name, arch):
    if not torch.cuda.is_available() or torch.version.hip:
        pytest.skip("needs an NVIDIA GPU")
    capability = torch.cuda.get_device_capability()
    device = torch.cuda.get_device_name()
    # what `sweep plan/run` decides: from the catalog's entry for this part (a profile names it), else the device
    entry = _catalog_entry(device)
    if entry is not None:
        assert entry.compute_capability == capability[0] + capability[1] / 10, f"catalog {entry.name} vs {device}"
    known = entry.compute_capability if entry is not None else capability[0] + capability[1] / 10
    reason = unsupported_reason(
        RECIPES[name], accelerator=device, vendor="nvidia", compute_capability=known, have_te=True
    )
    if capability < TE_MIN_CAPABILITY[name]:  # a part that cannot run it: the check must say so
        assert reason is not None and "compute capability" in reason, reason
        return
    assert reason is None, f"{name} runs on {device} (sm_{capability[0]}{capability[1]}); sweep refuses it: {reason}"
    try:
        import transformer_engine.pytorch  # noqa: F401
    except ImportError as e:
        pytest.fail(f"the GPU tests train the TE recipes: pip install -e '.[te]' ({e})")
    # every GEMM dim a multiple of 128 (Float8BlockScaling's block), head dim 32
    spec = (
        ModelSpec(arch="llama", n_layers=2, d_embd=128, n_heads=4, n_kv_heads=2, ffn_hidden=384, vocab_size=512)
        if arch == "llama"
        else ModelSpec(arch="gpt", n_layers=2, d_embd=128, n_heads=4, vocab_size=512, max_seq_len=256)
    )
    r = run_one_rank(spec, name, device_type="cuda", seq_len=128, warmup_steps=2, measure_steps=6)
    assert r.status == "ok", f"{r.error}\n{r.traceback}"
    assert r.loss_last < r.loss_first
    assert r.params_local == spec.n_params() and r.te_version


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["bf16", *TORCHAO_FP8])
def test_torch_recipes_train_on_a_gpu(run_one_rank, name):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    r = run_one_rank(FP8_SPEC, name, device_type="cuda", seq_len=128, warmup_steps=2, measure_steps=6)
    assert r.status == "ok", f"{r.error}\n{r.traceback}"
    assert r.loss_last < r.loss_first
