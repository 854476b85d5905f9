"""What a warm rank does between trials (trainer.release.settle): the objects that survive frozen, and the full
collection over them only where garbage may hide there (compiled code dropped, or memory held above the baseline).
On this process's CPU, with a real dynamo reset; tests/test_warm_groups.py runs it inside real rank processes."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from trainer import release
from trainer.job import TrialConfig
from trainer.models.specs import REGISTRY
from trainer.options import TrainingOptions

CPU = torch.device("cpu")


def config(dynamic: bool) -> TrialConfig:
    return TrialConfig(
        model_spec_json=REGISTRY["llama-tiny"].to_json(),
        precision="bf16",
        compile="regional",
        ac="none",
        batch_size=2,
        seq_len=32,
        warmup_steps="auto",
        measure_steps="auto",
        options=TrainingOptions(dynamic_batch=dynamic),
    )


class Cycle:
    """Garbage only a full collection frees: it refers to itself."""

    def __init__(self, payload: torch.Tensor | None = None) -> None:
        self.me, self.payload = self, payload


@pytest.fixture
def settled(monkeypatch):
    """A process that settled once (everything it held frozen), with no compiled code kept; thawed after."""
    monkeypatch.setattr(release, "_kept", [])
    monkeypatch.setattr(release, "_dropped", True)
    monkeypatch.setattr(release, "_code_frozen", False)
    yield release.settle(CPU).held_bytes
    gc.unfreeze()
    gc.collect()


def frozen_garbage(payload: torch.Tensor | None = None) -> weakref.ref:
    """An object that survived a settle (frozen), then became garbage; a weak reference to it."""
    cycle = Cycle(payload)
    gc.freeze()
    return weakref.ref(cycle)


def test_a_trial_that_kept_its_graphs_leaves_the_frozen_objects_untraversed(settled):
    kept = config(dynamic=True)
    release.settle(CPU, keep_for=kept)  # its graphs are kept: nothing dropped
    leftover = frozen_garbage()
    assert release.settle(CPU, keep_for=kept, baseline=settled).held_bytes <= settled
    assert leftover() is not None  # no full collection reached it
    assert gc.get_freeze_count() > 0


def test_kept_graphs_dropped_are_collected_among_the_frozen_objects_a_static_trials_own_are_not_looked_for(settled):
    release.settle(CPU, keep_for=config(dynamic=True))  # its graphs kept, and frozen with the rest
    leftover = frozen_garbage()
    release.settle(CPU, keep_for=config(dynamic=False))  # a static-shape trial drops them (dynamo's reset)
    assert leftover() is None
    # its own graphs were made after the last freeze and are dropped at its end: the young collection frees them
    leftover = frozen_garbage()
    release.settle(CPU, keep_for=config(dynamic=False))
    assert leftover() is not None


def test_memory_held_above_the_baseline_is_looked_for_among_the_frozen_objects(settled):
    kept = config(dynamic=True)
    release.settle(CPU, keep_for=kept)
    leftover = frozen_garbage(torch.ones(1 << 20))  # 4 MiB no young collection frees
    assert release.held_bytes(CPU) >= settled + (4 << 20)  # the count sees frozen tensors
    assert release.settle(CPU, keep_for=kept, baseline=settled).held_bytes <= settled
    assert leftover() is None
