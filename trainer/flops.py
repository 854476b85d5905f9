"""Training FLOPs per token: pure arithmetic, no torch.

    flops_per_token = 6 * N + 12 * L * H * D * T

the PaLM paper's Appendix B
estimate (Chowdhery et al. 2022): 6N for the forward (2N) and backward (4N) matmuls of N parameters,
plus 12·L·H·D·T for the attention scores and the weighted sum (Q·Kᵀ and A·V, forward 4·H·D·T per
token per layer, backward twice that), counted over the full T×T square (causal masking is not
subtracted), as nanoGPT's `estimate_mfu` counts it.

N is `sum(p.numel() for p in model.parameters())`: every parameter, embeddings included, tied weights
once. Embedding lookups, norms and biases do no matmul, so this slightly over-counts what a FLOP counter
sees (6 × those parameters); tests/test_flops.py measures the gap against FlopCounterMode.

A script that counts the nominal batch (`6 * N * 16 * 1024` per step) while training 12 rows overstates
TFLOP/s by 33 %. Here FLOPs are
always per token and multiplied by the tokens actually trained (grad_accum * batch_size * seq_len per rank
and optimizer step).

Other tools count other FLOPs for the same step, so their TFLOP/s and MFU are not ours: `CONVENTIONS`
holds theirs (`sweep results ... --flops megatron|torchtitan` recomputes a table in one of them). For
Llama3-8B at T 8192: sweep 61.07, torchtitan 57.91, megatron 51.47 GFLOP per token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer.models.specs import ModelSpec


def flops_per_token(*, n_params: int, n_layers: int, n_heads: int, head_dim: int, seq_len: int) -> float:
    return 6.0 * n_params + 12.0 * n_layers * n_heads * head_dim * seq_len


def spec_flops_per_token(spec: ModelSpec, seq_len: int, n_params: int | None = None) -> float:
    """`flops_per_token` for a `trainer.models.specs.ModelSpec`; `n_params` (the count the built model
    reported) overrides the spec's own count."""
    return flops_per_token(
        n_params=spec.n_params() if n_params is None else n_params,
        n_layers=spec.n_layers,
        n_heads=spec.n_heads,
        head_dim=spec.head_dim,
        seq_len=seq_len,
    )


def _attention(spec: ModelSpec, seq_len: int) -> float:
    """12·L·H·D·T: Q·Kᵀ and A·V over the full T×T square, forward and backward."""
    return 12.0 * spec.n_layers * spec.n_heads * spec.head_dim * seq_len


def torchtitan_flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """torchtitan: 6·(N − input-embedding lookups) + 12·L·H·D·T.

    Source: pytorch/torchtitan `torchtitan/models/utils.py`. `get_nparams_and_active_nparams` gives every
    `nn.Embedding` weight a zero FLOP weight unless it is shared with the output head, and
    `quadratic_attention_flops_per_token` counts 6·H·(2·D)·T per layer ("we follow the convention and do not
    account for sparsity in causal attention"); older releases wrote the same as `get_num_flop_per_token`,
    `6 * (num_params - embedding params) + 12 * l * h * q * t`. Norm weights stay in N.

    Ours: llama's untied token embedding (V·E) leaves N; gpt's token embedding is the tied head and stays,
    its learned position table (max_seq_len·E) leaves.
    """
    lookups = spec.max_seq_len * spec.d_embd if spec.arch == "gpt" else spec.vocab_size * spec.d_embd
    return 6.0 * (spec.n_params() - lookups) + _attention(spec, seq_len)


def megatron_flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """Megatron-LM: 6 × the GEMM weights (no embedding lookup, norm or bias) + 6·L·H·D·T (causal half).

    Source: NVIDIA/Megatron-LM `megatron/training/training.py`, `num_floating_point_operations` →
    `transformer_flops`: 3 (forward, wgrad, dgrad) × 2 (multiply-add) × [E·(H·D + 2·J·D) + H·D·E (QKV and out
    projections) + 2·H·D·T/2 ("causal mask (only half of the mask is non-zero)") + 3·E·F (SwiGLU) or 2·E·F
    (GELU MLP) per layer, + E·V logits]. That is `spec.n_matmul_params()` times 6 plus half our attention.

    Llama3-8B at T 8192: 51.47 GFLOP/token, the 51.5 quoted from NVIDIA/Megatron tables. Megatron releases
    before the causal halving (`12·B·s·L·h²·(1 + g/a + s/h + ...)`, Narayanan et al. 2021, appendix) count the
    full square, 6·N_matmul + 12·L·H·D·T = 57.91 GFLOP/token (the other quoted figure, 57.9), which is
    torchtitan's to 0.003 % (torchtitan also counts the norm weights): `--flops torchtitan` matches those.
    """
    return 6.0 * spec.n_matmul_params() + _attention(spec, seq_len) / 2


# name -> (FLOPs per token of (spec, seq_len), the formula in a few words for table captions)
CONVENTIONS: dict[str, tuple[Callable[[ModelSpec, int], float], str]] = {
    "sweep": (spec_flops_per_token, "6·N + 12·L·H·D·T, N = every parameter, full T×T attention (PaLM app. B)"),
    "megatron": (
        megatron_flops_per_token,
        "6·N_matmul + 6·L·H·D·T, no embedding lookup, causal half of T×T (Megatron-LM)",
    ),
    "torchtitan": (
        torchtitan_flops_per_token,
        "6·(N − embedding lookups) + 12·L·H·D·T, full T×T attention (torchtitan)",
    ),
}


def convention_flops_per_token(convention: str, spec: ModelSpec, seq_len: int) -> float:
    """FLOPs per token of `spec` at `seq_len` counted as `convention` counts them (a key of CONVENTIONS)."""
    return CONVENTIONS[convention][0](spec, seq_len)
