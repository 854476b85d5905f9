"""Waiting for a device's queued work: what a timed region starts and ends with (trainer.train, trainer.profiling)."""

from __future__ import annotations

import torch


def device_sync(device: torch.device) -> None:
    """Block until every kernel queued on `device` has run (a CPU runs its work as it is issued)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
