"""Model registry (`specs`, pure) and builders (torch).

Every built model exposes `.blocks` (an nn.ModuleList of transformer blocks: the unit of activation
checkpointing, regional compile and FSDP sharding) and `init_weights()` (so a model built on the meta
device can be sharded first and materialised after: an 8B model never exists whole on one rank).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainer.models.specs import REGISTRY, ModelSpec, resolve

if TYPE_CHECKING:
    import torch.nn as nn

__all__ = ["REGISTRY", "ModelSpec", "resolve", "build_model"]


def build_model(spec: ModelSpec, *, backend: str = "torch", fp8_lm_head: bool = False) -> nn.Module:
    """Build the nn.Module for `spec` on the current default device (use `torch.device('meta')`).

    backend "te" builds Transformer Engine layers (trainer.models.te), whose head leaves TE's FP8 region
    unless `fp8_lm_head`; anything else plain torch (torchao picks its FP8 layers when converting).
    """
    if backend == "te":
        from trainer.models.te import build_te_model

        return build_te_model(spec, fp8_lm_head=fp8_lm_head)
    if spec.arch == "gpt":
        from trainer.models.gpt import GPT

        return GPT(spec)
    from trainer.models.llama import Llama

    return Llama(spec)
