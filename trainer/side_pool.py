"""Side processes started ahead: the compile-ahead side processes of a run's first groups (`trainer.precompile`),
started by the driver as it starts Ray, so that their own start is over before any GPU is held.

A fresh group's first trial waits for its side processes before it builds its model, and each side process first
imports torch, dynamo, FSDP and the trainer: seconds of that wait before it compiles anything (benchmarks/RESULTS.md
"Cold sweep"). The Ray that sweep starts with rank processes ahead (`sweep.execution.prestart`) starts these too,
beside it (`spawn`); each does the imports a rank does ahead (`trainer.preload`: not inductor's, which start the CUDA
driver) and waits in a folder (FOLDER_ENV, in the ranks' environment) for a job. A rank takes one (`claim`: renaming its
`free-PID` file, which one rank alone can do), gives it a share of its graphs and its own environment (`give`: the
GPU Ray assigned it, which the waiting process has not started: its imports start no device, as a rank's ahead do),
and reads its results as the side process writes them (`out-PID`; `done-PID` once it has finished). The run stops
the ones left unclaimed as it ends (`stop`). No torch here: the driver imports this module.

Where one rank alone runs on the node at a time (a one-GPU node), the GPU a side process compiles on cannot be any
other group's, and the graphs it is to compile are the run's (sweep.execution.runner.ahead_graphs): the driver gives
each its job as it starts it (`spawn` with `jobs`; `given-PID`), so that it compiles while Ray starts and the first
rank imports and is placed, not after. The first rank takes those (`claim_given`), waits for them with its own,
and starts side processes only for graphs they were not given.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from trainer.side_sets import SideSet

FOLDER_ENV = "SWEEP_SIDE_POOL"  # where the waiting side processes are: set in the ranks' environment
POLL_S = 0.01  # how often a waiting side process looks for its job, and a rank for a side process's end
# the error a rank records for a side process it stopped at the wait's limit (PooledSide, trainer.sides.PipedSide)
STOPPED = "a side process still compiling when the rank stopped waiting for it was stopped"


@dataclass(frozen=True)
class SideJob:
    """What a rank gives one side process."""

    sets: tuple[SideSet, ...]
    """The sets of graphs it compiles (a trial's blocks, its loss, or both: `trainer.side_sets`), in order."""
    device_type: str
    """'cuda' or 'cpu': the rank's."""
    env: Mapping[str, str] | None = None
    """The rank's environment, set in a side process started ahead before it starts its device; None for one the rank
    started itself (it has it)."""


def spawn(folder: Path, count: int, env: Mapping[str, str], jobs: Sequence[SideJob] = ()) -> list[subprocess.Popen]:
    """Start `count` side processes that wait in `folder` (the driver, as it starts Ray), with environment `env`;
    the first len(`jobs`) given theirs at once (`given-PID`: a rank takes them with `claim_given`), the rest `free`."""
    procs = []
    for i in range(count):
        log = tempfile.NamedTemporaryFile(dir=folder, prefix="starting-", delete=False)  # noqa: SIM115 - renamed below
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainer.precompile", "--pool", str(folder)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=dict(env),
            start_new_session=True,  # its own process group, with its compile workers: a rank pauses them as one
        )
        log.close()  # the process has its own descriptor
        os.rename(log.name, folder / f"log-{proc.pid}")
        given = i < len(jobs)
        if given:
            PooledSide(folder, proc.pid).give(jobs[i])
        (folder / f"{'given' if given else 'free'}-{proc.pid}").touch()  # last: a rank taking it finds its log and job
        procs.append(proc)
    return procs


def signal_group(pid: int, signum: int) -> None:
    """Send `signum` to the side process `pid` and its compile workers: its process group (it leads one: `spawn`,
    `trainer.precompile.start`), else the process alone; nothing once it is gone."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except OSError:
        pass


def stop(procs: list[subprocess.Popen]) -> None:
    """Stop the driver's side processes (those still waiting, or a claimed one its rank left running)."""
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()


def claim(folder: Path, count: int, kind: str = "free") -> list[PooledSide]:
    """Up to `count` of the side processes waiting in `folder` (none when it is gone: the run has ended), of `kind`:
    free (waiting for a job) or given (given one by the driver: `claim_given`)."""
    taken: list[PooledSide] = []
    try:
        found = sorted(folder.glob(f"{kind}-*"))
    except OSError:
        return taken
    for path in found:
        if len(taken) == count:
            break
        pid = int(path.name.removeprefix(f"{kind}-"))
        try:
            path.rename(folder / f"claimed-{pid}")
        except OSError:  # another rank took it first
            continue
        taken.append(PooledSide(folder, pid, given=kind == "given"))
    return taken


def claim_given(folder: Path) -> list[PooledSide]:
    """Every side process in `folder` that the driver gave its job as it started it (compiling, or done)."""
    return claim(folder, sys.maxsize, "given")


def tail(log: str, chars: int = 600) -> str:
    """The end of a side process's log on one line: a failure's reason."""
    return log[-chars:].strip().replace("\n", " | ")


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped by the driver, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class PooledSide:
    """A side process started ahead, claimed by this rank."""

    def __init__(self, folder: Path, pid: int, given: bool = False) -> None:
        self.folder, self.pid, self.given = folder, pid, given  # given: its job by the driver as it started it

    def _path(self, kind: str) -> Path:
        return self.folder / f"{kind}-{self.pid}"

    def give(self, job: SideJob) -> None:
        staged = self._path("staging")
        staged.write_bytes(pickle.dumps(job))
        staged.rename(self._path("job"))  # whole or not at all, as the side process reads it

    def job(self) -> SideJob | None:
        """The job it was given (None: none yet, or its folder is gone)."""
        try:
            job = pickle.loads(self._path("job").read_bytes())  # written by this run's driver or rank: trusted
        except OSError:
            return None
        assert isinstance(job, SideJob)
        return job

    def collect(self, limit_s: float) -> tuple[str, list[str]]:
        """Its result lines, once it has finished or `limit_s` passed, and what went wrong with the process."""
        deadline = time.monotonic() + limit_s
        while not self._path("done").exists() and _alive(self.pid) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        errors = []
        if not self._path("done").exists():
            if _alive(self.pid):
                self.stop()
                errors.append(STOPPED)
            else:
                errors.append(f"a side process started ahead died: {self.log_tail()}")
        try:
            out = self._path("out").read_text()
        except OSError:
            out = ""
        return out, errors

    def log(self) -> str:
        try:
            return self._path("log").read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self) -> str:
        return tail(self.log())

    def finished(self) -> bool:
        return self._path("done").exists() or not _alive(self.pid)

    def signal(self, signum: int) -> None:
        signal_group(self.pid, signum)

    def stop(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass


def await_job(folder: Path) -> SideJob | None:
    """In a side process started ahead: its job, once a rank has given it; None when the run ends first (its folder
    removed)."""
    path = folder / f"job-{os.getpid()}"
    while not path.exists():
        if not folder.exists():
            return None
        time.sleep(POLL_S)
    job = pickle.loads(path.read_bytes())  # from the rank, through the run's own folder: trusted
    assert isinstance(job, SideJob)
    return job


def results(folder: Path) -> TextIO:
    """Where a side process started ahead writes its result lines (line-buffered)."""
    return open(folder / f"out-{os.getpid()}", "w", buffering=1)  # noqa: SIM115 - the caller closes it


def finished(folder: Path) -> None:
    """Say this side process has written all its results."""
    (folder / f"done-{os.getpid()}").touch()
