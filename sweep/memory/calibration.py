"""The GPU memory model (sweep.memory.model) corrected by the clean rows a cluster has measured: pure, no torch or Ray.

What is corrected is the figure a row records as peak_mem_gib: the CUDA caching allocator's peak *allocated* bytes
(`allocated_bytes.all.peak`, trainer/memory.py), not what it reserved, the figure the count itself is of (tensor
bytes). Two corrections, the closest first:

* **Affine, per config** (`GpuFit`), where the rows of one config (the trial's model, layout, seq len, `ac`,
  `grad_accum`, loss, precision and compile mode: everything `Shape` holds but the batch) measured two batch sizes
  or more: measured peak = overhead + slope · (the model's batch part: activations and loss tensors at the end of
  forward, `Breakdown.batch_part`), by ordinary least squares. The form is the count's own: with flash attention
  (no T² term) every tensor that grows with the batch grows in proportion to it, and the rest (weights, gradients,
  optimizer state, compute copies, the allocator's and the library's own) does not, so one config's peak is affine
  in its batch (Korthikanti et al. 2022, §4.1: activations of s·b·h·(34 + 5·a·s/h) bytes per layer, linear in b;
  the same two-part form as the CPU fit of sweep.memory.cpu). The slope corrects what the count misses per sample
  (measured, eager TE FP8 on one H200 keeps 9.75 GiB per sample where the count says 7.2), the overhead what it
  misses once. A ratio cannot: it scales both by one number, so a wrong slope makes a ratio that changes with the
  batch. Every clean row of the config enters the fit, those the count puts at the end of backward too (on one
  H200, llama3-8b-8l at batch 1, bf16 and TE FP8, measured 42.4 and 45.3 GiB where the count of that end says 45.9:
  they lie on the line of the larger batches), and the prediction stays at least the counted end of backward (no
  batch moves it). A fit is not used, the ratio is and the prediction says why (`Prediction.basis`), where its
  slope or overhead comes out not positive (a line no memory follows) or its slope is not known to MAX_SLOPE_ERROR.
* **A ratio, per kind** (`Kind`: precision, compile mode and loss; `Calibration.ratios`): the median
  measured/predicted of the rows of the kind, other models and layouts included; where a config has rows at one
  batch size, or none. The loss is part of the kind because the chunked loss takes away the count's largest
  temporary (the B·T·V logits) and with it the part the ratio corrects most: on one H200, TE FP8's full-loss rows
  teach × 1.22, which put its chunked row at batch 9 at +28 % where the count alone is +4.5 %.

Options outside `Shape` (attention kernel, TE's FP8 head, compile mode, ...) share a config: on one H200 they moved a
peak by at most 0.14 GiB of 123 (llama3-8b-8l: TE FP8 at batch 9; bf16 at batches 10 and 14, and GEMM autotuning at
10: 0.00).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from sweep.memory.model import Breakdown, Shape, breakdown, largest, least_squares
from sweep.spec.trial import Trial

MAX_SLOPE_ERROR = 0.05
"""The largest standard error of a fit's slope, as a share of the slope, that a fit is used with (ordinary least
squares: σ² / Sxx, σ² estimated from the residuals, n - 2 degrees of freedom). Rows of one config measured by two
trainer versions differ by as much as a sample adds: llama3-8b-8l, TE FP8 on one H200 at batch 8, 121.3 GiB in
session 16 and 113.5 in session 18, where batch 9 adds 9.7; the line through both at 8 and session 18's at 9 has a
slope of 0.81 ± 58 % and put batch 3 at +36 %. Session 18's rows alone (8 and 9, two options each, within 0.14 GiB)
give 1.355 ± 1 %."""
MIN_SPREAD = 1.2
"""With one row at each of two batch sizes nothing says how far a row may scatter: the larger batch part must then be
at least this many times the smaller (the CPU fit asks as much of its predicted peaks: sweep.memory.cpu)."""
UNCALIBRATED_MARGIN = 0.10  # with no rows, a trial is predicted not to fit only past the memory by this much

Config = tuple[Shape, str, str]
"""What an affine fit is keyed by: the trial's shape at batch 0, its precision and compile mode."""
Kind = tuple[str, str, str]
"""What a ratio is keyed by: precision, compile mode and loss (`full` for a sample that names no config)."""


def config_of(shape: Shape, precision: str, compile: str) -> Config:
    return replace(shape, batch_size=0), precision, compile


