"""Faults, for real: a hung trial, a rank killed with SIGKILL, a killed driver, Ctrl-C, a malformed profile,
and what an embedded sweep listens on.

Nothing is mocked. Trials run on the session's Ray (in-process CLI) or in a `sweep run` subprocess with its
own embedded Ray; processes are found, killed and inspected through /proc (Linux), as an operator would.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import tiny_grid

from sweep.execution.rank_group import INFEASIBLE_LIMIT_S
from sweep.record import store

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


# -- processes and sockets, from /proc ---------------------------------------------------------------------
def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    return text[text.rindex(")") + 2 :].split()  # state, ppid, pgrp, ...


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        return _stat(pid)[0] not in ("Z", "X")
    except OSError:
        return False


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                children.setdefault(int(_stat(int(name))[1]), []).append(int(name))
            except (OSError, IndexError, ValueError):
                pass
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _rank_workers(root: int, title: str = "ray::RankWorker.run") -> list[int]:
    """Rank actor processes under `root`; Ray titles them `ray::RankWorker`, `ray::RankWorker.run` inside run."""
    return [p for p in _descendants(root) if _cmdline(p).startswith(title)]


def _sockets(pids) -> list[tuple[int, str, int, str, int, str]]:
    """(pid, local ip, local port, remote ip, remote port, state) of every TCP socket the processes hold."""
    inodes = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes[link[8:-1]] = pid
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[9] in inodes:
                    state = {"0A": "LISTEN", "01": "ESTABLISHED"}.get(fields[3], fields[3])
                    found.append((inodes[fields[9]], *_address(fields[1], family), *_address(fields[2], family), state))
    return found


def _address(hex_address: str, family: int) -> tuple[str, int]:
    ip, port = hex_address.split(":")
    raw = bytes.fromhex(ip)  # /proc prints each 32-bit word in host (little-endian) order
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(family, raw), int(port, 16)


def _is_loopback(ip: str) -> bool:
    return ip.startswith("127.") or ip == "::1" or ip.startswith("::ffff:127.")


def _wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _training(workers: list[int]) -> bool:
    """Every rank joined the process group: each holds an established TCP connection to another rank."""
    if not workers:
        return False
    socks = _sockets(workers)
    ports = {pid: {lport for p, _, lport, *_ in socks if p == pid} for pid in workers}
    for pid in workers:
        others = set().union(*(ports[o] for o in workers if o != pid))
        if not any(p == pid and state == "ESTABLISHED" and rport in others for p, _, _, _, rport, state in socks):
            return False
    return True


def _training_ranks(root: int, world_size: int) -> list[int] | None:
    workers = _rank_workers(root)
    return workers if len(workers) == world_size and _training(workers) else None


def _not_master(workers: list[int]) -> int:
    """A rank other than 0 if it can be told: rank 0 also listens for the TCPStore, so it has one more port."""
    listening = {pid: sum(1 for p, *_, state in _sockets([pid]) if state == "LISTEN") for pid in workers}
    return min(workers, key=lambda pid: listening[pid])


@pytest.fixture
def sweep(sweep_env):
    """sweep(*args): `sweep run ...` as its own process (and process group), as a user starts it from a shell
    (none of the variables the session's Ray wrote into this process)."""

    def start(*args) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "sweep", "run", *map(str, args), "--no-progress"],
            cwd=ROOT,
            env=sweep_env(),
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    return start


def _kill_leftovers(pids) -> None:
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def fp32_grid(**keys) -> str:
    """The tiny grid in fp32, at the grid's default steps unless `keys` say otherwise."""
    return tiny_grid(**{"precisions": ["fp32"], "steps": None, **keys})


# -- a hung trial -------------------------------------------------------------------------------------------
# ~100M parameters: 6 * N * 512 tokens = 0.3 TFLOP per step and rank, so its 21 steps on one core each take
# minutes, never the 10 s limit; gpt-tiny does the same steps in a few seconds.
SLOW = "{arch: gpt, name: gpt-slow, n_layers: 8, d_embd: 1024, n_heads: 8, vocab_size: 512, max_seq_len: 64}"
TIMEOUT_S = 20  # room for gpt-tiny's fresh group (spawn, imports, 60 steps) on a loaded 2-core host


