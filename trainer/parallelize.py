"""The one place where a model is turned into what trains: precision → TP → AC → compile → FSDP2 / HSDP.

First the trial's attention kernel is set (`trainer.models.attention`: in the modules, before anything traces
them). The order is fixed and matters (torchtitan's `parallelize_llama` does the same):
  1. precision conversion first, so that everything after sees the final (e.g. float8) modules: TP would shard
     them (torchao's float8 TP styles; not built, `sweep.spec.layout` refuses torchao with tp > 1), compile traces
     them and FSDP shards them;
  2. tensor parallel (tp > 1; `trainer.tensor_parallel`) before everything that wraps or traces a block: its
     plan names the plain submodules (attn.wq, ffn.w2, ...), which AC's wrapper would hide, and compile must
     trace the TP collectives (DTensor ops) inside each block; FSDP comes after so it shards the TP shards
     further over the data-parallel ranks (2-D parameters: dp x tp);
  3. activation checkpointing wraps each block, inside what is compiled, so compile sees the recompute;
  4. regional compile: each block compiled in place before sharding, so FSDP2's all-gather hooks stay
     outside the compiled graphs (no graph breaks on collectives) and identical blocks reuse one graph;
  5. fully_shard each block, then the root (embeddings, final norm, head), over the data-parallel sub-mesh —
     when there is more than one rank: "dp_shard" (FSDP), or ("dp_replicate", "dp_shard") for HSDP (shard
     within a replica, all-reduce across replicas). With TP and no data parallelism (dp of 1) FSDP2 still
     wraps the model, over a mesh of one, for its mixed precision: the bf16 compute with fp32 master weights
     every multi-rank trial has. On one rank FSDP2 has nothing to shard and would only add copies; the plain
     model trains under bf16 autocast instead (`PrecisionPlan.training_context`), as single-GPU scripts do.
`full` compile wraps the whole sharded model instead (slow to compile on large models: a
GPT-1.5B with torchao rowwise did not finish compiling in 230 s on an H200). Either compiles with the trial's
`compile_mode` (`compile_kwargs`).

With `dynamic_batch` every compiled graph's first input has a symbolic batch dimension (`mark_batch_dynamic`),
so a later trial at another batch size runs the same compiled code (`trainer.release.release` keeps it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn as nn

from trainer import compile_keys

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from trainer.precision import PrecisionPlan


compile_keys.install()  # one graph, one cache key in every process (ranks and side processes import this module)


def _blocks(model: nn.Module) -> nn.ModuleList:
    """The model's transformer blocks: every built model has them (`trainer.models`)."""
    return cast(nn.ModuleList, model.blocks)


def _checkpoint_blocks(model: nn.Module, mode: str) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    blocks = _blocks(model)
    for i, block in enumerate(blocks):
        # selective: every other block recomputes (torchtitan's "op-free" selective layer AC, ac_freq=2)
        if mode == "full" or (mode == "selective" and i % 2 == 0):
            blocks[i] = checkpoint_wrapper(block, preserve_rng_state=False)


def mark_batch_dynamic(*tensors: torch.Tensor) -> None:
    """Dimension 0 of each tensor is traced as a symbol by the next compiled call it reaches. `maybe_`: a batch
    of 1 is specialised by dynamo (its 0/1 rule) instead of raising; the other sizes share one graph."""
    for tensor in tensors:
        torch._dynamo.maybe_mark_dynamic(tensor, 0)


def compile_kwargs(mode: str) -> dict[str, Any]:
    """torch.compile's keyword arguments for the trial's `compile_mode`: none for default (torch.compile() as every
    trial before the option ran), else `mode` (max-autotune-no-cudagraphs: inductor's max_autotune and
    coordinate_descent_tuning, no CUDA graphs; torch._inductor.list_mode_options)."""
    return {} if mode == "default" else {"mode": mode}


def _compile_block(block: nn.Module, dynamic_batch: bool, kwargs: dict[str, Any]) -> None:
    """Compile `block` in place (`nn.Module.compile`). With `dynamic_batch` its input activations, made in eager
    code between blocks (no mark survives an op), are marked at each call, outside the compiled frame, where
    dynamo reads marks (a forward pre-hook runs inside it: on one rank, where no FSDP2 hook breaks the graph,
    a disabled hook would add a graph break to every block)."""
    block.compile(**kwargs)
    if not dynamic_batch:
        return
    compiled: Any = block._compiled_call_impl  # what nn.Module.__call__ runs once compiled

    def call_marked(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        mark_batch_dynamic(x)
        return compiled(x, *args, **kwargs)

    block._compiled_call_impl = call_marked


@torch._dynamo.disable  # run eagerly: dynamo reads marks only on a frame's inputs, and a traced mark is refused
def _mark_after_fsdp(module: nn.Module, args: tuple[Any, ...]) -> None:
    """A sharded block's pre-forward hook, after FSDP2's own: FSDP2 hands the block new input tensors (outputs
    of the autograd function that registers its post-backward hook), which dynamo compiles `forward` on, so the
    mark made before the call is lost there (2 CPU ranks: the second batch size recompiled without this)."""
    mark_batch_dynamic(args[0])


def parallelize(
    model: nn.Module,
    *,
    plan: PrecisionPlan,
    compile_scope: str,
    ac: str,
    mesh: DeviceMesh,
    reduce_dtype: str = "fp32",
    dynamic_batch: bool = False,
    compile_mode: str = "default",
    attention: str = "auto",
) -> nn.Module:
    """Apply the transforms in order and return the model to train. `mesh`: the trial's ranks, 1-D (FSDP over all
    of them) or the named (dp_replicate, dp_shard, tp) mesh of `trainer.tensor_parallel.layout_mesh`.
    `compile_scope`: the grid's `compile` (none, regional, full); `compile_mode`: torch.compile's mode."""
    from torch.distributed.fsdp import fully_shard

    from trainer.models.attention import apply_te_attention, set_attention
    from trainer.tensor_parallel import apply_tp, dp_mesh

    if plan.model_backend == "te":  # 0. the attention kernel: TE's switches, or each SDPA module's backend
        apply_te_attention(attention)
    else:
        set_attention(model, attention)
    plan.convert(model)  # 1. precision
    named = mesh.mesh_dim_names is not None
    if named and mesh["tp"].size() > 1:  # 2. tensor parallel
        apply_tp(model, mesh["tp"])
    if ac != "none":  # 3. activation checkpointing
        _checkpoint_blocks(model, ac)
    kwargs = compile_kwargs(compile_mode)
    if compile_scope == "regional":  # 4. compile
        for block in _blocks(model):
            _compile_block(block, dynamic_batch, kwargs)
    if mesh.size() == 1:  # 5. nothing to shard
        return cast(nn.Module, torch.compile(model, **kwargs)) if compile_scope == "full" else model
    mesh = dp_mesh(mesh) if named else mesh
    mp_policy = plan.mp_policy(reduce_dtype)
    blocks = _blocks(model)
    for i, block in enumerate(blocks):  # 5. FSDP2 (HSDP over a 2-D mesh)
        # The last block is not resharded after forward: backward needs it first (saves one all-gather).
        fully_shard(block, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=i < len(blocks) - 1)
        if compile_scope != "none" and dynamic_batch:  # `full` too: dynamo compiles each sharded block's forward apart
            block.register_forward_pre_hook(_mark_after_fsdp)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    if compile_scope == "full":
        model = cast(nn.Module, torch.compile(model, **kwargs))
    return model
