"""`loss: chunked` as a unit (trainer.loss): the same loss and gradients as F.cross_entropy over the full logits,
in fp32, bf16 and under autocast, for any chunking, eager or compiled; tied weights; never a B x T x V tensor; and
the models' forward with labels, torch and TE (its CPU stub) alike."""

from __future__ import annotations

import math

import pytest
import test_models
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from trainer.loss import chunked_cross_entropy, compiled_chunks
from trainer.loss_chunk import CHUNK_LOGITS, chunk_tokens
from trainer.models import build_model
from trainer.models.specs import REGISTRY

B, T, D, V = 2, 7, 16, 50  # 14 tokens
stub_te = test_models.stub_te  # the fixture of Transformer Engine's CPU stub (tests/test_models.py)


def _inputs(dtype: torch.dtype = torch.float32, seed: int = 0, t: int = T):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, t, D, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(V, D, generator=g) * D**-0.5).to(dtype).requires_grad_()
    labels = torch.randint(0, V, (B, t), generator=g)
    return hidden, weight, labels


def _full(hidden, weight, labels):
    """Today's `loss: full`: the head's logits, their fp32 upcast, the mean cross-entropy (trainer.train)."""
    return F.cross_entropy(F.linear(hidden, weight).flatten(0, 1).float(), labels.flatten())


def _value_and_grads(loss_fn, hidden, weight, labels, scale: float = 1.0):
    hidden.grad = weight.grad = None
    loss = loss_fn(hidden, weight, labels)
    (loss * scale).backward()
    return loss.detach(), hidden.grad.clone(), weight.grad.clone()


@pytest.mark.parametrize("chunk", [1, 3, 5, 14, 100])  # 14 tokens: 3 and 5 leave a remainder chunk, 100 is one
def test_the_loss_and_its_gradients_are_those_of_the_full_logits_in_fp32(chunk):
    hidden, weight, labels = _inputs()
    want = _value_and_grads(_full, hidden, weight, labels, scale=0.5)  # 0.5: a grad_output other than 1
    got = _value_and_grads(
        lambda h, w, y: chunked_cross_entropy(h, w, y, chunk=chunk), hidden, weight, labels, scale=0.5
    )
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_in_bf16_it_matches_within_bf16_rounding():
    """bf16 hidden and weight (FSDP2's gathered parameters): the loss summed in fp32 either way."""
    hidden, weight, labels = _inputs(torch.bfloat16)
    want = _value_and_grads(_full, hidden, weight, labels)
    got = _value_and_grads(lambda h, w, y: chunked_cross_entropy(h, w, y, chunk=4), hidden, weight, labels)
    assert got[0].dtype == torch.float32
    assert got[1].dtype == got[2].dtype == torch.bfloat16  # each gradient in its input's dtype
    assert got[0].item() == pytest.approx(want[0].item(), rel=1e-3)
    for g, w in zip(got[1:], want[1:]):
        torch.testing.assert_close(g.float(), w.float(), rtol=0.02, atol=0.02 * w.float().abs().max().item())


def test_under_autocast_the_matmuls_run_in_bf16_and_the_gradients_return_fp32():
    """One rank: fp32 parameters under bf16 autocast, as the full path's head computes."""
    hidden, weight, labels = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = _value_and_grads(_full, hidden, weight, labels)
        got = _value_and_grads(lambda h, w, y: chunked_cross_entropy(h, w, y, chunk=4), hidden, weight, labels)
    assert got[1].dtype == got[2].dtype == torch.float32
    assert got[0].item() == pytest.approx(want[0].item(), rel=1e-3)
    exact = _value_and_grads(_full, hidden, weight, labels)  # fp32 throughout: autocast's bf16 did round
    assert not torch.equal(got[2], exact[2])
    for g, w in zip(got[1:], want[1:]):
        torch.testing.assert_close(g, w, rtol=0.02, atol=0.02 * w.abs().max().item())