@pytest.mark.timeout(150)
def test_a_trial_past_its_timeout_is_killed_and_the_next_one_runs(ray_session, cli, write_grid, tmp_path):
    grid = write_grid(f"""
models: [{SLOW}, gpt-tiny]
precisions: [fp32]
batch_sizes: [8]
compile: none
seq_len: 64
gpus: 2
steps: {{warmup: 1, measure: 60}}
timeout_s: {TIMEOUT_S}
""")
    out = tmp_path / "out"
    result = cli("run", grid, "--cluster", "local", "--output", out, "--max-concurrent", 1, "--no-progress")
    assert result.exit_code == 0, result.output

    rows = store.read_table(out).to_pylist()
    assert sorted(r["model"] for r in rows) == ["gpt-slow", "gpt-tiny"], "one row each: a timeout is not retried"
    slow, tiny = sorted(rows, key=lambda r: r["model"])
    assert slow["status"] == "timeout", slow["error"]
    assert f"past the {TIMEOUT_S} s limit" in slow["error"]
    assert TIMEOUT_S <= slow["trial_wall_s"] < TIMEOUT_S + 20  # killed on time, not when the steps end
    assert slow["step_time_s"] is None and slow["loss_last"] is None
    assert tiny["status"] == "ok", tiny["error"]
    assert tiny["started_at"] >= slow["finished_at"], "one at a time: the slot was freed by the kill"
    # the killed ranks are gone, not left computing on the session's Ray
    _wait_for(lambda: not _rank_workers(os.getpid(), "ray::RankWorker"), 15, "the timed-out rank processes to exit")


@pytest.mark.timeout(60)
def test_a_trial_no_node_can_hold_times_out_instead_of_waiting_forever(ray_session, cli, write_grid, tmp_path):
    # The profile promises 8 ranks on a node; the session's Ray has 4 CPUs (as a cluster that lost a node).
    profile = write_grid(
        "name: too-small\naccelerator: cpu\nray_address: local\nnodes: 1\ngpus_per_node: 8\n"
        "cpus_per_rank: 1\ntimeout_s: 3\n",
        "too-small.yaml",
    )
    out = tmp_path / "out"
    started = time.monotonic()
    result = cli("run", write_grid(fp32_grid(gpus=8)), "--cluster", profile, "--output", out, "--no-progress")
    assert result.exit_code == 3, result.output  # nothing was measured
    assert "no trial measured anything: 1 timeout" in result.stderr
    assert time.monotonic() - started < INFEASIBLE_LIMIT_S  # given up at the trial's 3 s, not the 120 s default
    (row,) = store.read_table(out).to_pylist()
    assert row["status"] == "timeout" and row["world_size"] == 8
    assert row["error"].startswith("could not be placed for 3 s"), row["error"]


# -- a rank killed ------------------------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_a_rank_killed_mid_trial_is_an_error_naming_it_and_is_retried_once(ray_session, cli, write_grid, tmp_path):
    # ~150 steps of a few tens of ms: the kill lands in the steps, and the retry still finishes soon.
    grid = write_grid(fp32_grid(gpus=2, steps={"warmup": 1, "measure": 150}))
    out = tmp_path / "out"
    results = []
    sweep = threading.Thread(
        target=lambda: results.append(cli("run", grid, "--cluster", "local", "--output", out, "--no-progress")),
        daemon=True,
    )
    sweep.start()

    workers = _wait_for(lambda: _training_ranks(os.getpid(), 2), 90, "both ranks to join the process group")
    victim = _not_master(workers)  # rank 1 if it can be told: its peer then fails in the same instant
    os.kill(victim, signal.SIGKILL)

    sweep.join(timeout=150)
    assert not sweep.is_alive(), "the sweep did not finish after a rank was killed"
    assert results[0].exit_code == 0, results[0].output
    rows = sorted(store.read_table(out).to_pylist(), key=lambda r: r["attempt"])
    assert [r["status"] for r in rows] == ["error", "ok"], [r["error"] for r in rows]
    failed, retry = rows
    # the dead rank is the cause, not its peer's "Connection reset by peer"
    assert failed["error"].startswith("infrastructure: rank "), failed["error"]
    assert f"of 2 died (pid {victim} on " in failed["error"], failed["error"]
    assert retry["parent_trial_id"] == failed["trial_id"] and retry["attempt"] == 2
    assert retry["trial_id"] != failed["trial_id"]
    assert retry["loss_last"] < retry["loss_first"]

    # A driver killed before the retry's row landed: --resume learns from the failed row alone that it was
    # the machinery's fault, and runs the retry (not the failed attempt) again.
    # (the run merged its attempts into one file when it ended: the retry's row leaves that file)
    _drop_rows(out, {retry["trial_id"]})
    result = cli("run", grid, "--cluster", "local", "--output", out, "--resume", "--no-progress")
    assert result.exit_code == 0, result.output
    rows = store.read_table(out).to_pylist()
    assert sorted((r["trial_id"], r["status"]) for r in rows) == sorted(
        [(failed["trial_id"], "error"), (retry["trial_id"], "ok")]
    )


