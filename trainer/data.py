"""The tokens a trial trains on: synthetic, made on the rank's device before anything is timed."""

from __future__ import annotations

import torch

from trainer.job import TrialConfig
from trainer.models.specs import ModelSpec


class SyntheticData:
    """Synthetic tokens. Labels are a fixed random permutation of the inputs: a mapping the model can learn
    (loss falls, showing the step really trains) with no shortcut at init (the first loss is ~ln V). The
    batches are made up front so no data work is timed: 4, or one per micro-batch of a step so that a
    step's micro-batches are distinct (a token batch is KBs). The permutation is the task, the same on
    every rank; each data-parallel rank (`data_rank`) draws its own tokens."""

    def __init__(self, spec: ModelSpec, config: TrialConfig, device: torch.device, data_rank: int) -> None:
        accum = config.options.grad_accum
        self.perm = torch.randperm(
            spec.vocab_size, generator=torch.Generator(device=device).manual_seed(config.seed), device=device
        )
        # one stream of tokens per data-parallel rank: FSDP 2 x TP 2 trains the tokens of FSDP 2
        gen = torch.Generator(device=device).manual_seed(config.seed + 1 + data_rank)
        n_batches = max(4, accum)
        if isinstance(config.warmup_steps, int) and isinstance(config.measure_steps, int):  # else known only after
            n_batches = min(n_batches, (config.warmup_steps + config.measure_steps) * accum)
        self.batches = [
            torch.randint(spec.vocab_size, (config.batch_size, config.seq_len), generator=gen, device=device)
            for _ in range(n_batches)
        ]

    def micro_batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The `index`-th micro-batch of the run: (tokens, labels)."""
        tokens = self.batches[index % len(self.batches)]
        return tokens, self.perm[tokens]
