"""A CPU rank's predicted peak (sweep.memory.cpu): the count against what this machine measured, the affine fit on a
folder's clean CPU rows, and `sweep plan` showing it against the cap without refusing anything. No Ray, no torch."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import invoke, result_row, rows_folder

from sweep.memory.cpu import (
    CpuSample,
    calibrate_cpu,
    config_of,
    cpu_breakdown,
    cpu_layer_bytes,
    cpu_leave_one_out,
    cpu_loss_bytes,
    cpu_predicted_bytes,
    fit_affine,
)
from sweep.memory.model import Shape
from trainer.models.specs import REGISTRY, ModelSpec

MiB = 2**20
WIDE_VOCAB = ModelSpec(
    arch="gpt", name="wide-vocab", n_layers=1, d_embd=64, n_heads=4, vocab_size=4096, max_seq_len=1024
)
MODELS = {"gpt-tiny": REGISTRY["gpt-tiny"], "llama-tiny": REGISTRY["llama-tiny"], "wide-vocab": WIDE_VOCAB}

# Measured on this project's 2-core machine (torch 2.13, 2 gloo ranks, FSDP2, compile none, a 1 GiB cap, one warm
# rank group after trainer/memory.py's heap trim): (model, precision, seq) -> [(batch, peak MiB)], every warm row
# of the run (its first trial, gpt-tiny bf16 batch 1 seq 32, ran on fresh processes: 38.7 MiB, no clean row).
CAMPAIGN = {
    ("gpt-tiny", "bf16", 32): [(4, 8.4), (16, 12.01), (64, 27.95)],
    ("gpt-tiny", "bf16", 128): [(1, 5.55), (4, 7.58), (16, 23.34), (64, 89.42)],
    ("gpt-tiny", "fp32", 32): [(1, 3.83), (4, 4.01), (16, 10.25), (64, 31.85)],
    ("gpt-tiny", "fp32", 128): [(1, 4.19), (4, 9.87), (16, 32.01), (64, 119.04)],
    ("llama-tiny", "bf16", 32): [(1, 9.94), (4, 12.16), (16, 18.31), (64, 37.93)],
    ("llama-tiny", "bf16", 128): [(1, 5.86), (4, 9.91), (16, 29.41), (64, 116.97)],
    ("llama-tiny", "fp32", 32): [(1, 4.2), (4, 5.4), (16, 12.6), (64, 39.06)],
    ("llama-tiny", "fp32", 128): [(1, 5.14), (4, 12.69), (16, 39.05), (64, 145.64)],
    ("wide-vocab", "bf16", 32): [(1, 7.99), (4, 11.49), (16, 30.2), (64, 105.9)],
    ("wide-vocab", "bf16", 128): [(1, 10.04), (4, 28.72), (16, 104.24), (64, 407.55)],
    ("wide-vocab", "fp32", 32): [(1, 8.48), (4, 10.77), (16, 30.56), (64, 109.44)],
    ("wide-vocab", "fp32", 128): [(1, 10.7), (4, 30.42), (16, 109.46), (64, 424.55)],
}


def _shape(model: str, precision: str = "fp32", batch: int = 64, seq: int = 128, **kw) -> Shape:
    return Shape.of_spec(MODELS[model], precision=precision, batch_size=batch, seq_len=seq, ranks=2, **kw)


def _campaign() -> list[tuple[str, str, int, int, CpuSample]]:
    out = []
    for (model, precision, seq), points in CAMPAIGN.items():
        for batch, mib in points:
            s = _shape(model, precision, batch, seq)
            sample = CpuSample(config_of(s, precision, "none"), cpu_predicted_bytes(s, precision), mib * MiB)
            out.append((model, precision, batch, seq, sample))
    return out


def test_a_block_saves_what_autograd_saved_on_this_machine():
    # saved_tensors_hooks over each tiny model's eager forward, storages counted once, per token per block
    assert cpu_layer_bytes(_shape("gpt-tiny"), 4) == 4112  # 16·E fp32 values and the fp32 log-sum-exp (4 heads)
    assert cpu_layer_bytes(_shape("llama-tiny"), 4) == 5648  # RMSNorm's 3·E, q k v out and wo's copy, SwiGLU's 4·K
    assert cpu_layer_bytes(_shape("llama-tiny", "bf16"), 2) == 3344  # RMSNorm keeps its input and x̂ in fp32


def test_the_loss_holds_12_bytes_per_logit_whatever_the_recipe_and_a_chunk_far_less():
    full = _shape("wide-vocab")
    assert cpu_loss_bytes(full, 4) == cpu_loss_bytes(full, 2) == 12 * 64 * 128 * 4096
    big_vocab = replace(full, vocab_size=128_256, loss="chunked", batch_size=64, seq_len=4096)
    assert cpu_loss_bytes(big_vocab, 2) < cpu_loss_bytes(replace(big_vocab, loss="full"), 2) / 50


def test_the_count_is_within_3_percent_of_the_large_fp32_peaks_before_any_fit():
    for model in MODELS:
        (measured,) = [mib for b, mib in CAMPAIGN[(model, "fp32", 128)] if b == 64]
        assert cpu_predicted_bytes(_shape(model), "fp32") == pytest.approx(measured * MiB, rel=0.03), model


def test_init_counts_the_unsharded_copy_every_rank_builds_from():
    parts = cpu_breakdown(_shape("gpt-tiny", batch=1, seq=1), "fp32")
    n = REGISTRY["gpt-tiny"].n_params()
    assert parts.init == 4 * n + 4 * n / 2 and parts.state == 12 * n / 2


def _samples(points: list[tuple[float, float]], precision: str = "fp32") -> list[CpuSample]:
    config = config_of(_shape("gpt-tiny"), precision, "none")
    return [CpuSample(config, raw * MiB, measured * MiB) for raw, measured in points]


def test_the_fit_recovers_overhead_and_slope_and_falls_back_to_an_overhead_alone():
    fit = fit_affine(_samples([(10, 13), (20, 24), (40, 46)]))  # 2 MiB + 1.1 x
    assert fit.overhead == pytest.approx(2 * MiB) and fit.slope == pytest.approx(1.1) and fit.rows == 3
    one = fit_affine(_samples([(10, 13)]))
    assert (one.overhead, one.slope) == (3 * MiB, 1.0)
    close = fit_affine(_samples([(10, 13), (11, 13.2)]))  # 10 % apart: a slope there would rest on noise
    assert close.slope == 1.0 and close.overhead == pytest.approx(2.6 * MiB)


def test_the_closest_rows_calibrate_a_trial_config_then_its_model_then_its_precision():
    s128, s32 = _shape("gpt-tiny", batch=1), _shape("gpt-tiny", batch=1, seq=32)
    own = [CpuSample(config_of(s128, "fp32", "none"), raw * MiB, (raw + 1) * MiB) for raw in (10, 40)]
    other = [CpuSample(config_of(_shape("llama-tiny"), "fp32", "none"), 10 * MiB, 15 * MiB)]
    cal = calibrate_cpu(own + other)
    assert cal.fit(s128, "fp32", "none").scope == "config"
    assert cal.fit(s32, "fp32", "none").scope == "model"  # the same model at another seq len
    kind = cal.fit(_shape("wide-vocab"), "fp32", "none")
    assert kind.scope == "kind" and kind.rows == 3 and kind.slope == 1.0
    assert cal.fit(s128, "bf16", "none") is None and cal.predict(s128, "bf16", "none").basis() == "uncalibrated"


def test_fitted_on_this_machine_every_row_above_20_mib_is_within_10_percent():
    rows = _campaign()
    cal = calibrate_cpu(s for *_, s in rows)
    held_out = cpu_leave_one_out([s for *_, s in rows])
    worst_in, worst_out = 0.0, 0.0
    for (model, precision, batch, seq, s), loo in zip(rows, held_out):
        if s.measured < 20 * MiB:  # a few MiB of heap noise: ±1.5 MiB between batches of the same tokens
            continue
        predicted = cal.predict(_shape(model, precision, batch, seq), precision, "none").bytes
        worst_in = max(worst_in, abs(predicted / s.measured - 1))
        assert loo is not None
        worst_out = max(worst_out, abs(loo / s.measured - 1))
    assert worst_in < 0.10
    assert worst_out < 0.20  # each row predicted from the others alone: 17.4 % at worst, extrapolating 4x


def _row(batch: int, peak_mib: float, **changes) -> dict:
    fields = dict(
        model="gpt-tiny",
        model_spec=REGISTRY["gpt-tiny"].model_dump_json(),
        precision="fp32",
        batch_size=batch,
        seq_len=128,
        world_size=2,
        dp_shard=2,
        peak_mem_gib=peak_mib / 1024,
        memory_cap_gib=0.25,
        actor_reused=True,
    )
    return result_row(**{**fields, **changes})


def test_plan_shows_the_cpu_prediction_against_the_cap_and_refuses_nothing(tmp_path_factory):
    fresh = _row(1, 38.7, actor_reused=False, trial_id="t0")  # a fresh process's first trial: not learned from
    out = rows_folder(tmp_path_factory, "cpu", [fresh, _row(4, 9.87, trial_id="t1"), _row(16, 32.01, trial_id="t2")])
    args = ("plan", "--cluster", "local", "-m", "gpt-tiny", "-p", "fp32", "--compile", "none", "--seq-len", 128)
    result = invoke(
        *args, "--gpus", 2, "-b", 16, "-b", 1024, "--memory-cap", "256MiB", "-o", out, env={"COLUMNS": "250"}
    )
    assert result.exit_code == 0, result.output
    assert "32 MiB / 256 MiB" in result.stdout  # batch 16: as measured
    assert "GiB / 256 MiB" in result.stdout and "no (" not in result.stdout  # batch 1024, 1.8 GiB, still runs
    assert "calibrated on 2 rows of local" in result.stdout and "calibrated on 2 rows of its config" in result.stdout
    # batch 1 predicted 4.3 MiB on a warm process: its fresh row measured 34.4 MiB above, said beside the figure
    assert (
        "a fresh process's first trial peaked +34.4 MiB above it (median of 1 row), not in the figure" in result.stdout
    )
    assert "predicted max batch: gpt-tiny fp32 (compile none, ac none, seq 128, 2 ranks): " in result.stdout
    uncapped = invoke(*args, "--gpus", 2, "-b", 16, "-o", out, env={"COLUMNS": "250"})
    assert "MiB /" not in uncapped.stdout and "predicted max batch" not in uncapped.stdout


def test_rows_that_compiled_in_their_window_are_said_apart_not_learned_from(tmp_path_factory):
    # measured, gpt-tiny fp32 regional seq 128: batch 4 compiled (39 s) and peaked with inductor in the rank process;
    # batch 16 ran the graph batch 4 compiled (dynamic_batch), 0.49 s beyond a steady first step
    compiled = _row(4, 49.76, compile="regional", compile_time_s=38.98, trial_id="t1")
    out = rows_folder(
        tmp_path_factory,
        "compiled",
        [compiled, _row(16, 28.53, compile="regional", compile_time_s=0.49, trial_id="t2")],
    )
    args = ("plan", "--cluster", "local", "-m", "gpt-tiny", "-p", "fp32", "--compile", "regional", "--seq-len", 128)
    result = invoke(*args, "--gpus", 2, "-b", 16, "--memory-cap", "256MiB", "-o", out, env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "28.5 MiB / 256 MiB" in result.stdout and "calibrated on 1 row of local" in result.stdout
    assert "a trial that compiled peaked +" in result.stdout
