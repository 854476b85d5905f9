"""The memory model as `sweep plan` and `sweep run` use it: calibrated on the clean rows the cluster has already
measured in --output, against the memory of the profile's GPU ranks. No torch, no Ray.

On a CPU profile the peak of a rank under a memory cap is predicted too (sweep.memory.cpu: its resident set, with
an affine fit on the folder's clean CPU rows) and shown by `sweep plan` against the cap, but never checked: no
trial is refused on it (sweep.execution.runner.unsupported), and a search places nothing by it (`memory`,
`max_batch` and `peak_curve` stay None there), so a CPU cap's out-of-memory failures stay real ones.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from clusters.schema import ClusterProfile
from sweep.memory.calibration import NO_ROWS as NO_ROWS  # re-exported: what sweep.execution.runner defaults to
from sweep.memory.calibration import Calibration, Prediction, Sample, calibrate
from sweep.memory.cpu import (
    COMPILING,
    COMPILING_S,
    FRESH,
    CpuCalibration,
    CpuSample,
    calibrate_cpu,
    config_of,
    cpu_predicted_bytes,
    one_time_excess,
)
from sweep.memory.model import GiB, Shape
from sweep.record.schema import Row
from sweep.spec.layout import layout_text
from sweep.spec.trial import Trial

# what a row must say for the calibration to learn from it (store.read_columns reads these alone)
CALIBRATION_COLUMNS = (
    "model_spec",
    "precision",
    "compile",
    "ac",
    "batch_size",
    "seq_len",
    "grad_accum",
    "world_size",
    "peak_mem_gib",
    "status",
    "alloc_retries",
    "tp",
    "dp_shard",
    "loss",
    "actor_reused",
    "compile_time_s",
)
NO_CPU_ROWS = CpuCalibration(configs={}, kinds={})


def _shape(row: Row) -> Shape:
    """The memory model's view of a recorded row (its model_spec and layout)."""
    from trainer.models.specs import ModelSpec

    spec, precision, batch_size, seq_len = row["model_spec"], row["precision"], row["batch_size"], row["seq_len"]
    ranks = row.get("dp_shard") or row["world_size"]  # rows before 1.12: FSDP over all
    # a measured row has them all (rows that ran nothing are no samples, nor probes with a spec)
    assert spec is not None and precision is not None and batch_size is not None and seq_len is not None
    assert ranks is not None
    tp = row.get("tp") or 1
    return Shape.of_spec(
        ModelSpec(**json.loads(spec)),
        precision=precision,
        batch_size=batch_size,
        seq_len=seq_len,
        ac=row.get("ac") or "none",
        grad_accum=row.get("grad_accum") or 1,
        tp=tp,
        ranks=ranks * tp,
        loss=row.get("loss") or "full",  # rows before 1.13 ran the full loss
    )


def _measured(row: Row) -> tuple[Shape, str, str, float] | None:
    """An ok row's shape, precision, compile mode and peak in bytes, where it has a peak and its model's spec."""
    peak, precision, compile = row.get("peak_mem_gib"), row.get("precision"), row.get("compile")
    if row.get("status") != "ok" or not peak or not row.get("model_spec"):
        return None
    assert precision is not None and compile is not None  # an ok row records both
    return _shape(row), precision, compile, peak * GiB


def sample(row: Row) -> Sample | None:
    """A clean measured row as a calibration sample: ok, a peak, no allocator retries (a retried allocation
    freed the cache, so its peak says less than the step needed), and the spec of its model; else None."""
    measured = None if row.get("alloc_retries") else _measured(row)
    return None if measured is None else Sample.of(*measured)


def one_time_cost(row: Row) -> str | None:
    """What one-time cost a CPU row's peak also counts (sweep.memory.cpu.ONE_TIME), or None: a fresh process's
    first trial (actor_reused false), or a compiled trial that compiled in its window (compile_time_s)."""
    if row.get("actor_reused") is False:
        return FRESH
    if row.get("compile") != "none" and (row.get("compile_time_s") or 0.0) > COMPILING_S:
        return COMPILING
    return None


