"""Grid YAML: parse, validate, expand into trials. Pure: no torch, no Ray.

    name: fp8-vs-bf16                 # optional
    models: [llama3-8b, {arch: gpt, n_layers: 2, d_embd: 64, n_heads: 4, vocab_size: 512}]
    precisions: [bf16, fp8-torchao-tensorwise]
    batch_sizes: [1, 2, 4]            # per-GPU micro-batch
    compile: regional                 # none | regional | full (or a list)
    seq_len: 4096                     # int or list
    gpus: 8                           # ranks per trial, int or list
    steps: {warmup: auto, measure: auto}  # counts, or auto: until the step times are stable (trainer/stopping.py);
                                      # with measure: auto, measure_max: 8 (its most measured steps); a key left
                                      # out: auto on GPUs, 3 and 10 on CPU ranks (sweep/spec/steps.py)
    ac: none                          # activation checkpointing: none | selective | full (or a list)
    grad_accum: 1                     # micro-batches per optimizer step (or a list)
    grad_clip: 1.0                    # clip the gradient norm to this before each optimizer step; 0: no clip
    fp8_lm_head: false                # FP8 recipes: also run the output head in FP8
    reduce_dtype: fp32                # FSDP2 gradient reduce-scatter dtype: fp32 | bf16
    grad_sync: micro_batch            # with grad_accum > 1: reduce gradients every micro_batch | once per step
    dynamic_batch: true               # compiled trials: a new batch size reuses the graphs; false: compile each
    loss: full                        # full | chunked: the head fused into a chunked loss, never the B·T·V logits
    attention: auto                   # attention kernel: auto | flash | cudnn | efficient (TE: auto | flash | cudnn)
    fp8_attention: false              # TE FP8 recipes: attention in FP8 too (TE's fp8_dpa)
    compile_mode: default             # compiled trials: default | max-autotune-no-cudagraphs (GEMM autotuning)
    fp8_pow2_scales: false            # torchao tensorwise FP8: scales rounded to powers of 2
    on_oom: {policy: halve, min_batch: 1}
    search: max_batch                 # optional: max_batch (the largest / fastest batch per precision), or
                                      # fastest (the fastest configuration: see tune below)
    tune: {vary: [batch_size, ac, grad_accum, compile], budget: 40, global_batch_tokens: 1048576, max_cost: 10}
                                      # search: fastest: the options it may change, its probe budget, an
                                      # optional global batch every probe keeps, its GPU time in trials
                                      # (sweep.search.fastest.search)
    profile: false                    # true: a torch.profiler trace of a few steps after the measured ones
    timeout_s: 1800                   # per trial
    memory_cap: 80GiB                 # optional per-rank cap (a real allocation failure past it)
    reuse_actors: true                # false: fresh rank processes for every trial (as --fresh-actors)
    precompile: true                  # a new group compiles its trials' graphs at once as it starts

The cartesian product of the list axes gives the trials; each has a stable `trial_id`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from clusters._load import display_path, read_mapping, unknown_name, validation_message
from clusters.errors import ProfileError
from clusters.schema import parse_memory_size
from sweep.errors import UserError
from sweep.spec.layout import LAYOUT_VARY
from sweep.spec.steps import MEASURE_MAX_DEFAULT as MEASURE_MAX_DEFAULT  # re-exported: the grid's key
from sweep.spec.steps import STRICT, Steps
from sweep.spec.trial import DEFAULT_TIMEOUT_S as DEFAULT_TIMEOUT_S  # explicit re-exports: the grid's importers
from sweep.spec.trial import Trial as Trial  # find a trial here too (sweep.spec.trial declares it)
from trainer.job import AcMode, CompileScope
from trainer.models.specs import REGISTRY, ModelSpec
from trainer.options import OPTION_DEFAULTS, OPTION_DOCS, option_types
from trainer.recipes import RECIPES

# Activations kept for the backward pass, in order: none keeps them all, selective some, full only each
# block's input. A config that runs out of memory does so with less checkpointing too.
AC_MEMORY = {"none": 2, "selective": 1, "full": 0}


def _listify(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _registry_model(value: Any) -> Any:
    """A registry name to its spec; a mapping goes on to ModelSpec's own validation."""
    if not isinstance(value, str):
        return value
    if value not in REGISTRY:
        raise ValueError(unknown_name("model", value, sorted(REGISTRY), "(or an inline mapping: arch, n_layers, ...)"))
    return REGISTRY[value]


