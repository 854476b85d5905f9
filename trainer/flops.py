"""Training FLOPs per token: pure arithmetic, no torch.

    flops_per_token = 6 * N + 12 * L * H * D * T

as in seed 000 (`LLaMAConfig.estimate_flops_per_token`), which is the PaLM paper's Appendix B
estimate (Chowdhery et al. 2022): 6N for the forward (2N) and backward (4N) matmuls of N parameters,
plus 12·L·H·D·T for the attention scores and the weighted sum (Q·Kᵀ and A·V, forward 4·H·D·T per
token per layer, backward twice that), counted over the full T×T square as the seed does (causal
masking is not subtracted).

N is `sum(p.numel() for p in model.parameters())`: every parameter, embeddings included, tied weights
once. Embedding lookups, norms and biases do no matmul, so this slightly over-counts what a FLOP counter
sees (6 × those parameters); tests/test_flops.py measures the gap against FlopCounterMode.

Seed 002 counted `6 * N * 16 * 1024` per step while training 12 rows: a +33 % error. Here FLOPs are
always per token and multiplied by the tokens actually trained (grad_accum * batch_size * seq_len per rank
and optimizer step).
"""

from __future__ import annotations


def flops_per_token(*, n_params: int, n_layers: int, n_heads: int, head_dim: int, seq_len: int) -> float:
    return 6.0 * n_params + 12.0 * n_layers * n_heads * head_dim * seq_len


def spec_flops_per_token(spec, seq_len: int, n_params: int | None = None) -> float:
    """`flops_per_token` for a `trainer.models.specs.ModelSpec`; `n_params` (the count the built model
    reported) overrides the spec's own count."""
    return flops_per_token(n_params=spec.n_params() if n_params is None else n_params, n_layers=spec.n_layers,
                           n_heads=spec.n_heads, head_dim=spec.head_dim, seq_len=seq_len)