@dataclass(frozen=True)
class Sample:
    """One clean measured row: its precision and compile mode, predicted (uncalibrated) and measured peak."""

    precision: str
    compile: str
    predicted: float
    """The model's uncalibrated peak of the row, in bytes."""
    measured: float
    """The row's peak_mem_gib, in bytes."""
    config: Config | None = None
    """The row's config (`config_of`): None, a sample no affine fit learns from."""
    parts: Breakdown | None = None
    """The model's count of the row, part by part (`sweep.memory.model.breakdown`)."""

    @property
    def kind(self) -> Kind:
        return self.precision, self.compile, self.config[0].loss if self.config else "full"

    @classmethod
    def of(cls, shape: Shape, precision: str, compile: str, measured: float) -> Sample:
        b = breakdown(shape)
        return cls(precision, compile, b.peak, measured, config_of(shape, precision, compile), b)


@dataclass(frozen=True)
class GpuFit:
    """measured peak ≈ overhead + slope · the model's batch part (`Breakdown.batch_part`), on one config's rows."""

    overhead: float
    """Bytes the rank holds whatever the batch: the line at batch 0."""
    slope: float
    """Measured bytes per counted byte of the batch part."""
    rows: int
    """How many clean rows it rests on."""
    batches: int
    """At how many batch sizes."""

    def apply(self, b: Breakdown) -> float:
        """The fitted end of forward, and at least the counted end of backward (no batch moves it)."""
        return max(self.overhead + self.slope * b.batch_part, b.backward_end)

    def text(self) -> str:
        """`affine on 4 clean rows of its config at 3 batch sizes: 45.3 GiB + 1.352 × its activations`."""
        from sweep.memory.capacity import size

        return (
            f"affine on {self.rows} clean row{'s' * (self.rows != 1)} of its config at {self.batches} batch sizes: "
            f"{size(self.overhead)} + {self.slope:.3f} × its activations"
        )


def fit_config(samples: list[Sample]) -> GpuFit | str | None:
    """The affine fit of one config's samples (the module's docstring) by ordinary least squares; None where they
    span fewer than 2 batch sizes (or are two rows closer than MIN_SPREAD); a line of why where the fit's slope or
    overhead is not positive, or its slope's standard error is past MAX_SLOPE_ERROR."""
    rows = [(s.parts.batch_part, s.measured) for s in samples if s.parts is not None]
    parts, ys = [x for x, _ in rows], [y for _, y in rows]
    batches = len(set(parts))
    if batches < 2 or (len(parts) == 2 and max(parts) < MIN_SPREAD * min(parts)):
        return None
    overhead, slope = least_squares(parts, ys)
    where = f"its config's {len(parts)} rows at {batches} batch sizes"
    if slope <= 0 or overhead <= 0:
        what = f"a slope of {slope:.3f}" if slope <= 0 else f"an overhead of {overhead / 2**30:.3g} GiB"
        return f"{where} fit {what}, which no memory has: not used"
    if (error := slope_error(parts, ys, overhead, slope)) > MAX_SLOPE_ERROR:
        return f"{where} scatter too far for a slope ({slope:.3f} ± {error:.0%}): not used"
    return GpuFit(overhead=overhead, slope=slope, rows=len(rows), batches=batches)


def slope_error(xs: list[float], ys: list[float], intercept: float, slope: float) -> float:
    """The standard error of a least-squares slope as a share of it (0 with no degree of freedom left to tell)."""
    if len(xs) < 3:
        return 0.0
    mx = sum(xs) / len(xs)
    residuals = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys))
    return math.sqrt(residuals / (len(xs) - 2) / sum((x - mx) ** 2 for x in xs)) / slope


@dataclass(frozen=True)
class Prediction:
    """A trial's predicted peak: raw, corrected by `fit` (its config's) or else by `ratio` (None: no rows to learn
    either from)."""

    raw: float
    ratio: float | None
    rows: int
    """The rows the ratio rests on."""
    fit: GpuFit | None = None
    fitted: float | None = None
    """`fit` applied to the trial's count, in bytes."""
    refused: str | None = None
    """Why its config's affine fit is not used (`fit_config`), where one was made."""

    @property
    def calibrated(self) -> bool:
        return self.fit is not None or self.ratio is not None

    @property
    def bytes(self) -> float:
        if self.fitted is not None:
            return self.fitted
        return self.raw * (self.ratio if self.ratio is not None else 1.0)

    def fits(self, available: float, margin: bool = True) -> bool:
        """Whether it is predicted to fit in `available` bytes. Uncalibrated, the figure may be off either way,
        so (`margin`) only a trial past the memory by more than UNCALIBRATED_MARGIN is predicted not to fit."""
        limit = available * (1 + UNCALIBRATED_MARGIN) if margin and not self.calibrated else available
        return self.bytes <= limit

    def basis(self) -> str:
        if self.fit is not None:
            return self.fit.text()
        if self.ratio is None:
            return (
                f"uncalibrated (no clean rows; predicted not to fit only past the memory by {UNCALIBRATED_MARGIN:.0%})"
            )
        refused = f"; {self.refused}" if self.refused else ""
        return (
            f"× {self.ratio:.3f}, the median measured/predicted of {self.rows} clean row{'s' * (self.rows != 1)}"
            + refused
        )

    def short(self) -> str:
        """What it rests on in a few words: `affine on 4 rows of its config`, `calibrated on 2 rows`."""
        if self.fit is not None:
            return f"affine on {self.fit.rows} rows of its config at {self.fit.batches} batch sizes"
        return f"calibrated on {self.rows} row{'s' * (self.rows != 1)}" if self.ratio is not None else "uncalibrated"


