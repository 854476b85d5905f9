"""The memory predictor (sweep/memory/model.py) against figures worked by hand for llama-tiny, and its calibration."""

from dataclasses import replace

import pytest
from conftest import ROOT

from sweep.memory.calibration import NO_ROWS, UNCALIBRATED_MARGIN, Prediction, Sample, calibrate, leave_one_out
from sweep.memory.model import Shape, activation_bytes, breakdown, layer_bytes_per_token, predicted_bytes
from sweep.spec.grid import load_grid
from trainer.models.specs import REGISTRY

# llama-tiny: E 64, 4 heads of D 16, 2 kv heads (J·D 32), ffn 192, vocab 512, 2 layers; 164,160 params,
# one block 49,280 (2·64 norms + 64·128 qkv + 64·64 out + 3·64·192 SwiGLU), root 65,600, matmul weights 131,072
TINY = Shape(
    arch="llama",
    n_layers=2,
    d_embd=64,
    n_heads=4,
    vocab_size=512,
    n_params=164160,
    n_kv_heads=2,
    ffn_hidden=192,
    max_seq_len=8192,
    batch_size=2,
    seq_len=8,
    ranks=1,
)


def test_the_spec_counts_are_the_ones_worked_by_hand():
    spec = REGISTRY["llama-tiny"]
    assert (spec.n_params(), spec.n_matmul_params()) == (164160, 131072)


def test_a_block_saves_what_backward_needs_per_token():
    # norms in and out 4·64, q 64, k and v 2·32, attention output 64, SwiGLU gate, up and product 3·192: 1024 × 2 B
    assert layer_bytes_per_token(TINY) == 2048
    # torchao FP8 keeps the matmul inputs (both norm outputs, attention output, down-projection input:
    # 3·64 + 192 = 384 elements) at 1 B instead of 2
    assert layer_bytes_per_token(replace(TINY, fp8_saved=True)) == 2048 - 384
    gpt = Shape(
        arch="gpt",
        n_layers=2,
        d_embd=64,
        n_heads=4,
        vocab_size=512,
        n_params=198400,
        n_kv_heads=None,
        ffn_hidden=None,
        max_seq_len=1024,
        batch_size=2,
        seq_len=8,
        ranks=1,
    )
    assert layer_bytes_per_token(gpt) == 32 * 64  # Korthikanti's 34·E less the two residual dropout masks


@pytest.mark.parametrize(
    "ac, expected",
    [
        ("none", 2 * 2048 * 16),  # 2 layers × 2,048 B × 16 tokens
        ("full", 2 * 64 * 16 + 2048 * 16),  # block 0's input kept while block 1 is recomputed whole
        ("selective", 2 * 64 * 16 + 2048 * 16),  # block 0 checkpointed (its input), block 1 keeps everything
    ],
)
def test_activations_by_ac_mode(ac, expected):
    assert activation_bytes(replace(TINY, ac=ac)) == expected


def test_one_rank_peak_worked_by_hand():
    b = breakdown(TINY)
    assert b.state == 12 * 164160  # masters and moments; no gradients at the end of forward
    assert b.compute_copies == 2 * 131072  # autocast's bf16 weight casts
    assert b.logits == 6 * 2 * 8 * 512
    assert b.forward_end == 1969920 + 262144 + 65536 + 49152
    assert b.backward_end == 16 * 164160 + 262144
    assert predicted_bytes(TINY) == 2888704  # the state dominates a tiny model at a small batch
    big = replace(TINY, batch_size=64)
    assert predicted_bytes(big) == 1969920 + 262144 + 2 * 2048 * 512 + 6 * 512 * 512


def test_sharded_peak_worked_by_hand():
    b = breakdown(replace(TINY, ranks=2))
    assert b.state == 6 * 164160
    assert b.compute_copies == 2 * 2 * 65600  # the root, the largest unit, all-gathered twice in bf16
    assert b.backward_end == 8 * 164160 + 262400
    # with grad_accum the earlier micro-batches' gradients are live at the end of forward
    assert breakdown(replace(TINY, ranks=2, grad_accum=4)).state == 8 * 164160


def test_calibration_is_the_median_ratio_per_precision_compile_and_loss():
    rows = [
        Sample("bf16", "regional", 100.0, 110.0),
        Sample("bf16", "regional", 100.0, 90.0),
        Sample("bf16", "regional", 100.0, 105.0),
        Sample("fp8-torchao-tensorwise", "regional", 50.0, 40.0),
    ]
    cal = calibrate(rows)
    assert cal.ratio("bf16", "regional") == pytest.approx(1.05)
    assert cal.rows[("bf16", "regional", "full")] == 3  # a sample that names no config: the full loss
    assert cal.ratio("fp8-torchao-tensorwise", "regional") == pytest.approx(0.8)
    assert cal.ratio("bf16", "none") is None


