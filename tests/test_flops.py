"""FLOPs per token (trainer.flops) against torch's own FLOP counter, and against the tokens trained.

What FlopCounterMode counts for one forward + backward of our models, per token:

    6 * spec.n_matmul_params() + 12 * L * H * D * T

- 6 * N_matmul: every Linear weight and the LM head do 2 FLOPs per weight per token forward, and 4
  backward (input gradient + weight gradient).
- 12 * L*H*D*T: attention's Q·Kᵀ and A·V, 2·T·D FLOPs per head per token each forward, doubled backward.
  The counter sees the full T×T square: SDPA's math path with is_causal=True still multiplies the whole
  score matrix (it masks, it does not skip), exactly as the PaLM formula counts it. On the CPU, SDPA's
  fused kernel is not in FlopCounterMode's table, so the test pins the math backend (plain bmm).

`trainer.flops.spec_flops_per_token` uses N = every parameter (`sum(p.numel())`), so it
exceeds the counter by exactly 6 × (embedding-lookup + norm + bias parameters): a lookup, a norm scale
and a bias add do no matmul. Tolerance: 1e-9 relative (float rounding only). Both counts are exact
integers; any difference would be an uncounted matmul, a wrong formula, or SDPA dispatched to a kernel
the counter cannot see.
"""

from __future__ import annotations

import statistics
import types
from datetime import datetime, timezone

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from trainer.flops import convention_flops_per_token, flops_per_token, spec_flops_per_token
from trainer.models import REGISTRY, ModelSpec, build_model

REL = 1e-9


def _scaled_down(spec: ModelSpec) -> ModelSpec:
    """Same as tests/test_models.py's scaled_down (2 layers, head dim 16), with a small vocabulary."""
    if spec.arch == "gpt":
        heads = 5 if spec.n_heads % 5 == 0 else 4
        return spec.model_copy(
            update=dict(n_layers=2, n_heads=heads, d_embd=16 * heads, vocab_size=512, max_seq_len=128)
        )
    ratio = spec.n_heads // spec.n_kv_heads
    heads = max(8, ratio)
    d = 16 * heads
    return spec.model_copy(
        update=dict(
            n_layers=2,
            n_heads=heads,
            n_kv_heads=heads // ratio,
            d_embd=d,
            ffn_hidden=16 * round(spec.ffn_hidden / spec.d_embd * d / 16),
            vocab_size=512,
        )
    )


SPECS = {name: spec if name.endswith("tiny") else _scaled_down(spec) for name, spec in REGISTRY.items()}


def _counted_flops_per_token(model: nn.Module, spec: ModelSpec, batch: int, seq: int) -> float:
    tokens = torch.randint(spec.vocab_size, (batch, seq))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        loss = F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
        loss.backward()
    return counter.get_total_flops() / (batch * seq)


def _non_matmul_params(model: nn.Module) -> int:
    """Parameters that do no matmul, counted from the built modules (not from the spec's formulas)."""
    head_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    tied = {id(model.tok_embd.weight)} if getattr(model.spec, "arch", None) == "gpt" else set()  # head = tok_embd
    total = 0
    for module in model.modules():
        if isinstance(module, nn.Embedding) and id(module.weight) not in tied | head_weights:
            total += module.weight.numel()  # lookups
        elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            total += sum(p.numel() for p in module.parameters(recurse=False))  # norm scale (+ shift)
        elif isinstance(module, nn.Linear) and module.bias is not None:
            total += module.bias.numel()
    return total


@pytest.mark.parametrize("name", sorted(SPECS))
def test_counter_matches_6n_matmul_plus_attention(name):
    spec, batch, seq = SPECS[name], 2, 64
    torch.manual_seed(0)
    model = build_model(spec)
    with torch.no_grad():
        model.init_weights()
    counted = _counted_flops_per_token(model, spec, batch, seq)
    expected = 6 * spec.n_matmul_params() + 12 * spec.n_layers * spec.n_heads * spec.head_dim * seq
    assert counted == pytest.approx(expected, rel=REL)

    # our N counts every parameter: the surplus is exactly the parameters that do no matmul
    surplus = spec_flops_per_token(spec, seq) - counted
    assert surplus == pytest.approx(6 * _non_matmul_params(model), rel=REL)
    assert surplus == pytest.approx(6 * (spec.n_params() - spec.n_matmul_params()), rel=REL)
    # Megatron counts every GEMM the counter sees, but half the T×T square (the causal half)
    half_square = 6 * spec.n_layers * spec.n_heads * spec.head_dim * seq
    assert convention_flops_per_token("megatron", spec, seq) == pytest.approx(counted - half_square, rel=REL)


def test_seed_000_formula_for_llama3_8b():
    # 6N + 12·L·H·D·T with N = 8.03 B, L = 32, H·D = 4096, T = 4096 (PaLM appendix B)
    spec = REGISTRY["llama3-8b"]
    assert spec_flops_per_token(spec, 4096) == 6 * 8_030_261_248 + 12 * 32 * 4096 * 4096
    assert flops_per_token(n_params=1, n_layers=1, n_heads=1, head_dim=1, seq_len=1) == 18


