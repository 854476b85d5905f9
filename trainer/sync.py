"""A rank's device (`rank_device`), and waiting for its queued work: what a timed region starts and ends with
(trainer.train, trainer.profiling)."""

from __future__ import annotations

import torch


def device_sync(device: torch.device) -> None:
    """Block until every kernel queued on `device` has run (a CPU runs its work as it is issued)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rank_device(device_type: str) -> torch.device:
    """This rank's device, made current: a rank's (trainer.worker), a side process's (trainer.precompile)."""
    if device_type != "cuda":
        return torch.device("cpu")
    device = torch.device("cuda", torch.cuda.current_device())  # Ray set CUDA/HIP_VISIBLE_DEVICES
    torch.cuda.set_device(device)
    # fp32 recipes use TF32 tensor cores: the catalog's NVIDIA fp32 peak (the MFU divisor) is TF32's
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    return device