def _drop_rows(out: Path, trial_ids: set[str]) -> None:
    """Rewrite the result files without the rows of ``trial_ids``: what a driver killed before they landed left."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    for f in store.result_files(out):
        table = pq.read_table(f)
        kept = table.filter(pc.invert(pc.is_in(table.column("trial_id"), value_set=pa.array(sorted(trial_ids)))))
        if kept.num_rows < table.num_rows:
            pq.write_table(kept, f)


# -- the driver killed, then --resume -----------------------------------------------------------------------
def _wait_for_first_row(driver: subprocess.Popen, out: Path, seen: set[int], timeout: float) -> list[Path]:
    """The result files once there is one, noting the driver's processes meanwhile (to check they end)."""

    def first_row():
        seen.update(_descendants(driver.pid))
        assert driver.poll() is None, driver.communicate()
        return store.result_files(out)

    return _wait_for(first_row, timeout, "the first result file", interval=0.05)


@pytest.mark.timeout(200)
def test_a_killed_driver_loses_only_running_trials_and_resume_finishes_the_grid(sweep, write_grid, tmp_path):
    grid = write_grid(fp32_grid(batch_sizes=[1, 2, 3], gpus=1, steps={"warmup": 1, "measure": 5}))
    out = tmp_path / "out"
    # one trial at a time: when the first row lands, the next trial is running and is lost with the driver
    driver = sweep(grid, "--cluster", "local", "--output", out, "--max-concurrent", 1)
    seen: set[int] = set()
    try:
        _wait_for_first_row(driver, out, seen, 120)
        os.killpg(driver.pid, signal.SIGKILL)  # the driver, its GCS and raylet; Ray's workers have groups of their own
        driver.wait(timeout=30)
        before = store.read_table(out).to_pylist()
        assert len(before) == 1 and before[0]["status"] == "ok"
        # nothing of the killed sweep lives on: the rank actors exit once their raylet is gone
        _wait_for(lambda: not [p for p in seen if _alive(p)], 30, "the killed driver's Ray processes to exit")

        resumed = sweep(grid, "--cluster", "local", "--output", out, "--resume")
        stdout, stderr = resumed.communicate(timeout=150)
        assert resumed.returncode == 0, stdout + stderr
    finally:
        _kill_leftovers(seen)

    rows = store.read_table(out).to_pylist()
    ids = [r["trial_id"] for r in rows]
    assert len(ids) == len(set(ids)) == 3, "every trial exactly once"
    assert sorted(r["batch_size"] for r in rows) == [1, 2, 3]
    assert all(r["status"] == "ok" for r in rows)
    assert len({r["run_id"] for r in rows}) == 2  # the first run's row was kept, not run again
    assert "1 reused" in stdout
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


