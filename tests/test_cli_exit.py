"""What a script or CI job running `sweep` relies on: the exit status, an --output checked before any work,
and SWEEP_DEBUG switching tracebacks on only when it says so. Through the real CLI."""

from __future__ import annotations

import pytest
from conftest import tiny_grid

from sweep.record import store
from sweep.search.policy import GridPlan
from sweep.spec.grid import OomPolicy

TINY = tiny_grid(gpus=2)


# -- exit status: non-zero when nothing was measured ---------------------------------------------------------
def test_a_sweep_whose_every_trial_is_unsupported_exits_3_and_says_so(cli, write_grid, tmp_path):
    # TE recipes need a GPU: both trials are recorded `unsupported`, no Ray is started
    grid = write_grid(TINY + "precisions: [fp8-te-delayed, bf16-te]\n")
    out = tmp_path / "out"
    result = cli("run", grid, "--cluster", "local", "--output", out, "--no-progress")
    assert result.exit_code == 3, result.output
    assert "no trial measured anything: 2 unsupported" in result.stderr
    rows = store.read_table(out).to_pylist()
    assert sorted(r["status"] for r in rows) == ["unsupported", "unsupported"], "the rows are still written"


@pytest.mark.parametrize("teardown_s, said", [(36.2, True), (0.4, False), (None, False)])
def test_a_long_teardown_is_said_after_the_run(capsys, tmp_path, teardown_s, said):
    """The rank processes and Ray are stopped after the last attempt, the GPUs held meanwhile: a teardown over
    TEARDOWN_NOTE_S is printed with its seconds, one under it is not."""
    from sweep.commands._outcome import finish
    from sweep.execution.runner import RunReport

    finish(RunReport(run_id="r1", teardown_s=teardown_s), tmp_path, plan=GridPlan([], OomPolicy()))
    err = capsys.readouterr().err
    assert ("teardown: 36.2 s to stop the rank processes and Ray after the last attempt" in err) == said
    assert "results: " in err


@pytest.mark.parametrize("signum, code, said", [(2, 130, "interrupted: "), (15, 143, "interrupted by SIGTERM: ")])
def test_an_interrupted_run_exits_128_plus_its_signal_and_says_how_to_resume(capsys, tmp_path, signum, code, said):
    import typer

    from sweep.commands._outcome import finish
    from sweep.execution.runner import RunReport

    with pytest.raises(typer.Exit) as exited:
        finish(RunReport(run_id="r1", interrupted_by=signum), tmp_path, plan=GridPlan([], OomPolicy()))
    assert exited.value.exit_code == code
    err = " ".join(capsys.readouterr().err.split())  # Rich wraps it at the capture's 80 columns
    assert err == f"{said}0 attempts written to {tmp_path}; rerun with --resume to finish"


@pytest.mark.integration
def test_a_sweep_that_measured_something_exits_0(ray_session, cli, write_grid, tmp_path):
    grid = write_grid(TINY + "precisions: [fp32, fp8-te-delayed]\n")
    out = tmp_path / "out"
    result = cli("run", grid, "--cluster", "local", "--output", out, "--no-progress")
    assert result.exit_code == 0, result.output
    assert "no trial measured anything" not in result.output
    assert sorted(r["status"] for r in store.read_table(out).to_pylist()) == ["ok", "unsupported"]


def test_resume_of_a_sweep_with_nothing_measured_still_exits_3(cli, write_grid, tmp_path):
    grid = write_grid(TINY + "precisions: [fp8-te-current]\n")
    out = tmp_path / "out"
    assert cli("run", grid, "--cluster", "local", "--output", out, "--no-progress").exit_code == 3
    result = cli("run", grid, "--cluster", "local", "--output", out, "--resume", "--no-progress")
    assert result.exit_code == 3, result.output
    assert "no trial measured anything: 1 unsupported" in result.stderr


# -- an unusable --output: refused before anything runs -----------------------------------------------------
@pytest.mark.parametrize("command", ["run", "max-batch"])
@pytest.mark.parametrize("where", ["file", "under-a-file", "read-only"])
def test_an_unusable_output_is_one_line_exit_2_before_anything_runs(cli, write_grid, tmp_path, command, where):
    target = tmp_path / "taken.txt"
    target.write_text("not a folder")
    output = {"file": target, "under-a-file": target / "results", "read-only": "/proc/sweep-results"}[
        where
    ]  # /proc refuses new files even to root
    args = (
        ["run", write_grid(TINY + "precisions: [fp32]\n")]
        if command == "run"
        else ["max-batch", "--model", "gpt-tiny", "--precision", "fp32", "--seq-len", 32, "--gpus", 2]
    )
    result = cli(*args, "--cluster", "local", "--output", output, "--no-progress")
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: --output {output}: "), line
    assert "Traceback" not in result.output
    assert target.read_text() == "not a folder"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "grid.yaml") == ["taken.txt"], "nothing written"


# -- SWEEP_DEBUG ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, traceback",
    [("0", False), ("", False), ("false", False), ("no", False), ("1", True), ("true", True), ("YES", True)],
)
def test_sweep_debug_turns_tracebacks_on_only_when_it_says_so(cli, write_grid, tmp_path, monkeypatch, value, traceback):
    monkeypatch.setenv("SWEEP_DEBUG", value)
    grid = write_grid(TINY + "precisions: [no-such-precision]\n")
    result = cli("plan", grid, "--cluster", "local")
    if traceback:  # the UserError propagates with its traceback (exit 1), as a bug would
        assert result.exit_code == 1 and result.exception is not None
        assert "no-such-precision" in str(result.exception)
    else:
        assert result.exit_code == 2, result.output
        (line,) = result.stderr.splitlines()
        assert line.startswith("error: ") and "no-such-precision" in line


# -- MASTER_PORT: held from the moment it is chosen -----------------------------------------------------------
def test_rank_zero_holds_its_master_port_from_choice_to_rendezvous(rank_jobs):
    """The port node_info reports stays bound until the store serves on it (no pick-release-bind race)."""
    import socket

    from trainer.models.specs import resolve
    from trainer.worker import RankWorker

    worker = RankWorker()
    info = worker.node_info()
    with socket.socket() as other, pytest.raises(OSError):  # a trial starting beside it cannot take the port
        other.bind((info["ip"], info["port"]))
    (job,) = rank_jobs(resolve("gpt-tiny"), "fp32", master_addr=info["ip"], master_port=info["port"], measure_steps=2)
    result = worker.run(job)  # the store serves on the held socket
    assert result.status == "ok", result.error


def test_a_worker_outside_ray_does_not_start_ray(sweep_env):
    """node_info asks Ray where the rank runs only inside Ray: outside it (a fresh process here, since this test
    session may hold its own Ray), asking Ray's runtime context would start a Ray instance, which a later
    `ray.init` then refuses ("called twice")."""
    import subprocess
    import sys

    code = (
        "import ray\nfrom trainer.worker import RankWorker\ninfo = RankWorker().node_info()\n"
        "print(info['node_id'], ray.is_initialized())"
    )
    done = subprocess.run([sys.executable, "-c", code], env=sweep_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["None", "False"]
