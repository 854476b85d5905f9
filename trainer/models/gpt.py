"""GPT-2 style decoder (Radford et al. 2019): LayerNorm, MHA with causal SDPA, GELU MLP x4, learned positions,
tied input/output embeddings. Initialised as GPT-2 / nanoGPT do, so the first loss is ~ln(vocab),
not the ~72 an untuned default init gives at this size.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainer.loss import chunked_cross_entropy
from trainer.models.attention import SDPAttention
from trainer.models.specs import ModelSpec

INIT_STD = 0.02  # GPT-2 (Radford et al. 2019), nanoGPT model.py _init_weights


class CausalSelfAttention(SDPAttention):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.head_dim = spec.head_dim
        self.qkv = nn.Linear(spec.d_embd, 3 * spec.d_embd)
        self.out_proj = nn.Linear(spec.d_embd, spec.d_embd)

    def forward(self, x_BTE: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x_BTE).split(x_BTE.size(-1), dim=-1)
        q, k, v = (t.unflatten(-1, (-1, self.head_dim)).transpose(1, 2) for t in (q, k, v))
        with self.sdpa_context():  # the trial's attention kernel (trainer.models.attention)
            o_BHTD = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(o_BHTD.transpose(1, 2).flatten(-2))


class GPTBlock(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        E = spec.d_embd
        self.attn_norm = nn.LayerNorm(E)
        self.attn = CausalSelfAttention(spec)
        self.ffn_norm = nn.LayerNorm(E)
        self.ffn_up = nn.Linear(E, 4 * E)
        self.ffn_down = nn.Linear(4 * E, E)

    def forward(self, x_BTE: torch.Tensor) -> torch.Tensor:
        x_BTE = x_BTE + self.attn(self.attn_norm(x_BTE))
        return x_BTE + self.ffn_down(F.gelu(self.ffn_up(self.ffn_norm(x_BTE))))


class GPT(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.tok_embd = nn.Embedding(spec.vocab_size, spec.d_embd)
        self.pos_embd = nn.Embedding(spec.max_seq_len, spec.d_embd)
        self.blocks = nn.ModuleList(GPTBlock(spec) for _ in range(spec.n_layers))
        self.out_norm = nn.LayerNorm(spec.d_embd)

    def init_weights(self) -> None:
        # Residual projections are scaled by 1/sqrt(2L) (GPT-2 paper, section 2.3).
        residual_std = INIT_STD / math.sqrt(2 * self.spec.n_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = residual_std if name.endswith(("out_proj", "ffn_down")) else INIT_STD
                nn.init.normal_(module.weight, mean=0.0, std=std)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, idx_BT: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """The logits; given `labels`, the mean loss instead, the head fused into it (trainer.loss, `loss: chunked`)."""
        pos_T = torch.arange(idx_BT.size(1), device=idx_BT.device)
        x_BTE = self.tok_embd(idx_BT) + self.pos_embd(pos_T)
        for block in self.blocks:
            x_BTE = block(x_BTE)
        x_BTE = self.out_norm(x_BTE)
        if labels is not None:  # the tied head too: its gradient adds to the embedding's
            return chunked_cross_entropy(x_BTE, self.tok_embd.weight, labels)
        return F.linear(x_BTE, self.tok_embd.weight)  # weight tying (as GPT-2)