def test_a_weight_tied_to_the_embedding_gets_both_gradients():
    """GPT's head is its embedding: the loss's gradient adds to the embedding's."""
    _, weight, labels = _inputs()
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))

    def tied(loss_fn):
        weight.grad = None
        loss_fn(F.embedding(tokens, weight), weight, labels).backward()
        return weight.grad.clone()

    torch.testing.assert_close(
        tied(lambda h, w, y: chunked_cross_entropy(h, w, y, chunk=3)), tied(_full), rtol=1e-5, atol=1e-6
    )


def test_gradients_accumulate_over_micro_batches():
    """Two micro-batches, each loss / 2 (grad_accum 2): autograd sums into .grad as for the full path."""
    (h1, w, y1), (h2, _, y2) = _inputs(seed=0), _inputs(seed=1)

    def accumulated(loss_fn):
        w.grad = None
        for h, y in ((h1, y1), (h2, y2)):
            (loss_fn(h, w, y) / 2).backward()
        return w.grad.clone()

    torch.testing.assert_close(
        accumulated(lambda h, w, y: chunked_cross_entropy(h, w, y, chunk=5)), accumulated(_full), rtol=1e-5, atol=1e-6
    )


class _Shapes(TorchDispatchMode):
    """Every tensor an op returns: its number of elements."""

    def __init__(self):
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.sizes.append(t.numel())
        return out


LONG = 40  # tokens per row here: B x LONG x V logits are the largest tensor of the full path (V x D is less)


def _largest(loss_fn) -> int:
    hidden, weight, labels = _inputs(t=LONG)
    with _Shapes() as seen:
        loss_fn(hidden, weight, labels).backward()
    return max(seen.sizes)


def test_no_tensor_of_the_full_logits_is_ever_made():
    """Forward and backward: the largest tensor is the weight's gradient (V x D) or a chunk's logits (here 30 x V),
    not B x T x V."""
    assert _largest(_full) == B * LONG * V  # the check sees the full path's logits
    assert _largest(lambda h, w, y: chunked_cross_entropy(h, w, y, chunk=30)) == max(30 * V, V * D, B * LONG * D)


def test_a_chunk_holds_a_fixed_number_of_logits():
    assert chunk_tokens(128_256) == CHUNK_LOGITS // 128_256 == 2092  # Llama 3: 2,092 tokens a chunk
    assert chunk_tokens(2 * CHUNK_LOGITS) == 1  # at least one token


@pytest.mark.parametrize("name", ["llama-tiny", "gpt-tiny"])
def test_a_model_given_labels_returns_the_loss_of_its_logits(name):
    """The models' forward with labels (`loss: chunked`) is the loss over the logits they return without."""
    torch.manual_seed(0)
    model = build_model(REGISTRY[name])
    model.init_weights()
    tokens = torch.randint(0, model.spec.vocab_size, (2, 16))
    labels = torch.roll(tokens, -1, dims=1)
    full = F.cross_entropy(model(tokens).flatten(0, 1).float(), labels.flatten())
    full.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    chunked = model(tokens, labels=labels)
    chunked.backward()
    assert chunked.item() == pytest.approx(full.item(), rel=1e-5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], rtol=1e-4, atol=1e-6, msg=n)


def test_under_compile_the_loss_runs_eagerly_and_is_the_same():
    """`compile: full` traces the whole model: the chunked loss is a graph break (trainer.loss), not a failure.
    aot_eager: dynamo and AOT autograd as inductor sees them, without the C++ compile of the CPU kernels."""
    torch.manual_seed(0)
    model = build_model(REGISTRY["llama-tiny"])
    model.init_weights()
    tokens = torch.randint(0, model.spec.vocab_size, (2, 16))
    labels = torch.roll(tokens, -1, dims=1)
    eager = model(tokens, labels=labels)
    compiled = torch.compile(model, backend="aot_eager")(tokens, labels=labels)
    compiled.backward()
    assert compiled.item() == pytest.approx(eager.item(), rel=1e-5)
    assert model.output.weight.grad is not None and model.tok_embd.weight.grad is not None


