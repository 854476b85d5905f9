"""A trial's compiled loss alone, as a side process compiles it (`trainer.precompile`): the graph its trial then finds
in inductor's cache, without the model that would make its logits.

Under `compile: regional` a trial compiles two kinds of graph: each block's (the model's width, its precision, the
batch) and the loss's (`trainer.train.cross_entropy` over the logits: the batch, the sequence and the vocabulary). A
side process's copy of the trial needs the whole vocabulary for the loss's graph, and with it the embedding's and the
head's training state and the logits and their gradient: most of its 24-30 GiB on the cold-sweep grid's 2.5 B model
(151,936 tokens, T 4096; benchmarks/RESULTS.md "Cold sweep"). So the copy that compiles the blocks has a cut
vocabulary and an eager loss (`trainer.precompile.reduced`), and the loss's graph is compiled here, as a set of its
own (`trainer.side_sets`), on logits made as the trial's model makes them: the shape, the dtype (the head under the
precision's context), the batch dimension marked as the trial marks it (`TrainStep._forward`), the labels from the
trial's own data. The whole-vocabulary copy held 24-30 GiB a side; apart, the largest set 13.9 GiB (session 32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.data import SyntheticData
from trainer.job import TrialConfig
from trainer.memory import peak_stats, reset_peak
from trainer.models.specs import ModelSpec
from trainer.parallelize import compile_kwargs, mark_batch_dynamic
from trainer.precision import precision_plan
from trainer.train import cross_entropy


def run_loss_graph(config: TrialConfig, device: torch.device) -> dict:
    """One forward and backward of `config`'s compiled loss (one micro-batch); its peak memory (`peak_stats`)."""
    spec = ModelSpec.model_validate_json(config.model_spec_json)
    plan = precision_plan(config.precision, device_type=device.type, sharded=False, options=config.options)
    tokens, labels = SyntheticData(spec, config, device, 0).micro_batch(0)
    with plan.training_context():  # the dtype the trial's head gives its logits
        dtype = F.linear(torch.zeros(1, 8, device=device), torch.zeros(8, 8, device=device)).dtype
    reset_peak(device)
    logits = torch.randn((*tokens.shape, spec.vocab_size), device=device, dtype=dtype, requires_grad=True)
    loss_fn = torch.compile(cross_entropy, **compile_kwargs(config.options.compile_mode))
    if config.options.dynamic_batch:  # as TrainStep._forward marks them
        mark_batch_dynamic(tokens, labels)
        mark_batch_dynamic(logits)
    (loss_fn(logits, labels) / config.options.grad_accum).backward()
    return peak_stats(device)
