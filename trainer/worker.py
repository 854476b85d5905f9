"""One rank of one trial: a plain class that the scheduler runs as a Ray actor (one process per rank).

The Ray-facing shell around `trainer.train.run_trial`: it joins the trial's process group on its device,
runs the trial, and reports; in a warm group it keeps device and process group for the group's next trial.
`run(job)` never raises: it returns a `trainer.result.RankResult` (its status: 'ok', 'oom' or 'error', and
what it measured), so the driver learns of a failed rank at once and can tear the whole group down (no rank
waits for an NCCL timeout). torch is imported only inside: the driver imports this module to make the actor class.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import sys
import time
import traceback
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from trainer import compile_report, side_pool
from trainer.job import RankJob, TrialConfig, classify_failure
from trainer.result import RankResult

WAIT_ENV = "SWEEP_PRECOMPILE_WAIT"  # "all": a trial waits for every side process still compiling, as before session 33

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from trainer.sides import PrecompileReport, Sides
    from trainer.train import Measurement, Rank


@functools.cache  # once per process: a warm rank reports them with every trial
def _versions() -> tuple[str, str | None, str | None]:
    """torch's version, and transformer-engine's and torchao's (None where not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    installed: list[str | None] = []
    for distribution in ("transformer-engine", "torchao"):
        try:
            installed.append(version(distribution))
        except PackageNotFoundError:
            installed.append(None)
    return str(torch.__version__), installed[0], installed[1]


@functools.cache  # the answer does not change while the process lives
def _device_info(device: torch.device) -> tuple[str | None, str | None, str | None]:
    """The GPU's name, its driver's version and the runtime torch was built for ('cuda 12.8'); None each on a CPU."""
    import torch

    if device.type != "cuda":
        return None, None, None
    runtime = torch.version.hip and f"hip {torch.version.hip}" or f"cuda {torch.version.cuda}"
    return torch.cuda.get_device_name(device), _driver_version(), runtime


def _driver_version() -> str | None:
    """The NVIDIA driver's version: NVML's, else nvidia-smi's, which is a subprocess inside the first trial's wall; None
    where neither answers (ROCm)."""
    from trainer.energy_backends import driver_version

    version = driver_version()
    if version is not None:
        return version
    try:
        import subprocess

        smi = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        return subprocess.run(smi, capture_output=True, text=True, timeout=10).stdout.split("\n")[0].strip() or None
    except Exception:
        return None


def _rendezvous_store(job: RankJob, timeout: timedelta, listener: socket.socket | None = None) -> dist.TCPStore:
    """The process group's TCPStore, served by rank 0 on MASTER_ADDR only.

    torch's default store listens on every interface; bound to rank 0's node address it is reachable by
    the other ranks and, for the embedded cluster (127.0.0.1), by nothing beyond this machine. Rank 0
    serves on `listener`, the socket `node_info` bound when it chose the port and kept listening since: a
    port picked, released and bound again later could be taken in between by a trial starting beside it.
    """
    import torch.distributed as dist

    if job.rank != 0:
        return dist.TCPStore(job.master_addr, job.master_port, job.world_size, False, timeout=timeout)
    if listener is None or listener.getsockname()[1] != job.master_port:  # a job not placed by node_info
        listener = _listen(job.master_addr, job.master_port)
    return dist.TCPStore(
        job.master_addr, job.master_port, job.world_size, True, timeout=timeout, master_listen_fd=listener.detach()
    )


def _listen(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, port))
    listener.listen()
    return listener