def _known_precision(value: str) -> str:
    if value not in RECIPES:
        raise ValueError(unknown_name("precision", value, list(RECIPES)))
    return value


_Positive = Annotated[int, Field(gt=0)]


# What `search: fastest` may change, and of that what changes the numerics (not just the speed): those vary
# only when `tune.vary` names them.
# The kernel options (issue 34) and the loss come last: a configuration (sweep.search.fastest.space.Config)
# leaves them at their default unless given.
KERNEL_OPTIONS = ("attention", "compile_mode", "fp8_attention", "fp8_pow2_scales")
TUNABLE = (
    "batch_size",
    "ac",
    "compile",
    "grad_accum",
    "reduce_dtype",
    "grad_sync",
    "fp8_lm_head",
    *KERNEL_OPTIONS,
    "loss",
)
NUMERICS_CHANGING = ("reduce_dtype", "grad_sync", "fp8_lm_head", "fp8_attention", "fp8_pow2_scales")
DEFAULT_VARY, VARIABLE = (
    ("batch_size", "ac", "compile", "grad_accum"),
    TUNABLE + LAYOUT_VARY,
)  # layouts: sweep.spec.layout


class TuneSpec(BaseModel):
    """How `search: fastest` searches (sweep.search.fastest.search): which options may vary, in how many probes,
    under which global batch. An option varies over its grid axis when that lists several values, else over all of
    its values (grad_accum: 1, 2, 4, 8)."""

    model_config = STRICT
    # a Literal of the tuple's values, made at run time (pydantic reads it; mypy cannot)
    vary: list[Literal[VARIABLE]] = Field(  # type: ignore[valid-type]
        default=list(DEFAULT_VARY), description="options the search may change"
    )
    budget: int = Field(default=40, gt=0, description="probes (trial attempts) at most, per model and precision")
    global_batch_tokens: int | None = Field(
        default=None, gt=0, description="micro-batch x grad_accum x ranks x seq_len held at this, if given"
    )
    max_cost: float | None = Field(
        default=10.0,
        gt=1,
        description="GPU time at most, in fresh measured trials of the fastest probe (finals "
        "included): a probe predicted past it is skipped; null: no cap",
    )

    @field_validator("vary")
    @classmethod
    def _no_repeats(cls, value: list[str]) -> list[str]:
        if not value:  # nothing to vary: the search would measure its one configuration over and over
            raise ValueError(
                f"no option to vary: name at least one of {', '.join(TUNABLE)}; to measure "
                f"one configuration, leave out search: fastest"
            )
        if len(set(value)) != len(value):
            raise ValueError(f"an option is named twice: {value}")
        return value


class OomPolicy(BaseModel):
    model_config = STRICT
    policy: Literal["halve", "next", "bisect", "none"] = Field(
        default="halve",
        description="after an out-of-memory attempt, retry at: halve (B/2), next (B-1), bisect "
        "(midway to the largest batch known to fit), or none (no retry)",
    )
    min_batch: int = Field(default=1, gt=0, description="no retry below this batch")


# The training options as grid axes: a list of each option's type (its constraint included), defaulting to
# the option's default alone (`trainer.options.TrainingOptions` declares them).
# (built at run time from the options, so mypy sees neither the fields nor the base class: the ignores below)
_TrainingAxes = create_model(
    "_TrainingAxes",
    __config__=STRICT,
    **{  # type: ignore[call-overload]
        name: (
            list[typ],  # type: ignore[valid-type]
            Field(default=[OPTION_DEFAULTS[name]], min_length=1, description=OPTION_DOCS[name]),
        )
        for name, typ in option_types().items()
    },
)