def test_leave_one_out_uses_only_the_other_rows():
    rows = [
        Sample("bf16", "regional", 100.0, 110.0),
        Sample("bf16", "regional", 100.0, 90.0),
        Sample("bf16", "none", 10.0, 12.0),
    ]
    # the first row's ratio is the second's alone (0.9), and the reverse; the third has no other row of its kind
    assert leave_one_out(rows) == [pytest.approx(90.0), pytest.approx(110.0), None]


def test_uncalibrated_prediction_needs_the_margin_to_say_no():
    p = Prediction(raw=105.0, ratio=None, rows=0)
    assert p.fits(100.0)  # within the margin: not ruled out on an uncalibrated figure
    assert not Prediction(raw=100.0 * (1 + UNCALIBRATED_MARGIN) + 1, ratio=None, rows=0).fits(100.0)
    assert not Prediction(raw=105.0, ratio=1.0, rows=3).fits(100.0)


def test_max_batch_is_the_largest_batch_predicted_to_fit():
    available = predicted_bytes(replace(TINY, batch_size=64))
    # uncalibrated, no margin (the estimate itself, where a search places a probe)
    assert NO_ROWS.max_batch(TINY, "bf16", "none", available, margin=False) == 64
    assert NO_ROWS.max_batch(TINY, "bf16", "none", available - 1, margin=False) == 63
    assert NO_ROWS.max_batch(TINY, "bf16", "none", 1000.0, margin=False) == 0
    # a ratio of 2 halves the room: the largest batch whose raw figure is at most half
    half = calibrate([Sample("bf16", "none", 100.0, 200.0)]).max_batch(TINY, "bf16", "none", available)
    assert predicted_bytes(replace(TINY, batch_size=half)) * 2 <= available
    assert predicted_bytes(replace(TINY, batch_size=half + 1)) * 2 > available


def test_a_chunked_loss_holds_a_chunk_and_the_head_gradients_not_the_logits():
    """`loss: chunked` (trainer/loss.py): llama-tiny's 16 tokens are one chunk (chunk_tokens(512) is 524,288):
    its logits in bf16, their fp32 upcast and log-softmax, the head's gradient in fp32 with a chunk's bf16 share, the
    hidden gradient."""
    chunked = replace(TINY, loss="chunked")
    assert breakdown(chunked).logits == 10 * 16 * 512 + 6 * 512 * 64 + 2 * 16 * 64
    assert breakdown(chunked).logits > breakdown(TINY).logits  # at 16 tokens the V x E gradients outweigh them
    # everything else is the full loss's
    assert breakdown(chunked).forward_end - breakdown(chunked).logits == breakdown(TINY).forward_end - 49152


# Llama3-8B's layer dims with 8 layers on one H200, T 4096, batch 16: the model of the campaign's loss grid
LLAMA_8L = Shape.of_spec(
    load_grid(ROOT / "benchmarks/campaigns/kernels-one-gpu/loss.yaml").models[0],
    precision="bf16",
    batch_size=16,
    seq_len=4096,
    ranks=1,
)


def test_at_llama3_dims_a_chunk_is_2092_tokens_and_the_logits_term_shrinks_sevenfold():
    full, chunked = breakdown(LLAMA_8L), breakdown(replace(LLAMA_8L, loss="chunked"))
    assert full.logits == 6 * 16 * 4096 * 128256  # 50.4 GB: bf16 batch 16 failed allocating 15.7 GiB of it
    assert chunked.logits == 10 * 2092 * 128256 + 6 * 128256 * 4096 + 2 * 16 * 4096 * 4096
    assert full.logits / chunked.logits > 7  # 50.4 GB against 6.4 GB
    # and it grows with the batch by the hidden gradient alone (2 B x E per token), not 6 B x V
    more = breakdown(replace(LLAMA_8L, loss="chunked", batch_size=17)).logits
    assert more - chunked.logits == 2 * 4096 * 4096


def test_a_trial_s_loss_reaches_its_shape():
    from conftest import tiny_trial

    assert Shape.of(tiny_trial(loss="chunked")).loss == "chunked"
    assert Shape.of(tiny_trial()).loss == "full"
    assert predicted_bytes(Shape.of(tiny_trial(loss="chunked"))) != predicted_bytes(Shape.of(tiny_trial()))


def test_a_recorded_row_is_predicted_with_the_loss_it_ran():
    """Calibration compares a row's measured peak with the prediction for what it ran: a chunked row's prediction
    is the chunked one (rows before schema 1.13, with no loss column, ran the full loss)."""
    from sweep.memory.predictor import sample

    spec = REGISTRY["llama-tiny"]
    row = {
        "model_spec": spec.to_json(),
        "precision": "bf16",
        "compile": "none",
        "batch_size": 4,
        "seq_len": 64,
        "world_size": 1,
        "peak_mem_gib": 0.01,
        "status": "ok",
    }
    shape = Shape.of_spec(spec, precision="bf16", batch_size=4, seq_len=64, ranks=1)
    chunked, old = sample({**row, "loss": "chunked"}), sample(row)
    assert chunked is not None and old is not None
    assert chunked.predicted == predicted_bytes(replace(shape, loss="chunked"))
    assert old.predicted == predicted_bytes(shape) != chunked.predicted
