"""Which kernel options (`TrainingOptions.attention`, `fp8_attention`) a trial's recipe, model and hardware can
run: a trial that cannot is recorded `unsupported` with the reason before any GPU time, as a recipe the hardware
lacks is (`sweep.execution.runner.unsupported`). Pure: no torch, so `sweep plan` says it on any machine.

An option that can do nothing in a trial folds away instead (`sweep.spec.expand.fold_kernel_options`): these are
the ones that would do something, but cannot.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from trainer.models.specs import ModelSpec
from trainer.options import TrainingOptions
from trainer.recipes import Recipe, have_module

# TE's backends as `attention` names them (trainer.models.attention.TE_KEEPS): it has no memory-efficient kernel
TE_ATTENTION = ("auto", "flash", "cudnn")


def kernel_unsupported(
    options: TrainingOptions,
    *,
    recipe: Recipe,
    model: ModelSpec,
    vendor: str,
    compute_capability: float | None = None,
) -> str | None:
    """Why the trial's attention options cannot run here, or None. `vendor`: the accelerator's (cpu, nvidia, amd);
    `compute_capability`: an NVIDIA part's, from the catalog (None: unknown, given the benefit of the doubt)."""
    attention = options.attention
    if vendor == "cpu" and attention in ("cudnn", "efficient"):
        # torch 2.13 on CPU: sdpa_kernel(CUDNN_ATTENTION or EFFICIENT_ATTENTION) raises "No viable backend"
        return f"attention: {attention} needs a GPU (torch's CPU attention has only its flash and math kernels)"
    if vendor == "amd" and attention == "cudnn":
        return "attention: cudnn is NVIDIA's cuDNN attention; on AMD GPUs use flash, efficient or auto"
    if recipe.layers == "te":
        return _te_reason(options, recipe=recipe, compute_capability=compute_capability)
    if attention in ("flash", "cudnn") and recipe.family == "fp32" and vendor != "cpu":
        # SDPA's flash and cuDNN kernels take fp16/bf16 only (torch sdp_utils check_dtypes_low_precision)
        return f"attention: {attention} needs bf16 or fp16 attention inputs; {recipe.name} computes in fp32"
    if attention == "efficient" and model.kv_heads != model.n_heads:
        # session 16, one H200 (torch 2.13): SDPA's memory-efficient kernel with enable_gqa failed under compile
        return (
            f"attention: efficient with grouped-query attention ({model.label}: n_kv_heads {model.kv_heads} < "
            f"n_heads {model.n_heads}) failed under compile on an H200 (torch 2.13); use flash, cudnn or auto"
        )
    return None


def refused_everywhere(
    options: TrainingOptions, name: str, values: Iterable[Any], *, recipe: Recipe, model: ModelSpec
) -> set[Any]:
    """The values of option `name` with which `kernel_unsupported` refuses these options on every kind of accelerator
    (e.g. attention efficient for TE layers, or for llama's grouped-query attention); none for another option."""
    if name not in ("attention", "fp8_attention"):
        return set()
    return {
        value
        for value in values
        if all(
            kernel_unsupported(replace(options, **{name: value}), recipe=recipe, model=model, vendor=vendor)
            for vendor in ("cpu", "nvidia", "amd")
        )
    }


def _te_reason(options: TrainingOptions, *, recipe: Recipe, compute_capability: float | None) -> str | None:
    """TE layers: TE's backends, FP8 attention only where TE 2.10-2.20 runs it (`get_attention_backend`), and TE's
    flash backend only where the flash-attn package it calls is installed."""
    if options.attention not in TE_ATTENTION:
        return f"attention: {options.attention} is SDPA's; TE layers run {', '.join(TE_ATTENTION)}"
    if options.fp8_attention and (reason := _te_fp8_attention_reason(options, recipe, compute_capability)):
        return reason
    if options.attention == "flash" and not have_module("flash_attn"):
        # TE's flash backend is the flash-attn package's kernels; without it TE finds no backend (one H200, TE 2.20.2:
        # "ValueError: No dot product attention backend is available for the provided inputs")
        return (
            "attention: flash with TE layers runs the flash-attn package, which is not installed: pip install "
            "flash-attn, or use attention cudnn or auto"
        )
    return None


def _te_fp8_attention_reason(options: TrainingOptions, recipe: Recipe, compute_capability: float | None) -> str | None:
    if recipe.scaling == "Float8BlockScaling":  # its __post_init__ asserts `not fp8_dpa and not fp8_mha`
        return f"fp8_attention: {recipe.name} (TE's Float8BlockScaling) has no FP8 attention"
    if options.attention == "flash":  # TE disables flash-attention for FP8 attention in training
        return "fp8_attention runs in TE's fused (cuDNN) attention only: use attention cudnn or auto, not flash"
    if recipe.scaling == "Float8CurrentScaling" and compute_capability is not None and compute_capability < 10.0:
        return (
            f"fp8_attention with {recipe.name}: TE's fused attention takes FP8 current scaling on sm_100+ only "
            f"(compute capability {compute_capability})"
        )
    return None
