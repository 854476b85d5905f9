"""Shared fixtures. One real local Ray instance serves every integration test of the session."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The environment before any test ran: `ray.init` writes RAY_AUTH_MODE, RAY_USAGE_STATS_ENABLED,
# PYTHONBREAKPOINT (and more) into os.environ, and a `sweep` subprocess must not start with them.
_ENV_AT_START = dict(os.environ)


def _sweep_env() -> dict[str, str]:
    """The environment a user's shell gives a `sweep` process: this machine's, minus what the session Ray
    wrote into this process; SWEEP_DEBUG unset; the checkout importable; wide lines."""
    env = {k: v for k, v in _ENV_AT_START.items() if k != "SWEEP_DEBUG"}
    return {**env, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}


@pytest.fixture(scope="session")
def sweep_env():
    """sweep_env(): the environment for a `sweep` subprocess (no variables the session Ray wrote)."""
    return _sweep_env


@pytest.fixture(scope="session")
def ray_session():
    """A real Ray instance on this machine (127.0.0.1, no dashboard). `sweep run` reuses it in-process."""
    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    # 4 logical CPUs on a 2-core machine: two 2-rank trials may overlap; timings are not asserted.
    # Not loopback-only (unlike the embedded profile): tests/test_multinode.py starts a Ray cluster from
    # this process for a driver subprocess, and both must agree on this machine's node address.
    ray.init(address="local", num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1",
             logging_level="ERROR", log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def cli():
    """Invoke the real CLI in-process; returns click's Result (exit_code, stdout, stderr)."""
    from typer.testing import CliRunner

    from sweep.cli import app

    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def write_grid(tmp_path):
    def write(text: str, name: str = "grid.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


def _free_ports(n: int) -> list[int]:
    """n ports free now, from outside the kernel's ephemeral range: a port released here and bound by a
    rank later cannot meanwhile be handed to another process's bind(0) or outgoing connection."""
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    candidates = [p for p in range(20000, 32000) if not low <= p <= high] or list(range(1024, low))
    ports: list[int] = []
    for port in random.sample(candidates, len(candidates)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == n:
            return ports
    raise RuntimeError(f"fewer than {n} free ports outside the ephemeral range {low}-{high}")


@pytest.fixture(scope="session")
def free_ports():
    """free_ports(n): n TCP ports free on 127.0.0.1 now (for process-group rendezvous)."""
    return _free_ports


def _rank_jobs(spec, precision: str, *, world_size: int = 1, master_addr: str = "127.0.0.1",
               master_port: int | None = None, device_type: str = "cpu", **fields) -> list:
    """The RankJobs of a trial on this machine (CPU, gloo), one per rank, all on one fresh rendezvous port,
    built as the scheduler builds them (`sweep.execution.scheduler.rank_jobs`): tiny steps, no compile, unless
    `fields` (any Trial field: batch_size, grad_accum, ...) say otherwise."""
    from sweep.spec.grid import Trial
    from sweep.execution.scheduler import rank_jobs

    base = dict(cluster="local", model=spec, precision=precision, compile="none", ac="none", batch_size=2,
                seq_len=32, warmup_steps=1, measure_steps=4, gpus=world_size)
    trial = Trial(**{**base, **fields})
    node = {"ip": master_addr, "port": master_port or _free_ports(1)[0], "node_id": None}
    return rank_jobs(trial, [node] * world_size, device_type=device_type)


@pytest.fixture(scope="session")
def rank_jobs():
    """rank_jobs(spec, precision, world_size=1, **Trial or RankJob fields): a trial's RankJobs, one per rank."""
    return _rank_jobs


def _run_in_processes(target, jobs_per_process: list[list], timeout: float = 300) -> list:
    """One spawned process per entry of `jobs_per_process`, each calling `target(jobs, queue)` (a module-level
    function that puts one item per job); returns the items in the order they arrived."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(jobs, queue)) for jobs in jobs_per_process]
    for p in procs:
        p.start()
    try:
        return [queue.get(timeout=timeout) for _ in range(sum(map(len, jobs_per_process)))]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


@pytest.fixture(scope="session")
def run_ranks():
    """run_ranks(target, jobs_per_process, timeout): the ranks of real multi-process trials (gloo, no Ray)."""
    return _run_in_processes


@pytest.fixture
def run_one_rank():
    """run_one_rank(spec, precision, **Trial or RankJob fields): the real RankWorker.run for one rank, in this process
    (no Ray), as a Ray actor would run it; the environment it sets (MASTER_ADDR, RANK, ...) is put back."""
    from trainer.result import RankResult
    from trainer.worker import RankWorker

    def run(spec, precision: str, **fields) -> RankResult:
        (job,) = _rank_jobs(spec, precision, **fields)
        saved = dict(os.environ)
        try:
            return RankWorker().run(job)
        finally:
            os.environ.clear()
            os.environ.update(saved)

    return run


def rows_folder(tmp_path_factory, name: str, rows) -> Path:
    """A results folder holding `rows` (result rows as dicts), written as `sweep run` writes them."""
    from sweep.record.store import write_row

    out = tmp_path_factory.mktemp(name)
    for row in rows:
        write_row(out, row)
    return out