# -- an embedded sweep, mid-trial: what it listens on, then Ctrl-C ------------------------------------------
@pytest.mark.timeout(200)
def test_an_embedded_sweep_listens_on_loopback_only_and_ctrl_c_stops_it_cleanly(sweep, write_grid, tmp_path):
    """One `sweep run` on the embedded `local` cluster, its two ranks inside a trial that would take minutes:
    every socket it listens on is loopback; then Ctrl-C ends it, writes nothing and says how to resume."""
    grid = write_grid(fp32_grid(gpus=2, steps={"warmup": 1, "measure": 100000}))
    out = tmp_path / "out"
    driver = sweep(grid, "--cluster", "local", "--output", out)
    pids = {driver.pid}
    try:
        _wait_for(lambda: _training_ranks(driver.pid, 2), 120, "the ranks to start training")
        pids |= set(_descendants(driver.pid))
        ranks = [p for p in pids if _cmdline(p).startswith("ray::RankWorker")]
        for who, group in (("Ray", [p for p in pids if p not in ranks]), ("the ranks", ranks)):  # GCS, raylet, ...
            listening = [(p, ip, port) for p, ip, port, *_, state in _sockets(group) if state == "LISTEN"]
            assert len(listening) >= (3 if who == "Ray" else 1), (who, listening)  # the check sees them
            exposed = [(_cmdline(p)[:60], ip, port) for p, ip, port in listening if not _is_loopback(ip)]
            assert not exposed, f"{who} listening beyond this machine: {exposed}"

        os.killpg(driver.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the driver and Ray's daemons get it
        stdout, stderr = driver.communicate(timeout=30)  # ~2 s when nothing hangs
        assert driver.returncode == 130, stdout + stderr
        assert "--resume" in stderr
        assert store.result_files(out) == [], "the interrupted trial must not be recorded"
        # its embedded Ray is shut down: the actors, raylet, GCS and agents are gone
        _wait_for(lambda: not [p for p in pids if _alive(p)], 30, "every process of the sweep to exit")
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        _kill_leftovers(pids)


@pytest.mark.timeout(90)
def test_ctrl_c_while_ray_starts_leaves_no_process_behind(sweep, write_grid, tmp_path):
    # Interrupting ray.init halfway used to leave its dashboard and runtime-env agents running for good.
    grid = write_grid(fp32_grid(gpus=1, steps={"warmup": 1, "measure": 100000}))
    driver = sweep(grid, "--cluster", "local", "--output", tmp_path / "out")
    seen: set[int] = set()

    def ray_starting():
        seen.update(_descendants(driver.pid))
        return any("runtime_env/agent" in _cmdline(p) for p in seen)  # the raylet's agents: ray.init is not done

    try:
        _wait_for(ray_starting, 60, "Ray to start its agents", interval=0.02)
        os.killpg(driver.pid, signal.SIGINT)
        deadline = time.monotonic() + 30
        while driver.poll() is None and time.monotonic() < deadline:  # note what it starts meanwhile
            seen.update(_descendants(driver.pid))
            time.sleep(0.05)
        stdout, stderr = driver.communicate(timeout=5)
        assert driver.returncode == 130, stdout + stderr
        assert "--resume" in stderr
        _wait_for(lambda: not [p for p in seen if _alive(p)], 15, "every process of the sweep to exit")
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        _kill_leftovers(seen)


@pytest.mark.timeout(240)
def test_sigterm_mid_trial_stops_as_ctrl_c_does_and_resume_finishes_the_grid(sweep, write_grid, tmp_path):
    """`timeout`, `docker stop` and a batch scheduler send SIGTERM to the driver alone: the running trial is
    torn down, nothing half written, exit 143 with the --resume line; --resume then runs what is missing."""
    # 200 steps: still seconds a trial (0.05-0.07 s a step measured on a loaded 2-core host), several times the
    # ~1.5 s from the first row to the SIGTERM; the first trial and the resumed one run them all (400: 35 s more)
    grid = write_grid(fp32_grid(batch_sizes=[1, 2], gpus=2, steps={"warmup": 1, "measure": 200}))
    out = tmp_path / "out"
    driver = sweep(grid, "--cluster", "local", "--output", out, "--max-concurrent", 1)
    seen: set[int] = set()
    try:
        (first,) = _wait_for_first_row(driver, out, seen, 150)
        # the next trial starts at once on the warm ranks: its 200 steps take seconds, not one
        _wait_for(lambda: _training_ranks(driver.pid, 2), 30, "the second trial's ranks")
        time.sleep(1.0)
        seen.update(_descendants(driver.pid))
        os.kill(driver.pid, signal.SIGTERM)  # the driver only, as `timeout` sends it
        stdout, stderr = driver.communicate(timeout=30)
        assert driver.returncode == 143, stdout + stderr
        (line,) = [text for text in stderr.splitlines() if text.startswith("interrupted")]
        assert line == f"interrupted by SIGTERM: 1 attempt written to {out}; rerun with --resume to finish", stderr
        assert "Traceback" not in stderr and "SystemExit" not in stderr, stderr
        assert store.result_files(out) == [first], "the interrupted trial must not be recorded"
        assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
        # every actor, placement group and the embedded Ray are gone with it
        _wait_for(lambda: not [p for p in seen if _alive(p)], 30, "every process of the sweep to exit")

        resumed = sweep(grid, "--cluster", "local", "--output", out, "--resume")
        stdout, stderr = resumed.communicate(timeout=150)
        assert resumed.returncode == 0, stdout + stderr
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        _kill_leftovers(seen)
    rows = store.read_table(out).to_pylist()
    assert sorted(r["batch_size"] for r in rows) == [1, 2] and all(r["status"] == "ok" for r in rows)
    assert "1 reused" in stdout


# -- a malformed profile ------------------------------------------------------------------------------------
def test_a_malformed_profile_is_one_line_and_exit_2(cli, write_grid, tmp_path, monkeypatch):
    monkeypatch.delenv("SWEEP_DEBUG", raising=False)
    grid = write_grid(fp32_grid())
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\naccelerator: cpu\nray_address: 10.0.0.7\nnodes: 2\ngpus_per_node: 1\n")
    result = cli("run", grid, "--cluster", bad, "--output", tmp_path / "out", "--no-progress")
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: Invalid cluster profile ") and "bad.yaml" in line
    assert "ray_address: expected 'local', 'auto', 'ray://host:port' or 'host:port' (got '10.0.0.7')" in line
    assert not (tmp_path / "out").exists()
