"""Shared fixtures. One real local Ray instance serves every integration test of the session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
