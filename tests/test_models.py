"""Model registry and builders: parameter counts, the first loss, spec validation, TE builds.

Parameter counts are checked on the meta device (no memory: Llama3-8B "builds" in milliseconds). The
first loss is checked with the worker's labels (a fixed random permutation of the inputs, see
trainer/worker.py): a freshly initialised model should be near-uniform over the vocabulary, so its
cross-entropy is ~ln V. Large registry models are checked through scaled-down copies: the same
architecture, vocabulary and head/GQA ratios, two layers of width ~100.
"""

from __future__ import annotations

import math

import pydantic
import pytest
import torch
import torch.nn.functional as F

from sweep.errors import UserError
from sweep.grid import parse_grid
from trainer.models import REGISTRY, ModelSpec, build_model, resolve
from trainer.models.te import init_rule


def scaled_down(spec: ModelSpec, *, n_layers: int = 2, head_dim: int = 16) -> ModelSpec:
    """`spec`'s architecture at CPU size: same arch, vocabulary, GQA ratio and FFN ratio; 2 layers.

    Heads: 5 for GPT models whose head count is a multiple of 5 (GPT-1.5B has 25: keep it odd), else
    4; Llama: 8 query heads and 8 / (the GQA ratio) KV heads. All matmul dims are multiples of 16.
    """
    if spec.arch == "gpt":
        heads = 5 if spec.n_heads % 5 == 0 else 4
        return spec.model_copy(update=dict(name=f"{spec.label}-small", n_layers=n_layers, n_heads=heads,
                                           d_embd=heads * head_dim, max_seq_len=min(spec.max_seq_len, 256)))
    ratio = spec.n_heads // spec.n_kv_heads
    heads = max(8, ratio)
    d = heads * head_dim
    ffn = 16 * round(spec.ffn_hidden / spec.d_embd * d / 16)
    return spec.model_copy(update=dict(name=f"{spec.label}-small", n_layers=n_layers, n_heads=heads,
                                       n_kv_heads=heads // ratio, d_embd=d, ffn_hidden=ffn,
                                       max_seq_len=min(spec.max_seq_len, 256)))


TINY = ["gpt-tiny", "llama-tiny"]
SMALL = {f"{name}-small": scaled_down(spec) for name, spec in REGISTRY.items() if name not in TINY}


def _meta_numel(spec: ModelSpec, backend: str = "torch") -> int:
    with torch.device("meta"):
        model = build_model(spec, backend=backend)
    return sum(p.numel() for p in model.parameters())


# -- parameter counts ----------------------------------------------------------------------------

def test_seed_model_sizes():
    # seed 000 prints "8.03B" for Llama3-8B; seed 002's GPT (48 x 1600, vocab 50304, tied) has 1.5577 B
    assert REGISTRY["llama3-8b"].n_params() == 8_030_261_248
    assert REGISTRY["gpt2-1.5b"].n_params() == 1_557_686_400
    assert _meta_numel(REGISTRY["llama3-8b"]) == 8_030_261_248
    assert _meta_numel(REGISTRY["gpt2-1.5b"]) == 1_557_686_400


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_registry_param_count_matches_built_model(name):
    spec = REGISTRY[name]
    assert _meta_numel(spec) == spec.n_params()
    assert spec.n_matmul_params() < spec.n_params()


@pytest.mark.parametrize("name", sorted(SMALL))
def test_scaled_down_specs_keep_the_architecture(name):
    small, big = SMALL[name], REGISTRY[name.removesuffix("-small")]
    assert (small.arch, small.vocab_size) == (big.arch, big.vocab_size)
    if big.arch == "llama":
        assert small.n_heads // small.n_kv_heads == big.n_heads // big.n_kv_heads
    assert _meta_numel(small) == small.n_params()


# -- first loss ----------------------------------------------------------------------------------

def _first_loss(spec: ModelSpec, *, batch: int = 2, seq: int = 64, device: str = "cpu", backend: str = "torch") -> float:
    torch.manual_seed(3985)
    with torch.device(device):
        model = build_model(spec, backend=backend)
    with torch.no_grad():
        model.init_weights()
    gen = torch.Generator(device=device).manual_seed(3985)
    perm = torch.randperm(spec.vocab_size, generator=gen, device=device)  # the worker's labels
    tokens = torch.randint(spec.vocab_size, (batch, seq), generator=gen, device=device)
    with torch.no_grad():
        logits = model(tokens)
    return F.cross_entropy(logits.flatten(0, 1).float(), perm[tokens].flatten()).item()


@pytest.mark.parametrize("spec", [REGISTRY[n] for n in TINY] + list(SMALL.values()), ids=lambda s: s.label)
def test_first_loss_is_near_ln_vocab(spec):
    loss = _first_loss(spec)
    assert abs(loss - math.log(spec.vocab_size)) < 0.1 * math.log(spec.vocab_size), loss


# -- validation ----------------------------------------------------------------------------------