def cpu_sample(row: Row) -> CpuSample | None:
    """A measured CPU row as a sample of sweep.memory.cpu: ok, a peak, its model's spec; else None. A clean one
    (`one_time_cost` None) is what the fits learn from."""
    if (measured := _measured(row)) is None:
        return None
    shape, precision, compile, peak = measured
    return CpuSample(config_of(shape, precision, compile), cpu_predicted_bytes(shape, precision), peak)


def cpu_calibration(rows: Iterable[Row]) -> CpuCalibration:
    """The fits of sweep.memory.cpu on the clean CPU rows, and what the others peaked above them."""
    clean: list[CpuSample] = []
    paid: dict[str, list[CpuSample]] = {}
    for row in rows:
        if (x := cpu_sample(row)) is not None:
            if (cost := one_time_cost(row)) is None:
                clean.append(x)
            else:
                paid.setdefault(cost, []).append(x)
    return one_time_excess(calibrate_cpu(clean), paid)


@dataclass(frozen=True)
class ProbePeak:
    """One probe of a search: its batch, predicted peak (calibrated as the run began), measured peak, status."""

    batch: int
    predicted: float
    measured_gib: float | None
    status: str
    predicted_oom: bool  # recorded without GPU time: the prediction stands in for the measurement
    basis: str = "uncalibrated"  # what the prediction rests on (Prediction.short): a fresh folder's is the raw model


