"""A trial: one configuration of a grid to run once, and the `trial_id` that names its measurement. Pure: no
torch, no Ray. `sweep.spec.expand.expand` makes them from a grid."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any

from trainer.job import AcMode, CompileScope
from trainer.models.specs import ModelSpec
from trainer.options import TrainingOptions
from trainer.stopping import StepsSpec

DEFAULT_TIMEOUT_S = 1800.0  # a trial's limit when neither grid nor profile sets one: a cold 8B compile plus
#                             measurement fits; a hung collective does not


@dataclass(frozen=True, kw_only=True)
class Trial(TrainingOptions):
    """One configuration to run once. `trial_id` hashes everything that defines the measurement.

    The training options (grad_accum, grad_clip, ...) are its fields too, from `TrainingOptions`."""

    cluster: str
    model: ModelSpec
    precision: str
    compile: CompileScope
    ac: AcMode
    batch_size: int
    seq_len: int
    gpus: int
    warmup_steps: StepsSpec  # a count, or "auto" (the rows hold the count run)
    measure_steps: StepsSpec
    memory_cap_bytes: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S  # `expand` resolves it: the grid's, else the profile's, else this
    # lineage: not part of the measurement
    attempt: int = 1
    parent_trial_id: str | None = None
    retry: int = 0  # infrastructure retries of the same config
    search_id: str | None = None
    profiled: bool = False  # a trace of a few steps after the measured ones (does not change the measurement)
    predict_memory: bool = True  # a trial predicted not to fit is not run (does not change the measurement)
    auto_max: tuple[int, int] | None = None  # the most warm-up and measured steps `auto` may run: a tune's finals

    @property
    def trial_id(self) -> str:
        key = {
            "cluster": self.cluster,
            "model": self.model.model_dump(exclude_none=True),
            "precision": self.precision,
            "compile": self.compile,
            "ac": self.ac,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "gpus": self.gpus,
            "warmup": self.warmup_steps,
            "measure": self.measure_steps,
            "memory_cap": self.memory_cap_bytes,
            "retry": self.retry,
        }
        # Keys added later enter the hash only when not at their default, so earlier trial ids stay valid.
        key.update(self.changed())
        if self.auto_max is not None:  # fewer steps at most: another measurement
            key["auto_max"] = list(self.auto_max)
        # a profiled attempt is its own row (it has a trace): --resume does not stand one for the other
        if self.profiled:
            key["profile"] = True
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def dp_shard(self) -> int:
        """What remains of the ranks once replicas, TP and CP take theirs (`sweep.spec.layout`)."""
        return self.gpus // (self.dp_replicate * self.tp * self.cp)

    @property
    def config_key(self) -> tuple[Any, ...]:
        """Everything but the batch: trials that differ only in batch share it (OOM retry, search)."""
        return (
            self.cluster,
            self.model.to_json(),
            self.precision,
            self.compile,
            self.ac,
            self.seq_len,
            self.gpus,
            *self.changed().items(),
        )  # as trial_id: options at their default leave earlier keys alone

    @property
    def training_options(self) -> dict[str, Any]:
        return self.as_dict()

    def child(self, **changes: Any) -> Trial:
        """A follow-up attempt (lower batch after an OOM, or an infrastructure retry)."""
        return replace(self, attempt=self.attempt + 1, parent_trial_id=self.trial_id, **changes)

    def options_text(self) -> str:
        """The training options not at their default, e.g. 'grad_accum=8 fp8_lm_head=True'."""
        return " ".join(f"{k}={v}" for k, v in self.changed().items())

    def describe(self) -> str:
        extra = self.options_text()
        return (
            f"{self.model.label} {self.precision} bs={self.batch_size} T={self.seq_len} "
            f"gpus={self.gpus} compile={self.compile}{' ' + extra if extra else ''}"
        )