class GridSpec(_TrainingAxes):  # type: ignore[valid-type, misc]
    name: str | None = Field(default=None, description="the grid's name, stored in every row's grid_name column")
    models: list[Annotated[ModelSpec, BeforeValidator(_registry_model)]] = Field(
        min_length=1,
        description="registry names (llama3-8b, gpt2-1.5b, ...) or inline specs {arch: gpt|llama, "
        "n_layers, d_embd, n_heads, vocab_size, ...}",
    )
    precisions: list[Annotated[str, AfterValidator(_known_precision)]] = Field(
        default=["bf16"],
        min_length=1,
        description="precision recipes (bf16, fp8-torchao-tensorwise, fp8-te-delayed, ...)",
    )
    batch_sizes: list[_Positive] = Field(min_length=1, description="per-GPU micro-batch, in samples")
    compile: list[CompileScope] = Field(
        default=["regional"],
        min_length=1,
        description=("torch.compile: none, regional (each transformer block) or full (the whole model)"),
    )
    seq_len: list[_Positive] = Field(
        default=[1024], min_length=1, description=("tokens per sample; at most each model's max_seq_len")
    )
    gpus: list[_Positive] = Field(default=[1], min_length=1, description="ranks per trial (one per GPU)")
    ac: list[AcMode] = Field(
        default=["none"],
        min_length=1,
        description=("activation checkpointing: none, selective (some blocks) or full (every block)"),
    )
    # + one axis per training option (from _TrainingAxes): grad_accum, grad_clip, fp8_lm_head, reduce_dtype, grad_sync,
    # dynamic_batch, attention, fp8_attention, compile_mode, fp8_pow2_scales, dp_replicate, tp, cp
    steps: Steps = Field(
        default=Steps(),
        description="warm-up and measured steps per trial (counts, or auto); a key left out: auto on GPUs, the count "
        "shown on CPU ranks",
    )
    on_oom: OomPolicy = Field(default=OomPolicy(), description="what an out-of-memory attempt is retried at")
    search: Literal["max_batch", "fastest"] | None = Field(
        default=None,
        description=(
            "max_batch: the largest and the fastest batch per model and precision; fastest: the fastest "
            "configuration over the options tune.vary names; null: run the grid as written"
        ),
    )
    tune: TuneSpec | None = Field(default=None, description="how search: fastest searches")
    profile: bool = Field(
        default=False,
        description="record a torch.profiler trace of a few steps after the "
        "measured ones, and where the step time goes",
    )
    timeout_s: float | None = Field(
        default=None,
        gt=0,
        description=(
            "seconds a trial may run before it is killed and recorded timeout (null: the profile's, else 1800)"
        ),
    )
    memory_cap: int | None = Field(
        default=None,
        description=(  # bytes, from a size with a unit
            "per-rank memory cap, a size with a unit (80GiB): allocations past it really fail"
        ),
    )
    predict_memory: bool = Field(
        default=True,
        description=(
            "record a trial whose predicted peak memory (sweep.memory.model) exceeds a GPU rank's memory unsupported, "
            "without GPU time; false: run it anyway"
        ),
    )
    reuse_actors: bool = Field(
        default=True,
        description="run trials of one kind one after the other on warm rank "
        "processes (sweep.execution.scheduler); false: fresh ones for each",
    )
    precompile: bool = Field(
        default=True,
        description="a new group of warm one-rank processes compiles the regional graphs of the trials it will run "
        "at once, in side processes, while it starts (trainer.precompile; 8+ CPU cores); false (as --no-precompile): "
        "each when its trial is reached",
    )

    _as_list = field_validator(
        "models", "precisions", "batch_sizes", "compile", "seq_len", "gpus", "ac", *OPTION_DEFAULTS, mode="before"
    )(_listify)

    @field_validator("memory_cap", mode="before")
    @classmethod
    def _size(cls, value: Any) -> int | None:
        return None if value is None else parse_memory_size(str(value))  # "80GiB"; a bare 80 (bytes) is refused

    @model_validator(mode="after")
    def _one_spec_per_name(self) -> GridSpec:
        """A label is a model's identity in the results: one label, one spec."""
        seen: dict[str, ModelSpec] = {}
        for i, spec in enumerate(self.models):
            known = REGISTRY.get(spec.label)
            if known is not None and known != spec:
                raise ValueError(
                    f"models.{i}: name {spec.label!r} is a registry model with other dims; "
                    f"give this spec a name of its own"
                )
            if seen.setdefault(spec.label, spec) != spec:
                raise ValueError(f"models.{i}: two different specs are named {spec.label!r}; give each its own name")
        return self

    @model_validator(mode="after")
    def _one_start_for_a_search(self) -> GridSpec:
        if self.search and len(self.batch_sizes) > 1:
            raise ValueError(
                f"search: {self.search} starts from one batch and finds the rest; give one batch_sizes "
                f"entry (the first probe), got {self.batch_sizes}"
            )
        if self.tune is not None and self.search != "fastest":
            raise ValueError("tune: configures search: fastest; add `search: fastest` or remove tune")
        return self

    @model_validator(mode="after")
    def _storable(self) -> GridSpec:
        """Every size a row records fits its column (sweep.record.schema): a batch of 3e9 would otherwise run, and then
        fail to be written."""
        sizes = {
            "batch_sizes": ("batch_size", self.batch_sizes),
            "seq_len": ("seq_len", self.seq_len),
            "gpus": ("world_size", self.gpus),
            "steps.warmup": ("warmup_steps", [self.steps.warmup]),
            "steps.measure": ("measure_steps", [self.steps.measure]),
            "models": ("n_params", [m.n_params() for m in self.models]),
            **{name: (name, getattr(self, name)) for name, default in OPTION_DEFAULTS.items() if type(default) is int},
        }  # grad_accum
        for key, (column, values) in sizes.items():
            problem = unstorable(key, column, values)
            if problem:
                raise ValueError(problem)
        return self

    def on(self, *, gpu: bool) -> GridSpec:
        """This grid where its trials run: the steps it leaves out decided for the ranks (`Steps.on`: auto on GPUs)."""
        decided: GridSpec = self.model_copy(update={"steps": self.steps.on(gpu=gpu)})
        return decided


