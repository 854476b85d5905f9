"""What one rank sends back for one trial (`RankResult`). Pure: no torch, no Ray.

`trainer.worker.RankWorker.run` makes one per trial and never raises; the driver decides the attempt from the
ranks' statuses (`sweep.execution.scheduler`) and turns the ok ranks' measurements into a row
(`sweep.record.rows.outcome_row`). A failed rank carries only its status, error and traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer.energy import EnergyReport


@dataclass
class RankResult:
    """One rank's report of one trial: its status and, when ok, what it measured and where it ran."""

    status: str
    """'ok', 'oom' (an allocation failed: `trainer.job.classify_failure`) or 'error'."""
    error: str | None = None
    """A failed rank's exception, as 'ExceptionType: message' (at most 2000 characters); None when ok."""
    traceback: str | None = None
    """A failed rank's Python traceback (its last 4000 characters); None when ok."""

    step_times: list[float] = field(default_factory=list)
    """The measured steps' times in seconds, warm-up left out."""
    warmup_times: list[float] = field(default_factory=list)
    """The warm-up steps' times in seconds (the first one's includes compiling)."""
    warmup_steps: int | None = None
    """Warm-up steps run: the grid's count, or as many as `auto` took."""
    losses: list[float] = field(default_factory=list)
    """Every step's loss, warm-up included (each computed before its step's update)."""
    loss_first: float | None = None
    """The first step's loss (`losses[0]`)."""
    loss_last: float | None = None
    """The last step's loss (`losses[-1]`)."""
    tokens_per_step: int | None = None
    """Tokens one optimizer step trains over every rank: grad_accum micro-batches on each data-parallel rank."""
    compile_time_s: float | None = None
    """The first step's time beyond a steady step: compilation and autotuning."""
    init_time_s: float | None = None
    """From the rank's start (a fresh process's creation, a warm one's trial start) to the model ready."""
    model_build_s: float | None = None
    """From `trainer.train.run_trial`'s call to the model ready: this trial's own set-up, warm or fresh."""
    n_params: int | None = None
    """Every parameter of the model: the N of the FLOP formula."""
    params_local: int | None = None
    """Parameter elements this rank holds after sharding."""
    peak_mem_bytes: int | None = None
    """Peak memory over the trial (`trainer.memory.peak_stats`): CUDA allocated bytes, or the CPU's resident set
    above what the process held at the trial's start."""
    reserved_mem_bytes: int | None = None
    """Peak bytes the CUDA caching allocator reserved; None on a CPU."""
    alloc_retries: int | None = None
    """The CUDA caching allocator's retries (frees and retries after a failed allocation); None on a CPU."""
    profile: dict[str, Any] | None = None
    """Rank 0 of a profiled trial: the step's *_pct shares and `trace_gz`, its gzipped Chrome trace
    (`trainer.profiling.profile_steps`); None otherwise."""
    energy: EnergyReport | None = None
    """What this rank's GPU drew over the measured steps (`trainer.energy`); None on a CPU."""
    import_s: float | None = None
    """The process's own imports before its first trial (torch, torch.distributed); None on a warm trial."""
    process_setup_s: float | None = None
    """Joining the device and the process group before the first trial; None on a warm trial."""
    precompile_s: float | None = None
    """A fresh group's first trial: waiting for its side processes compiling the group's graphs ahead
    (`trainer.precompile`), after its imports and process group; None when there were none."""
    precompiled_graphs: int | None = None
    """Of the group's sets of graphs given to those side processes, how many compiled; None as precompile_s."""
    precompile_sides_ahead: int | None = None
    """Of those side processes, how many the run started ahead (`trainer.side_pool`); None as precompile_s."""
    precompile_sides_given: int | None = None
    """Of those, how many the run gave their graphs as it started them (`side_pool.claim_given`); None as
    precompile_s."""
    compile_cache_hits: int | None = None
    """Graphs this trial loaded from inductor's FX graph cache instead of generating them."""
    compile_cache_misses: int | None = None
    """Graphs this trial generated (not in the cache, or not cacheable)."""
    torch_version: str | None = None
    """torch.__version__ in the rank's process."""
    te_version: str | None = None
    """The installed transformer-engine distribution's version, None when absent."""
    torchao_version: str | None = None
    """The installed torchao distribution's version, None when absent."""
    gpu_name: str | None = None
    """The device's name (torch.cuda.get_device_name); None on a CPU."""
    driver_version: str | None = None
    """The GPU driver's version (nvidia-smi); None on a CPU or without nvidia-smi."""
    cuda_version: str | None = None
    """The runtime torch was built for ('cuda 12.8', 'hip 6.4'); None on a CPU."""
    baseline_bytes: int | None = None
    """A warm rank: the tensor bytes its process held before its group's first trial (`trainer.release.held_bytes`)."""
    held_bytes: int | None = None
    """A warm rank: the tensor bytes its process holds after this trial gave back what it held."""