@dataclass
class Predictor:
    """A profile's prediction of each trial's peak per rank, and the rows (output) it is calibrated on."""

    profile: ClusterProfile
    output: Path | None = None
    samples: list[Sample] | None = None
    calibration: Calibration = NO_ROWS
    prior: Calibration = NO_ROWS  # as loaded, before a run's own rows refined it: what its probes were placed by
    cpu: CpuCalibration = NO_CPU_ROWS  # CPU profiles: the fits of sweep.memory.cpu, shown and never checked

    @classmethod
    def load(cls, profile: ClusterProfile, output: Path | None) -> Predictor:
        """Calibrated on the clean rows of `profile`'s cluster under `output` (a CPU profile's, by sweep.memory.cpu)."""
        from sweep.record import store

        rows = store.read_columns(output, CALIBRATION_COLUMNS, cluster=profile.name) if output else []
        if not profile.is_gpu:
            return cls(profile=profile, output=output, samples=[], cpu=cpu_calibration(rows))
        samples = [s for r in rows if (s := sample(r)) is not None]
        calibration = calibrate(samples)
        return cls(profile=profile, output=output, samples=samples, calibration=calibration, prior=calibration)

    def learn(self, row: Row) -> None:
        """Refine the calibration with a row that has just landed (a run's own clean rows)."""
        if self.profile.is_gpu and (s := sample(row)) is not None:
            self.samples = [*(self.samples or []), s]
            self.calibration = calibrate(self.samples)

    def memory(self, trial: Trial) -> tuple[float, str] | None:
        """The memory one of the trial's ranks may use where a prediction is checked against it (GPU ranks)."""
        from sweep.memory.capacity import per_rank_memory

        if not self.profile.is_gpu:
            return None
        return per_rank_memory(
            memory_cap=trial.memory_cap_bytes,
            memory_per_device=self.profile.memory_per_device_bytes,
            accelerator=self.profile.accelerator,
            memory_gib=self.profile.accelerator_info.memory_gib,
        )

    def predict(self, trial: Trial) -> Prediction:
        return self.calibration.predict_trial(trial)

    def shown(self, trial: Trial) -> tuple[float, float] | None:
        """The trial's predicted peak per rank and the memory it is shown against, in bytes: a GPU rank's (as
        checked), or a CPU rank's under a memory cap (sweep.memory.cpu, never checked); None where neither."""
        memory = self.memory(trial)
        if memory is not None:
            return self.predict(trial).bytes, memory[0]
        if self.profile.is_gpu or trial.memory_cap_bytes is None:
            return None
        return self.cpu.predict(Shape.of(trial), trial.precision, trial.compile).bytes, trial.memory_cap_bytes

    def _cpu_max_batch(self, t: Trial) -> tuple[int, str] | None:
        """A CPU trial's largest batch predicted within its cap, and what it rests on; None without a cap."""
        if self.profile.is_gpu or t.memory_cap_bytes is None:
            return None
        shape = Shape.of(replace(t, batch_size=1))
        best = self.cpu.max_batch(shape, t.precision, t.compile, t.memory_cap_bytes)
        return best, self.cpu.predict(shape, t.precision, t.compile).basis()

    def max_batch(self, trial: Trial, *, point: bool = False) -> int | None:
        """The largest batch of `trial`'s config predicted to fit its ranks (0: none), as
        `sweep.execution.runner.unsupported` decides (uncalibrated, only past the memory by the margin); `point`:
        the estimate itself, without that margin (where a search places a probe). None where nothing is
        predicted: CPU ranks, no memory known, or a trial that runs whatever is predicted (--no-predict)."""
        memory = self.memory(trial)
        if memory is None or not trial.predict_memory:
            return None
        shape = Shape.of(replace(trial, batch_size=1))
        return self.calibration.max_batch(shape, trial.precision, trial.compile, memory[0], margin=not point)

    def peak_curve(self, trial: Trial) -> Callable[[int], float] | None:
        """The predicted peak per rank of `trial`'s config at a batch (where `max_batch` predicts one): a search
        scales it by a probe's measured peak (sweep.search.max_batch.MaxBatchSearch.peak_model). Calibrated as
        `predict` is: a ratio cancels in that scaling (the raw curve's shape), an affine fit of the config gives
        the curve its measured slope, which one probe's ratio cannot."""
        if self.memory(trial) is None or not trial.predict_memory:
            return None
        return lambda batch: self.predict(replace(trial, batch_size=batch)).bytes

    def probe_peaks(self, probes: Iterable[Row]) -> list[ProbePeak]:
        """Predicted (by the calibration the run began with) against measured peak, per probe row with a spec."""
        from sweep.search.policy import is_predicted_oom

        out = []
        for row in probes:
            if not row.get("model_spec"):
                continue
            precision, compile, batch, status = row["precision"], row["compile"], row["batch_size"], row["status"]
            assert precision is not None and compile is not None and batch is not None and status is not None
            prediction = self.prior.predict(_shape(row), precision, compile)
            out.append(
                ProbePeak(
                    batch=batch,
                    predicted=prediction.bytes,
                    measured_gib=row.get("peak_mem_gib") if status == "ok" else None,
                    status=status,
                    predicted_oom=is_predicted_oom(row),
                    basis=prediction.short(),
                )
            )
        return out

    def max_batch_lines(self, trials: Iterable[Trial]) -> list[str]:
        """The largest batch predicted to fit, per model × precision (and the rest of its layout), on GPU ranks, and
        on CPU ranks under a memory cap (shown, not enforced)."""
        lines: list[str] = []
        seen: set[tuple[tuple[Any, ...], int | None]] = set()
        for t in trials:
            key = (t.config_key, t.memory_cap_bytes)
            cpu = self._cpu_max_batch(t)
            if (self.memory(t) is None and cpu is None) or key in seen:
                continue
            seen.add(key)
            basis = self.predict(t).short()
            best = self.max_batch(replace(t, predict_memory=True))  # --no-predict still shows what is predicted
            if cpu is not None:
                best, basis = cpu
            layout = f" as {layout_text(t)}" if layout_text(t) else ""  # e.g. "8 ranks as tp 2"
            # the options besides the layout (said above), e.g. a chunked loss fits larger batches
            changed = " ".join(f"{k}={v}" for k, v in t.changed().items() if k not in ("dp_replicate", "tp", "cp"))
            options = f", {changed}" if changed else ""
            lines.append(
                f"predicted max batch: {t.model.label} {t.precision} (compile {t.compile}, ac {t.ac}, seq "
                f"{t.seq_len}, {t.gpus} rank{'s' * (t.gpus != 1)}{layout}{options}): {best}, {basis}"
            )
        return lines

    def basis(self) -> str:
        """What the predictions rest on: `calibrated on 12 rows of h200 (bf16 regional: 4, ...)` or `uncalibrated`."""
        where = self.output if self.output is not None else "--output"
        if not self.profile.is_gpu:
            return self._cpu_basis(where, self.cpu.rows)
        rows = self.calibration.rows
        if not rows:
            return f"memory prediction uncalibrated: no clean rows of {self.profile.name} in {where}"
        kinds = ", ".join(
            f"{p} {c}{'' if loss == 'full' else f' loss={loss}'}: {n}" for (p, c, loss), n in sorted(rows.items())
        )
        total = sum(rows.values())
        return (
            f"memory prediction calibrated on {total} row{'s' * (total != 1)} of {self.profile.name} "
            f"in {where} ({kinds}){self.calibration.affine_text()}"
        )

    def _cpu_basis(self, where: Path | str, rows: dict[tuple[str, str], int]) -> str:
        shown = "shown, not enforced: the memory cap makes allocations fail for real"
        if not rows:
            return (
                f"memory prediction of CPU ranks ({shown}) uncalibrated: "
                f"no clean rows of {self.profile.name} in {where}"
            )
        kinds = ", ".join(f"{p} {c}: {n}" for (p, c), n in sorted(rows.items()))
        total = sum(rows.values())
        excess = "".join(
            f"; {what} peaked {fit.overhead / 2**20:+.3g} MiB above it (median of {fit.rows} "
            f"row{'s' * (fit.rows != 1)}), not in the figure"
            for what, fit in self.cpu.excess.items()
        )
        return (
            f"memory prediction of CPU ranks ({shown}) calibrated on {total} row{'s' * (total != 1)} of "
            f"{self.profile.name} in {where} ({kinds}){excess}"
        )


