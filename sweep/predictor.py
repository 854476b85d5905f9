"""The memory model as `sweep plan` and `sweep run` use it: calibrated on the clean rows the cluster has already
measured in --output, against the memory of the profile's GPU ranks. No torch, no Ray.

A CPU profile predicts nothing (a CPU rank's peak is its resident set, not tensor bytes: sweep.runner.unsupported)
and reads no rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from sweep.memory_model import GiB, Calibration, Prediction, Sample, Shape, calibrate, max_batch, predicted_bytes

# what a row must say for the calibration to learn from it (store.read_columns reads these alone)
CALIBRATION_COLUMNS = ("model_spec", "precision", "compile", "ac", "batch_size", "seq_len", "grad_accum", "world_size",
                       "peak_mem_gib", "status", "alloc_retries")
NO_ROWS = Calibration(ratios={}, rows={})


def sample(row: dict) -> Sample | None:
    """A clean measured row as a calibration sample: ok, a peak, no allocator retries (a retried allocation
    freed the cache, so its peak says less than the step needed), and the spec of its model; else None."""
    from trainer.models.specs import ModelSpec

    if row.get("status") != "ok" or not row.get("peak_mem_gib") or row.get("alloc_retries") or not row.get("model_spec"):
        return None
    shape = Shape.of_spec(ModelSpec(**json.loads(row["model_spec"])), precision=row["precision"],
                          batch_size=row["batch_size"], seq_len=row["seq_len"], ranks=row["world_size"],
                          ac=row.get("ac") or "none", grad_accum=row.get("grad_accum") or 1)
    return Sample(precision=row["precision"], compile=row["compile"], predicted=predicted_bytes(shape),
                  measured=row["peak_mem_gib"] * GiB)


@dataclass
class Predictor:
    """A profile's prediction of each trial's peak per rank, and the rows (output) it is calibrated on."""

    profile: object  # clusters.schema.ClusterProfile
    output: Path | None = None
    samples: list[Sample] | None = None
    calibration: Calibration = NO_ROWS

    @classmethod
    def load(cls, profile, output: Path | None) -> "Predictor":
        """Calibrated on the clean rows of `profile`'s cluster under `output` (GPU profiles; none read otherwise)."""
        from sweep import store

        rows = store.read_columns(output, CALIBRATION_COLUMNS, cluster=profile.name) if output and profile.is_gpu else []
        samples = [s for r in rows if (s := sample(r)) is not None]
        return cls(profile=profile, output=output, samples=samples, calibration=calibrate(samples))

    def learn(self, row: dict) -> None:
        """Refine the calibration with a row that has just landed (a run's own clean rows)."""
        if self.profile.is_gpu and (s := sample(row)) is not None:
            self.samples = [*(self.samples or []), s]
            self.calibration = calibrate(self.samples)

    def memory(self, trial) -> tuple[float, str] | None:
        """The memory one of the trial's ranks may use where a prediction is checked against it (GPU ranks)."""
        from sweep.capacity import per_rank_memory

        if not self.profile.is_gpu:
            return None
        return per_rank_memory(memory_cap=trial.memory_cap_bytes, memory_per_device=self.profile.memory_per_device_bytes,
                               accelerator=self.profile.accelerator, memory_gib=self.profile.accelerator_info.memory_gib)

    def predict(self, trial) -> Prediction:
        from sweep.capacity import predict

        return predict(trial, self.calibration)

    def max_batch(self, trial, *, point: bool = False) -> int | None:
        """The largest batch of `trial`'s config predicted to fit its ranks (0: none), as `sweep.runner.unsupported`
        decides (uncalibrated, only past the memory by the margin); `point`: the estimate itself, without that
        margin (where a search places a probe). None where nothing is predicted: CPU ranks, no memory known,
        or a trial that runs whatever is predicted (--no-predict)."""
        memory = self.memory(trial)
        if memory is None or not trial.predict_memory:
            return None
        ratio = self.calibration.ratio(trial.precision, trial.compile)
        return max_batch(Shape.of(replace(trial, batch_size=1)), memory[0], 1.0 if point and ratio is None else ratio)

    def basis(self) -> str:
        """What the predictions rest on: `calibrated on 12 rows of h200 (bf16 regional: 4, ...)` or `uncalibrated`."""
        where = self.output if self.output is not None else "--output"
        rows = self.calibration.rows
        if not rows:
            return f"memory prediction uncalibrated: no clean rows of {self.profile.name} in {where}"
        kinds = ", ".join(f"{p} {c}: {n}" for (p, c), n in sorted(rows.items()))
        total = sum(rows.values())
        return f"memory prediction calibrated on {total} row{'s' * (total != 1)} of {self.profile.name} in {where} ({kinds})"
