"""The side processes of one rank, as the rank sees them: started by `trainer.precompile.start`, waited for by its
first trial (`Sides.wait`), whose report (`PrecompileReport`) says what the wait went to: each set's seconds, peak
memory and span, from the JSON lines the side processes write (`trainer.precompile`'s `_compile`)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import IO

from trainer import side_pool
from trainer.side_pool import PooledSide

WAIT_LIMIT_S = 900.0  # past this the rank stops waiting, kills them and compiles what is missing itself


@dataclass(frozen=True)
class PrecompileReport:
    """What the side processes of one rank did, as its first trial saw it."""

    waited_s: float  # how long the trial waited for them after its own imports and process group
    graphs: int  # sets of graphs they were given (a trial's blocks, its loss, or both: trainer.side_sets)
    compiled: int  # of those, compiled without an error
    errors: tuple[str, ...] = ()  # one line per failure: the trial compiles those graphs itself
    ahead: int = 0  # of its side processes, those started ahead (trainer.side_pool)
    given: int = 0  # of those, the ones the driver gave their graphs as it started them (side_pool.claim_given)
    seconds: tuple[float, ...] = ()  # each set's compile (a reduced trial) in its side process, as they reported
    peak_bytes: tuple[int | None, ...] = ()  # the same sets' peak memory there (GPU: reserved; None: it failed)
    spans: tuple[tuple[float, float, float], ...] = ()  # the same sets: their side's imports done, began, ended (epoch)
    began_at: float = 0.0  # when the wait began (epoch): the spans' origin in `line`
    alone: int = 0  # sets that ran out of memory beside the others and ran again alone (trainer.side_lock)

    def line(self) -> str:
        """What the wait went to, on one line (rank 0 prints it with SWEEP_COMPILE_REPORT): each set's seconds, peak
        memory, and when its side's imports ended and the set began and ended, in seconds from the wait's start."""
        sets = ", ".join(
            f"{s:.1f} s"
            + (f" / {b / 2**30:.1f} GiB" if b is not None else "")
            + (_span_text(span, self.began_at) if span else "")
            for s, b, span in itertools.zip_longest(self.seconds, self.peak_bytes, self.spans)
        )
        again = f"; {self.alone} ran again alone after running out of memory" if self.alone else ""
        return f"waited {self.waited_s:.1f} s for side processes (each set's seconds / peak memory: {sets}){again}"


def _span_text(span: tuple[float, float, float], origin: float) -> str:
    imported, began, ended = (t - origin for t in span)
    return f" (imports {imported:+.1f}, set {began:+.1f} to {ended:+.1f})"


class PipedSide:
    """A side process this rank started: its configs on stdin, its results on stdout."""

    def __init__(self, proc: subprocess.Popen, log: IO[bytes]) -> None:
        self.proc, self.log_file = proc, log

    def collect(self, limit_s: float) -> tuple[str, list[str]]:
        errors = []
        try:
            out, _ = self.proc.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            errors.append(f"a side process still compiling after {limit_s:.0f} s was stopped")
        if self.proc.returncode not in (0, -signal.SIGKILL):
            errors.append(f"a side process exited {self.proc.returncode}: {self.log_tail()}")
        return out.decode(errors="replace"), errors

    def log_tail(self) -> str:
        return side_pool.tail(self.log())

    def log(self) -> str:
        self.log_file.seek(0)
        return self.log_file.read().decode(errors="replace")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log_file.close()


class Sides:
    """The side processes of one rank, started by `start`; `wait` collects them, `stop` kills them."""

    def __init__(self, procs: list[PipedSide | PooledSide], graphs: int) -> None:
        self.procs, self.graphs = procs, graphs

    def wait(self, limit_s: float = WAIT_LIMIT_S) -> PrecompileReport:
        began, began_at = time.perf_counter(), time.time()
        compiled, errors, seconds, peaks, spans, alone = 0, [], [], [], [], 0
        for side in self.procs:
            out, failures = side.collect(max(0.0, began + limit_s - time.perf_counter()))
            for line in out.splitlines():
                try:
                    result = json.loads(line)
                except json.JSONDecodeError:  # a line cut by the side's death: its failure says so
                    continue
                compiled += result["ok"]
                errors += [result["error"]] if result["error"] else []
                if "seconds" in result:  # not in the line of a side process that never ran the set
                    seconds.append(result["seconds"])
                    peaks.append(result["peak_bytes"])
                    spans.append(tuple(result["span"]))
                    alone += result["alone"]
            errors += failures
            if os.environ.get("SWEEP_DEBUG"):  # what the side printed, in the rank's log
                sys.stderr.write(side.log())
        for side in self.procs:
            if isinstance(side, PipedSide):
                side.log_file.close()
        ahead = sum(isinstance(side, PooledSide) for side in self.procs)
        given = sum(isinstance(side, PooledSide) and side.given for side in self.procs)
        waited = time.perf_counter() - began
        return PrecompileReport(
            waited,
            self.graphs,
            compiled,
            tuple(errors),
            ahead,
            given,
            tuple(seconds),
            tuple(peaks),
            tuple(spans),
            began_at,
            alone,
        )

    def stop(self) -> None:
        for side in self.procs:
            side.stop()
