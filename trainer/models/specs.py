"""Model specs: pure data (no torch), validated on construction, and the registry of named models.

Dims of the large models are the published ones: Llama3-8B and Llama3-70B from Meta's Llama 3 release
(params.json), GPT-1.5B from GPT-2 XL (Radford et al. 2019) with its vocabulary padded to 50304.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class ModelSpec(BaseModel):
    """A decoder-only transformer. `arch` picks the block: GPT-2 style or Llama style."""

    # strict: a quoted "64" in a grid is a mistake, as in a cluster profile
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    arch: Literal["gpt", "llama"]
    name: str | None = Field(default=None, min_length=1, description="label in tables; else arch, dims and a hash")
    n_layers: int = Field(gt=0, description="transformer blocks (L)")
    d_embd: int = Field(gt=0, description="model width (E)")
    n_heads: int = Field(gt=0, description="attention heads (H)")
    vocab_size: int = Field(gt=1, description="vocabulary (V)")
    n_kv_heads: int | None = Field(default=None, gt=0, description="llama: key/value heads (GQA)")
    ffn_hidden: int | None = Field(default=None, gt=0, description="llama: SwiGLU hidden width")
    max_seq_len: int = Field(
        default=8192, gt=0, description="longest seq_len: gpt's learned positions, llama's RoPE table"
    )
    rope_theta: float = Field(default=500000.0, gt=0, description="llama: RoPE base (Llama3: 500000)")
    norm_eps: float = Field(default=1e-5, gt=0)

    @field_validator("name")
    @classmethod
    def _no_outer_spaces(cls, value: str | None) -> str | None:
        # the name is the `model` column: `--where model=...` (stripped) could never select ' mine '
        if value is not None and not value.strip():
            raise ValueError("only spaces: give the model a name, or leave name out")
        if value is not None and value != value.strip():
            raise ValueError(f"leading or trailing spaces: write it {value.strip()!r}")
        return value

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.d_embd % self.n_heads:
            raise ValueError(f"d_embd ({self.d_embd}) must be divisible by n_heads ({self.n_heads})")
        if self.arch == "llama":
            if self.n_kv_heads is None or self.ffn_hidden is None:
                raise ValueError("llama models need n_kv_heads and ffn_hidden")
            if self.n_heads % self.n_kv_heads:
                raise ValueError(f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})")
            if self.head_dim % 2:  # RoPE rotates the head's dims in pairs
                raise ValueError(
                    f"head dim d_embd / n_heads = {self.d_embd} / {self.n_heads} = {self.head_dim} "
                    f"is odd; llama's RoPE needs an even head dim"
                )
        elif self.n_kv_heads is not None or self.ffn_hidden is not None:
            raise ValueError("n_kv_heads and ffn_hidden apply to llama models only (gpt uses MHA and a 4x GELU MLP)")
        return self

    @property
    def label(self) -> str:
        """The model's identity in tables and aggregates: its name, else its shape and a hash of the whole
        spec, so that unnamed specs differing in any field (vocab_size, rope_theta, ...) stay apart."""
        if self.name:
            return self.name
        digest = hashlib.sha256(self.to_json().encode()).hexdigest()[:6]
        return f"{self.arch}-L{self.n_layers}-d{self.d_embd}-{digest}"

    @property
    def head_dim(self) -> int:
        return self.d_embd // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads: a llama's n_kv_heads (every llama spec has one: `_check`), else n_heads (MHA)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def ffn_width(self) -> int:
        """The MLP's hidden width: a llama's ffn_hidden (every llama spec has one: `_check`), else 4 x d_embd."""
        return 4 * self.d_embd if self.ffn_hidden is None else self.ffn_hidden

    def to_json(self) -> str:
        return json.dumps(self.model_dump(exclude_none=True), sort_keys=True)

    def n_params(self) -> int:
        """Every parameter, tied weights once. Matches `sum(p.numel())` of the built model (tested)."""
        E, L, V = self.d_embd, self.n_layers, self.vocab_size
        if self.arch == "gpt":
            # per block: 2 LayerNorms (w+b), qkv (3E*E + 3E), out (E*E + E), MLP (4E*E + 4E, 4E*E + E)
            block = 2 * 2 * E + (3 * E * E + 3 * E) + (E * E + E) + (4 * E * E + 4 * E) + (4 * E * E + E)
            return V * E + self.max_seq_len * E + L * block + 2 * E  # tied head; final LayerNorm
        D, J, K = self.head_dim, self.kv_heads, self.ffn_width
        block = 2 * E + E * (E + 2 * J * D) + E * E + 3 * E * K  # 2 RMSNorms, qkv, out, SwiGLU
        return 2 * V * E + L * block + E  # untied embedding and head; final RMSNorm

    def n_matmul_params(self) -> int:
        """Parameters that multiply activations in a matmul (every Linear weight and the LM head).

        Embedding lookups, norms and biases are in `n_params` but do no matmul; this is what
        FlopCounterMode sees (tests compare the two).
        """
        E, L, V = self.d_embd, self.n_layers, self.vocab_size
        if self.arch == "gpt":
            return L * 12 * E * E + V * E
        D, J, K = self.head_dim, self.kv_heads, self.ffn_width
        return L * (E * (E + 2 * J * D) + E * E + 3 * E * K) + V * E


def _spec(**kw: Any) -> ModelSpec:
    return ModelSpec(**kw)


# Named models. Big ones carry their published dims; tiny ones keep the CPU demo and CI fast.
REGISTRY: dict[str, ModelSpec] = {
    "gpt-tiny": _spec(arch="gpt", name="gpt-tiny", n_layers=2, d_embd=64, n_heads=4, vocab_size=512, max_seq_len=1024),
    "llama-tiny": _spec(
        arch="llama", name="llama-tiny", n_layers=2, d_embd=64, n_heads=4, n_kv_heads=2, ffn_hidden=192, vocab_size=512
    ),
    # GPT-2 XL: 48 layers, 25 heads, d 1600, vocab 50304 (GPT-2 vocab padded to a multiple of 64), seq 1024
    "gpt2-1.5b": _spec(
        arch="gpt", name="gpt2-1.5b", n_layers=48, d_embd=1600, n_heads=25, vocab_size=50304, max_seq_len=1024
    ),
    # Meta's Llama3-8B (32 layers, 32 heads, 8 kv heads, d 4096, ffn 14336, vocab 128256, RoPE 500000)
    "llama3-8b": _spec(
        arch="llama",
        name="llama3-8b",
        n_layers=32,
        d_embd=4096,
        n_heads=32,
        n_kv_heads=8,
        ffn_hidden=14336,
        vocab_size=128256,
    ),
    # Llama3-70B (80 layers, d 8192, 64 heads, 8 kv heads, ffn 28672, vocab 128256, RoPE 500000): 70.55 B
    # params, whose training state alone (16 B per param) needs ~8 H200s or MI300Xs (sweep/memory/capacity.py)
    "llama3-70b": _spec(
        arch="llama",
        name="llama3-70b",
        n_layers=80,
        d_embd=8192,
        n_heads=64,
        n_kv_heads=8,
        ffn_hidden=28672,
        vocab_size=128256,
    ),
    # Llama3-70B dims with only 4 layers, so one or two GPUs can run its GEMM shapes
    "llama3-70b-proxy": _spec(
        arch="llama",
        name="llama3-70b-proxy",
        n_layers=4,
        d_embd=8192,
        n_heads=64,
        n_kv_heads=8,
        ffn_hidden=28672,
        vocab_size=128256,
    ),
    "mistral-7b": _spec(
        arch="llama",
        name="mistral-7b",
        n_layers=32,
        d_embd=4096,
        n_heads=32,
        n_kv_heads=8,
        ffn_hidden=14336,
        vocab_size=32000,
        rope_theta=1000000.0,
    ),
}


def resolve(model: str | dict | ModelSpec) -> ModelSpec:
    """A registry name or an inline mapping to a ModelSpec. Raises KeyError / pydantic.ValidationError."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        if model not in REGISTRY:
            raise KeyError(model)
        return REGISTRY[model]
    return ModelSpec(**model)
