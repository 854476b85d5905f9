"""One trial on one rank: build the model, make the data, step, time, report what was measured.

`run_trial(config, rank)` is the whole of it, and knows nothing of Ray: the caller (`trainer.worker`, or a
test) has set up the process group and the device. A process may run several trials one after the other;
each starts from the same state (`release`), so a trial measures the same whatever ran before it.
Timing follows nanoGPT's bench.py: warm up, then time each step between device syncs.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from trainer import autotune_store, models
from trainer.data import SyntheticData
from trainer.energy import EnergyMeter, EnergyReport, NullMeter, meter_for
from trainer.job import TrialConfig
from trainer.loss import compiled_chunks
from trainer.memory import memory_cap, peak_stats, reset_peak
from trainer.models.specs import ModelSpec
from trainer.options import TrainingOptions
from trainer.parallelize import compile_kwargs, mark_batch_dynamic, parallelize
from trainer.precision import PrecisionPlan, precision_plan
from trainer.profiling import BACKWARD, FORWARD, OPTIMIZER, profile_steps
from trainer.release import release
from trainer.result import RankResult
from trainer.stopping import PHASES, Schedule
from trainer.sync import device_sync
from trainer.tensor_parallel import init_layout_independent, local_value, loss_context, whole_model

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


@dataclass(frozen=True)
class Rank:
    """Where this rank trains: its device, and the mesh of every rank of the trial (the process group's)."""

    device: torch.device
    mesh: DeviceMesh  # every rank of the trial, 1-D
    rank: int = 0
    # (dp_replicate, tp) -> its named mesh
    layouts: dict[tuple[int, int], DeviceMesh] = field(default_factory=dict, compare=False, repr=False)

    @property
    def world_size(self) -> int:
        return self.mesh.size()

    def layout_mesh(self, options: TrainingOptions) -> DeviceMesh:
        """The mesh a trial of `options` trains over: the ranks' own 1-D mesh for FSDP over all of them (as every
        trial before layouts), else the named (dp_replicate, dp_shard, tp) mesh, made once per layout in this
        process group (a warm group's later trials of the layout reuse its process groups)."""
        from trainer.tensor_parallel import layout_mesh

        key = (options.dp_replicate, options.tp)
        if key == (1, 1):
            return self.mesh
        if key not in self.layouts:
            self.layouts[key] = layout_mesh(
                self.device.type, self.world_size, dp_replicate=options.dp_replicate, tp=options.tp
            )
        return self.layouts[key]

    def data_rank(self, options: TrainingOptions) -> int:
        """This rank's index among the data-parallel ranks: the ranks of one TP group (consecutive) train one batch."""
        return self.rank // options.layout_ranks


@dataclass
class Measurement:
    """What one rank measured in one trial."""

    step_times: list[float]  # the measured steps' times (warm-up left out)
    warmup_times: list[float]  # the warm-up steps' times (the first's includes compiling)
    warmup_steps: int  # warm-up steps run (a grid's count, or as many as `auto` took)
    losses: list[float]  # every step's loss, warm-up included (each computed before its step's update)
    tokens_per_step: int  # tokens one optimizer step trains over every rank: grad_accum micro-batches on each
    compile_time_s: float  # the first step's time beyond a steady step (compilation, autotuning)
    init_time_s: float  # from `started_at` to the model built, sharded and ready
    model_build_s: float  # from run_trial's call to the same point: this trial's own set-up, warm or fresh
    n_params: int  # every parameter: the N of the FLOP formula
    params_local: int  # parameter elements this rank holds after sharding
    memory: dict = field(default_factory=dict)  # `trainer.memory.peak_stats`
    profile: dict | None = None  # rank 0 of a profiled trial: `trainer.profiling.profile_steps`
    energy: EnergyReport | None = None  # this rank's GPU over the measured steps (`trainer.energy`); None on CPU

    def report(self) -> RankResult:
        """What the driver turns into a row (`sweep.record.rows.outcome_row`): an ok rank's result, to which
        the worker adds what it knows of the process (`trainer.worker.RankWorker.run`)."""
        return RankResult(
            status="ok",
            step_times=self.step_times,
            warmup_times=self.warmup_times,
            warmup_steps=self.warmup_steps,
            compile_time_s=self.compile_time_s,
            init_time_s=self.init_time_s,
            model_build_s=self.model_build_s,
            loss_first=self.losses[0],
            loss_last=self.losses[-1],
            losses=self.losses,
            tokens_per_step=self.tokens_per_step,
            n_params=self.n_params,
            params_local=self.params_local,
            profile=self.profile,
            energy=self.energy,
            peak_mem_bytes=self.memory.get("peak_mem_bytes"),
            reserved_mem_bytes=self.memory.get("reserved_mem_bytes"),
            alloc_retries=self.memory.get("alloc_retries"),
        )


def learning_rate(d_embd: int) -> float:
    """AdamW lr scaled as 1/width (muP-style, Yang et al. 2022): 1e-3 for the tiny models, ~7.5e-5 for d 4096.
    A fixed 1e-3 made Llama3-8B's loss rise over its first 10 steps; this keeps every model's loss falling."""
    return min(1e-3, 0.3 / d_embd)


class Beside(Protocol):
    """What runs beside a trial and must not beside its measured steps (side processes still compiling ahead:
    `trainer.sides.Sides`): paused from the first measured step's sync until the steps are done."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...


def run_trial(
    config: TrialConfig, rank: Rank, *, started_at: float | None = None, beside: Beside | None = None
) -> Measurement:
    """Train `config` on this rank (every rank of the trial calls it together) and measure it.
    `started_at` (time.perf_counter) is where init_time_s starts: the call, unless given (model_build_s always
    starts at the call: a fresh process's earlier start-up is the caller's to time). `beside`: paused while it
    measures (`time_steps`)."""
    called_at = time.perf_counter()
    started_at = called_at if started_at is None else started_at
    release(rank.device, keep_for=config)
    if config.compile != "none":
        autotune_store.install()  # a kernel's configs benchmarked once per cache, not again in every process
    spec = ModelSpec.model_validate_json(config.model_spec_json)
    plan = precision_plan(
        config.precision,
        device_type=rank.device.type,
        sharded=rank.world_size > 1,
        options=config.options,
    )
    with memory_cap(config.memory_cap_bytes, rank.device):
        reset_peak(rank.device)
        torch.manual_seed(config.seed)
        model, n_params = build_model(spec, plan, config, rank)
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=learning_rate(spec.d_embd), fused=rank.device.type == "cuda"
        )
        data = SyntheticData(spec, config, rank.device, rank.data_rank(config.options))
        compiled = {"compiled": config.compile != "none", "compiled_loss": config.compiled_loss}
        step = TrainStep(model, optimizer, plan, data, config.options, **compiled)
        dist.barrier()
        ready_at = time.perf_counter()
        schedule = Schedule(config.warmup_steps, config.measure_steps, config.auto_max)
        meter = meter_for(rank.device.type, rank.device.index)
        losses = time_steps(step, schedule, rank, meter, beside)
        energy = meter.stop()  # the window `time_steps` opened at the first measured step's sync
        dist.barrier()
        memory = peak_stats(rank.device)
        profile = None
        if config.profiled:  # after the measurement and its peak memory: neither sees the profiler
            profile = profile_steps(step, len(losses), rank)
            dist.barrier()
    measured = schedule.measure.times
    data_ranks = rank.world_size // config.options.layout_ranks  # a TP group trains one batch together
    tokens_per_step = config.options.grad_accum * config.batch_size * config.seq_len * data_ranks
    return Measurement(
        step_times=measured,
        warmup_times=schedule.warmup.times,
        warmup_steps=len(schedule.warmup.times),
        losses=losses,
        tokens_per_step=tokens_per_step,
        init_time_s=ready_at - started_at,
        model_build_s=ready_at - called_at,
        n_params=n_params,
        profile=profile,
        compile_time_s=max(0.0, schedule.times[0] - statistics.median(measured)),
        params_local=_local_numel(model),
        memory=memory,
        energy=energy,
    )


def build_model(spec: ModelSpec, plan: PrecisionPlan, config: TrialConfig, rank: Rank) -> tuple[nn.Module, int]:
    """The model to train, sharded over the rank's mesh and initialised; and its parameter count."""
    with torch.device("meta"):  # build on meta, shard, then materialise only this rank's shard
        model = models.build_model(spec, backend=plan.model_backend, fp8_lm_head=config.options.fp8_lm_head)
    n_params = sum(p.numel() for p in model.parameters())  # N of the FLOP formula: every parameter
    model = parallelize(
        model,
        plan=plan,
        compile_scope=config.compile,
        ac=config.ac,
        mesh=rank.layout_mesh(config.options),
        reduce_dtype=config.options.reduce_dtype,
        dynamic_batch=config.options.dynamic_batch,
        compile_mode=config.options.compile_mode,
        attention=config.options.attention,
    )
    whole = (
        whole_model(spec, plan, fp8_lm_head=config.options.fp8_lm_head)
        if rank.device.type == "cpu" and rank.world_size > 1
        else None
    )
    model.to_empty(device=rank.device)
    with torch.no_grad():
        model.init_weights()  # type: ignore[operator]  # ours (trainer.models); a compiled model forwards it
    if whole is not None:
        init_layout_independent(model, whole)
    return model, n_params


def _local_numel(model: nn.Module) -> int:
    return sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


class TrainStep:
    """One optimizer step over grad_accum micro-batches: `step(i)` trains step i and returns its loss.

    By default FSDP2 reduce-scatters the gradients of each micro-batch as its backward runs (as a plain FSDP1
    loop without no_sync does); with grad_sync "step" only the last micro-batch's backward does."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        plan: PrecisionPlan,
        data: SyntheticData,
        options: TrainingOptions,
        *,
        compiled: bool,
        compiled_loss: bool = True,
    ):
        from torch.distributed.fsdp import FSDPModule

        self.model, self.optimizer, self.plan, self.data, self.options = model, optimizer, plan, data, options
        # Compiled with the model: inductor fuses the fp32 upcast into the log-softmax, so the
        # (tokens x vocab) logits are never materialised in fp32 (torchtitan compiles its loss too).
        # With TP the logits are vocab-sharded DTensors and the loss runs eagerly under loss_parallel (a DTensor
        # dispatch override; compiling it is not tried here).
        self.loss_fn = (
            torch.compile(cross_entropy, **compile_kwargs(options.compile_mode))
            if compiled and compiled_loss and options.tp == 1
            else cross_entropy
        )
        self.loss_context = loss_context(options.tp)  # loss_parallel, for the loss and its backward alike
        self.chunked = options.loss == "chunked"  # the model's forward computes the loss (never tp > 1: fold_options)
        self.compiled = compiled
        self.dynamic_batch = compiled and options.dynamic_batch  # every compiled call's batch dimension symbolic
        # TE caches each layer's FP8 weights on a step's first micro-batch and reuses them for the
        # rest (weights only change at the optimizer step), TE's `is_first_microbatch`.
        self.weight_cache = plan.model_backend == "te" and options.grad_accum > 1
        self.fsdp_root: Any = getattr(model, "_orig_mod", model)  # `full` compile wraps the sharded model
        self.sync_once = (
            options.grad_sync == "step" and options.grad_accum > 1 and isinstance(self.fsdp_root, FSDPModule)
        )
        # label(name) wraps each phase: nothing in measured steps; trainer.profiling makes it record_function
        self.label = contextlib.nullcontext

    def __call__(self, i: int) -> torch.Tensor:
        accum = self.options.grad_accum
        total = torch.zeros((), device=self.data.perm.device)
        for micro in range(accum):
            if self.sync_once:
                self._hold_gradients(last=micro == accum - 1)
            tokens, labels = self.data.micro_batch(i * accum + micro)
            kwargs = {"is_first_microbatch": micro == 0} if self.weight_cache else {}
            with self.label(FORWARD):
                loss = self._forward(tokens, labels, kwargs) / accum
            with self.label(BACKWARD), self.loss_context():
                loss.backward()
            total += local_value(loss.detach())
        with self.label(OPTIMIZER):
            if self.options.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.options.grad_clip)  # default 1.0
            self.optimizer.step()
            self.plan.after_optimizer_step(self.model)
            self.optimizer.zero_grad(set_to_none=True)
        return total

    def _forward(self, tokens: torch.Tensor, labels: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        """One micro-batch's mean loss. `loss: chunked`: the model computes it, its head fused into the loss
        (trainer.loss), inside the root's forward where FSDP2 has the head's weight gathered."""
        if self.dynamic_batch:
            mark_batch_dynamic(tokens, labels)
        if self.chunked:
            with self.plan.training_context(), compiled_chunks(self.compiled):
                return self.model(tokens, labels=labels, **kwargs)
        with self.plan.training_context():
            logits = self.model(tokens, **kwargs)
        if self.dynamic_batch:
            mark_batch_dynamic(logits)
        with self.loss_context():
            return self.loss_fn(logits, labels)

    def _hold_gradients(self, *, last: bool) -> None:
        """Before the last micro-batch: gradients accumulate unsharded on each rank (FSDP1's no_sync; + one
        unsharded gradient copy in memory) and parameters stay gathered after backward, so the next forward
        needs no all-gather (FSDP2's documented trade of memory for communication during accumulation)."""
        self.fsdp_root.set_requires_gradient_sync(last)
        self.fsdp_root.set_reshard_after_backward(last)


def time_steps(
    step: Callable[[int], torch.Tensor],
    schedule: Schedule,
    rank: Rank,
    meter: EnergyMeter = NullMeter(),
    beside: Beside | None = None,
) -> list[float]:
    """Step until `schedule` is done, each step timed between device syncs into it; the loss of each step.

    Python's automatic garbage collection is off while stepping, and a young-generation collection runs after
    each step, outside the timed region (Megatron-LM's --manual-gc, torchtitan's gc_freq): a collection that
    lands inside a launch-bound step makes it a straggler, and how long a full one takes depends on how many
    objects the process holds, which differs between a fresh rank process and one that ran trials before.

    With an `auto` phase rank 0 decides when each phase ends, from its own step times, and broadcasts the
    phase after every step (outside the timed region), so every rank stops on the same step: a rank that
    stopped alone would leave its peers waiting in the next step's collectives. Fixed counts need no word.

    `meter` opens its energy window at the first measured step's starting sync (`trainer.energy`); the caller
    closes it when this returns, after the last measured step's sync. `beside` is paused just before that sync and
    resumed as this returns."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        return _step_until_done(step, schedule, rank, meter, beside)
    finally:
        if beside is not None:
            beside.resume()
        if was_enabled:  # a caller that turned it off keeps it off
            gc.enable()


def _step_until_done(
    step: Callable[[int], torch.Tensor], schedule: Schedule, rank: Rank, meter: EnergyMeter, beside: Beside | None
) -> list[float]:
    shared = schedule.adaptive and rank.world_size > 1
    phase = torch.zeros(1, dtype=torch.int64, device=rank.device)  # an index into PHASES
    losses, i, metering = [], 0, False
    while schedule.phase != "done":
        first_measured = not metering and schedule.phase == "measure"
        if first_measured and beside is not None:
            beside.pause()
        device_sync(rank.device)
        if first_measured:  # energy: the measured steps only, from this sync
            meter.start()
            metering = True
        t0 = time.perf_counter()
        loss = step(i)
        device_sync(rank.device)
        elapsed = time.perf_counter() - t0
        gc.collect(1)  # what the step left in cycles, between steps
        losses.append(loss.detach())
        if not shared:
            schedule.add(elapsed)
        elif rank.rank == 0:
            phase.fill_(PHASES.index(schedule.add(elapsed)))
            dist.broadcast(phase, src=0)
        else:
            dist.broadcast(phase, src=0)
            schedule.follow(elapsed, PHASES[int(phase.item())])
        i += 1
    return [float(loss) for loss in losses]