BAD_SPECS = [
    (dict(arch="gpt", n_layers=2, d_embd=100, n_heads=3, vocab_size=512), "divisible by n_heads"),
    (dict(arch="mamba", n_layers=2, d_embd=64, n_heads=4, vocab_size=512), "arch"),
    (dict(arch="llama", n_layers=2, d_embd=64, n_heads=4, vocab_size=512), "n_kv_heads and ffn_hidden"),
    (dict(arch="llama", n_layers=2, d_embd=64, n_heads=4, n_kv_heads=3, ffn_hidden=128, vocab_size=512),
     "divisible by n_kv_heads"),
    (dict(arch="gpt", n_layers=2, d_embd=64, n_heads=4, ffn_hidden=256, vocab_size=512), "llama models only"),
    (dict(arch="gpt", n_layers=0, d_embd=64, n_heads=4, vocab_size=512), "greater than 0"),
    (dict(arch="gpt", n_layers=2, d_embd=64, n_heads=4, vocab_size=512, dropout=0.1), "Extra inputs"),
]


@pytest.mark.parametrize("data,message", BAD_SPECS, ids=[m for _, m in BAD_SPECS])
def test_bad_inline_spec_raises(data, message):
    with pytest.raises(pydantic.ValidationError, match=message):
        resolve(data)
    # the same mapping inline in a grid is a user error that names the models field
    with pytest.raises(UserError, match="Invalid grid <grid>: models"):
        parse_grid({"models": [data], "batch_sizes": [1]})


def test_unknown_registry_name_raises():
    with pytest.raises(KeyError):
        resolve("llama3-9b")
    with pytest.raises(UserError, match="unknown model 'llama3-9b'; valid: .*llama3-8b"):
        parse_grid({"models": ["llama3-9b"], "batch_sizes": [1]})


# -- Transformer Engine builds -------------------------------------------------------------------

# Parameter names of te.TransformerLayer (fuse_qkv_params=True) and te.LayerNormLinear, TE 2.x
TE_NAMES = {
    "blocks.0.self_attention.layernorm_qkv.layer_norm_weight": ("ones", 1.0),
    "blocks.0.self_attention.layernorm_qkv.layer_norm_bias": ("zeros", 0.0),
    "blocks.0.self_attention.layernorm_qkv.weight": ("normal", 0.02),
    "blocks.0.self_attention.layernorm_qkv.bias": ("zeros", 0.0),
    "blocks.0.self_attention.proj.weight": ("normal", 0.01),
    "blocks.0.self_attention.proj.bias": ("zeros", 0.0),
    "blocks.0.layernorm_mlp.layer_norm_weight": ("ones", 1.0),
    "blocks.0.layernorm_mlp.fc1_weight": ("normal", 0.02),
    "blocks.0.layernorm_mlp.fc1_bias": ("zeros", 0.0),
    "blocks.0.layernorm_mlp.fc2_weight": ("normal", 0.01),
    "blocks.0.layernorm_mlp.fc2_bias": ("zeros", 0.0),
    "output.layer_norm_weight": ("ones", 1.0),
    "output.weight": ("normal", 0.02),
    "tok_embd.weight": ("normal", 0.02),
    "pos_embd.weight": ("normal", 0.02),
    "out_norm.weight": ("ones", 1.0),
    "out_norm.bias": ("zeros", 0.0),
    # activation checkpointing and whole-model compile prefix the names; the rule reads the suffix
    "_orig_mod.blocks.1._checkpoint_wrapped_module.layernorm_mlp.fc2_weight": ("normal", 0.01),
}


@pytest.mark.parametrize("name", sorted(TE_NAMES))
def test_te_init_rule_matches_the_torch_models(name):
    kind, value = init_rule(name, n_layers=2)  # residual std 0.02 / sqrt(2 * 2) = 0.01
    assert (kind, pytest.approx(value)) == TE_NAMES[name]


def test_te_backend_without_te_says_how_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "transformer_engine", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", None)
    with pytest.raises(ImportError, match=r"pip install 'sweep\[te\]'"):
        build_model(REGISTRY["llama-tiny"], backend="te")


@pytest.mark.parametrize("name", sorted(REGISTRY))
@pytest.mark.gpu
@pytest.mark.usefixtures("te")
def test_te_param_count_matches_spec(name):
    spec = REGISTRY[name]
    assert _meta_numel(spec, backend="te") == spec.n_params()


@pytest.mark.parametrize("spec", [REGISTRY[n] for n in TINY] + list(SMALL.values()), ids=lambda s: s.label)
@pytest.mark.gpu
@pytest.mark.usefixtures("te")
def test_te_first_loss_is_near_ln_vocab(spec):
    loss = _first_loss(spec, device="cuda", backend="te")
    assert abs(loss - math.log(spec.vocab_size)) < 0.1 * math.log(spec.vocab_size), loss


@pytest.mark.gpu
@pytest.mark.usefixtures("te")
def test_te_rope_table_is_fp32_and_sized_to_max_seq_len():
    spec = REGISTRY["llama-tiny"]
    with torch.device("cuda"):
        model = build_model(spec, backend="te")
    model.init_weights()
    assert model.rope_freqs.dtype == torch.float32
    assert tuple(model.rope_freqs.shape) == (spec.max_seq_len, 1, 1, spec.head_dim)
    inv_freq = 1.0 / spec.rope_theta ** (torch.arange(0, spec.head_dim, 2, device="cuda").float() / spec.head_dim)
    torch.testing.assert_close(model.rope_freqs[100, 0, 0, : spec.head_dim // 2], 100 * inv_freq)


@pytest.fixture
def te():
    if not torch.cuda.is_available():
        pytest.skip("Transformer Engine needs a CUDA GPU")
    return pytest.importorskip("transformer_engine.pytorch")
