"""A trial's parallel layout (dp_replicate x dp_shard x tp x cp) checked at plan time. Pure: no torch, no Ray.

The trial's ranks form the mesh (dp_replicate, dp_shard, tp) in rank (bundle) order, tp innermost: a TP group is
tp consecutive ranks, so on one node when a node holds a multiple of tp ranks (`layout_problem` asks it); an
HSDP replica is dp_shard x tp consecutive ranks, so replicas fill nodes one after another (`sweep.execution.placement`).

Two kinds of answer, as for recipes: a layout this grid can never split its model or ranks into is the user's
mistake (`layout_problem`: one line, exit 2); a layout the code does not build for a recipe or model yet is
recorded `unsupported` with the reason (`layout_unsupported`), as a recipe the hardware lacks is.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypedDict, cast

from sweep.spec.trial import Trial
from trainer.models.specs import ModelSpec
from trainer.recipes import RECIPES

LAYOUT_AXES = ("dp_replicate", "tp", "cp")
# What tune.vary may name besides sweep.spec.grid.TUNABLE: a layout is searched as its own group, one search per
# value (sweep.search.fastest.plan), as the layout sets each rank's share of the memory (so its batch fit) and its
# communication.
LAYOUT_VARY = ("tp", "dp_replicate")


class Layout(TypedDict):
    """One layout a `search: fastest` group searches (`searched_layouts`): the Trial fields of LAYOUT_VARY."""

    tp: int  # ranks per tensor-parallel group
    dp_replicate: int  # HSDP replicas


CP_NOT_BUILT = (
    "context parallel is not built: torch 2.13's context_parallel has no sharding rule for CPU attention "
    "(aten._scaled_dot_product_flash_attention_for_cpu), so it cannot be tested on CPU ranks; use cp: 1"
)


class LayoutLists(Protocol):
    """What a grid lists of its layouts (sweep.spec.grid.GridSpec, which imports this module): each axis's values,
    and the ranks per trial."""

    @property
    def gpus(self) -> Sequence[int]: ...

    @property
    def dp_replicate(self) -> Sequence[int]: ...

    @property
    def tp(self) -> Sequence[int]: ...

    @property
    def cp(self) -> Sequence[int]: ...


def layout_ranks(options: Mapping[str, Any]) -> int:
    """The ranks one dp_shard rank stands for: the product of the layout axes."""
    ranks: int = options["dp_replicate"] * options["tp"] * options["cp"]
    return ranks


def divides(gpus: int, options: Mapping[str, Any]) -> bool:
    return gpus % layout_ranks(options) == 0


def _split_dims(model: ModelSpec) -> dict[str, int]:
    """The dims tensor parallel splits (trainer.tensor_parallel): heads, the MLP's hidden width, the vocabulary
    (embedding rows and the output head's columns)."""
    dims = {"n_heads": model.n_heads, "vocab_size": model.vocab_size}
    if model.arch == "llama":  # a llama spec has both (ModelSpec fills them in)
        assert model.n_kv_heads is not None and model.ffn_hidden is not None
        dims |= {"n_kv_heads": model.n_kv_heads, "ffn_hidden": model.ffn_hidden}
    else:
        dims |= {"4 x d_embd (the MLP)": 4 * model.d_embd}
    return dims


def layout_problem(
    model: ModelSpec, *, seq_len: int, options: Mapping[str, Any], ranks_per_node: int | None
) -> str | None:
    """Why this model can never run at this layout (a grid to fix), or None. `options`: the trial's training
    options (dp_replicate, tp, cp among them); `ranks_per_node`: the cluster's (None: not checked)."""
    tp = options["tp"]
    if tp == 1:
        return None
    for name, size in _split_dims(model).items():
        if size % tp:
            return f"tp: {tp} does not divide {model.label}'s {name} ({size})"
    if seq_len % tp:  # sequence parallel shards the norms' activations on the sequence
        return f"tp: {tp} does not divide seq_len {seq_len} (sequence parallel splits it)"
    if ranks_per_node is not None and ranks_per_node % tp:
        # a TP group all-reduces in every block: it must stay on one node's fabric
        return f"tp: {tp} ranks cannot stay on one node of {ranks_per_node} ranks (tp must divide the ranks per node)"
    return None


def layout_unsupported(trial: Trial) -> str | None:
    """Why this recipe, model or compile mode does not run at the trial's layout yet (recorded `unsupported`), or None.
    `trial`: a sweep.spec.grid.Trial. The compile limits were measured on torch 2.13 (CPU ranks, gloo)."""
    if trial.tp == 1:
        return None
    recipe = RECIPES[trial.precision]
    if recipe.layers == "te":
        return f"{trial.precision}: tensor parallel (tp > 1) is not wired for Transformer Engine layers yet"
    if recipe.backend == "torchao":
        return (
            f"{trial.precision}: tensor parallel (tp > 1) with torchao float8 (its float8 TP styles) is not built yet"
        )
    if trial.model.arch == "gpt":
        return "tp > 1: tensor parallel is built for llama models (gpt ties its output head to the embedding)"
    if trial.compile == "full":  # dynamo over the whole TP model: "Attempting to use FunctionalTensor on its own"
        return "tp > 1 with compile: full does not compile (torch 2.13); use compile: regional or none"
    if trial.compile != "none" and trial.ac != "none":  # AOT autograd: a DeviceMesh among the tensors saved
        return f"tp > 1 with ac: {trial.ac} and compile: {trial.compile} does not compile (torch 2.13); use one of them"
    return None


def grid_layout_problem(grid: LayoutLists) -> str | None:
    """Why a listed dp_replicate, tp or cp value can never run in this grid, or None: cp > 1 (not built), or a value
    with which dp_replicate x tp x cp divides none of the grid's gpus (a trial's ranks are a multiple of it)."""
    if any(cp > 1 for cp in grid.cp):
        # torch's ring attention shards only the flash, efficient and cuDNN SDPA ops (GPU); on CPU ranks SDPA is
        # aten._scaled_dot_product_flash_attention_for_cpu, and the math backend mixes DTensors with plain tensors:
        # measured on 2 gloo ranks, torch 2.13. A GPU-only path would be code no test here runs.
        return f"cp: {max(grid.cp)}: {CP_NOT_BUILT}"
    combos = [dict(zip(LAYOUT_AXES, values)) for values in itertools.product(*(getattr(grid, a) for a in LAYOUT_AXES))]
    for axis in ("tp", "dp_replicate"):
        for value in getattr(grid, axis):  # a value of 1 fails only with another axis's, which is named instead
            if value > 1 and not any(divides(gpus, c) for c in combos if c[axis] == value for gpus in grid.gpus):
                least = min(layout_ranks(c) for c in combos if c[axis] == value)
                return (
                    f"{axis}: {value}: gpus {grid.gpus[0] if len(grid.gpus) == 1 else grid.gpus} is not a "
                    f"multiple of dp_replicate x tp x cp ({least} at the least with {axis} {value})"
                )
    return None


def layout_text(trial: Trial) -> str:
    """`dp_replicate 2 x tp 2`: the layout axes off their default (empty for FSDP over all ranks)."""
    return " x ".join(f"{axis} {getattr(trial, axis)}" for axis in LAYOUT_AXES if getattr(trial, axis) != 1)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def searched_layouts(
    template: Trial, spec: LayoutLists, vary: Sequence[str], *, ranks_per_node: int | None
) -> list[Layout]:
    """The layouts (dp_replicate, tp) a `search: fastest` group searches, one search each: an axis tune.vary names
    ranges over the grid's list when it lists several values, else over the divisors of the trial's ranks; one not
    named stays at the template's. Kept: the template's own (the grid's trial: a recipe that does not build it is
    recorded unsupported, as in a grid), and others that divide the ranks, split the model (`layout_problem`) and
    that this recipe builds (`layout_unsupported`). `template`: the group's first trial (sweep.spec.grid.Trial)."""
    values: dict[str, list[Any]] = {}  # ranks per axis, as the trial's fields (replace below) take them
    for axis in LAYOUT_VARY:
        listed = list(getattr(spec, axis))
        values[axis] = (
            (listed if len(listed) > 1 else _divisors(template.gpus)) if axis in vary else [getattr(template, axis)]
        )
    kept: list[Layout] = []
    own = {a: getattr(template, a) for a in LAYOUT_VARY}
    for combo in (dict(zip(LAYOUT_VARY, v)) for v in itertools.product(*values.values())):
        options = {**template.as_dict(), **combo}
        fits = divides(template.gpus, options) and not layout_problem(
            template.model, seq_len=template.seq_len, options=options, ranks_per_node=ranks_per_node
        )
        if combo == own or (fits and not layout_unsupported(replace(template, **combo))):
            kept.append(cast(Layout, combo))  # combo's keys: LAYOUT_VARY, Layout's
    return kept
