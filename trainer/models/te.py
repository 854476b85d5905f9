"""The registry's architectures built from Transformer Engine layers (the `*-te` recipes).

Same contract as trainer/models/gpt.py and llama.py, and the same parameters (names aside): `.blocks`
(an nn.ModuleList of `te.TransformerLayer`), `init_weights()` (same init scheme, so the first loss is
~ln V) and `forward(tokens) -> logits` (`forward(tokens, labels=labels) -> loss`: `loss: chunked`);
`sum(p.numel())` equals `spec.n_params()` (tests/test_models.py, where TE is installed).

Llama: TransformerLayer with RMSNorm, SwiGLU, grouped-query attention, fused QKV,
no biases, no dropout, causal self-attention on (batch, seq, hidden) input, RoPE applied inside TE's
attention from `rotary_pos_emb` (TE's RotaryPositionEmbedding table, base `spec.rope_theta`); the head is
a TE LayerNormLinear (final RMSNorm fused with the vocabulary projection), kept out of FP8 unless
`fp8_lm_head`.
Pitfalls avoided on purpose (seen in a hand-written TE Llama script, benchmarks/RESULTS.md "The probes"):
`num_gqa_groups` is the number of KV heads (TE's meaning; passing n_heads // n_kv_heads = 4 for Llama3-8B's
8 KV heads builds a 7.90 B model instead of 8.03 B), RoPE uses base `spec.rope_theta` (500000, not TE's
default 10000) and fp32 angles sized to `spec.max_seq_len` (not a 131072-position table cast to bf16).
RoPE pairs channels as (i, i + D/2) (TE's default, as HF Llama) where llama.py pairs (2i, 2i+1): the
same rotation up to a fixed permutation of each head's channels, so the same cost and the same model.

GPT-2: TransformerLayer with LayerNorm, GELU (TE's is the tanh approximation), biases, multi-head
attention; learned positions, a final LayerNorm and the head tied to the token embedding (plain torch,
so never FP8).

FSDP2: layers are created with `device="meta"` (TE then defers its own init), sharded by
`trainer.parallelize`, materialised with `to_empty` and initialised here. TE needs a CUDA device.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainer.loss import chunked_cross_entropy
from trainer.models.specs import ModelSpec

INIT_STD = 0.02  # as gpt.py / llama.py


def init_rule(name: str, n_layers: int, d_embd: int = 0) -> tuple[str, float]:
    """How the parameter called `name` (its fully qualified name) is initialised.

    ("ones", 1.0) for norm scales, ("zeros", 0.0) for biases, ("normal", std) for the rest: std 0.02, and
    0.02 / sqrt(2L) for the projections that write into the residual stream (attention output `proj`,
    MLP `fc2`), as GPT-2 and torchtitan's Llama do (the same scheme as gpt.py and llama.py).
    """
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "layer_norm_weight" or name.endswith("norm.weight"):
        return ("ones", 1.0)
    if leaf == "layer_norm_bias" or leaf.endswith("bias"):
        return ("zeros", 0.0)
    if name == "output.weight" and d_embd:  # the untied Llama head, as llama.py
        from trainer.models.llama import head_init_std

        return ("normal", head_init_std(d_embd))
    if name.endswith(("proj.weight", "fc2_weight")):
        return ("normal", INIT_STD / math.sqrt(2 * n_layers))
    return ("normal", INIT_STD)


def _init_params(model: nn.Module, n_layers: int, d_embd: int = 0) -> None:
    """Initialise every parameter in place by `init_rule` (plain tensors or FSDP2's DTensor shards)."""
    for name, param in model.named_parameters():
        kind, value = init_rule(name, n_layers, d_embd)
        if kind == "normal":
            nn.init.normal_(param, mean=0.0, std=value)
        else:
            nn.init.constant_(param, value)


def _te() -> Any:
    from trainer.precision.te import import_te

    return import_te("TE models (build_te_model)")


def _fp8_off() -> contextlib.AbstractContextManager[Any]:
    te = _te()
    return te.autocast(enabled=False) if hasattr(te, "autocast") else te.fp8_autocast(enabled=False)


def _device() -> str:
    # TE compares `device == "meta"` to a string to decide whether to defer its init: pass a str.
    return "meta" if torch.get_default_device().type == "meta" else "cuda"


def _layer(te: Any, spec: ModelSpec, device: str, **arch: Any) -> nn.Module:
    """One block, built exactly as every other, so that `compile: regional` need not recompile per block:
    dynamo guards on what a forward reads, and TE's attention reads the module's name (`Layer_<count>` unless
    given one: TE 2.20, MultiheadAttention.forward) — on 2xH200 every Llama3-8B TE trial hit the recompile limit
    (RESULTS.md, session 11). So one name, and no layer_number (training reads it only for the off-by-default
    NVTE_APPLY_QK_LAYER_SCALING and inference's KV cache). Not enough with delayed scaling: dynamo then guards on
    TE's global amax buffer, one entry longer per layer, and still compiles per block (session 12); for TE,
    `compile: none` measured faster (README, Tune)."""
    return te.TransformerLayer(
        hidden_size=spec.d_embd,
        num_attention_heads=spec.n_heads,
        layernorm_epsilon=spec.norm_eps,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        self_attn_mask_type="causal",
        name="block",
        fuse_qkv_params=True,
        attn_input_format="bshd",
        params_dtype=torch.float32,
        device=device,
        **arch,
    )


class TELlama(nn.Module):
    rope_freqs: torch.Tensor  # RoPE angles, a buffer (register_buffer)

    def __init__(self, spec: ModelSpec, *, fp8_lm_head: bool = False):
        super().__init__()
        te, device = _te(), _device()
        self.spec, self.fp8_lm_head = spec, fp8_lm_head
        self.tok_embd = nn.Embedding(spec.vocab_size, spec.d_embd)
        self.blocks = nn.ModuleList(
            _layer(
                te,
                spec,
                device,
                ffn_hidden_size=spec.ffn_hidden,
                num_gqa_groups=spec.n_kv_heads,
                normalization="RMSNorm",
                activation="swiglu",
                bias=False,
            )
            for _ in range(spec.n_layers)
        )
        self.output = te.LayerNormLinear(
            spec.d_embd,
            spec.vocab_size,
            eps=spec.norm_eps,
            bias=False,
            normalization="RMSNorm",
            params_dtype=torch.float32,
            device=device,
        )
        # RoPE angles (T, 1, 1, D), fp32. Not persistent: filled by init_weights on the real device.
        self.register_buffer("rope_freqs", torch.empty(spec.max_seq_len, 1, 1, spec.head_dim), persistent=False)

    def init_weights(self) -> None:
        _init_params(self, self.spec.n_layers, self.spec.d_embd)
        rope = _te().RotaryPositionEmbedding(self.spec.head_dim, rotary_base=self.spec.rope_theta)
        self.rope_freqs.copy_(rope(self.spec.max_seq_len).to(self.rope_freqs.device, torch.float32))

    def forward(
        self, idx_BT: torch.Tensor, is_first_microbatch: bool | None = None, labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`is_first_microbatch` (TE's): None casts the weights to FP8 on every call; True casts and caches
        them, False reuses the cache - valid while the weights do not change (gradient accumulation).
        Given `labels`, the mean loss instead of the logits (`loss: chunked`, `chunked_head`)."""
        T = idx_BT.size(1)
        if T > self.rope_freqs.size(0):
            raise ValueError(f"seq_len {T} exceeds {self.spec.label}'s max_seq_len ({self.spec.max_seq_len})")
        x_BTE = self.tok_embd(idx_BT)
        freqs = self.rope_freqs[:T]
        for block in self.blocks:
            x_BTE = block(x_BTE, rotary_pos_emb=freqs, is_first_microbatch=is_first_microbatch)
        if labels is not None:
            return self.chunked_head(x_BTE, labels)
        # the LM head stays in bf16 (accuracy), as torchao's module filter does, unless asked
        with contextlib.nullcontext() if self.fp8_lm_head else _fp8_off():
            return self.output(x_BTE, is_first_microbatch=is_first_microbatch)

    def chunked_head(self, x_BTE: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The head's RMSNorm and projection (TE's LayerNormLinear: its `layer_norm_weight` and `weight`) with the
        loss, in bf16 as the head runs without `fp8_lm_head` (which folds `loss: chunked` away: there the head is
        FP8, which this would not be; sweep.spec.expand.fold_options)."""
        if self.fp8_lm_head:
            raise ValueError("loss: chunked runs the head in bf16: not with fp8_lm_head (fold_options folds it)")
        norm_weight = self.output.layer_norm_weight
        h_BTE = F.rms_norm(x_BTE, (self.spec.d_embd,), norm_weight.to(x_BTE.dtype), eps=self.spec.norm_eps)
        return chunked_cross_entropy(h_BTE, self.output.weight, labels)


class TEGPT(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        te, device = _te(), _device()
        self.spec = spec
        self.tok_embd = nn.Embedding(spec.vocab_size, spec.d_embd)
        self.pos_embd = nn.Embedding(spec.max_seq_len, spec.d_embd)
        self.blocks = nn.ModuleList(
            _layer(
                te,
                spec,
                device,
                ffn_hidden_size=4 * spec.d_embd,
                normalization="LayerNorm",
                activation="gelu",
                bias=True,
            )
            for _ in range(spec.n_layers)
        )
        self.out_norm = nn.LayerNorm(spec.d_embd, eps=spec.norm_eps)

    def init_weights(self) -> None:
        _init_params(self, self.spec.n_layers)

    def forward(
        self, idx_BT: torch.Tensor, is_first_microbatch: bool | None = None, labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        pos_T = torch.arange(idx_BT.size(1), device=idx_BT.device)
        x_BTE = self.tok_embd(idx_BT) + self.pos_embd(pos_T)
        for block in self.blocks:
            x_BTE = block(x_BTE, is_first_microbatch=is_first_microbatch)
        if labels is not None:  # `loss: chunked`
            return chunked_cross_entropy(self.out_norm(x_BTE), self.tok_embd.weight, labels)
        return F.linear(self.out_norm(x_BTE), self.tok_embd.weight)  # tied head (as GPT-2), not FP8


def build_te_model(spec: ModelSpec, *, fp8_lm_head: bool = False) -> nn.Module:
    """The TE model for `spec`, on the meta device when built under `torch.device("meta")`, else CUDA.
    GPT's head is the tied embedding (plain torch): `fp8_lm_head` applies to Llama only."""
    return TEGPT(spec) if spec.arch == "gpt" else TELlama(spec, fp8_lm_head=fp8_lm_head)
