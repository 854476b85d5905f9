"""The attention kernel a trial asks for (`TrainingOptions.attention`), applied to the model it trains.

Torch models (gpt.py, llama.py): each attention module is an `SDPAttention` whose forward calls SDPA inside
`sdpa_kernel(backend)` (nothing for `auto`), so the backend is chosen in the traced code and the aten op it
picks is part of the compiled graph. A global backend flag set around the compiled call would not be: inductor's
FX and AOTAutograd caches do not key on those flags, and a cached run reused a flash graph for a cuDNN trial
(session 16, H200). `set_attention` sets every attention module of a model before it is compiled.

TE models (te.py): TE picks its backend in `DotProductAttention.forward` from the NVTE_FLASH_ATTN /
NVTE_FUSED_ATTN / NVTE_UNFUSED_ATTN environment (TE 2.10-2.20 `get_attention_backend`), so `te_attention_env`
says which to turn off; `apply_te_attention` sets them for this process's trial.
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch.nn as nn
from torch.nn.attention import SDPBackend, sdpa_kernel

# The option's values but auto, as torch's SDPA backends
SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}
# torch._fused_sdp_choice's answer (an SDPBackend's value) as the option names it; math: no fused kernel
SDPA_CHOICES = {SDPBackend.MATH.value: "math", **{b.value: name for name, b in SDPA_BACKENDS.items()}}

# TE's backend switches (each on unless set to 0) and which of them each value keeps on: flash is TE's
# flash-attention, cudnn its FusedAttention (cuDNN); unfused (TE's torch implementation) is off for both, so that
# a backend TE cannot run fails the trial instead of falling back to another
TE_SWITCHES = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")
TE_KEEPS = {"flash": "NVTE_FLASH_ATTN", "cudnn": "NVTE_FUSED_ATTN"}


class SDPAttention(nn.Module):
    """An attention module whose SDPA call runs under the trial's backend (`sdpa`)."""

    attention_kernel: str = "auto"  # `TrainingOptions.attention`; set by `set_attention`

    def sdpa_context(self) -> contextlib.AbstractContextManager:
        """What SDPA runs under: `sdpa_kernel` of the chosen backend, or nothing for auto (torch's choice)."""
        if self.attention_kernel == "auto":
            return contextlib.nullcontext()
        return sdpa_kernel(SDPA_BACKENDS[self.attention_kernel])


def set_attention(model: nn.Module, kernel: str) -> None:
    """Every SDPA module of `model` runs `kernel` (auto: torch picks, as before the option existed)."""
    if kernel != "auto" and kernel not in SDPA_BACKENDS:
        raise ValueError(f"attention: {kernel!r} is not one of auto, {', '.join(SDPA_BACKENDS)}")
    for module in model.modules():
        if isinstance(module, SDPAttention):
            module.attention_kernel = kernel


def te_attention_env(kernel: str) -> dict[str, str]:
    """The TE switches `kernel` sets: each off but the one it keeps; auto sets none (TE's own choice)."""
    if kernel == "auto":
        return {}
    if kernel not in TE_KEEPS:
        raise ValueError(f"attention: {kernel!r} has no TE backend (TE layers run auto, {', '.join(TE_KEEPS)})")
    return {name: "1" if name == TE_KEEPS[kernel] else "0" for name in TE_SWITCHES}


_started_with = {name: os.environ.get(name) for name in TE_SWITCHES}  # what auto gives back


def apply_te_attention(kernel: str) -> None:
    """Set TE's switches for a trial of `kernel` in this process (auto: as the process started). TE keeps its last
    choice while the attention's shapes stay the same (its module-level `_attention_backends`), so a change is
    flagged to it: a warm process's next trial at the same shapes would otherwise run the previous trial's backend."""
    wanted = {**_started_with, **te_attention_env(kernel)}
    if all(os.environ.get(name) == value for name, value in wanted.items()):
        return
    for name, value in wanted.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    dpa = sys.modules.get("transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention")
    backends = getattr(dpa, "_attention_backends", None)
    if isinstance(backends, dict):
        backends["backend_selection_requires_update"] = True
