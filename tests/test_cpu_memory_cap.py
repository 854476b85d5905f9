"""The CPU memory cap (trainer/memory.py): a real allocation failure past it, and threads that other libraries
start inside a trial (Ray's gRPC does) taking no more than a sliver of it. Each case runs in a subprocess, since
the cap and the thread-stack default are process-wide."""

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA caps are Linux's")


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_an_allocation_past_the_cap_fails_and_one_under_it_does_not():
    out = _run("""
        import torch
        from trainer.memory import memory_cap
        with memory_cap(64 * 2**20, torch.device("cpu")):
            under = torch.ones(32 * 2**20, dtype=torch.uint8)
            try:
                torch.ones(48 * 2**20, dtype=torch.uint8)
                print("fitted")
            except RuntimeError as e:
                print("oom" if "can't allocate memory" in str(e) else e)
        print(torch.ones(48 * 2**20, dtype=torch.uint8).numel() == 48 * 2**20)  # the cap is gone after
    """)
    assert out.splitlines() == ["oom", "True"]


def test_a_thread_started_under_the_cap_takes_about_a_mebibyte_of_it_not_a_full_stack():
    out = _run("""
        import threading, torch
        from trainer import memory
        before = memory.default_thread_stack_bytes()
        with memory.memory_cap(64 * 2**20, torch.device("cpu")):
            start = memory._proc_status_kib("VmData")
            ready, stop = threading.Event(), threading.Event()
            t = threading.Thread(target=lambda: (ready.set(), stop.wait())); t.start(); ready.wait()
            grown = memory._proc_status_kib("VmData") - start
            stop.set(); t.join()
        print(before, memory.default_thread_stack_bytes(), grown)
    """)
    before, after, grown_kib = map(int, out.split())
    assert before > 2 * 2**20, "glibc's default thread stack (RLIMIT_STACK, 8 MiB) was expected before the cap"
    assert after == 2**20
    assert grown_kib < 2048, f"a thread started under the cap took {grown_kib} KiB of it"
