"""Llama-3 style decoder (Meta's Llama 3 architecture): RMSNorm, grouped-query attention with RoPE, SwiGLU, untied head.

Init follows torchtitan's Llama (normal 0.02; output projections of each block scaled by depth) with a
small output head, so the first loss is ~ln(vocab).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainer.loss import chunked_cross_entropy
from trainer.models.attention import SDPAttention
from trainer.models.specs import ModelSpec

INIT_STD = 0.02


def head_init_std(d_embd: int) -> float:
    """Output head std: torchtitan's d^-0.5, halved, so the first logits have std ~0.5 and the first loss is
    ln V + ~0.125 (std 0.02 on a d=8192 head gives logits of std 1.8 and a loss 14 % above ln V)."""
    return 0.5 * d_embd**-0.5


def rope_cos_sin(head_dim: int, seq_len: int, theta: float, device: torch.device | None = None) -> torch.Tensor:
    """cos/sin tables of rotary embeddings (Su et al. 2021), stacked as (2, T, D/2) in fp32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return torch.stack([angles.cos(), angles.sin()])


def apply_rope(x_BHTD: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    T = x_BHTD.size(-2)
    cos, sin = rope[0, :T].to(x_BHTD.dtype), rope[1, :T].to(x_BHTD.dtype)
    x1, x2 = x_BHTD[..., 0::2], x_BHTD[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class Attention(SDPAttention):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = spec.n_heads, spec.kv_heads, spec.head_dim
        E, D = spec.d_embd, spec.head_dim
        self.wq = nn.Linear(E, spec.n_heads * D, bias=False)
        self.wk = nn.Linear(E, spec.kv_heads * D, bias=False)
        self.wv = nn.Linear(E, spec.kv_heads * D, bias=False)
        self.wo = nn.Linear(spec.n_heads * D, E, bias=False)

    def forward(self, x_BTE: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        split = lambda t: t.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.wq(x_BTE)), split(self.wk(x_BTE)), split(self.wv(x_BTE))
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        with self.sdpa_context():  # the trial's attention kernel (trainer.models.attention)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv_heads != self.n_heads)
        return self.wo(o.transpose(1, 2).flatten(-2))


class FeedForward(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.w1 = nn.Linear(spec.d_embd, spec.ffn_width, bias=False)  # gate
        self.w3 = nn.Linear(spec.d_embd, spec.ffn_width, bias=False)  # up
        self.w2 = nn.Linear(spec.ffn_width, spec.d_embd, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.attn_norm = nn.RMSNorm(spec.d_embd, eps=spec.norm_eps)
        self.attn = Attention(spec)
        self.ffn_norm = nn.RMSNorm(spec.d_embd, eps=spec.norm_eps)
        self.ffn = FeedForward(spec)

    def forward(self, x_BTE: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        x_BTE = x_BTE + self.attn(self.attn_norm(x_BTE), rope)
        return x_BTE + self.ffn(self.ffn_norm(x_BTE))


class Llama(nn.Module):
    rope: torch.Tensor  # the RoPE table, a buffer (register_buffer)

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.tok_embd = nn.Embedding(spec.vocab_size, spec.d_embd)
        self.blocks = nn.ModuleList(LlamaBlock(spec) for _ in range(spec.n_layers))
        self.norm = nn.RMSNorm(spec.d_embd, eps=spec.norm_eps)
        self.output = nn.Linear(spec.d_embd, spec.vocab_size, bias=False)
        # Not persistent: recomputed by init_weights after the model leaves the meta device.
        self.register_buffer("rope", rope_cos_sin(spec.head_dim, spec.max_seq_len, spec.rope_theta), persistent=False)

    def init_weights(self) -> None:
        depth_std = INIT_STD / math.sqrt(2 * self.spec.n_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = depth_std if name.endswith(("wo", "w2")) else INIT_STD
                std = head_init_std(self.spec.d_embd) if name == "output" else std
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
            elif isinstance(module, nn.RMSNorm):
                nn.init.ones_(module.weight)
        with torch.no_grad():
            self.rope.copy_(
                rope_cos_sin(self.spec.head_dim, self.spec.max_seq_len, self.spec.rope_theta, device=self.rope.device)
            )

    def forward(self, idx_BT: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """The logits; given `labels`, the mean loss instead, the head fused into it (trainer.loss, `loss: chunked`)."""
        x_BTE = self.tok_embd(idx_BT)
        for block in self.blocks:
            x_BTE = block(x_BTE, self.rope)
        if labels is not None:
            return chunked_cross_entropy(self.norm(x_BTE), self.output.weight, labels)
        return self.output(self.norm(x_BTE))