def unstorable(key: str, column: str, values: Sequence[Any]) -> str | None:
    """Why one of `values` (given as `key`) cannot be recorded in the integer `column` of the results, or None."""
    from sweep.record.schema import RESULT_SCHEMA, int_range

    low, high = int_range(column)
    bad = next((v for v in values if type(v) is int and not low <= v <= high), None)
    if bad is None:
        return None
    unit = " parameters" if column == "n_params" else ""
    return (
        f"{key}: {bad}{unit} is more than the results can record ({column} is "
        f"{RESULT_SCHEMA.field(column).type}: at most {high})"
    )


def parse_grid(data: Any, source: str = "<grid>") -> GridSpec:
    """Validate a grid mapping once; every mistake in it goes into the one line of the UserError."""
    if not isinstance(data, dict):
        raise UserError(
            f"Invalid grid {source}: the top level must be a mapping of keys (models, precisions, ...), "
            f"got {type(data).__name__}"
        )
    try:
        grid: GridSpec = GridSpec.model_validate(data)
    except ValidationError as e:
        raise UserError(f"Invalid grid {source}: {validation_message(e, GridSpec)}") from None
    return grid


def read_grid(path: str | Path) -> dict[str, Any]:
    """The grid file's mapping, unvalidated (the CLI's options go into it before `parse_grid`).

    Read as cluster profiles are: safe YAML (no tags that build objects), a key given twice refused.
    """
    try:
        return read_mapping(Path(path), "grid")
    except ProfileError as e:  # the reader is the profiles' own; a grid's mistake is sweep's user error
        raise UserError(str(e)) from None


def load_grid(path: str | Path) -> GridSpec:
    return parse_grid(read_grid(path), display_path(Path(path)))
