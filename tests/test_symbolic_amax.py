"""torchao's amax in two static-length stages where the batch is symbolic (trainer.precision.symbolic_amax).

On CPU ranks (torchao's emulated FP8) through a compiled Float8Linear model: the two stages run in the symbolic trace,
the forward and the gradients are bitwise those of torchao's own amax in eager code, and two batch sizes share one
graph. Whether it is faster is measured on the GPU (benchmarks/device/kernels_probe.py --profile).
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")

import torch.nn as nn  # noqa: E402

from trainer.precision import symbolic_amax  # noqa: E402

BACKEND = "aot_eager"


def _model(recipe: str) -> nn.Module:
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.SiLU(), nn.Linear(128, 64))
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=True)
    convert_to_float8_training(model, config=config)
    return model


def _step(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    out = model(x)
    out.square().mean().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_symbolic_batch_is_bitwise_torchaos_amax_in_one_graph(recipe: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensorwise takes the two stages in the symbolic trace; rowwise keeps torchao's own amax (its column scales'
    stages trained wrongly on the GPU); both train bitwise as torchao's eager code, on one graph for two batches."""
    symbolic_amax.install()
    two_stage: list[set[int]] = []
    stages = symbolic_amax._two_stage
    monkeypatch.setattr(symbolic_amax, "_two_stage", lambda x, dims: two_stage.append(dims) or stages(x, dims))
    eager, compiled = _model(recipe), _model(recipe)
    compiled.compile(backend=BACKEND)
    torch._dynamo.reset()
    graphs = []
    try:
        for batch in (2, 3):
            x = torch.randn(batch, 256, 64, generator=torch.Generator().manual_seed(batch))
            torch._dynamo.mark_dynamic(x, 0)
            want = _step(eager, x)  # eager: no symbolic size, torchao's own amax
            got = _step(compiled, x)
            assert torch.equal(got[0], want[0])
            assert all(torch.equal(g, w) for g, w in zip(got[1], want[1]))
            graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
        assert graphs[1] == graphs[0], "batch 3 compiled anew instead of running batch 2's graphs"
        assert bool(two_stage) == (recipe == "tensorwise"), two_stage
        assert all(0 in dims for dims in two_stage)  # the symbolic batch, flattened into the tokens
    finally:
        torch._dynamo.reset()


def test_static_shapes_and_eager_run_torchaos_own_amax(monkeypatch: pytest.MonkeyPatch) -> None:
    symbolic_amax.install()
    calls: list[int] = []
    original = symbolic_amax._original
    monkeypatch.setattr(symbolic_amax, "_original", lambda *a: calls.append(1) or original(*a))
    _step(_model("tensorwise"), torch.randn(2, 256, 64))
    assert calls, "eager code did not reach torchao's amax"
