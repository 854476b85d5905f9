"""The GPU calibration (sweep/memory/calibration.py): an affine fit per config where its rows span 2 batch sizes,
the ratio per precision, compile mode and loss otherwise, and fits that are not used (and say why)."""

from dataclasses import replace

import pytest
from conftest import ROOT

from sweep.memory.calibration import MIN_SPREAD, Sample, calibrate, config_of, leave_one_out
from sweep.memory.model import GiB, Shape, breakdown
from sweep.spec.grid import load_grid

TE = "fp8-te-delayed"
# Llama3-8B's layer dims with 8 layers on one H200 at T 4096 (the kernels-one-gpu campaign's model)
LLAMA_8L = Shape.of_spec(
    load_grid(ROOT / "benchmarks/campaigns/kernels-one-gpu/te.yaml").models[0],
    precision=TE,
    batch_size=1,
    seq_len=4096,
    ranks=1,
)


def _at(batch: int, shape: Shape = LLAMA_8L) -> Shape:
    return replace(shape, batch_size=batch)


def _rows(measured, batches, precision: str = TE, compile: str = "none", shape: Shape = LLAMA_8L) -> list[Sample]:
    """Samples of `shape` at `batches`, each measured `measured(breakdown)` bytes."""
    return [Sample.of(_at(b, shape), precision, compile, measured(breakdown(_at(b, shape)))) for b in batches]


def _affine(overhead: float, slope: float):
    return lambda b: overhead + slope * b.batch_part


def test_the_fit_recovers_a_known_overhead_and_slope_and_predicts_other_batches_by_it():
    """TE on one H200 keeps 9.75 GiB per sample where the count says 7.2: a line through measured rows at 3, 8 and 9
    gives batch 11 the measured slope, where a ratio learned at those batches would not."""
    truth = _affine(30 * GiB, 1.355)
    cal = calibrate(_rows(truth, [3, 8, 9]))
    fit = cal.fits[config_of(LLAMA_8L, TE, "none")]
    assert (fit.overhead / GiB, fit.slope, fit.rows, fit.batches) == (pytest.approx(30.0), pytest.approx(1.355), 3, 3)
    at_11 = cal.predict(_at(11), TE, "none")
    assert at_11.bytes == pytest.approx(truth(breakdown(_at(11))))
    assert at_11.basis() == "affine on 3 clean rows of its config at 3 batch sizes: 30 GiB + 1.355 × its activations"
    # the ratio of the same rows is off at 11 by more than 1 %: a slope it cannot have
    ratio = cal.ratio(TE, "none")
    assert ratio is not None and abs(ratio * at_11.raw / at_11.bytes - 1) > 0.01
    # another seq len is another config: the ratio, not this config's line
    assert cal.predict(replace(_at(11), seq_len=2048), TE, "none").fit is None


def test_a_config_measured_at_one_batch_size_falls_back_to_the_ratio():
    cal = calibrate(_rows(lambda b: 1.2 * b.peak, [4, 4]))
    assert cal.fits == {} and cal.refused == {}
    p = cal.predict(_at(8), TE, "none")
    assert p.bytes == pytest.approx(1.2 * p.raw) and p.fit is None
    assert p.basis() == "× 1.200, the median measured/predicted of 2 clean rows"


def test_two_rows_too_close_for_a_slope_fall_back_to_the_ratio():
    """One row at each of two batches: nothing says how far a row scatters, so their batch parts must spread by
    MIN_SPREAD (8 and 9 do not)."""
    parts = [breakdown(_at(b)).batch_part for b in (8, 9)]
    assert parts[1] < MIN_SPREAD * parts[0]
    assert calibrate(_rows(_affine(30 * GiB, 1.355), [8, 9])).fits == {}
    assert calibrate(_rows(_affine(30 * GiB, 1.355), [3, 9])).fits != {}


@pytest.mark.parametrize(
    "measured, why",
    [
        (lambda b: 200 * GiB - 0.5 * b.batch_part, "fit a slope of -0.500, which no memory has: not used"),
        (lambda b: -10 * GiB + 2.0 * b.batch_part, "fit an overhead of -10 GiB, which no memory has: not used"),
    ],
    ids=["negative slope", "negative overhead"],
)
def test_a_line_no_memory_follows_is_not_used_and_the_prediction_says_so(measured, why):
    cal = calibrate(_rows(measured, [2, 4, 8]))
    config = config_of(LLAMA_8L, TE, "none")
    assert cal.fits == {} and cal.refused[config] == f"its config's 3 rows at 3 batch sizes {why}"
    p = cal.predict(_at(16), TE, "none")  # never extrapolated down the line: the ratio, which says why
    ratio = cal.ratio(TE, "none")
    assert ratio is not None and p.bytes == pytest.approx(ratio * p.raw) and p.fit is None
    assert p.basis().endswith(f"clean rows; its config's 3 rows at 3 batch sizes {why}")


def test_rows_that_scatter_too_far_for_a_slope_are_not_fitted():
    """As measured on one H200: TE at batch 8 by two trainer versions (121.3 and 113.5 GiB, twice each) and at 9
    once more (123.2, twice): a line through them has a slope of 0.81 ± 58 %, and put batch 3 at +36 %."""
    peaks = {8: [121.34, 121.21, 113.51, 113.39], 9: [123.26, 123.12]}
    samples = [Sample.of(_at(b), TE, "none", gib * GiB) for b, figures in peaks.items() for gib in figures]
    cal = calibrate(samples)
    why = cal.refused[config_of(LLAMA_8L, TE, "none")]
    assert why.startswith("its config's 6 rows at 2 batch sizes scatter too far for a slope (0.811 ± 5")
    # session 18's rows alone agree within 0.14 GiB at each batch: their line is used
    alone = calibrate([s for s in samples if not 115 * GiB < s.measured < 122 * GiB])
    assert alone.fits[config_of(LLAMA_8L, TE, "none")].slope == pytest.approx(1.355, abs=0.01)


def test_the_prediction_stays_at_least_the_counted_end_of_backward():
    cal = calibrate(_rows(_affine(1 * GiB, 1.0), [4, 8]))
    b = breakdown(_at(1))
    assert cal.predict(_at(1), TE, "none").bytes == b.backward_end > 1 * GiB + b.batch_part


def test_the_ratio_of_the_full_loss_does_not_correct_a_chunked_loss():
    """TE's full-loss rows teach × 1.22 (the count misses what TE keeps per sample); the chunked loss takes away
    the logits that miss is mostly in: its row is uncalibrated, not corrected by 1.22."""
    cal = calibrate(_rows(lambda b: 1.22 * b.peak, [8, 8]))
    chunked = replace(_at(9), loss="chunked")
    assert cal.predict(_at(9), TE, "none").ratio == pytest.approx(1.22)
    p = cal.predict(chunked, TE, "none")
    assert p.ratio is None and p.bytes == p.raw and not p.calibrated


def test_leave_one_out_predicts_each_row_from_the_others_by_the_same_rules():
    truth = _affine(30 * GiB, 1.355)
    samples = _rows(truth, [1, 3, 8])
    loo = leave_one_out(samples)
    # left out, batch 3 is predicted by the line through 1 and 8; batch 1 by that through 3 and 8, floored by the
    # counted end of backward
    assert loo[1] == pytest.approx(samples[1].measured)
    assert loo[0] == pytest.approx(max(samples[0].measured, breakdown(_at(1)).backward_end))
