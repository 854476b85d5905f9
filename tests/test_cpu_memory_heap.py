"""The CPU memory cap (trainer/memory.py) on a process that ran a capped trial before: the tensors that trial
freed are given back to the system, not kept in glibc's heap where the next trial would reuse them on top of its
own cap. In a subprocess, since the cap and glibc's malloc settings are process-wide."""

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA caps are Linux's")


def test_a_trials_freed_tensors_do_not_widen_the_next_trials_cap():
    code = """
        import torch
        from trainer import memory
        cpu, MiB = torch.device("cpu"), 2**20
        with memory.memory_cap(64 * MiB, cpu):  # a trial, whose first freed block raises glibc's mmap threshold
            torch.empty(4 * MiB, dtype=torch.uint8)
            blocks = [torch.ones(4 * MiB, dtype=torch.uint8) for _ in range(12)]  # 48 MiB, then from the heap
            kept = torch.ones(64 * 1024)  # a block the process keeps (a library's cache), above them in the heap
            del blocks
        with memory.memory_cap(64 * MiB, cpu):  # the next trial: 80 MiB is past its cap
            try:
                more = [torch.ones(4 * MiB, dtype=torch.uint8) for _ in range(20)]
                print("fitted")
            except RuntimeError as e:
                print("oom" if "can't allocate memory" in str(e) else e)
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # before the fix: "fitted", the 48 MiB freed inside the heap reused on top of the 64 MiB cap
    assert done.stdout.strip() == "oom"
