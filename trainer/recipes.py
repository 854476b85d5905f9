"""Precision recipes as pure data, and the capability check that runs before any GPU time.

The torch side (module conversion, autocast, FSDP mixed precision) is `trainer.precision`. This file
imports no torch so `sweep plan` can say which trials cannot run, and why, on any machine.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from typing import Literal

Family = Literal["fp32", "bf16", "fp8"]
Backend = Literal["torch", "torchao", "te"]

# What a recipe needs of the hardware is stated here (min_cuda_capability, amd); what each accelerator has
# is in the catalog (`clusters/accelerators.yaml`: NVIDIA compute capability, and whether a part has FP8
# at all). FP8 needs sm_89+ (Ada, Hopper) or an MI300-class GPU (gfx942: e4m3fnuz; gfx950: OCP e4m3fn);
# MXFP8 needs Blackwell (sm_100+).
TE_INSTALL_HINT = "pip install 'sweep[te]' (transformer-engine[pytorch]>=2.10)"


@dataclass(frozen=True, kw_only=True)
class Recipe:
    name: str
    family: Family  # which peak TFLOP/s is the MFU divisor
    backend: Backend
    summary: str
    min_cuda_capability: float = 0.0
    amd: bool = True  # runs on MI300-class GPUs
    cpu: bool = True  # runs on CPU ranks (torchao FP8 only through emulation)


RECIPES: dict[str, Recipe] = {r.name: r for r in [
    Recipe(name="bf16", family="bf16", backend="torch",
           summary="bf16 compute: FSDP2 MixedPrecisionPolicy with bf16 params, fp32 gradient reduction"),
    Recipe(name="fp32", family="fp32", backend="torch",
           summary="fp32 params and compute (TF32 matmuls on NVIDIA)"),
    Recipe(name="fp8-torchao-tensorwise", family="fp8", backend="torchao", min_cuda_capability=8.9,
           summary="torchao float8, dynamic tensorwise scaling, float8 FSDP all-gather + scale precompute"),
    Recipe(name="fp8-torchao-rowwise", family="fp8", backend="torchao", min_cuda_capability=9.0,
           summary="torchao float8, dynamic rowwise scaling (more accurate, slower casts)"),
    Recipe(name="fp8-torchao-rowwise-gw-hp", family="fp8", backend="torchao", min_cuda_capability=9.0,
           summary="torchao float8 rowwise, weight gradient in high precision"),
    Recipe(name="bf16-te", family="bf16", backend="te", min_cuda_capability=8.0, cpu=False,
           summary="Transformer Engine layers in bf16, no FP8: the fair baseline for TE FP8"),
    Recipe(name="fp8-te-delayed", family="fp8", backend="te", min_cuda_capability=8.9, cpu=False,
           summary="TE DelayedScaling, HYBRID (E4M3 fwd / E5M2 bwd), amax history 16, max"),
    Recipe(name="fp8-te-current", family="fp8", backend="te", min_cuda_capability=8.9, cpu=False,
           summary="TE Float8CurrentScaling (per-tensor scale from the current amax)"),
    Recipe(name="fp8-te-block", family="fp8", backend="te", min_cuda_capability=9.0, cpu=False, amd=False,
           summary="TE Float8BlockScaling (DeepSeek-V3 style 1x128 / 128x128 blocks), Hopper and newer"),
    Recipe(name="fp8-te-mxfp8", family="fp8", backend="te", min_cuda_capability=10.0, cpu=False, amd=False,
           summary="TE MXFP8BlockScaling (32-element blocks, E8M0 scales), Blackwell only"),
]}


@functools.cache  # what is installed does not change while sweep runs; asked once per trial otherwise
def have_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def unsupported_reason(recipe: Recipe, *, accelerator: str, vendor: str, compute_capability: float | None = None,
                       has_fp8: bool = True, have_te: bool | None = None,
                       have_torchao: bool | None = None) -> str | None:
    """Why `recipe` cannot run on this accelerator with what is installed, or None if it can.

    `compute_capability` (NVIDIA) and `has_fp8` (AMD: an MI300-class part) come from the accelerator
    catalog; an NVIDIA part of unknown capability is given the benefit of the doubt. `have_te` /
    `have_torchao` default to whether the package is importable here (the driver and the rank processes
    share one environment on a Ray cluster built from one container image).
    """
    hardware = _hardware_reason(recipe, accelerator=accelerator, vendor=vendor,
                                compute_capability=compute_capability, has_fp8=has_fp8)
    if hardware:  # the hardware answer first: installing a package would not help
        return hardware
    have_te = have_module("transformer_engine") if have_te is None else have_te
    have_torchao = have_module("torchao") if have_torchao is None else have_torchao
    if recipe.backend == "te" and not have_te:
        return f"{recipe.name} needs Transformer Engine: {TE_INSTALL_HINT}"
    if recipe.backend == "torchao" and not have_torchao:
        return f"{recipe.name} needs torchao: pip install torchao"
    return None


def _hardware_reason(recipe: Recipe, *, accelerator: str, vendor: str, compute_capability: float | None,
                     has_fp8: bool) -> str | None:
    if vendor == "cpu":
        return None if recipe.cpu else f"{recipe.name} needs a GPU (Transformer Engine has no CPU kernels)"
    if vendor == "amd":
        if recipe.family == "fp8" and not has_fp8:
            return f"{recipe.name} needs an MI300-class GPU for FP8, not {accelerator}"
        return None if recipe.amd else f"{recipe.name} is not available on AMD GPUs"
    if compute_capability is not None and compute_capability < recipe.min_cuda_capability:
        return (f"{recipe.name} needs CUDA compute capability >= {recipe.min_cuda_capability}; "
                f"{accelerator} has {compute_capability}")
    if recipe.family == "fp8" and not has_fp8:  # a declared part may say so without a capability to go by
        return f"{recipe.name} needs FP8 tensor cores; {accelerator} has none (its peak_tflops.fp8 is null)"
    return None