@dataclass(frozen=True)
class Calibration:
    """Measured / predicted, per `Kind`, and the affine fit of each config with rows at 2 batch sizes or more;
    `rows` says how many rows each ratio rests on."""

    ratios: dict[Kind, float]
    rows: dict[Kind, int]
    fits: dict[Config, GpuFit] = field(default_factory=dict)
    refused: dict[Config, str] = field(default_factory=dict)
    """Configs whose affine fit is not used, and why (`fit_config`)."""

    def ratio(self, precision: str, compile: str, loss: str = "full") -> float | None:
        return self.ratios.get((precision, compile, loss))

    def predict_parts(self, b: Breakdown, config: Config) -> Prediction:
        """The prediction of a count `b` of `config`: by its config's fit where one is, else by the ratio."""
        fit, kind = self.fits.get(config), (config[1], config[2], config[0].loss)
        return Prediction(
            raw=b.peak,
            ratio=self.ratios.get(kind),
            rows=self.rows.get(kind, 0),
            fit=fit,
            fitted=None if fit is None else fit.apply(b),
            refused=self.refused.get(config),
        )

    def predict(self, shape: Shape, precision: str, compile: str) -> Prediction:
        return self.predict_parts(breakdown(shape), config_of(shape, precision, compile))

    def predict_trial(self, trial: Trial) -> Prediction:
        """A `sweep.spec.grid.Trial`'s prediction: raw, and calibrated where rows of its kind are."""
        return self.predict(Shape.of(trial), trial.precision, trial.compile)

    def max_batch(
        self, shape: Shape, precision: str, compile: str, available: float, *, margin: bool = True, limit: int = 1 << 20
    ) -> int:
        """The largest batch of `shape`'s config predicted to fit in `available` bytes (0: not even one), as
        `Prediction.fits` says (`margin`: uncalibrated, only past the memory by UNCALIBRATED_MARGIN)."""
        return largest(
            lambda b: self.predict(replace(shape, batch_size=b), precision, compile).fits(available, margin), limit
        )

    def affine_text(self) -> str:
        """`; affine per config for 2 configs with rows at 2 batch sizes or more` (empty without one)."""
        n = len(self.fits)
        return f"; affine for {n} config{'s' * (n != 1)} with rows at 2 batch sizes or more" if n else ""


def calibrate(samples: Iterable[Sample]) -> Calibration:
    """The median measured/predicted ratio per `Kind` over `samples`, and `fit_config` per config."""
    by_kind: dict[Kind, list[float]] = {}
    by_config: dict[Config, list[Sample]] = {}
    for x in samples:
        if x.predicted > 0 and x.measured > 0:
            by_kind.setdefault(x.kind, []).append(x.measured / x.predicted)
            if x.config is not None:
                by_config.setdefault(x.config, []).append(x)
    fits, refused = {}, {}
    for config, rows in by_config.items():
        fit = fit_config(rows)
        if isinstance(fit, GpuFit):
            fits[config] = fit
        elif fit is not None:
            refused[config] = fit
    return Calibration(
        ratios={k: statistics.median(v) for k, v in by_kind.items()},
        rows={k: len(v) for k, v in by_kind.items()},
        fits=fits,
        refused=refused,
    )


NO_ROWS = Calibration(ratios={}, rows={})


def calibrated(calibration: Calibration, x: Sample) -> float | None:
    """`x`'s prediction by `calibration` (None: nothing of its kind to correct it by)."""
    if x.parts is None or x.config is None:
        ratio = calibration.ratios.get(x.kind)
        return None if ratio is None else x.predicted * ratio
    p = calibration.predict_parts(x.parts, x.config)
    return p.bytes if p.calibrated else None


def leave_one_out(samples: list[Sample]) -> list[float | None]:
    """Each sample's calibrated prediction from the others alone (None: no other sample of its kind)."""
    return [calibrated(calibrate(samples[:i] + samples[i + 1 :]), x) for i, x in enumerate(samples)]
