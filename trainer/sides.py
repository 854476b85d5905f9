"""The side processes of one rank, as the rank sees them: started by `trainer.precompile.start`, waited for by its
first trial (`Sides.wait`), whose report (`PrecompileReport`) says what the wait went to: each set's seconds, peak
memory and span, from the JSON lines the side processes write (`trainer.precompile`'s `_compile`)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from trainer import side_pool
from trainer.side_pool import PooledSide

WAIT_LIMIT_S = 900.0  # past this the rank stops waiting, kills them and compiles what is missing itself
BESIDE_MARGIN = 1.10  # over a trial's expected peak (trainer.job.TrialConfig.expected_peak_bytes) beside side processes
SIDE_PEAK_BYTES = 16 * 2**30  # what a side process may grow to where no set of its kind has reported its peak yet
SETTLE_S = 0.05  # after pausing them: the GPU work a paused side process had queued drains before a measured step
POLL_S = 0.05  # how often `make_room` looks for a side process that has finished


@dataclass(frozen=True)
class PrecompileReport:
    """What the side processes of one rank did, as its first trial saw it."""

    waited_s: float  # how long the trial waited for them after its own imports and process group
    graphs: int  # sets of graphs they were given (a trial's blocks, its loss, or both: trainer.side_sets)
    compiled: int  # of those, compiled without an error
    errors: tuple[str, ...] = ()  # one line per failure: the trial compiles those graphs itself
    ahead: int | None = 0  # of its side processes, those started ahead (trainer.side_pool); None: not the first wait
    given: int | None = 0  # of those, the ones the driver gave their graphs as it started them (claim_given)
    seconds: tuple[float, ...] = ()  # each set's compile (a reduced trial) in its side process, as they reported
    peak_bytes: tuple[int | None, ...] = ()  # the same sets' peak memory there (GPU: reserved; None: it failed)
    spans: tuple[tuple[float, float, float], ...] = ()  # the same sets: their side's imports done, began, ended (epoch)
    began_at: float = 0.0  # when the wait began (epoch): the spans' origin in `line`
    alone: int = 0  # sets that ran out of memory beside the others and ran again alone (trainer.side_lock)

    def then(self, later: PrecompileReport) -> PrecompileReport:
        """This wait and a `later` one of the same trial, as one."""
        return PrecompileReport(
            self.waited_s + later.waited_s,
            self.graphs + later.graphs,
            self.compiled + later.compiled,
            self.errors + later.errors,
            self.ahead if self.ahead is not None else later.ahead,
            self.given if self.given is not None else later.given,
            self.seconds + later.seconds,
            self.peak_bytes + later.peak_bytes,
            self.spans + later.spans,
            self.began_at,
            self.alone + later.alone,
        )

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
            errors.append(side_pool.STOPPED)
        if self.proc.returncode not in (0, -signal.SIGKILL):
            errors.append(f"a side process exited {self.proc.returncode}: {self.log_tail()}")
        return out.decode(errors="replace"), errors

    def log_tail(self) -> str:
        return side_pool.tail(self.log())

    def log(self) -> str:
        self.log_file.seek(0)
        return self.log_file.read().decode(errors="replace")

    def finished(self) -> bool:
        return self.proc.poll() is not None

    def signal(self, signum: int) -> None:
        side_pool.signal_group(self.proc.pid, signum)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log_file.close()


class Sides:
    """The side processes of one rank, started by `trainer.precompile.start`, each with the sets it compiles (their
    `trainer.side_sets.set_key`s). A trial waits for those compiling its own graphs (`wait`); the others go on
    compiling while it trains, paused while it measures (`pause`, `resume`): they never share the GPU with a measured
    step. `stop` kills those left."""

    def __init__(self, procs: list[PipedSide | PooledSide], graphs: int, keys: list[frozenset[tuple]]) -> None:
        self.procs, self.graphs = procs, graphs
        self.pending: list[tuple[PipedSide | PooledSide, frozenset[tuple]]] = list(zip(procs, keys, strict=True))
        self.part_peaks: dict[str, int] = {}  # the largest peak memory a set of each part has reported
        self.paused = False
        self._reported = False  # the counts of sets and of sides started ahead go in the first report alone

    def wait(self, needed: frozenset[tuple] | None = None, limit_s: float = WAIT_LIMIT_S) -> PrecompileReport:
        """Collect the side processes compiling any set in `needed` (every one: None), and those done already; what
        they did. The others stay `pending`."""
        began, began_at = time.perf_counter(), time.time()
        taken = [(side, keys) for side, keys in self.pending if needed is None or keys & needed or side.finished()]
        self.pending = [entry for entry in self.pending if entry not in taken]
        compiled, errors, seconds, peaks, spans, alone, sets = 0, [], [], [], [], 0, 0
        for side, keys in taken:
            out, failures = side.collect(max(0.0, began + limit_s - time.perf_counter()))
            sets += len(keys)
            for line in out.splitlines():
                try:
                    result = json.loads(line)
                except json.JSONDecodeError:  # a line cut by the side's death: its failure says so
                    continue
                compiled += result["ok"]
                errors += [result["error"]] if result["error"] else []
                if result.get("peak_bytes") is not None:
                    part, peak = result.get("part", "whole"), result["peak_bytes"]
                    self.part_peaks[part] = max(peak, self.part_peaks.get(part, 0))
                if "seconds" in result:  # not in the line of a side process that never ran the set
                    seconds.append(result["seconds"])
                    peaks.append(result["peak_bytes"])
                    spans.append(tuple(result["span"]))
                    alone += result["alone"]
            errors += failures
            if os.environ.get("SWEEP_DEBUG"):  # what the side printed, in the rank's log
                sys.stderr.write(side.log())
            if isinstance(side, PipedSide):
                side.log_file.close()
        first, self._reported = not self._reported, True
        return PrecompileReport(
            time.perf_counter() - began,
            self.graphs if first else sets,
            compiled,
            tuple(errors),
            sum(isinstance(side, PooledSide) for side in self.procs) if first else None,
            sum(isinstance(side, PooledSide) and side.given for side in self.procs) if first else None,
            tuple(seconds),
            tuple(peaks),
            tuple(spans),
            began_at,
            alone,
        )

    def room_for(self, expected_bytes: int | None, free_bytes: int) -> bool:
        """Whether a trial expected to peak at `expected_bytes` (None: not known) fits `free_bytes` of its GPU's memory
        beside the pending side processes, BESIDE_MARGIN over its expectation, each side allowed to grow to the largest
        peak a set of its parts has reported (any part's where none of its own has; SIDE_PEAK_BYTES where none has)."""
        if expected_bytes is None:
            return not self.pending
        fallback = max(self.part_peaks.values(), default=SIDE_PEAK_BYTES)
        growth = sum(
            max((self.part_peaks.get(key[0], fallback) for key in keys), default=fallback) for _, keys in self.pending
        )
        return expected_bytes * BESIDE_MARGIN + growth <= free_bytes

    def make_room(
        self, expected_bytes: int | None, free_bytes: Callable[[], int], limit_s: float = WAIT_LIMIT_S
    ) -> PrecompileReport | None:
        """Wait for pending side processes one at a time, as each finishes, until a trial expected to peak at
        `expected_bytes` fits beside those left (`room_for`, `free_bytes()` read again after each); what the waits
        collected (None: it fit at once). Waiting for all of them at once had a first trial that fits beside all but
        the slowest (torchao rowwise's sets, 30-44 s: benchmarks/RESULTS.md "Cold sweep") wait for that one too."""
        began, report = time.perf_counter(), None
        while self.pending and not self.room_for(expected_bytes, free_bytes()):
            while not any(side.finished() for side, _ in self.pending) and time.perf_counter() - began < limit_s:
                time.sleep(POLL_S)
            left = max(0.0, limit_s - (time.perf_counter() - began))
            done = self.wait(frozenset() if left else None, left)  # those finished; past the limit, all (stopped)
            report = done if report is None else report.then(done)
        # the wait is all of it, polls included: the row's precompile_s (sweep.record.cost counts it as compile)
        return None if report is None else dataclasses.replace(report, waited_s=time.perf_counter() - began)

    def pause(self) -> None:
        """Stop the pending side processes and their compile workers where they are (SIGSTOP to each one's process
        group): a measured step follows. They keep the memory they hold."""
        if self.pending:
            self._signal(signal.SIGSTOP)
            self.paused = True
            time.sleep(SETTLE_S)

    def resume(self) -> None:
        """Let paused side processes go on (SIGCONT)."""
        if self.paused:
            self._signal(signal.SIGCONT)
            self.paused = False

    def _signal(self, signum: int) -> None:
        for side, _ in self.pending:
            if not side.finished():  # one done is gone, or soon: its pid (a group's id) may be another's later
                side.signal(signum)

    def stop(self) -> None:
        for side, _ in self.pending:
            side.stop()
        self.pending = []
