"""Precision recipes as pure data, and the capability check that runs before any GPU time.

A recipe's data is all here: its stack (`backend`), the layers the model is built from, its FP8 scaling in
the stack's own terms and whether FSDP2 gathers FP8 weights. `trainer.precision` turns a recipe into what
training does (module conversion, autocast, FSDP mixed precision), one module per stack, with no branch
on recipe names. This file imports no torch so `sweep plan` can say which trials cannot run, and why,
on any machine.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Literal

Family = Literal["fp32", "bf16", "fp8"]
Backend = Literal["torch", "torchao", "te"]

# What a recipe needs of the hardware is stated here (min_cuda_capability, amd); what each accelerator has
# is in the catalog (`clusters/accelerators.yaml`: NVIDIA compute capability, and whether a part has FP8
# at all). FP8 needs sm_89+ (Ada, Hopper) or an MI300-class GPU (gfx942: e4m3fnuz; gfx950: OCP e4m3fn);
# MXFP8 needs Blackwell (sm_100+).
TE_INSTALL_HINT = "pip install 'sweep[te]' (transformer-engine[pytorch]>=2.10)"
# `sweep[te]` is NVIDIA's build, which cannot drive AMD GPUs: there TE is ROCm's fork (README, Precisions).
TE_ROCM_HINT = (
    "use ROCm's Transformer Engine (github.com/ROCm/TransformerEngine: the one in AMD's ROCm containers, "
    "its transformer_engine_rocm wheels, or a source build), not pip install 'sweep[te]'"
)

# Which vendor's TE is installed, told by the distribution its core library came in: NVIDIA's wheels
# (`pip install 'sweep[te]'`) are transformer-engine-cu12 / -cu13, ROCm's are transformer-engine-rocm. A
# source build is plain transformer-engine for either vendor and says nothing, so it is let through.
TE_BUILDS = {"transformer-engine-cu12": "nvidia", "transformer-engine-cu13": "nvidia", "transformer-engine-rocm": "amd"}


@dataclass(frozen=True, kw_only=True)
class Recipe:
    name: str
    family: Family  # which peak TFLOP/s is the MFU divisor; fp32 trains fp32 parameters, the others bf16
    backend: Backend  # the stack: a module of `trainer.precision`
    summary: str
    layers: Literal["torch", "te"] = "torch"  # the model's layers: torch's (torchao swaps Linear) or TE's
    # FP8 scaling in the stack's own terms, None for none: torchao's recipe name (Float8LinearConfig.
    # from_recipe_name) or the class in transformer_engine.common.recipe, built with `scaling_args`
    # (an fp8_format is the name of a member of TE's Format).
    scaling: str | None = None
    scaling_args: dict[str, Any] = field(default_factory=dict, hash=False)
    # FSDP2 all-gathers FP8 weights (half the bytes of bf16; torchtitan's default for tensorwise) when
    # sharded. On one rank there is nothing to gather and the extra casts cost ~0.1 s/step on GPT-1.5B.
    fp8_all_gather: bool = False
    # torchao: the recipe rounds its scales down to powers of 2 itself (torchao 0.18 Float8LinearConfig.
    # from_recipe_name sets round_scales_to_power_of_2 for rowwise and rowwise_with_gw_hp), so `fp8_pow2_scales`
    # changes nothing there
    pow2_scales: bool = False
    # compiled graphs may take a symbolic batch (the trial option dynamic_batch) at little cost: not torchao's
    # rowwise recipes, whose column scales reduce over the symbolic tokens (25 % slower on one H200;
    # trainer/precision/symbolic_amax.py, benchmarks/RESULTS.md "Compile once per graph"); tensorwise runs 0.2-1.5 %
    # slower than static shapes (benchmarks/RESULTS.md "Cold sweep", session 47)
    symbolic_batch: bool = True
    min_cuda_capability: float = 0.0
    amd: bool = True  # runs on MI300-class GPUs
    cpu: bool = True  # runs on CPU ranks (torchao FP8 only through emulation)


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in [
        Recipe(
            name="bf16",
            family="bf16",
            backend="torch",
            summary="bf16 compute: FSDP2 MixedPrecisionPolicy with bf16 params, fp32 gradient reduction",
        ),
        Recipe(name="fp32", family="fp32", backend="torch", summary="fp32 params and compute (TF32 matmuls on NVIDIA)"),
        Recipe(
            name="fp8-torchao-tensorwise",
            family="fp8",
            backend="torchao",
            min_cuda_capability=8.9,
            scaling="tensorwise",
            fp8_all_gather=True,
            summary="torchao float8, dynamic tensorwise scaling, float8 FSDP all-gather + scale precompute",
        ),
        Recipe(
            name="fp8-torchao-rowwise",
            family="fp8",
            backend="torchao",
            min_cuda_capability=9.0,
            scaling="rowwise",
            pow2_scales=True,
            symbolic_batch=False,
            summary="torchao float8, dynamic rowwise scaling (more accurate, slower casts)",
        ),
        Recipe(
            name="fp8-torchao-rowwise-gw-hp",
            family="fp8",
            backend="torchao",
            min_cuda_capability=9.0,
            scaling="rowwise_with_gw_hp",
            pow2_scales=True,
            symbolic_batch=False,
            summary="torchao float8 rowwise, weight gradient in high precision",
        ),
        Recipe(
            name="bf16-te",
            family="bf16",
            backend="te",
            layers="te",
            min_cuda_capability=8.0,
            cpu=False,
            summary="Transformer Engine layers in bf16, no FP8: the fair baseline for TE FP8",
        ),
        # E4M3 forward / E5M2 backward (TE's HYBRID format), scale from the max of the last 16 amaxes
        Recipe(
            name="fp8-te-delayed",
            family="fp8",
            backend="te",
            layers="te",
            min_cuda_capability=8.9,
            cpu=False,
            scaling="DelayedScaling",
            scaling_args={"fp8_format": "HYBRID", "amax_history_len": 16, "amax_compute_algo": "max"},
            summary="TE DelayedScaling, HYBRID (E4M3 fwd / E5M2 bwd), amax history 16, max",
        ),
        Recipe(
            name="fp8-te-current",
            family="fp8",
            backend="te",
            layers="te",
            min_cuda_capability=8.9,
            cpu=False,
            scaling="Float8CurrentScaling",
            scaling_args={"fp8_format": "HYBRID"},
            summary="TE Float8CurrentScaling (per-tensor scale from the current amax)",
        ),
        Recipe(
            name="fp8-te-block",
            family="fp8",
            backend="te",
            layers="te",
            min_cuda_capability=9.0,
            cpu=False,
            amd=False,
            scaling="Float8BlockScaling",  # 1x128 activations/grads, 128x128 weights, E4M3
            summary="TE Float8BlockScaling (DeepSeek-V3 style 1x128 / 128x128 blocks), Hopper and newer",
        ),
        Recipe(
            name="fp8-te-mxfp8",
            family="fp8",
            backend="te",
            layers="te",
            min_cuda_capability=10.0,
            cpu=False,
            amd=False,
            scaling="MXFP8BlockScaling",  # 32-element blocks, E8M0 scales
            summary="TE MXFP8BlockScaling (32-element blocks, E8M0 scales), Blackwell only",
        ),
    ]
}


@functools.cache  # what is installed does not change while sweep runs; asked once per trial otherwise
def have_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@functools.cache  # as have_module: asked once per process
def te_distributions() -> frozenset[str]:
    """The vendor-specific TE distributions installed here (the keys of TE_BUILDS that pip knows of)."""
    from importlib import metadata

    found = set()
    for name in TE_BUILDS:
        try:
            metadata.distribution(name)  # matches transformer_engine_cu12 as well: names are normalised
        except metadata.PackageNotFoundError:
            continue
        found.add(name)
    return frozenset(found)


def te_build_reason(recipe: Recipe, *, accelerator: str, vendor: str, distributions: frozenset[str]) -> str | None:
    """Why the installed TE is the other vendor's build for this accelerator, or None (pure: `distributions`
    as `te_distributions` finds them)."""
    wrong = sorted(d for d in distributions if TE_BUILDS.get(d, vendor) != vendor)
    if recipe.backend != "te" or vendor not in ("nvidia", "amd") or not wrong:
        return None
    needs, found, then = (
        ("ROCm's", "NVIDIA's", TE_ROCM_HINT) if vendor == "amd" else ("NVIDIA's", "ROCm's", TE_INSTALL_HINT)
    )
    uninstall = " ".join(
        ["transformer-engine", "transformer-engine-torch", *wrong]
    )  # the metapackage, the torch extension
    return (
        f"{recipe.name} on {accelerator} needs {needs} Transformer Engine, but {found} is installed "
        f"({', '.join(wrong)}): pip uninstall -y {uninstall}, then {then}"
    )


def unsupported_reason(
    recipe: Recipe,
    *,
    accelerator: str,
    vendor: str,
    compute_capability: float | None = None,
    has_fp8: bool = True,
    have_te: bool | None = None,
    have_torchao: bool | None = None,
    te_builds: frozenset[str] | None = None,
) -> str | None:
    """Why `recipe` cannot run on this accelerator with what is installed, or None if it can.

    `compute_capability` (NVIDIA) and `has_fp8` (AMD: an MI300-class part) come from the accelerator
    catalog; an NVIDIA part of unknown capability is given the benefit of the doubt. `have_te` /
    `have_torchao` default to whether the package is importable here, and `te_builds` to the vendor TE
    distributions installed here (the driver and the rank processes share one environment on a Ray
    cluster built from one container image).
    """
    hardware = _hardware_reason(
        recipe, accelerator=accelerator, vendor=vendor, compute_capability=compute_capability, has_fp8=has_fp8
    )
    if hardware:  # the hardware answer first: installing a package would not help
        return hardware
    if recipe.backend == "te":  # before "is it there": find_spec finds the wrong build too; it fails in a rank
        builds = te_distributions() if te_builds is None else te_builds
        wrong_build = te_build_reason(recipe, accelerator=accelerator, vendor=vendor, distributions=builds)
        if wrong_build:
            return wrong_build
    have_te = have_module("transformer_engine") if have_te is None else have_te
    have_torchao = have_module("torchao") if have_torchao is None else have_torchao
    if recipe.backend == "te" and not have_te:
        return f"{recipe.name} needs Transformer Engine: {TE_ROCM_HINT if vendor == 'amd' else TE_INSTALL_HINT}"
    if recipe.backend == "torchao" and not have_torchao:
        return f"{recipe.name} needs torchao: pip install torchao"
    return None


def _hardware_reason(
    recipe: Recipe, *, accelerator: str, vendor: str, compute_capability: float | None, has_fp8: bool
) -> str | None:
    if vendor == "cpu":
        return None if recipe.cpu else f"{recipe.name} needs a GPU (Transformer Engine has no CPU kernels)"
    if vendor == "amd":
        if recipe.family == "fp8" and not has_fp8:
            return f"{recipe.name} needs an MI300-class GPU for FP8, not {accelerator}"
        return None if recipe.amd else f"{recipe.name} is not available on AMD GPUs"
    if compute_capability is not None and compute_capability < recipe.min_cuda_capability:
        return (
            f"{recipe.name} needs CUDA compute capability >= {recipe.min_cuda_capability}; "
            f"{accelerator} has {compute_capability}"
        )
    if recipe.family == "fp8" and not has_fp8:  # a declared part may say so without a capability to go by
        return f"{recipe.name} needs FP8 tensor cores; {accelerator} has none (its peak_tflops.fp8 is null)"
    return None
