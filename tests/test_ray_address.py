"""A `ray_address` that cannot be reached: one line naming the address and what to do, exit 2, within the
profile's connect_timeout_s, nothing written. `sweep run` as its own process on real sockets (Ray retries a dead
address for many minutes, and past the deadline sweep exits the process)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusters.schema import DEFAULT_CONNECT_TIMEOUT_S

ROOT = Path(__file__).resolve().parents[1]
GRID = ["--model", "gpt-tiny", "--batch-size", 1, "--seq-len", 32, "--compile", "none", "--precision", "fp32"]


def _dead_port() -> int:
    """A port nothing listens on: bound, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _profile(tmp_path: Path, address: str, extra: str = "") -> Path:
    path = tmp_path / "remote.yaml"
    path.write_text(f'name: remote\naccelerator: cpu\nray_address: "{address}"\nnodes: 1\ngpus_per_node: 1\n{extra}')
    return path


def _sweep(tmp_path: Path, env: dict, profile: Path, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    began = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sweep",
            "run",
            *map(str, GRID),
            "--cluster",
            str(profile),
            "--output",
            str(tmp_path / "out"),
            "--no-progress",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done, time.monotonic() - began


def _one_line(done: subprocess.CompletedProcess, address: str) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()  # none of Ray's GCS warnings
    assert line.startswith(f"error: cluster 'remote': cannot reach Ray at {address}: "), line
    return line


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_nothing_listening_is_one_line_and_exit_2_at_once(sweep_env, tmp_path, scheme):
    port = _dead_port()
    address = f"{scheme}127.0.0.1:{port}"
    done, took = _sweep(tmp_path, sweep_env(), _profile(tmp_path, address), timeout=DEFAULT_CONNECT_TIMEOUT_S + 30)
    line = _one_line(done, address)
    assert f"nothing answers on port {port} (Connection refused)" in line
    start = f"--ray-client-server-port {port}" if scheme else f"--port {port}"
    assert f"ray start --head {start}" in line and "--cluster local" in line, line
    assert took < DEFAULT_CONNECT_TIMEOUT_S
    assert sorted(p.name for p in tmp_path.iterdir()) == ["remote.yaml"], "nothing written"


def test_a_port_that_never_answers_as_ray_gives_up_at_connect_timeout_s(sweep_env, tmp_path):
    with socket.socket() as mute:  # accepts connections (the kernel's backlog), never speaks gRPC
        mute.bind(("127.0.0.1", 0))
        mute.listen(64)
        address = f"127.0.0.1:{mute.getsockname()[1]}"
        done, took = _sweep(tmp_path, sweep_env(), _profile(tmp_path, address, "connect_timeout_s: 3\n"), timeout=60)
    line = _one_line(done, address)
    assert "no answer from Ray within 3 s" in line, line
    assert 3 <= took < 3 + 15, took  # the interpreter's start and imports, then the 3 s
    assert sorted(p.name for p in tmp_path.iterdir()) == ["remote.yaml"], "nothing written"


def test_token_auth_set_in_the_environment_without_a_token_is_named(sweep_env, tmp_path):
    """A driver started by a process that ran ray.init inherits RAY_AUTH_MODE=token; with no token here Ray
    refuses to connect at all: the line says that is why."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in sweep_env().items() if not k.startswith("RAY_AUTH_TOKEN")}
    env.update(RAY_AUTH_MODE="token", HOME=str(home))  # no ~/.ray/auth_token
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(64)
        address = f"127.0.0.1:{listening.getsockname()[1]}"
        done, _ = _sweep(tmp_path, env, _profile(tmp_path, address), timeout=60)
    line = _one_line(done, address)
    assert "RAY_AUTH_MODE=token is set here" in line and "unset it" in line, line
