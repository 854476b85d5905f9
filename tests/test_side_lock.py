"""A side process's set that runs out of memory beside the others runs again alone (trainer.side_lock): a real
allocation failure under a CPU memory cap, and a real second process holding the device's shared lock."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from trainer.memory import memory_cap
from trainer.side_lock import device_lock, out_of_memory, run_sharing

MiB = 1024**2

_HOLDER = """
import fcntl, sys, time
with open(sys.argv[1], "a") as f:
    fcntl.flock(f, fcntl.LOCK_SH)  # a side process running a set beside this one
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
    print(time.time(), flush=True)  # when it let go
"""


def _allocate(cap_bytes: int | None) -> int:
    with memory_cap(cap_bytes, torch.device("cpu")):
        t = torch.ones(64 * MiB // 4)  # 64 MiB, touched
        return int(t.sum())


def test_a_set_that_runs_out_of_memory_runs_again_alone_once_the_others_let_go(tmp_path):
    lock = tmp_path / "device.lock"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(lock), "1.5"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    caps, released, began = iter([8 * MiB, None]), [], []

    def run() -> int:  # the first time 8 MiB are left beside the others; alone, the whole host
        began.append(time.time())
        return _allocate(next(caps))

    result, alone = run_sharing(run, lock, lambda: released.append(time.time()))
    let_go = float(holder.stdout.readline())
    holder.wait()
    assert (result, alone) == (64 * MiB // 4, True)
    assert len(began) == 2 and len(released) == 1
    assert began[0] < let_go - 0.5  # the first run went beside the holder
    assert released[0] < let_go <= began[1]  # the second waited for it to let go


def test_a_set_that_fits_runs_once_beside_the_others_and_other_failures_are_raised(tmp_path):
    lock = tmp_path / "device.lock"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(lock), "30"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert run_sharing(lambda: _allocate(None), lock, lambda: None) == (64 * MiB // 4, False)  # no waiting

        def broken() -> int:
            raise ValueError("not a memory failure")

        with pytest.raises(ValueError, match="not a memory failure"):
            run_sharing(broken, lock, lambda: None)
    finally:
        holder.kill()
        holder.wait()


def test_a_second_allocation_failure_alone_is_raised(tmp_path):
    with pytest.raises(RuntimeError) as failure:
        run_sharing(lambda: _allocate(8 * MiB), tmp_path / "device.lock", lambda: None)
    assert out_of_memory(failure.value)


def test_every_process_on_a_cpu_finds_the_same_lock():
    code = "from trainer.side_lock import device_lock; print(device_lock('cpu'))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == str(device_lock("cpu"))
