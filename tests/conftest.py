"""Shared fixtures and factories. One real local Ray instance serves every integration test of the session.

Marks are enforced at collection: a test that starts Ray or real ranks (it requests a fixture of
`INTEGRATION_FIXTURES`) must be marked `integration`, and one that needs a GPU must be marked `gpu`; and while a
test without the `integration` mark runs, `ray.init` raises, so `-m "not integration"` never starts Ray.

Factories (plain functions, `from conftest import ...` at a test module's top, as `rows_folder`):
`result_row` (a row of the result schema), `tiny_grid` (the YAML of a grid of gpt-tiny at tiny sizes) and
`invoke` (the CLI in-process, as the `cli` fixture).

Inductor's C++ builds go through tests/tools/cached-g++ for the whole session (`_cache_compiler_builds`): the tiny
models' kernels, built afresh by every test that starts from an empty compile cache, are built once (the full suite
on a 2-core machine, `HOME=$(mktemp -d) make test` against the same with SWEEP_TEST_CXX_CACHE=off: 1,430 s against
1,496 s, 2026-12-05). HOME is a folder of the session's own (`_private_home`): the default compile cache under it
starts empty and is removed at exit.
"""

from __future__ import annotations

import atexit
import datetime as dt
import inspect
import multiprocessing as mp
import os
import random
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _session_folder(prefix: str) -> str:
    """A new temporary folder, removed when this process exits."""
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def _cache_compiler_builds() -> None:
    """Inductor's C++ builds through tests/tools/cached-g++ for the session (every process: the ranks and side
    processes inherit this environment through Ray and `sweep` subprocesses): a kernel built once is not built again
    by the next test that generates it. SWEEP_TEST_CXX_CACHE set outside (a folder) keeps the builds across sessions;
    SWEEP_TEST_CXX_CACHE=off builds every kernel afresh. Only for inductor's default g++: a CXX set outside (clang++,
    say) is left alone, since inductor picks its flags by the compiler's name and the wrapper's says g++."""
    if os.environ.get("SWEEP_TEST_CXX_CACHE") == "off" or "CXX" in os.environ or not shutil.which("g++"):
        return
    os.environ["CXX"] = str(ROOT / "tests" / "tools" / "cached-g++")
    if "SWEEP_TEST_CXX_CACHE" not in os.environ:
        os.environ["SWEEP_TEST_CXX_CACHE"] = _session_folder("sweep-test-cxx-")


def _private_home() -> None:
    """HOME is a folder of the session's own, before Ray starts: every profile that keeps the default
    `compile_cache` (~/.cache/sweep/inductor: the built-in `local` one most tests run on) reaches the ranks as
    ${HOME}/..., which Ray expands in this process's environment. So a test starts from no compiled graphs of an
    earlier session (its hits and misses do not depend on what ran before) and leaves nothing in the user's home;
    the session's tests still share one cache, as one user's runs do."""
    os.environ["HOME"] = _session_folder("sweep-test-home-")


_cache_compiler_builds()
_private_home()
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
    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        logging_level="ERROR",
        log_to_driver=False,
    )
    yield ray
    ray.shutdown()


def invoke(*args, env: dict[str, str] | None = None):
    """The real CLI in-process with `args` (each made a str), `env` added to the environment (COLUMNS, ...);
    returns click's Result (exit_code, stdout, stderr, output)."""
    from typer.testing import CliRunner

    from sweep.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], env=env)


@pytest.fixture
def cli():
    """cli(*args, env=None): `invoke`, the real CLI in-process; returns click's Result."""
    return invoke


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


def _rank_jobs(
    spec,
    precision: str,
    *,
    world_size: int = 1,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    device_type: str = "cpu",
    **fields,
) -> list:
    """The RankJobs of a trial on this machine (CPU, gloo), one per rank, all on one fresh rendezvous port,
    built as the scheduler builds them (`sweep.execution.scheduler.rank_jobs`): tiny steps, no compile, unless
    `fields` (any Trial field: batch_size, grad_accum, ...) say otherwise."""
    from sweep.execution.scheduler import rank_jobs
    from sweep.spec.grid import Trial

    base = dict(
        cluster="local",
        model=spec,
        precision=precision,
        compile="none",
        ac="none",
        batch_size=2,
        seq_len=32,
        warmup_steps=1,
        measure_steps=4,
        gpus=world_size,
    )
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


# -- factories ------------------------------------------------------------------------------------------------

T0 = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.timezone.utc)
# A finished ok attempt of gpt-tiny on one CPU rank: the columns a row of `sweep run` always has, at values of
# such a trial; every other column of the schema is null (measured nothing, not profiled, no GPU).
_ROW_DEFAULTS: dict[str, Any] = {
    "run_id": "r1",
    "trial_id": "t1",
    "attempt": 1,
    "grid_name": "g",
    "cluster": "local",
    "accelerator": "cpu",
    "world_size": 1,
    "nodes": 1,
    "node_ids": ["n0"],
    "hosts": ["host0"],
    "hostname": "host0",
    "model": "gpt-tiny",
    "precision": "bf16",
    "compile": "none",
    "ac": "none",
    "batch_size": 2,
    "seq_len": 64,
    "warmup_steps": 1,
    "measure_steps": 4,
    "dp_shard": 1,
    "status": "ok",
    "step_time_s": 0.5,
    "step_time_p10_s": 0.45,
    "step_time_p90_s": 0.55,
    "tokens_per_s_per_gpu": 256.0,
    "started_at": T0,
    "finished_at": T0 + dt.timedelta(seconds=30),
}