def predicted_reason(trial: Trial, memory: tuple[float, str] | None, calibration: Calibration = NO_ROWS) -> str | None:
    """`predicted OOM: <pred> > <avail>` when the trial's predicted peak (sweep.memory.model, corrected by
    `calibration`, sweep.memory.calibration, where it has rows of the trial's kind) does not fit `memory`, else None."""
    from sweep.memory.capacity import size

    if memory is None:
        return None
    prediction = (calibration or NO_ROWS).predict_trial(trial)
    available, per = memory
    if prediction.fits(available):
        return None
    return (
        f"predicted OOM: {size(prediction.bytes)} > {size(available)} {per} "
        f"(sweep.memory.model, {prediction.basis()}; --no-predict or predict_memory: false runs it anyway)"
    )


def peak_line(v: Mapping[str, Any], peaks: Sequence[ProbePeak]) -> str:
    """Under a max-batch verdict `v`, its probes' predicted against measured peak (the prediction's error), saying
    what the predictions rest on as the run began (a fresh folder: the raw model; a probe predicted not to fit was
    decided by the calibration of that moment, which its row's error gives): `predicted (calibrated on 2 rows) /
    measured peak, llama3-8b bf16 (...): batch 5 129 GiB / 130 GiB (-0.8 %) · batch 6 150 GiB / oom`."""
    from sweep.memory.capacity import size

    parts = []
    for p in peaks:
        if p.measured_gib:
            measured = f"{size(p.measured_gib * 2**30)} ({100 * (p.predicted / (p.measured_gib * 2**30) - 1):+.1f} %)"
        else:
            measured = "predicted OOM" if p.predicted_oom else p.status
        parts.append(f"batch {p.batch} {size(p.predicted)} / {measured}")
    return (
        f"predicted{f' ({peaks[0].basis})' if peaks else ''} / measured peak, {v['model']} {v['precision']} "
        f"(compile {v['compile']}, {v['gpus']} "
        f"rank{'s' * (v['gpus'] != 1)}): " + (" · ".join(parts) or "no probes")
    )