class RankWorker:
    """One rank's process. With `keep_group` (the scheduler's warm groups) it runs trial after trial: the
    device, the process group and the imports stay, and after each ok trial it gives back what the trial held
    and reports the bytes it holds against those it held before its first trial (`trainer.release.held_bytes`),
    so the driver can retire a process that did not return to its baseline. Without it, each run joins and
    leaves its own process group (a test may run several RankWorkers one after the other in one process)."""

    def __init__(self, keep_group: bool = False) -> None:
        self.created_at = time.perf_counter()
        self.listener: socket.socket | None = None  # rank 0's store socket, from node_info to the rendezvous
        self.keep_group = keep_group
        self.rank: Rank | None = None  # the device and process group, once joined (kept with keep_group)
        self.trials = 0  # trials this process started
        self.baseline_bytes: int | None = None  # tensor memory held before the first trial
        self.sides: Sides | None = None  # the first trial's side processes compiling ahead (`trainer.precompile`)

    def node_info(self) -> dict[str, Any]:
        """Where this rank runs, and a port it holds listening on its address (rank 0's becomes MASTER_PORT)."""
        import ray

        node_id, ip = None, "127.0.0.1"
        if ray.is_initialized():  # outside Ray (a test's worker), asking Ray's context would start a Ray instance
            try:
                node_id = ray.get_runtime_context().get_node_id()
                ip = ray.util.get_node_ip_address()
            except Exception:
                node_id, ip = None, "127.0.0.1"
        self.listener = _listen(ip, 0)
        port = self.listener.getsockname()[1]
        # when Ray's worker pool imported torch and the trainer in this process (trainer.preload), if it did: the
        # driver compares it with its group's placement (imported_before_placement); importing the module here
        # would run the preload
        preloaded = getattr(sys.modules.get("trainer.preload"), "DONE", None)
        return {
            "ip": ip,
            "port": port,
            "hostname": socket.gethostname(),
            "node_id": node_id,
            "pid": os.getpid(),
            "preloaded_at": preloaded.finished_at if preloaded else None,
        }

    def run(self, job: RankJob) -> RankResult:
        # A warm process's trial starts here: its init_time_s is the model build alone, not the process start.
        started_at = self.created_at if self.trials == 0 else time.perf_counter()
        # before this process's imports: the side processes import beside them. A first trial with nothing to compile
        # ahead still takes (and waits for) those the run gave graphs as it started them: they compile on its GPU
        if self.trials == 0 and (job.precompile or os.environ.get(side_pool.FOLDER_ENV)):
            from trainer.precompile import start

            self.sides = start(job.precompile, job.device_type, job.node_groups)
        self.trials += 1
        try:
            result = self._train(job, started_at)
        except BaseException as e:  # noqa: BLE001 - every failure becomes a row, with its class
            if self.sides is not None:
                self.sides.stop()
                self.sides = None
            message = f"{type(e).__name__}: {e}".strip()
            # Report at once, without destroying a shared process group: peers may be inside a collective,
            # and tearing down a communicator they still use can block. The driver kills every rank now.
            if job.world_size == 1:
                self._leave()
            return RankResult(
                status=classify_failure(
                    type(e).__name__,
                    message,
                    cpu_capped=job.device_type == "cpu" and bool(_this_ranks_share(job).memory_cap_bytes),
                ),
                error=message[:2000],
                traceback=traceback.format_exc()[-4000:],
            )
        if not self.keep_group:
            self._leave()
        return result

    def _take_listener(self, job: RankJob) -> socket.socket | None:
        """Rank 0 keeps the socket node_info bound for the store; the other ranks close theirs."""
        listener, self.listener = self.listener, None
        if listener is not None and job.rank != 0:
            listener.close()
            listener = None
        return listener

    def _leave(self) -> None:
        import torch.distributed as dist

        self.rank = None
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # the result is already measured; a failing teardown must not lose it
            pass

    def _joined(self, job: RankJob) -> Rank:
        """This rank's device and process group: joined for the first trial, the same one after."""
        from trainer.sync import rank_device
        from trainer.train import Rank

        if self.rank is None:
            preloaded = sys.modules.get("trainer.preload")  # imported by Ray ahead of this actor, if at all
            if preloaded is not None and job.device_type != "cpu":
                preloaded.check()  # its GPU must be the one Ray assigned
            device = rank_device(job.device_type)
            self.rank = Rank(device=device, mesh=_join(job, device, self._take_listener(job)), rank=job.rank)
        elif (job.rank, job.world_size, job.device_type) != (
            self.rank.rank,
            self.rank.world_size,
            self.rank.device.type,
        ):
            raise RuntimeError(
                f"a warm rank {self.rank.rank} of {self.rank.world_size} ({self.rank.device.type}) "
                f"was sent rank {job.rank} of {job.world_size} ({job.device_type})"
            )
        return self.rank

    def _train(self, job: RankJob, started_at: float) -> RankResult:
        # The process's start-up, in phases (rows: import_s, process_setup_s): only a trial that joins pays them.
        # The driver's module imports nothing of torch (see the docstring above): a rank's first trial imports it.
        began = time.perf_counter()
        import torch._dynamo  # noqa: F401 - every trial's release() resets it: the process's import, not a build's
        import torch.distributed as dist

        import trainer.train  # noqa: F401 - the process's import (import_s), not its first trial's build
        from trainer.release import settle

        imported = time.perf_counter()
        joins = self.rank is None
        rank = self._joined(job)
        if self.keep_group and self.baseline_bytes is None:
            dist.barrier()  # what the process group keeps for itself (a communicator's barrier tensor) is baseline
            # and out of every later trial's collections. A fresh process has compiled nothing: dynamo's reset would
            # only import inductor (its CUDA graph trees, torch 2.11; benchmarks/RESULTS.md "Cold sweep"), which a
            # trial without compile never needs; a compiled trial imports it here, beside its side processes
            # compiling ahead, not in its first step
            self.baseline_bytes = settle(
                rank.device, keep_for=job.trial if job.trial.compile == "none" else None
            ).held_bytes
        joined = time.perf_counter()
        config = _this_ranks_share(job)
        ahead = self._wait_for_sides(config, rank.device)
        waited = time.perf_counter()
        measured, late, (hits, misses) = self._run_counted(job, config, rank, started_at)
        ran = time.perf_counter()
        ahead = ahead.then(late) if ahead and late else ahead or late
        torch_version, te_version, torchao_version = _versions()
        gpu_name, driver_version, cuda_version = _device_info(rank.device)
        result = dataclasses.replace(
            measured.report(),
            import_s=imported - began if joins else None,
            process_setup_s=joined - imported if joins else None,
            precompile_s=ahead.waited_s if ahead else None,
            precompiled_graphs=ahead.compiled if ahead else None,
            precompile_sides_ahead=ahead.ahead if ahead else None,
            precompile_sides_given=ahead.given if ahead else None,
            compile_cache_hits=hits,
            compile_cache_misses=misses,
            torch_version=torch_version,
            te_version=te_version,
            torchao_version=torchao_version,
            gpu_name=gpu_name,
            driver_version=driver_version,
            cuda_version=cuda_version,
        )
        reported = time.perf_counter()
        if self.keep_group:  # what the trial left behind, once its model, optimizer and graphs are gone
            del measured
            # its compiled code stays for a next trial that can run it
            settled = settle(rank.device, keep_for=job.trial, baseline=self.baseline_bytes)
            result.baseline_bytes, result.held_bytes = self.baseline_bytes, settled.held_bytes
        if job.rank == 0 and compile_report.enabled():  # where the trial's wall went, beside its rows' own figures
            spans = (began, imported, joined, waited, ran, reported, time.perf_counter())
            collect_s = settled.collect_s if self.keep_group else None
            print(compile_report.trial_phases(spans, result, collect_s), file=sys.stderr, flush=True)
        return result

    def _wait_for_sides(self, config: TrialConfig | None, device: torch.device) -> PrecompileReport | None:
        """Wait for the side processes compiling `config`'s graphs (`trainer.side_sets.trial_keys`; every one: None),
        and for the rest, one at a time, until the trial fits the GPU's memory beside those left (`Sides.make_room`;
        a CPU rank's memory cap counts its own process alone); what they did (None: none were left). Failures on
        stderr."""
        import torch

        from trainer.side_sets import trial_keys

        sides = self.sides
        if sides is None:
            return None
        own = None if config is None or os.environ.get(WAIT_ENV) == "all" else trial_keys(config)
        report = sides.wait(own)
        if sides.pending and device.type == "cuda" and config is not None:
            later = sides.make_room(config.expected_peak_bytes, lambda: torch.cuda.mem_get_info(device)[0])
            report = report if later is None else report.then(later)
        if not sides.pending:
            self.sides = None
        for error in report.errors:  # the trial compiles those graphs itself: slower, not wrong
            print(f"sweep: compiling ahead: {error}", file=sys.stderr, flush=True)
        if compile_report.enabled():  # where the trial's wait went
            print(f"sweep compile report: {report.line()}", file=sys.stderr, flush=True)
        return report

    def _run_counted(
        self, job: RankJob, config: TrialConfig, rank: Rank, started_at: float
    ) -> tuple[Measurement, PrecompileReport | None, tuple[int, int]]:
        """`_run`, and the graphs the trial found in inductor's cache and those it compiled; rank 0's compile report
        (SWEEP_COMPILE_REPORT) after it."""
        from trainer.precompile import mark

        reporting = job.rank == 0 and compile_report.enabled()
        if reporting:
            compile_report.watch_benchmarks()
        before = _cache_counts()
        measured, late = self._run(config, rank, started_at)
        hits, misses = (now - then for now, then in zip(_cache_counts(), before))
        if (hits or misses) and job.world_size == 1 and config.compile == "regional":
            mark(config)  # its graphs went through the cache: no group compiles them ahead again
        if reporting:
            compile_report.report()
        return measured, late, (hits, misses)

    def _run(self, config: TrialConfig, rank: Rank, started_at: float) -> tuple[Measurement, PrecompileReport | None]:
        """The trial, the side processes still compiling paused while it measures (`trainer.train.Beside`). One that
        runs out of GPU memory beside them runs again once they are done (its first try counts in its wall); then
        also the report of that wait."""
        import torch

        from trainer.release import release
        from trainer.train import run_trial

        sides = self.sides
        if sides is None:
            return run_trial(config, rank, started_at=started_at), None
        try:
            return run_trial(config, rank, started_at=started_at, beside=sides), None
        except torch.OutOfMemoryError:
            if rank.device.type != "cuda":  # a CPU rank's memory cap counts its own process alone
                raise
        # out of the handler (its traceback holds what the try allocated): again, with nothing beside it
        release(rank.device, keep_for=config)
        late = self._wait_for_sides(None, rank.device)
        return run_trial(config, rank, started_at=started_at), late


