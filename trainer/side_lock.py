"""One device's side processes share its memory: a set that runs out of it runs again alone.

A rank's side processes (`trainer.precompile`) each run a reduced copy of a trial on the rank's GPU, at once. Their
peaks add up: four of them held 22.8, 27.4 and 16.9 GiB of an 80 GB H100 when the fourth ran out of memory
(benchmarks/RESULTS.md "Cold sweep", session 31), and its set was left to its trial to compile. So each side
process runs a set holding a shared lock on a file named by the device (`device_lock`), and a set that fails for
want of memory is released and run again under the exclusive lock (`run_sharing`): once the sets running beside it
are done, and alone, the way a single side process would have run it. Its compiled graphs that reached the caches
before the failure are loaded the second time, not compiled again.

No torch at import: `device_lock` reads the device's identity from torch only when called.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from trainer.job import classify_failure

T = TypeVar("T")


def device_lock(device_type: str, index: int | None = None) -> Path:
    """The lock file of a device, the same in every process that uses it: a GPU's by its UUID (Ray's
    CUDA_VISIBLE_DEVICES numbers a GPU differently in a rank and in a process the driver started; a build whose
    device properties lack it, by name and numbering), a CPU's by user (its ranks share the host's memory)."""
    if device_type == "cuda":
        import torch

        props = torch.cuda.get_device_properties(index or 0)
        name = str(getattr(props, "uuid", None) or f"{props.name}-{os.environ.get('CUDA_VISIBLE_DEVICES')}-{index}")
    else:
        name = f"{device_type}-{os.getuid()}"
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"sweep-side-{digest}.lock"


@contextmanager
def _locked(path: Path, exclusive: bool) -> Iterator[None]:
    with open(path, "a") as f:  # never truncated: another process may hold it
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def out_of_memory(e: BaseException) -> bool:
    """Whether `e` is an allocation failure (`trainer.job.classify_failure`'s verdict, CPU caps' messages included)."""
    return classify_failure(type(e).__name__, str(e), cpu_capped=True) == "oom"


def run_sharing(run: Callable[[], T], lock: Path, release: Callable[[], None]) -> tuple[T, bool]:
    """`run()` beside the other side processes of the device (a shared hold on `lock`); if it runs out of memory,
    `release()` and `run()` again alone (the exclusive hold). Its result, and whether it ran again alone. Any other
    failure, or a second allocation failure, is raised."""
    try:
        with _locked(lock, exclusive=False):
            return run(), False
    except Exception as e:
        if not out_of_memory(e):
            raise
    release()  # the failed run's tensors, freed with its traceback as the handler ended
    with _locked(lock, exclusive=True):
        return run(), True
