"""A rank's side processes as its trials see them (trainer.sides.Sides): each trial waits for those compiling its own
graphs, the others go on compiling, paused (with their compile workers) while a trial measures; a trial starts beside
them only where the GPU's memory holds it and what they may still grow to.

Real processes stand in for side processes here: each writes the JSON line a side writes per set
(trainer.precompile), one when told to (a file appears), one after starting a child of its own (as inductor's
compile workers are), so that which one a wait takes, and what a pause stops, do not depend on a compile's speed.
"""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from trainer.sides import BESIDE_MARGIN, PipedSide, Sides

GiB = 2**30


def _line(part: str, peak: int) -> str:
    span = [time.time()] * 3
    result = {"ok": True, "error": None, "seconds": 0.1, "peak_bytes": peak, "part": part, "alone": False, "span": span}
    return json.dumps(result)


def _side(script: str) -> PipedSide:
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True
    )
    return PipedSide(proc, tempfile.TemporaryFile())


def _state(pid: int) -> str:
    """The process's state letter (/proc/PID/stat): T stopped, S sleeping, R running."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _until(pid: int, states: str) -> str:
    deadline = time.monotonic() + 10
    while (state := _state(pid)) not in states and time.monotonic() < deadline:
        time.sleep(0.01)
    return state


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_trial_waits_for_its_own_side_process_while_the_other_pauses_with_its_workers_and_goes_on(tmp_path):
    go, child = tmp_path / "go", tmp_path / "child"
    quick = _side(f"print({_line('blocks', 2 * GiB)!r}, flush=True)")
    slow = _side(
        "import pathlib, subprocess, sys, time\n"
        "worker = subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(0.01)'])\n"
        f"pathlib.Path({str(child)!r}).write_text(str(worker.pid))\n"
        f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.01)\n"
        f"print({_line('loss', 5 * GiB)!r}, flush=True)\n"
        "worker.kill()\n"
    )
    sides = Sides([quick, slow], 3, [frozenset({("blocks", "a")}), frozenset({("blocks", "b"), ("loss", "b")})])

    report = sides.wait(frozenset({("blocks", "a"), ("loss", "a")}))  # the first trial's own sets: the quick side's
    assert (report.graphs, report.compiled, report.peak_bytes) == (3, 1, (2 * GiB,))
    assert [side for side, _ in sides.pending] == [slow]

    # beside the slow side a trial needs room for what it may grow to: its kind of set's largest peak so far
    free = 10 * GiB
    assert sides.room_for(int((free - 2 * GiB) / BESIDE_MARGIN), free)
    assert not sides.room_for(int((free - 2 * GiB) / BESIDE_MARGIN) + GiB, free)
    assert not sides.room_for(None, free)  # a trial with no expected peak waits for every side

    deadline = time.monotonic() + 30
    while not child.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    worker = int(child.read_text())
    sides.pause()  # a measured step follows: the side and its worker stop where they are
    assert (_until(slow.proc.pid, "T"), _until(worker, "T")) == ("T", "T")
    sides.resume()
    assert _until(slow.proc.pid, "RS") in "RS" and _until(worker, "RS") in "RS"

    go.touch()
    later = sides.wait()  # the next trial's: what is left
    assert (later.graphs, later.compiled, later.ahead, later.peak_bytes) == (2, 1, None, (5 * GiB,))
    assert not sides.pending and sides.room_for(None, free)  # none left: nothing to make room for
    assert report.then(later).peak_bytes == (2 * GiB, 5 * GiB)


def test_what_runs_beside_a_trial_is_paused_from_its_first_measured_step_to_its_last():
    import torch
    from test_train import _one_rank_group

    from trainer.stopping import Schedule
    from trainer.train import time_steps

    events: list = []

    class Beside:
        def pause(self) -> None:
            events.append("pause")

        def resume(self) -> None:
            events.append("resume")

    def step(i: int) -> torch.Tensor:
        events.append(i)
        return torch.zeros(())

    with _one_rank_group() as rank:
        time_steps(step, Schedule(2, 3), rank, beside=Beside())
    assert events == [0, 1, "pause", 2, 3, 4, "resume"]


def test_a_first_trial_waits_only_until_it_fits_beside_the_side_processes_left(tmp_path):
    go = tmp_path / "go"
    quick = _side(f"import time\ntime.sleep(0.3)\nprint({_line('blocks', 2 * GiB)!r}, flush=True)")
    slow = _side(
        "import pathlib, time\n"
        f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.01)\n"
        f"print({_line('loss', 3 * GiB)!r}, flush=True)\n"
    )
    sides = Sides([quick, slow], 2, [frozenset({("blocks", "a")}), frozenset({("loss", "b")})])
    reads: list[int] = []

    def free() -> int:
        reads.append(40 * GiB)
        return reads[-1]

    # before any set reported its peak, each side may grow to SIDE_PEAK_BYTES (16 GiB): 2 x 16 + 1.1 x 9 > 40 GiB;
    # once the quick side's set reports 2 GiB, the slow one counts that much: 2 + 1.1 x 9 <= 40 GiB
    report = sides.make_room(9 * GiB, free)
    assert report is not None and (report.compiled, report.peak_bytes) == (1, (2 * GiB,))
    assert report.waited_s >= 0.2  # the polls count as the wait (the row's precompile_s)
    assert [side for side, _ in sides.pending] == [slow] and len(reads) == 2  # free memory read again after the wait
    assert sides.make_room(9 * GiB, free) is None  # it fits now: no wait

    go.touch()
    rest = sides.make_room(39 * GiB, free)  # fits beside none: waits for every one left
    assert rest is not None and (rest.compiled, rest.peak_bytes, rest.ahead) == (1, (3 * GiB,), None)
    assert not sides.pending


def test_making_room_stops_side_processes_still_compiling_at_the_limit():
    stuck = _side("import time\ntime.sleep(60)")
    sides = Sides([stuck], 1, [frozenset({("blocks", "a")})])
    report = sides.make_room(None, lambda: 40 * GiB, limit_s=0.2)  # no expected peak: it waits for every side
    assert report is not None and report.compiled == 0 and "stopped" in report.errors[0]
    assert not sides.pending and stuck.proc.poll() is not None