def test_other_tools_conventions_for_llama3_8b_at_8192():
    """The issue's figures: NVIDIA/Megatron tables give 57.9 or 51.5 GFLOP per token against our 61.1."""
    spec, T = REGISTRY["llama3-8b"], 8192
    E, L, H, J, D, F, V = (
        spec.d_embd,
        spec.n_layers,
        spec.n_heads,
        spec.n_kv_heads,
        spec.head_dim,
        spec.ffn_hidden,
        spec.vocab_size,
    )
    gflop = {c: convention_flops_per_token(c, spec, T) / 1e9 for c in ("sweep", "megatron", "torchtitan")}
    assert {c: round(g, 1) for c, g in gflop.items()} == {"sweep": 61.1, "megatron": 51.5, "torchtitan": 57.9}
    # Megatron-LM's transformer_flops (megatron/training/training.py), written out: 3 passes x 2 FLOPs x
    # (QKV + causal core attention + out projection + SwiGLU per layer, and the logits)
    megatron = 3 * 2 * (L * (E * (H * D + 2 * J * D) + H * D * T / 2 * 2 + H * D * E + 3 * E * F) + E * V)
    assert convention_flops_per_token("megatron", spec, T) == megatron
    # Megatron before the causal halving (12·B·s·L·h²·(...) of Narayanan et al. 2021): full square, 57.9
    legacy = 12 * L * E * E * ((1 + J / H + T / E) + F / E * 1.5 + V / (2 * L * E))
    assert legacy / 1e9 == pytest.approx(gflop["torchtitan"], rel=5e-5)  # torchtitan also counts the norm weights
    # torchtitan: 6 × (every parameter but the token embedding) + 12·L·H·D·T
    assert convention_flops_per_token("torchtitan", spec, T) == 6 * (spec.n_params() - V * E) + 12 * L * H * D * T


def test_flops_use_the_batch_actually_trained(monkeypatch, run_one_rank):
    """TFLOP/s = flops_per_token × the tokens each rank trained per second.

    Counting the nominal 16 rows (`6 * N * 16 * 1024`) while training 12 overstates by 33 %. Here the worker is
    run for real (one CPU rank), the model records the shape of every batch it is given, and the result
    row's TFLOP/s must equal flops_per_token × (rows seen × seq_len) / step time.
    """
    import trainer.models
    from sweep.execution.outcome import Outcome
    from sweep.record.rows import outcome_row
    from sweep.spec.grid import Trial

    spec, batch, seq = REGISTRY["gpt-tiny"], 3, 32
    seen: list[tuple[int, int]] = []
    real_build = trainer.models.build_model

    def recording_build(spec_, **kw):
        model = real_build(spec_, **kw)
        model.register_forward_pre_hook(lambda _m, args: seen.append(tuple(args[0].shape)))
        return model

    monkeypatch.setattr(trainer.models, "build_model", recording_build)
    result = run_one_rank(spec, "bf16", batch_size=batch, seq_len=seq, warmup_steps=1, measure_steps=3)
    assert result.status == "ok", result.error
    assert seen == [(batch, seq)] * 4  # every step, warm-up included, trained `batch` rows of `seq` tokens

    trial = Trial(
        cluster="local",
        model=spec,
        precision="bf16",
        compile="none",
        ac="none",
        batch_size=batch,
        seq_len=seq,
        gpus=1,
        warmup_steps=1,
        measure_steps=3,
    )
    now = datetime.now(timezone.utc)
    outcome = Outcome(trial=trial, status="ok", ranks=[result], started_at=now, finished_at=now, wall_s=1.0)
    profile = types.SimpleNamespace(
        name="local",
        accelerator="cpu",
        peak_tflops=lambda family: None,
        cost_per_gpu_hour=None,
        power_cost_per_kwh=None,
        pue=None,
        power_limit_w=None,
    )
    row = outcome_row(outcome, run_id="r", profile=profile, grid_name=None)
    step_time = statistics.median(result.step_times)
    tokens_per_s = seen[-1][0] * seen[-1][1] / step_time
    assert row["tokens_per_s_per_gpu"] == pytest.approx(tokens_per_s)
    assert row["tflops_per_gpu"] == pytest.approx(spec_flops_per_token(spec, seq) * tokens_per_s / 1e12)


def test_git_sha_names_the_shipped_commit_when_given(monkeypatch):
    """A tree copied to a GPU machine may carry no .git or a stale one: SWEEP_GIT_SHA, when set, wins; else
    the rows name this checkout's HEAD, +dirty with uncommitted changes, and None only outside a checkout."""
    import subprocess
    from pathlib import Path

    from sweep.record import rows

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(Path(rows.__file__).parent), *args], capture_output=True, text=True)

    rows.git_sha.cache_clear()
    try:
        monkeypatch.setenv("SWEEP_GIT_SHA", "926b7b394b80")
        assert rows.git_sha() == "926b7b394b80"
        rows.git_sha.cache_clear()
        monkeypatch.delenv("SWEEP_GIT_SHA")
        sha = rows.git_sha()
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:  # not a git checkout (or no git): nothing to name
            assert sha is None
            return
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip() != ""
        assert sha == head.stdout.strip()[:12] + ("+dirty" if dirty else ""), sha
    finally:
        rows.git_sha.cache_clear()
