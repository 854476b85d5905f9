"""What each side process compiles ahead (`trainer.precompile`): a trial's blocks and its loss, as two sets. Pure: no
torch (the driver splits the run's graphs among the side processes it starts ahead).

Under `compile: regional` a trial's graphs are its blocks' (the model's width, its precision, the batch) and its
loss's (`trainer.train.cross_entropy` over the logits: the batch, the sequence, the vocabulary). Compiling them in one
process, one after the other, made the slowest trial's set (torchao rowwise, 30-31 s on an H100 host) the floor of a
cold sweep's first wait, while each side process used about one of the host's 16 cores (its compile is serial Python;
benchmarks/RESULTS.md "Cold sweep", session 32). So where the loss is a graph of its own (`separable`) a trial is two
sets, which side processes may compile apart (`trainer.precompile.start` gives each every n-th set): its blocks, on a
copy with a cut vocabulary (SMALL_VOCAB) and an eager loss, and its loss, on logits made as the trial's head makes
them (`trainer.loss_graph`); trials whose loss graph is the same (`loss_key`: a symbolic batch's bf16 and torchao
recipes) share one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trainer.job import TrialConfig, compiled_graphs

SMALL_VOCAB = 256
"""The vocabulary of a side process's block copy: the blocks' graphs never see it (the embedding's output is their
input, the head is outside them), and a multiple of 16 keeps every FP8 recipe's shape rules."""

Part = Literal["whole", "blocks", "loss"]


@dataclass(frozen=True)
class SideSet:
    """One set of graphs a side process compiles: `config`'s `part` (whole: every graph of a reduced copy)."""

    config: TrialConfig
    part: Part = "whole"


def separable(config: TrialConfig) -> bool:
    """Whether `config`'s loss is a graph of its own, apart from its blocks: `regional` compile of torch's layers on one
    rank, the loss after the head (not `loss: chunked`, which fuses the head into the loss inside the model), the head
    in the precision's compute dtype (not `fp8_lm_head`) and no tensor parallelism (its loss runs eagerly)."""
    from trainer.recipes import RECIPES

    recipe = RECIPES.get(config.precision)
    options = config.options
    return (
        recipe is not None
        and recipe.layers == "torch"
        and config.compile == "regional"
        and options.loss != "chunked"
        and not options.fp8_lm_head
        and options.tp == 1
    )


def loss_key(config: TrialConfig) -> tuple:
    """What a separable trial's loss graph depends on: the logits' shape (vocabulary, sequence, the batch unless it is
    symbolic) and dtype (fp32 for fp32 training, else bf16: `trainer.precision.plan`), and torch.compile's mode."""
    from trainer.models.specs import ModelSpec
    from trainer.recipes import RECIPES

    vocab = ModelSpec.model_validate_json(config.model_spec_json).vocab_size
    fp32 = RECIPES[config.precision].family == "fp32"
    batch = None if config.options.dynamic_batch else config.batch_size
    return (vocab, config.seq_len, batch, fp32, config.options.compile_mode)


def side_sets(configs: tuple[TrialConfig, ...]) -> tuple[SideSet, ...]:
    """The sets that compile `configs`' graphs: each one's blocks (or whole, where its loss is not separable), in
    order (the first trial's first), then the distinct losses."""
    first = tuple(SideSet(c, "blocks" if separable(c) else "whole") for c in configs)
    losses: dict[tuple, SideSet] = {}
    for c in configs:
        if separable(c):
            losses.setdefault(loss_key(c), SideSet(c, "loss"))
    return first + tuple(losses.values())


def set_key(item: SideSet) -> tuple:
    """Which graphs `item` compiles, as a trial needing them names them (`trial_keys`): a loss set by its loss graph
    (trials with the same logits share it), the others by their trial's graphs (`trainer.job.compiled_graphs`)."""
    return (item.part, loss_key(item.config) if item.part == "loss" else compiled_graphs(item.config))


def trial_keys(config: TrialConfig) -> frozenset[tuple]:
    """The sets (`set_key`) holding `config`'s graphs: what its trial waits for while side processes compile others."""
    return frozenset(set_key(item) for item in side_sets((config,)))
