"""The training options: how a trial trains, beyond what model at which batch. Declared once, here.

Everything else is derived from `TrainingOptions`: the grid's axes and their defaults (`sweep.spec.grid`),
the result columns and the value an older row without one is read with (`sweep.record.schema`), and what each
rank is sent (`trainer.job.TrialConfig.options`). Each field's type carries its constraint, so a value
is checked the same way in a grid file (pydantic, one line naming the key) and here (`__post_init__`,
a ValueError naming the field). Pure: pydantic only, no torch.
"""

from __future__ import annotations

import functools
import typing
from dataclasses import dataclass, field, fields
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, TypeAdapter, ValidationError


def _clip(value: float) -> float:
    if not value >= 0:  # also refuses nan
        raise ValueError("must be >= 0 (0 turns clipping off)")
    return value


def _option(default: Any, doc: str) -> Any:
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True, kw_only=True)
class TrainingOptions:
    """The training options of one trial. Each field's default is what rows written before it existed ran with."""

    grad_accum: Annotated[int, Field(gt=0)] = _option(1, "micro-batches per optimizer step")
    """A step trains grad_accum micro-batches of batch_size rows per rank before the optimizer steps."""
    grad_clip: Annotated[float, AfterValidator(_clip)] = _option(1.0, "max gradient norm, 0 = no clipping")
    """The gradient norm is clipped to this before each optimizer step (1.0: torchtitan's default); 0: no clip."""
    fp8_lm_head: bool = _option(False, "FP8 recipes: output head in FP8 too")
    """FP8 recipes run the output head in FP8 too (off: it stays bf16 for accuracy, torchtitan's default)."""
    reduce_dtype: Literal["fp32", "bf16"] = _option("fp32", "FSDP2 gradient reduce-scatter dtype: fp32 | bf16")
    """The dtype FSDP2 reduce-scatters gradients in: fp32 (accuracy of the sum over ranks) or bf16 (half the bytes)."""
    grad_sync: Literal["micro_batch", "step"] = _option(
        "micro_batch", "gradients reduced after every micro_batch or once per step"
    )
    """With grad_accum > 1: reduce gradients after every micro-batch's backward, or only after the step's last."""
    dynamic_batch: bool = _option(
        True, "compiled trials: a symbolic batch dimension, so a new batch size reuses the graphs"
    )
    """Compiled trials trace the batch dimension as a symbol (`torch._dynamo.maybe_mark_dynamic`) and a process keeps
    its compiled code for its next trial when that differs only in batch size: a warm group compiles each graph once.
    false: every batch size is a static shape, compiled afresh in every trial (before schema 1.11 every row ran so)."""
    # The kernel options (schema 1.13): which kernels a trial's attention and compiled code run (issue 34).
    attention: Literal["auto", "flash", "cudnn", "efficient"] = _option(
        "auto", "attention kernel: auto (torch's or TE's own choice) | flash | cudnn | efficient"
    )
    """SDPA's backend (`torch.nn.attention.sdpa_kernel` inside each attention module's traced forward), or for TE
    layers TE's (flash: its flash-attention, cudnn: its fused cuDNN attention); auto: the library picks, as before."""
    fp8_attention: bool = _option(False, "TE FP8 recipes: dot-product attention in FP8 too (TE's fp8_dpa)")
    """TE FP8 recipes run the attention's matmuls and softmax in FP8 (the recipe's `fp8_dpa`): a numerics change."""
    compile_mode: Literal["default", "max-autotune-no-cudagraphs"] = _option(
        "default", "compiled trials: torch.compile mode: default | max-autotune-no-cudagraphs (GEMM autotuning)"
    )
    """torch.compile's mode for every compiled graph: max-autotune-no-cudagraphs benchmarks inductor's GEMM templates
    against the library kernels at compile time (a longer compile, counted in compile_time_s)."""
    fp8_pow2_scales: bool = _option(False, "torchao tensorwise FP8: scales rounded to powers of 2")
    """torchao float8 scales rounded down to a power of 2 (`round_scales_to_power_of_2`): exact scaling multiplies,
    a numerics change. torchao's rowwise recipes always round so; this turns it on for tensorwise."""
    # The parallel layout (schema 1.12): the trial's ranks as a (dp_replicate, dp_shard, tp) mesh, dp_shard being
    # what remains (ranks / (dp_replicate x tp x cp)); trainer.parallelize applies it.
    dp_replicate: Annotated[int, Field(gt=0)] = _option(
        1, "HSDP: data-parallel replicas, each sharding the model over its own ranks (1: FSDP over all ranks)"
    )
    """Replicas of the sharded model (HSDP): gradients all-reduce across replicas, parameters shard within one."""
    tp: Annotated[int, Field(gt=0)] = _option(1, "tensor-parallel ranks (with sequence parallel), within one node")
    """Each block's matmuls split over tp ranks (Megatron column/row parallel), norms sequence parallel."""
    cp: Annotated[int, Field(gt=0)] = _option(
        1, "context-parallel ranks (not built: no CPU path to test it in torch 2.13; only 1 runs)"
    )
    """Context parallel: the sequence split over cp ranks. Not built yet: a grid with cp > 1 is refused."""
    loss: Literal["full", "chunked"] = _option(
        "full", "the loss over the full B x T x V logits, or chunked: never holding them (trainer/loss.py)"
    )
    """full: the head's B x T x V logits and their fp32 upcast, then cross-entropy (as every row before it). chunked:
    the head and the loss fused, a chunk of tokens at a time, never holding the B x T x V logits (trainer/loss.py),
    so a larger batch fits; the same loss within rounding. Folds to full where it cannot run: tp > 1 (vocab-sharded
    logits) and an FP8 head (`sweep.spec.expand.fold_options`)."""

    def __post_init__(self) -> None:
        for f in fields(TrainingOptions):  # a subclass's own fields are its own business
            try:
                value = _adapter(f.name).validate_python(getattr(self, f.name), strict=True)
            except ValidationError as e:
                raise ValueError(f"{f.name}: {_first_error(e)} (got {getattr(self, f.name)!r})") from None
            object.__setattr__(self, f.name, value)  # an int grad_clip becomes the float it means

    def as_dict(self) -> dict[str, Any]:
        """The options only (a subclass's other fields left out), in declaration order."""
        return {name: getattr(self, name) for name in OPTION_DEFAULTS}

    def changed(self) -> dict[str, Any]:
        """The options not at their default."""
        return {k: v for k, v in self.as_dict().items() if v != OPTION_DEFAULTS[k]}

    @property
    def layout_ranks(self) -> int:
        """Ranks one data-parallel shard spans: tp x cp (they see the same batch)."""
        return self.tp * self.cp

    def options(self) -> TrainingOptions:
        """The options alone, as a TrainingOptions (from a subclass such as sweep's Trial)."""
        return TrainingOptions(**self.as_dict())


OPTION_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(TrainingOptions)}
OPTION_DOCS: dict[str, str] = {f.name: f.metadata["doc"] for f in fields(TrainingOptions)}


@functools.cache
def option_types() -> dict[str, Any]:
    """Each option's type with its constraint (e.g. `Annotated[int, Field(gt=0)]`): a grid axis holds a list of it."""
    return typing.get_type_hints(TrainingOptions, include_extras=True)


@functools.cache
def _adapter(name: str) -> TypeAdapter:
    return TypeAdapter(option_types()[name])


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    return str(err["ctx"]["error"]) if err["type"] == "value_error" else err["msg"]


DEFAULT_OPTIONS = TrainingOptions()  # every option at its default (a default argument's value)
