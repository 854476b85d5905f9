"""The output head and the loss fused, a chunk of tokens at a time: the grid's `loss: chunked` (trainer.options).

`chunked_cross_entropy(hidden, weight, labels)` is `F.cross_entropy(hidden @ weight.T, labels)` (the mean over
every token, the log-softmax in fp32) without ever holding the B x T x V logits or their fp32 upcast (12.6 GB at
batch 4, T 4096, V 128,256; on one H200 they failed to allocate at batch 16).

The method is Liger Kernel's fused linear cross-entropy (linkedin/Liger-Kernel,
src/liger_kernel/ops/fused_linear_cross_entropy.py; Hsu et al. 2024, "Liger Kernel: Efficient Triton Kernels for
LLM Training", §3.3): forward takes the tokens a chunk at a time, computes the chunk's logits, their fp32 softmax
and loss, and right there the chunk's gradients: with g = softmax - onehot(label) (d summed loss / d logits),
grad_hidden = g @ W and grad_W += g^T @ h. Only grad_hidden (N x D) and grad_W (V x D) are kept; backward scales
them by 1 / N (the mean) and the incoming gradient (1 / grad_accum). Chosen over a per-chunk
`torch.utils.checkpoint`, which would recompute every chunk's logits in backward: one more N·D·V matmul, a third
more of the head's FLOPs (at Llama3-8B's dims with 8 layers the head is ~23 % of the matmul FLOPs, so ~7 % more a
step); this does the head's three matmuls once each, as the full path does. Plain torch here, where Liger fuses
the softmax in Triton: a chunk's softmax and gradient are a few elementwise passes over its C x V logits,
compiled into one or two kernels when the trial compiles (`compiled_chunks`). A chunk's size, and why:
trainer.loss_chunk.

Dtypes follow what the full path computes in: the matmuls in the autocast dtype where autocast is on (one rank),
else in the weight's (FSDP2's bf16 gathered parameters; fp32 recipes in fp32); the softmax and the loss in fp32;
grad_W summed over the chunks in fp32.

The head weight is an FSDP2 parameter of the root module, unsharded only inside the root's forward, so the models
call this inside their forward (`model(tokens, labels=labels)` returns the loss): FSDP2 sees the weight used there
and reduce-scatters its gradient as it does the plain head's. The chunk loop is not traced by the model's compile
(a graph break under `compile: full`): its trip count depends on the batch, which a symbolic batch dimension would
make dynamo specialise on (a recompile per batch size); each chunk's math is compiled on its own instead.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import torch

from trainer.loss_chunk import chunk_tokens


def matmul_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """What the head's matmul would run in: the autocast dtype where autocast is on, else the weight's."""
    device = hidden.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype


def _chunk(logits: torch.Tensor, labels: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A chunk's summed loss and d(summed loss)/d(logits) = softmax - onehot(label), the latter in `dtype` (as the
    full path's gradient enters the head's backward matmuls), from its C x V logits in the matmul dtype: the
    log-softmax in fp32, as F.cross_entropy over the full path's fp32 upcast computes it."""
    logp = torch.log_softmax(logits, dim=1, dtype=torch.float32)
    picked = logp.gather(1, labels)
    return -picked.sum(), logp.exp_().scatter_add_(1, labels, torch.full_like(picked, -1.0)).to(dtype)


# Whether the trial compiles: then inductor fuses a chunk's softmax and gradient (expected: the logits read twice and
# the gradient written once, not yet measured on a GPU), where eager makes about six passes over C x V values, most
# in fp32 (at Llama 3's vocabulary and batch 16 a step's chunks hold 8.4 G logits). A trial without compile compiles
# nothing.
_COMPILED: ContextVar[bool] = ContextVar("trainer.loss compiled chunks", default=False)


@contextlib.contextmanager
def compiled_chunks(enabled: bool) -> Iterator[None]:
    """Within it, `chunked_cross_entropy` runs each chunk's softmax and gradient compiled (`enabled`) or eagerly."""
    token = _COMPILED.set(enabled)
    try:
        yield
    finally:
        _COMPILED.reset(token)


@functools.cache
def _compiled_chunk() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    # dynamic=None: the first chunk size compiles static; a second (a batch's remainder chunk) compiles once more
    # with the token dimension symbolic, and serves every later size (dynamo's automatic dynamic shapes)
    return torch.compile(_chunk, dynamic=None)


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]  # autograd.Function's forward takes its own arguments
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int
    ) -> torch.Tensor:
        dtype = matmul_dtype(hidden, weight)
        with torch.autocast(hidden.device.type, enabled=False):  # the dtypes are chosen here
            h, w, y = hidden.reshape(-1, hidden.size(-1)).to(dtype), weight.to(dtype), labels.reshape(-1, 1)
            grad_h = torch.empty_like(h)
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            chunk_fn = _compiled_chunk() if _COMPILED.get() else _chunk
            for start in range(0, h.size(0), chunk):
                h_c = h[start : start + chunk]
                loss_c, g_c = chunk_fn(h_c @ w.T, y[start : start + chunk], dtype)
                total += loss_c
                grad_h[start : start + chunk] = g_c @ w
                grad_w += g_c.T @ h_c
        # the gradients of the summed loss: backward scales them by 1 / N (the mean) with the incoming gradient
        ctx.save_for_backward(grad_h, grad_w)
        ctx.hidden_shape, ctx.hidden_dtype, ctx.weight_dtype = hidden.shape, hidden.dtype, weight.dtype
        ctx.tokens = h.size(0)
        return total / h.size(0)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        grad_h, grad_w = ctx.saved_tensors
        scale = grad_out / ctx.tokens
        # in place: the saved gradients are this graph's alone (freed after this backward)
        grad_hidden = grad_h.mul_(scale).to(ctx.hidden_dtype).view(ctx.hidden_shape)
        return grad_hidden, grad_w.mul_(scale).to(ctx.weight_dtype), None, None


@torch.compiler.disable  # the loop outside the model's compile: see the module's docstring
def chunked_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *, chunk: int | None = None
) -> torch.Tensor:
    """Mean cross-entropy of `hidden @ weight.T` (hidden: B x T x D, weight: V x D, labels: B x T) against
    `labels`, `chunk` tokens at a time (default: `chunk_tokens(V)`); gradients flow to hidden and weight."""
    size = chunk or chunk_tokens(weight.size(0))
    loss: torch.Tensor = _ChunkedLinearCrossEntropy.apply(hidden, weight, labels, size)
    return loss
