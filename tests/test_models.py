"""Model registry and builders: parameter counts, the first loss, spec validation, TE builds.

Parameter counts are checked on the meta device (no memory: Llama3-8B "builds" in milliseconds). The
first loss is checked with the worker's labels (a fixed random permutation of the inputs, see
trainer/worker.py): a freshly initialised model should be near-uniform over the vocabulary, so its
cross-entropy is ~ln V. Large registry models are checked through scaled-down copies: the same
architecture, vocabulary and head/GQA ratios, two layers of width ~100.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import sys
import types

import pydantic
import pytest
import torch
import torch.nn.functional as F

from sweep.errors import UserError
from sweep.spec.grid import parse_grid
from trainer.models import REGISTRY, ModelSpec, build_model, resolve
from trainer.models.te import init_rule


def scaled_down(spec: ModelSpec, *, n_layers: int = 2, head_dim: int = 16) -> ModelSpec:
    """`spec`'s architecture at CPU size: same arch, vocabulary, GQA ratio and FFN ratio; 2 layers.

    Heads: 5 for GPT models whose head count is a multiple of 5 (GPT-1.5B has 25: keep it odd), else
    4; Llama: 8 query heads and 8 / (the GQA ratio) KV heads. All matmul dims are multiples of 16.
    """
    if spec.arch == "gpt":
        heads = 5 if spec.n_heads % 5 == 0 else 4
        return spec.model_copy(
            update=dict(
                name=f"{spec.label}-small",
                n_layers=n_layers,
                n_heads=heads,
                d_embd=heads * head_dim,
                max_seq_len=min(spec.max_seq_len, 256),
            )
        )
    ratio = spec.n_heads // spec.n_kv_heads
    heads = max(8, ratio)
    d = heads * head_dim
    ffn = 16 * round(spec.ffn_hidden / spec.d_embd * d / 16)
    return spec.model_copy(
        update=dict(
            name=f"{spec.label}-small",
            n_layers=n_layers,
            n_heads=heads,
            n_kv_heads=heads // ratio,
            d_embd=d,
            ffn_hidden=ffn,
            max_seq_len=min(spec.max_seq_len, 256),
        )
    )


TINY = ["gpt-tiny", "llama-tiny"]
# Scaled down, Llama3-70B is its 4-layer proxy's copy (same dims, vocabulary and ratios): checked once.
SAME_AS_PROXY = ["llama3-70b"]
SMALL = {f"{name}-small": scaled_down(spec) for name, spec in REGISTRY.items() if name not in TINY + SAME_AS_PROXY}


def _meta_numel(spec: ModelSpec, backend: str = "torch") -> int:
    with torch.device("meta"):
        model = build_model(spec, backend=backend)
    return sum(p.numel() for p in model.parameters())


# -- parameter counts ----------------------------------------------------------------------------


def test_seed_model_sizes():
    # Llama3-8B is "8.03B" in Meta's release; GPT-2 XL dims (48 x 1600, vocab 50304, tied) give 1.5577 B
    assert REGISTRY["llama3-8b"].n_params() == 8_030_261_248
    assert REGISTRY["gpt2-1.5b"].n_params() == 1_557_686_400
    assert _meta_numel(REGISTRY["llama3-8b"]) == 8_030_261_248
    assert _meta_numel(REGISTRY["gpt2-1.5b"]) == 1_557_686_400
    # Llama3-70B (Meta's model card: 70.6B); its proxy keeps the dims with 4 of the 80 layers
    assert REGISTRY["llama3-70b"].n_params() == _meta_numel(REGISTRY["llama3-70b"]) == 70_553_706_496
    assert REGISTRY["llama3-70b"] == REGISTRY["llama3-70b-proxy"].model_copy(
        update=dict(name="llama3-70b", n_layers=80)
    )


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


def _first_loss(
    spec: ModelSpec, *, batch: int = 2, seq: int = 64, device: str = "cpu", backend: str = "torch"
) -> float:
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
    (
        dict(arch="llama", n_layers=2, d_embd=64, n_heads=4, n_kv_heads=3, ffn_hidden=128, vocab_size=512),
        "divisible by n_kv_heads",
    ),
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
    with pytest.raises(UserError, match="unknown model 'llama3-9b' — did you mean 'llama3-8b'"):
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


# A stand-in for Transformer Engine (it cannot be imported without CUDA): TE's constructor arguments,
# parameter names and shapes, and a forward that uses every weight, so trainer/models/te.py's own logic
# (meta-device build, parameter count, init by name, RoPE table, LM head outside FP8, training through
# the worker) runs on the CPU. The real layers are checked by the `gpu` tests below.


class _StubTE:
    def __init__(self):
        self.fp8_enabled = [False]  # autocast stack
        self.head_calls: list[bool] = []  # fp8 state seen by LayerNormLinear (the LM head)
        self.block_calls: list[bool] = []  # fp8 state seen by TransformerLayer
        self.rope_args: list[tuple] = []
        self.cache_args: list[bool | None] = []  # is_first_microbatch seen by the blocks (FP8 weight cache)
        self.block_kwargs: list[dict] = []  # what each TransformerLayer was built with
        stub = self

        def _device(device):
            assert isinstance(device, str), "TE compares device to the string 'meta'"
            return device if device == "meta" else "cpu"

        def _norm(x, w, b, eps):
            if b is None:
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
            return F.layer_norm(x, (x.size(-1),), w, b, eps)

        class _Params(torch.nn.Module):
            def __init__(self, device, **shapes):
                super().__init__()
                for name, shape in shapes.items():
                    if shape is not None:
                        self.register_parameter(name, torch.nn.Parameter(torch.empty(shape, device=device)))
                    else:
                        setattr(self, name, None)

        class TransformerLayer(torch.nn.Module):
            def __init__(
                self,
                *,
                hidden_size,
                ffn_hidden_size,
                num_attention_heads,
                num_gqa_groups=None,
                layernorm_epsilon,
                hidden_dropout,
                attention_dropout,
                self_attn_mask_type,
                name,
                fuse_qkv_params,
                attn_input_format,
                params_dtype,
                device,
                normalization="LayerNorm",
                activation="gelu",
                bias=True,
            ):  # (no layer_number: passing one fails here)
                super().__init__()
                stub.block_kwargs.append({k: v for k, v in locals().items() if k not in ("self", "__class__")})
                assert (fuse_qkv_params, attn_input_format, self_attn_mask_type) == (True, "bshd", "causal")
                assert hidden_dropout == attention_dropout == 0.0 and params_dtype == torch.float32
                dev, E, H = _device(device), hidden_size, num_attention_heads
                D, G = E // H, num_gqa_groups or H
                K = ffn_hidden_size * (2 if activation == "swiglu" else 1)
                ln_b = (E,) if normalization == "LayerNorm" else None
                self.act, self.eps, self.E = activation, layernorm_epsilon, E
                self.self_attention = torch.nn.Module()
                self.self_attention.layernorm_qkv = _Params(
                    dev,
                    layer_norm_weight=(E,),
                    layer_norm_bias=ln_b,
                    weight=((H + 2 * G) * D, E),
                    bias=((H + 2 * G) * D,) if bias else None,
                )
                self.self_attention.proj = _Params(dev, weight=(E, H * D), bias=(E,) if bias else None)
                self.layernorm_mlp = _Params(
                    dev,
                    layer_norm_weight=(E,),
                    layer_norm_bias=ln_b,
                    fc1_weight=(K, E),
                    fc1_bias=(K,) if bias else None,
                    fc2_weight=(E, ffn_hidden_size),
                    fc2_bias=(E,) if bias else None,
                )

            def forward(self, x, rotary_pos_emb=None, is_first_microbatch=None):
                stub.block_calls.append(stub.fp8_enabled[-1])
                stub.cache_args.append(is_first_microbatch)
                if rotary_pos_emb is not None:
                    stub.rope_args.append((tuple(rotary_pos_emb.shape), rotary_pos_emb.dtype))
                a, m = self.self_attention.layernorm_qkv, self.layernorm_mlp
                q = F.linear(_norm(x, a.layer_norm_weight, a.layer_norm_bias, self.eps), a.weight, a.bias)[
                    ..., : self.E
                ]
                x = x + F.linear(q, self.self_attention.proj.weight, self.self_attention.proj.bias)
                h = F.linear(_norm(x, m.layer_norm_weight, m.layer_norm_bias, self.eps), m.fc1_weight, m.fc1_bias)
                if self.act == "swiglu":
                    gate, up = h.chunk(2, -1)
                    h = F.silu(gate) * up
                else:
                    h = F.gelu(h, approximate="tanh")
                return x + F.linear(h, m.fc2_weight, m.fc2_bias)

        class LayerNormLinear(torch.nn.Module):
            def __init__(self, in_features, out_features, *, eps, bias, normalization, params_dtype, device):
                super().__init__()
                assert not bias and normalization == "RMSNorm" and params_dtype == torch.float32
                dev = _device(device)
                self.eps = eps
                self.layer_norm_weight = torch.nn.Parameter(torch.empty(in_features, device=dev))
                self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, device=dev))

            def forward(self, x, is_first_microbatch=None):
                stub.head_calls.append(stub.fp8_enabled[-1])
                return F.linear(_norm(x, self.layer_norm_weight, None, self.eps), self.weight)

        class RotaryPositionEmbedding:
            def __init__(self, dim, rotary_base=10000.0):
                self.inv_freq = 1.0 / rotary_base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)

            def __call__(self, max_seq_len):
                freqs = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), self.inv_freq)
                emb = torch.cat((freqs, freqs), dim=-1)
                return emb.reshape(emb.size(0), 1, 1, emb.size(1))

        @contextlib.contextmanager
        def autocast(enabled=True, recipe=None):
            self.fp8_enabled.append(enabled)
            try:
                yield
            finally:
                self.fp8_enabled.pop()

        class _Recipe:
            def __init__(self, **kw):
                self.kw = kw

        self.pytorch = types.SimpleNamespace(
            TransformerLayer=TransformerLayer,
            LayerNormLinear=LayerNormLinear,
            RotaryPositionEmbedding=RotaryPositionEmbedding,
            autocast=autocast,
        )
        self.recipe = types.SimpleNamespace(
            Format=types.SimpleNamespace(HYBRID="HYBRID"),
            DelayedScaling=_Recipe,
            Float8CurrentScaling=_Recipe,
            Float8BlockScaling=_Recipe,
            MXFP8BlockScaling=_Recipe,
        )

    def install(self, monkeypatch):
        root = types.ModuleType("transformer_engine")
        pytorch, common, recipe = (
            types.ModuleType(n)
            for n in ("transformer_engine.pytorch", "transformer_engine.common", "transformer_engine.common.recipe")
        )
        pytorch.__dict__.update(vars(self.pytorch))
        recipe.__dict__.update(vars(self.recipe))
        root.pytorch, root.common, common.recipe = pytorch, common, recipe
        for name, module in [
            ("transformer_engine", root),
            ("transformer_engine.pytorch", pytorch),
            ("transformer_engine.common", common),
            ("transformer_engine.common.recipe", recipe),
        ]:
            monkeypatch.setitem(sys.modules, name, module)
        return self


@pytest.fixture
def stub_te(monkeypatch):
    if torch.cuda.is_available() and importlib.util.find_spec("transformer_engine") is not None:
        pytest.skip("the real Transformer Engine is here: the gpu tests cover it")
    return _StubTE().install(monkeypatch)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_te_model_param_count_with_stub(stub_te, name):
    spec = REGISTRY[name]
    assert _meta_numel(spec, backend="te") == spec.n_params()


@pytest.mark.parametrize("spec", [REGISTRY[n] for n in TINY] + list(SMALL.values()), ids=lambda s: s.label)
def test_te_model_first_loss_with_stub(stub_te, spec):
    loss = _first_loss(spec, backend="te")
    assert abs(loss - math.log(spec.vocab_size)) < 0.1 * math.log(spec.vocab_size), loss
    if spec.arch == "llama":
        assert stub_te.rope_args[-1] == ((64, 1, 1, spec.head_dim), torch.float32)


@pytest.mark.parametrize("name", ["llama-tiny", "gpt-tiny"])
def test_te_blocks_are_built_alike_one_name_and_no_layer_number(stub_te, name):
    # TE names an unnamed module Layer_<count> and its attention's forward reads that name: one dynamo recompile per
    # block (RESULTS.md, session 11; with delayed scaling dynamo still recompiles on TE's amax buffer: session 12)
    build_model(REGISTRY[name], backend="te")
    assert len(stub_te.block_kwargs) == REGISTRY[name].n_layers > 1
    assert (
        all(kw == stub_te.block_kwargs[0] for kw in stub_te.block_kwargs) and stub_te.block_kwargs[0]["name"] == "block"
    )


def test_te_llama_head_runs_outside_fp8_and_rope_is_bounded(stub_te):
    spec = REGISTRY["llama-tiny"]
    model = build_model(spec, backend="te")
    with torch.no_grad():
        model.init_weights()
    with stub_te.pytorch.autocast(enabled=True):
        model(torch.zeros(1, 16, dtype=torch.long))
    assert stub_te.head_calls == [False]
    with pytest.raises(ValueError, match="exceeds llama-tiny's max_seq_len"):
        model(torch.zeros(1, spec.max_seq_len + 1, dtype=torch.long))


@pytest.mark.parametrize("recipe", ["bf16-te", "fp8-te-delayed"])
@pytest.mark.parametrize("arch", ["llama", "gpt"])
def test_te_model_trains_through_the_worker_with_stub(stub_te, run_one_rank, recipe, arch):
    """The worker's whole path for a TE recipe on one CPU rank: meta build, to_empty, init, steps (one rank
    trains unsharded under autocast; the real TE layers under FSDP2 are the H200 benchmarks')."""
    spec = REGISTRY[f"{arch}-tiny"]
    result = run_one_rank(spec, recipe)
    assert result.status == "ok", result.traceback
    assert result.loss_last < result.loss_first
    assert abs(result.loss_first - math.log(spec.vocab_size)) < 0.1 * math.log(spec.vocab_size)
    assert result.params_local == spec.n_params()
    # blocks ran in the FP8 region (bf16-te: none opened), the Llama head always outside it
    assert stub_te.block_calls and set(stub_te.block_calls) == {recipe != "bf16-te"}
    assert stub_te.head_calls == ([False] * 5 if arch == "llama" else [])  # 1 warm-up + 4 measured steps
    assert stub_te.fp8_enabled == [False]
    assert set(stub_te.cache_args) == {None}  # one micro-batch per step: FP8 weights cast at every forward


def test_te_gradient_accumulation_caches_fp8_weights_and_fp8_head_with_stub(stub_te, run_one_rank):
    """grad_accum 3: TE casts FP8 weights on each step's first micro-batch and reuses them on the other two;
    fp8_lm_head runs the head inside the FP8 region."""
    spec = REGISTRY["llama-tiny"]
    result = run_one_rank(spec, "fp8-te-delayed", grad_accum=3, fp8_lm_head=True)
    assert result.status == "ok", result.traceback
    assert result.loss_last < result.loss_first
    assert stub_te.head_calls == [True] * 3 * 5  # 3 micro-batches x (1 warm-up + 4 measured steps)
    per_forward = [True, False, False] * 5
    assert stub_te.cache_args == [c for c in per_forward for _ in range(spec.n_layers)]


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