def result_row(**changes) -> dict:
    """A row of the result schema (`sweep.record.schema.COLUMNS`, every one a key): an ok gpt-tiny trial on one
    CPU rank, training options at their defaults, unmeasured columns null; `changes` override any column (a
    name not in the schema raises KeyError: a typo would otherwise be a column silently left at its default)."""
    from sweep.record.schema import COLUMNS, TRAINING_DEFAULTS

    unknown = set(changes) - set(COLUMNS)
    if unknown:
        raise KeyError(f"not columns of the result schema: {sorted(unknown)}")
    values = {**_ROW_DEFAULTS, **TRAINING_DEFAULTS, **changes}
    return {name: values.get(name) for name in COLUMNS}


# The smallest grid that trains: gpt-tiny, one batch, short sequences, a warm-up step and two measured ones.
_TINY_GRID: dict[str, Any] = {
    "models": ["gpt-tiny"],
    "compile": "none",
    "seq_len": 32,
    "batch_sizes": [2],
    "steps": {"warmup": 1, "measure": 2},
}


def tiny_trial(**changes):
    """A Trial of gpt-tiny in bf16 over 2 ranks, batch 2, seq 32, one warm-up and two measured steps, no compile;
    `changes` override any field."""
    from sweep.spec.grid import Trial
    from trainer.models.specs import REGISTRY

    base = dict(
        cluster="local",
        model=REGISTRY["gpt-tiny"],
        precision="bf16",
        compile="none",
        ac="none",
        batch_size=2,
        seq_len=32,
        gpus=2,
        warmup_steps=1,
        measure_steps=2,
    )
    return Trial(**{**base, **changes})


def tiny_grid(**keys) -> str:
    """The YAML text of a tiny grid (`_TINY_GRID`); `keys` add or replace grid keys, a key given as None is
    left out (the grid's own default then)."""
    import yaml

    grid = {k: v for k, v in {**_TINY_GRID, **keys}.items() if v is not None}
    return yaml.safe_dump(grid, default_flow_style=None, sort_keys=False)


# -- marks, enforced ------------------------------------------------------------------------------------------

# Fixtures that start a real Ray instance or real multi-process ranks: a test that requests one (directly or
# through another fixture) runs for seconds to minutes, so it must be marked `integration`.
INTEGRATION_FIXTURES = frozenset({"ray_session", "run_ranks"})
# Fixtures that need a GPU (they skip without one): a test that requests one must be marked `gpu`.
GPU_FIXTURES = frozenset({"te"})
# In a test's own source: it looks for a GPU itself (and skips without one).
_GPU_SOURCE = ("torch.cuda.is_available()",)


def _needs_gpu(item: pytest.Item) -> bool:
    if GPU_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    function = getattr(item, "function", None)
    try:
        source = inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        source = ""
    return any(text in source for text in _GPU_SOURCE)


def mark_errors(items: list[pytest.Item]) -> list[str]:
    """One line per test whose marks do not say what it does (see the module docstring)."""
    errors = []
    for item in items:
        marks = {mark.name for mark in item.iter_markers()}
        starts = sorted(INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())))
        if starts and "integration" not in marks:
            errors.append(
                f"{item.nodeid}: uses {', '.join(starts)} (starts Ray or ranks) without @pytest.mark.integration"
            )
        if "gpu" not in marks and _needs_gpu(item):
            errors.append(f"{item.nodeid}: needs a GPU without @pytest.mark.gpu")
    return errors


def pytest_collection_modifyitems(session, config, items):
    """Fail the collection on a test whose marks do not say that it starts Ray or ranks, or needs a GPU: the
    `-m "not integration"` lane would otherwise start them."""
    errors = mark_errors(items)
    if errors:
        raise pytest.UsageError("tests without the marks they need:\n  " + "\n  ".join(errors))


@pytest.fixture(autouse=True)
def _no_ray_outside_integration(request, monkeypatch):
    """Outside an `integration` test `ray.init` raises: a unit test that would reach Ray fails at once, by name,
    instead of starting a cluster (a test that replaces `ray.init` with its own fake still may)."""
    if request.node.get_closest_marker("integration") is not None:
        return
    import ray

    def refuse(*args, **kwargs):
        raise RuntimeError(
            f"{request.node.nodeid} is not marked integration, and calls ray.init: mark it "
            f"@pytest.mark.integration, or keep it from reaching Ray"
        )

    monkeypatch.setattr(ray, "init", refuse)


def verdicts_json(plan) -> list[dict]:
    """A plan's verdicts as `sweep run` saves them under `_search/` (`Verdict.to_json()`)."""
    return [v.to_json() for v in plan.verdicts()]
