"""The parallel layout on the ranks: the named mesh, tensor parallel with sequence parallel, the sharded loss.

The trial's ranks are the mesh (dp_replicate, dp_shard, tp), row-major in rank order: tp innermost, so a TP group
is tp consecutive ranks, which `sweep.spec.layout` keeps on one node (each block's TP collectives stay on its fabric).

Tensor parallel follows Megatron-LM (Shoeybi et al. 2019) with sequence parallel (Korthikanti et al. 2022), as
torchtitan's `apply_tp` for Llama: between blocks the activations are sharded on the sequence (each TP rank holds
T / tp tokens, so norms and the residual stream cost 1 / tp of the memory); each attention and MLP all-gathers
its input, splits its first matmuls by column (heads, the SwiGLU hidden units) and its last by row, and
reduce-scatters back onto the sequence. The vocabulary is split too: the embedding by rows, the output head by
columns with its logits left sharded on the vocabulary (a DTensor), and the loss is computed on those shards
under `loss_parallel` (each rank's log-sum-exp over its vocabulary slice, all-reduced) — the (tokens x vocab)
logits are never gathered on one rank.

The residual stream stays a DTensor (Shard(1)) from the embedding to the head (use_local_output=False on the
embedding and the row-parallel outputs): with plain local tensors between the blocks, a regionally compiled block
gave its input no gradient (the embedding's came back zero on torch 2.13, CPU/gloo; eager was right), while a
compiled block whose inputs and outputs are DTensors trains as the eager one does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn as nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from trainer.models.specs import ModelSpec
    from trainer.precision import PrecisionPlan

DP_DIMS = ("dp_replicate", "dp_shard")


def layout_mesh(device_type: str, world_size: int, *, dp_replicate: int, tp: int) -> DeviceMesh:
    """The named 3-D mesh (dp_replicate, dp_shard, tp) of the trial's ranks (every rank calls it together: its
    sub-meshes are new process groups)."""
    from torch.distributed.device_mesh import init_device_mesh

    dp_shard = world_size // (dp_replicate * tp)
    return init_device_mesh(device_type, (dp_replicate, dp_shard, tp), mesh_dim_names=(*DP_DIMS, "tp"))


def dp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The data-parallel sub-mesh FSDP2 shards over: ("dp_replicate", "dp_shard") when there are replicas
    (HSDP: shard within a replica, all-reduce gradients across), else "dp_shard" alone (FSDP)."""
    return mesh[DP_DIMS] if mesh["dp_replicate"].size() > 1 else mesh["dp_shard"]


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Shard a Llama (trainer.models.llama) over `tp_mesh` in place: Megatron column/row parallel with sequence
    parallel norms, the vocabulary split in the embedding and the head (its logits a vocab-sharded DTensor)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    if not hasattr(model, "output"):  # sweep.spec.layout refuses it at plan time: a caller that did not is a bug
        raise ValueError(f"tensor parallel is built for llama models, not {type(model).__name__}")
    parallelize_module(
        model,
        tp_mesh,
        {
            # rows of the vocabulary: each rank looks up its slice, the partial sums reduce-scatter onto the sequence
            "tok_embd": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False),
            "norm": SequenceParallel(),
            # columns of the vocabulary: logits stay sharded on it for the loss (use_local_output=False: a DTensor)
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
        },
    )
    for block in cast(nn.ModuleList, model.blocks):
        parallelize_module(
            block,
            tp_mesh,
            {
                "attn_norm": SequenceParallel(),
                # the sequence all-gathered before attention (it needs every token); the RoPE table is not an activation
                "attn": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
                "attn.wq": ColwiseParallel(),
                "attn.wk": ColwiseParallel(),
                "attn.wv": ColwiseParallel(),  # by heads
                # reduce-scattered back onto the sequence, kept a DTensor (module docstring)
                "attn.wo": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
                "ffn_norm": SequenceParallel(),
                "ffn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "ffn.w1": ColwiseParallel(),
                "ffn.w3": ColwiseParallel(),  # by hidden units
                "ffn.w2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
            },
        )


def loss_context(tp: int) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """What wraps the loss and its backward: `loss_parallel` when the logits are vocab-sharded (tp > 1)."""
    if tp == 1:
        return contextlib.nullcontext
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel


def local_value(loss: torch.Tensor) -> torch.Tensor:
    """The loss as a plain tensor: under loss_parallel it is a DTensor replicated over the TP group."""
    return loss.full_tensor() if hasattr(loss, "full_tensor") else loss


@torch.no_grad()
def init_layout_independent(model: nn.Module, full: nn.Module) -> None:
    """Copy the initialised unsharded `full` model into the sharded `model`, each rank its own shard.

    CPU only: a random op on a CPU DTensor draws each shard from the rank's own generator (DTensor's offset-based
    RNG tracker is for accelerators), so the weights would depend on the layout, and FSDP 2 x TP 2 would start
    from other weights than FSDP 2. Drawn whole, as on one rank, every layout starts from the same weights
    (CPU models are small: a second copy at init is cheap)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    for param, whole in zip(model.parameters(), full.parameters(), strict=True):
        if param.shape != whole.shape:  # the same module order: a mismatch is a bug
            raise RuntimeError(f"parameter shapes differ: {tuple(param.shape)} and {tuple(whole.shape)}")
        if isinstance(param, DTensor):  # each rank's shard, cut locally (src_data_rank=None: no collective)
            param.copy_(distribute_tensor(whole, param.device_mesh, param.placements, src_data_rank=None))
        else:
            param.copy_(whole)


def whole_model(spec: ModelSpec, plan: PrecisionPlan, *, fp8_lm_head: bool) -> nn.Module:
    """The unsharded model on the CPU, initialised from the trial's seed as one rank would be: what every CPU
    layout copies its shards from (`init_layout_independent`). Made before the sharded model's own init, from the
    same generator state (restored after), so that both draw the same numbers."""
    from trainer import models

    with torch.device("meta"):
        whole = models.build_model(spec, backend=plan.model_backend, fp8_lm_head=fp8_lm_head)
    plan.convert(whole)  # the same modules as the sharded model's, so the same parameters in the same order
    whole.to_empty(device="cpu")
    state = torch.get_rng_state()
    with torch.no_grad():
        whole.init_weights()  # type: ignore[operator]  # ours (trainer.models)
    torch.set_rng_state(state)
    return whole
