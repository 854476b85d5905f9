"""A grid's trials: the cartesian product of its axes (`expand`), each trial's options folded to what it can
use (`fold_options`). Pure: no torch, no Ray."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from sweep.errors import UserError
from sweep.spec.grid import GridSpec
from sweep.spec.layout import divides, grid_layout_problem, layout_problem
from sweep.spec.trial import DEFAULT_TIMEOUT_S, Trial
from trainer.models.specs import ModelSpec
from trainer.options import OPTION_DEFAULTS
from trainer.recipes import RECIPES


def fold_options(
    options: Mapping[str, Any], *, model: ModelSpec, precision: str, gpus: int, compile: str | None = None
) -> dict[str, Any]:
    """The options a trial really runs with: one that can do nothing in this trial is back at its default."""
    family = RECIPES[precision].family
    # An FP8 head needs an FP8 recipe and an untied head (GPT's head is the embedding): elsewhere the
    # option does nothing, so `fp8_lm_head: [false, true]` crossed with bf16 gives one bf16 trial.
    fp8_head = options["fp8_lm_head"] and family == "fp8" and model.arch == "llama"
    # Gradients are only reduced across ranks, and only in a dtype other than the parameters' when
    # those are bf16 (fp32 trains and reduces in fp32); they can only wait for the step's last
    # micro-batch when there is more than one. Elsewhere these options do nothing and fold away.
    reduce = options["reduce_dtype"] if gpus > 1 and family != "fp32" else OPTION_DEFAULTS["reduce_dtype"]
    sync = options["grad_sync"] if gpus > 1 and options["grad_accum"] > 1 else OPTION_DEFAULTS["grad_sync"]
    # Nothing is traced without compile (a caller that does not say which compile keeps the option as it is).
    # Recipes whose graphs lose much speed with a symbolic batch keep static shapes (trainer.recipes `symbolic_batch`:
    # torchao rowwise ran 25 % slower on one H200), more than a benchmark may trade for compile time. Tensorwise, its
    # amax in static-length stages, keeps it: 0.2-1.5 % slower (mean 0.7 %) on an H100, where static shapes would
    # compile every batch and every max-batch probe (benchmarks/RESULTS.md "Cold sweep", session 47).
    dynamic = (
        options["dynamic_batch"] and RECIPES[precision].symbolic_batch
        if compile != "none"
        else OPTION_DEFAULTS["dynamic_batch"]
    )
    # A chunked loss fuses the head's matmul into the loss: with tp > 1 the head's logits are vocab-sharded DTensors
    # (loss_parallel), and an FP8 head would run in bf16 inside it. There it folds to full, as an FP8 head folds for
    # GPT's tied head: the row then says what ran (trainer/loss.py).
    loss = options["loss"] if options["tp"] == 1 and not fp8_head else OPTION_DEFAULTS["loss"]
    return {
        **options,
        "fp8_lm_head": fp8_head,
        "reduce_dtype": reduce,
        "grad_sync": sync,
        "dynamic_batch": dynamic,
        "loss": loss,
        **fold_kernel_options(options, precision=precision, compile=compile),
    }


def fold_kernel_options(options: Mapping[str, Any], *, precision: str, compile: str | None) -> dict[str, Any]:
    """The kernel options (issue 34) back at their default where they can do nothing in this trial."""
    recipe = RECIPES[precision]
    # FP8 attention is TE's (its recipe's fp8_dpa): torchao converts Linear layers only, and bf16 has no FP8.
    fp8_attention = options["fp8_attention"] and recipe.backend == "te" and recipe.family == "fp8"
    # Only compiled code has a compile mode (a caller that does not say which compile keeps the option).
    mode = options["compile_mode"] if compile != "none" else OPTION_DEFAULTS["compile_mode"]
    # Power-of-2 scales are torchao float8's; its rowwise recipes round their scales so already (torchao 0.18
    # Float8LinearConfig.from_recipe_name), so the option changes tensorwise only (`Recipe.pow2_scales`).
    pow2 = options["fp8_pow2_scales"] and recipe.backend == "torchao" and not recipe.pow2_scales
    return {"fp8_attention": fp8_attention, "compile_mode": mode, "fp8_pow2_scales": pow2}


def expand(
    grid: GridSpec,
    *,
    cluster: str,
    source: str = "",
    max_ranks: int | None = None,
    timeout_s: float | None = None,
    memory_cap_bytes: int | None = None,
    default_memory_cap: int | None = None,
    ranks_per_node: int | None = None,
) -> list[Trial]:
    """The cartesian product of the grid's axes, in a stable order. `timeout_s` is the profile's: a trial's
    limit is the grid's timeout_s, else that, else DEFAULT_TIMEOUT_S (decided here, once). A layout (dp_replicate x
    tp x cp) that does not divide a trial's ranks is left out of that gpus value's trials (gpus: [2, 4] with tp: [1, 4]
    runs tp 4 at 4 ranks only); one that divides none of them, or cannot split a model, is refused
    (sweep.spec.layout)."""
    _check_ranks(grid, cluster=cluster, source=source, max_ranks=max_ranks)
    cap = next((c for c in (memory_cap_bytes, grid.memory_cap, default_memory_cap) if c is not None), None)
    limit = grid.timeout_s or timeout_s or DEFAULT_TIMEOUT_S
    option_sets = [
        dict(zip(OPTION_DEFAULTS, values))
        for values in itertools.product(*(getattr(grid, name) for name in OPTION_DEFAULTS))
    ]
    trials = []
    for model, precision, comp, ac, seq_len, gpus, options, batch in itertools.product(
        grid.models, grid.precisions, grid.compile, grid.ac, grid.seq_len, grid.gpus, option_sets, grid.batch_sizes
    ):
        if seq_len > model.max_seq_len:  # gpt: learned positions; llama: the RoPE table
            raise UserError(
                f"Invalid grid {source}: seq_len: {seq_len} exceeds {model.label}'s max_seq_len ({model.max_seq_len})"
            )
        if not divides(gpus, options):
            continue
        if problem := layout_problem(model, seq_len=seq_len, options=options, ranks_per_node=ranks_per_node):
            raise UserError(f"Invalid grid {source}: {problem}")
        trials.append(
            Trial(
                cluster=cluster,
                model=model,
                precision=precision,
                compile=comp,
                ac=ac,
                batch_size=batch,
                seq_len=seq_len,
                gpus=gpus,
                warmup_steps=grid.steps.warmup,
                measure_steps=grid.steps.measure,
                auto_max=grid.steps.auto_max,
                memory_cap_bytes=cap,
                timeout_s=limit,
                predict_memory=grid.predict_memory,
                profiled=grid.profile,
                **fold_options(options, model=model, precision=precision, gpus=gpus, compile=comp),
            )
        )
    unique = {t.trial_id: t for t in trials}
    return list(unique.values())


def _check_ranks(grid: GridSpec, *, cluster: str, source: str, max_ranks: int | None) -> None:
    """The grid's ranks per trial against the cluster's, and its layouts against its ranks (before any trial)."""
    if max_ranks is not None:
        too_many = [g for g in grid.gpus if g > max_ranks]
        if too_many:
            raise UserError(
                f"Invalid grid {source}: gpus: {too_many[0]} ranks per trial, but cluster '{cluster}' has {max_ranks}"
            )
    if problem := grid_layout_problem(grid):
        raise UserError(f"Invalid grid {source}: {problem}")