def _cache_counts() -> tuple[int, int]:
    """Inductor's FX graph cache hits and misses in this process so far (dynamo's counters)."""
    from torch._dynamo.utils import counters

    return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]


def _join(job: RankJob, device: torch.device, listener: socket.socket | None) -> DeviceMesh:
    """Join the trial's process group (gloo on CPU, NCCL on GPUs); the mesh of its ranks."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(
        MASTER_ADDR=job.master_addr,
        MASTER_PORT=str(job.master_port),
        RANK=str(job.rank),
        WORLD_SIZE=str(job.world_size),
        LOCAL_RANK=str(job.local_rank),
    )
    timeout = timedelta(seconds=job.pg_timeout_s)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        store=_rendezvous_store(job, timeout, listener),
        rank=job.rank,
        world_size=job.world_size,
        timeout=timeout,
        device_id=device if device.type == "cuda" else None,
    )
    return init_device_mesh(device.type, (job.world_size,))


def _this_ranks_share(job: RankJob) -> TrialConfig:
    """The trial as this rank runs it. SWEEP_MEMORY_CAP_RANKS=1,3 caps only those ranks (to rehearse one
    rank failing alone)."""
    capped = os.environ.get("SWEEP_MEMORY_CAP_RANKS")
    if capped is None or str(job.rank) in capped.split(","):
        return job.trial
    return dataclasses.replace(job.trial, memory_cap_bytes=None)