def test_compiled_chunks_give_the_eager_loss_and_gradients():
    """A compiled trial's chunks run through inductor (`compiled_chunks`): a remainder chunk too, the same values."""
    from torch._dynamo.utils import counters

    hidden, weight, labels = _inputs()
    eager = _value_and_grads(lambda h, w, y: chunked_cross_entropy(h, w, y, chunk=5), hidden, weight, labels)
    graphs = counters["stats"]["unique_graphs"]
    with compiled_chunks(True):
        compiled = _value_and_grads(lambda h, w, y: chunked_cross_entropy(h, w, y, chunk=5), hidden, weight, labels)
    assert counters["stats"]["unique_graphs"] > graphs  # dynamo did compile them
    for g, w in zip(compiled, eager):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch", ["llama", "gpt"])
def test_te_models_given_labels_return_the_loss_of_their_logits_with_stub(stub_te, arch):
    """TE's Llama head is a LayerNormLinear (its RMSNorm fused in): the chunked loss applies its norm weight and
    its projection, outside it (the stub of tests/test_models.py records its calls); GPT's is the tied embedding."""
    spec = REGISTRY[f"{arch}-tiny"]
    torch.manual_seed(0)
    model = build_model(spec, backend="te")
    model.init_weights()
    tokens = torch.randint(0, spec.vocab_size, (2, 16))
    labels = torch.roll(tokens, -1, dims=1)
    full = F.cross_entropy(model(tokens).flatten(0, 1).float(), labels.flatten())
    full.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    head_calls = list(stub_te.head_calls)
    chunked = model(tokens, labels=labels)
    chunked.backward()
    assert stub_te.head_calls == head_calls  # the TE head's own forward did not run
    assert chunked.item() == pytest.approx(full.item(), rel=1e-5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], rtol=1e-4, atol=1e-6, msg=n)


def test_te_llama_refuses_a_chunked_loss_with_its_fp8_head_with_stub(stub_te):
    """fold_options never sends it one (an FP8 head folds the loss to full): were it sent, not silently bf16."""
    model = build_model(REGISTRY["llama-tiny"], backend="te", fp8_lm_head=True)
    tokens = torch.zeros(1, 8, dtype=torch.long)
    with pytest.raises(ValueError, match="fp8_lm_head"):
        model(tokens, labels=tokens)


def test_a_te_recipe_trains_with_the_chunked_loss_through_the_worker_with_stub(stub_te, run_one_rank):
    """bf16-te on one CPU rank (autocast, unsharded), two micro-batches a step: the loss falls from ~ln V."""
    spec = REGISTRY["llama-tiny"]
    result = run_one_rank(spec, "bf16-te", loss="chunked", grad_accum=2)
    assert result.status == "ok", result.traceback
    assert result.loss_last < result.loss_first
    assert result.loss_first == pytest.approx(math.log(spec.vocab_size), rel=0.1)
    assert stub_te.head_calls == []  # never the TE head's forward


def test_a_compiled_trial_trains_with_the_chunked_loss_through_the_worker(run_one_rank):
    """compile: regional on one CPU rank: the blocks compiled, the chunk loop eager, each chunk compiled."""
    from trainer import loss

    def compiled_calls() -> int:  # each loss of a compiled trial asks for the compiled chunk function
        info = loss._compiled_chunk.cache_info()
        return info.hits + info.misses

    spec = REGISTRY["llama-tiny"]
    full = run_one_rank(spec, "bf16", compile="regional", measure_steps=2)
    before = compiled_calls()
    chunked = run_one_rank(spec, "bf16", compile="regional", measure_steps=2, loss="chunked")
    assert chunked.status == "ok", chunked.traceback
    assert compiled_calls() == before + 3  # 1 warm-up + 2 measured steps, one micro-batch each
    assert chunked.losses == pytest.approx(full.losses, rel=1e-3)
