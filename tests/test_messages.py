"""Messages, help and numbers that pointed the wrong way (issue 27, items 8-10), through the CLI a user runs:
a mistake refused in one line where it was accepted or misreported, help that says what the options do,
counts in their plural and sizes without exponents."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml
from conftest import invoke, tiny_grid
from test_grid_cli import error_line  # exit 2, one `error: ...` line, no traceback

from sweep.record import store
from sweep.record.schema import RESULT_SCHEMA

ROOT = Path(__file__).resolve().parents[1]

NO_RAY = tiny_grid(gpus=1, precisions=["fp8-te-delayed"])  # TE needs a GPU: recorded `unsupported`, no Ray started


def wide(*args):
    """The CLI in a 250-column terminal: help and tables unwrapped."""
    return invoke(*args, env={"COLUMNS": "250"})


# -- item 8: refused, or said the way it is --------------------------------------------------------------------


def test_a_search_with_nothing_to_vary_is_refused(cli, write_grid):
    grid = write_grid(tiny_grid(gpus=1, search="fastest", tune={"vary": []}))
    line = error_line(cli("plan", grid, "--cluster", "local"))
    assert "tune.vary: no option to vary" in line and "batch_size" in line and "leave out search: fastest" in line


@pytest.mark.parametrize(
    "name, says",
    [
        (" mine", "leading or trailing spaces: write it 'mine'"),
        ("mine  ", "leading or trailing spaces: write it 'mine'"),
        ("  ", "only spaces"),
    ],
)
def test_a_model_name_with_outer_spaces_is_refused(cli, write_grid, name, says):
    """`--where model=...` strips its value: such a name would be accepted, and then never selected."""
    spec = f"{{arch: gpt, name: {name!r}, n_layers: 1, d_embd: 64, n_heads: 4, vocab_size: 64}}"
    line = error_line(cli("plan", write_grid(f"models: [{spec}]\nbatch_sizes: [1]\n"), "--cluster", "local"))
    assert f"models.0.name: {says}" in line


def test_a_grid_given_as_cluster_lists_the_valid_keys_once(cli):
    line = error_line(cli("plan", "--model", "gpt-tiny", "--batch-size", 1, "--cluster", ROOT / "examples/demo.yaml"))
    assert line.count("valid keys:") == 1, line
    assert line.count("compile_cache") == 2  # the suggestion for `compile`, and the list
    assert "this looks like a grid file" in line and "unknown key 'precisions'" in line


def test_a_profile_with_several_unknown_keys_lists_the_valid_keys_once(cli, tmp_path):
    profile = tmp_path / "mine.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "name": "mine",
                "accelerator": "cpu",
                "ray_address": "local",
                "nodes": 1,
                "gpus_per_node": 1,
                "zzz": 1,
                "qqq": 2,
            }
        )
    )
    line = error_line(cli("clusters", "show", profile))
    assert "unknown key 'qqq'; unknown key 'zzz'; valid keys: accelerator, " in line and line.count("valid keys") == 1


def test_an_output_that_cannot_be_made_in_the_working_directory_says_so(sweep_env, tmp_path):
    """From /proc, `--output results` (the default) cannot be created: /proc exists and is a folder, so
    "cannot write in /proc (No such file or directory)" pointed nowhere."""
    command = [
        sys.executable,
        "-m",
        "sweep",
        "run",
        "--model",
        "gpt-tiny",
        "--batch-size",
        "1",
        "--cluster",
        "local",
        "--no-progress",
    ]
    result = subprocess.run(command, capture_output=True, text=True, env=sweep_env(), cwd="/proc", timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        "error: --output results: cannot create the folder /proc/results: /proc "
        "refuses new files (No such file or directory)"
    ]


def test_a_resume_with_nothing_left_names_no_run(cli, write_grid, tmp_path):
    grid, out = write_grid(NO_RAY), tmp_path / "out"
    assert cli("run", grid, "--cluster", "local", "--output", out, "--no-progress").exit_code == 3
    runs = sorted(p.name for p in (out / "cluster=local").iterdir())
    result = wide("run", grid, "--cluster", "local", "--output", out, "--resume", "--no-progress")
    assert result.exit_code == 3, result.output  # still nothing measured
    assert f"results: {out} (all 1 trial already recorded; nothing to run)" in result.stderr
    assert "(run " not in result.output  # no id of a run that wrote nothing
    assert sorted(p.name for p in (out / "cluster=local").iterdir()) == runs


# -- item 9: help and README say what the tool does ------------------------------------------------------------


def test_run_help_says_an_axis_option_replaces_the_grid_axis():
    result = wide("run", "--help")
    assert result.exit_code == 0, result.output
    assert "replaces that axis of the grid: it does not add to it" in result.stdout
    assert "override" not in result.stdout


@pytest.mark.parametrize("command", [("run",), ("max-batch",), ("tune",), ("results", "compare"), ("results", "show")])
def test_flags_show_no_value_in_help(command):
    result = wide(*command, "--help")
    assert result.exit_code == 0, result.output
    flags = [
        line
        for line in result.stdout.splitlines()
        if re.search(r"--(resume|progress|fresh-actors|profile|yes|best|skip-bad)\b", line)
    ]
    assert flags, result.stdout
    # typer's own --help has the same `<bool>`; ours take no value and show none
    assert [line for line in flags if "<bool>" in line] == []


def test_clusters_list_explains_its_memory_column_in_words():
    result = wide("clusters", "list")
    assert result.exit_code == 0, result.output
    assert "dim memory" not in result.stdout
    assert (
        result.stdout.rstrip().splitlines()[-1].strip()
        == "memory: the profile's memory_per_device, else the datasheet figure"
    )


def test_readme_names_the_column_a_grid_name_is_stored_in():
    readme = (ROOT / "docs" / "grids.md").read_text()
    (comment,) = re.findall(r"^name: .*#(.*)$", readme.split("## The grid file", 1)[1], re.M)[:1]
    (column,) = re.findall(r"\b(\w+) column\b", comment)
    assert column == "grid_name" and column in RESULT_SCHEMA.names


def test_the_license_is_an_spdx_expression_that_setuptools_reads_without_a_warning():
    """`pip install -e .` warned that a TOML table `license` stops working in 2027 (PEP 639)."""
    import warnings

    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "Apache-2.0"
    (setuptools,) = pyproject["build-system"]["requires"]
    low = tuple(int(x) for x in re.fullmatch(r"setuptools>=([\d.]+)", setuptools).group(1).split("."))
    assert low >= (77, 0, 3)  # the first to read a license expression (77.0) with the fix for older packaging
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"


# -- item 10: numbers and counts --------------------------------------------------------------------------------


def test_plan_gives_a_huge_parameter_count_without_an_exponent(cli, write_grid):
    huge = "{arch: gpt, name: huge, n_layers: 100000, d_embd: 65536, n_heads: 64, vocab_size: 512}"
    result = cli("plan", write_grid(f"models: [gpt-tiny, {huge}]\nbatch_sizes: [1]\n"), "--cluster", "local")
    assert result.exit_code == 0, result.output
    assert re.search(r"│ huge\s+│ 5\.15P\s+│", result.stdout), result.stdout
    assert "e+" not in result.stdout


@pytest.mark.parametrize(
    "n, text",
    [
        (5, "5"),
        (198_000, "198K"),
        (8_030_261_248, "8.03B"),
        (999_700_000_000, "1T"),
        (5_150_000_000_000_000, "5.15P"),
        (10**21, "1,000E"),
    ],
)
def test_param_count(n, text):
    from sweep.text import param_count

    assert param_count(n) == text


@pytest.mark.parametrize(
    "value, text",
    [
        (0.0001, "0.0001 s"),
        (1, "1 s"),
        (1.5, "1.5 s"),
        (1800, "1,800 s"),
        (0.00001234, "0.0000123 s"),
        (0.09996, "0.1 s"),
    ],
)
def test_seconds(value, text):
    from sweep.text import seconds

    assert seconds(value) == text


def test_counts_of_one_are_singular(cli, write_grid, tmp_path):
    one_rank = tmp_path / "one.yaml"
    one_rank.write_text(
        yaml.safe_dump({"name": "one", "accelerator": "cpu", "ray_address": "local", "nodes": 1, "gpus_per_node": 1})
    )
    plan = wide("plan", write_grid(NO_RAY), "--cluster", one_rank)
    assert plan.exit_code == 0, plan.output
    assert "1 trial on one (cpu, 1 rank)" in " ".join(plan.stdout.split())  # a title as wide as its table
    run = cli("run", write_grid(NO_RAY), "--cluster", "local", "--output", tmp_path / "out", "--no-progress")
    assert run.exit_code == 3, run.output
    assert re.search(r"run \S+: 1 attempt\b", run.stdout) and "1 attempts" not in run.output
    budget = error_line(cli("tune", "--model", "gpt-tiny", "--budget", 1, "--cluster", "local"))
    assert "tune.budget: 1 probe cannot" in budget


# -- with a real trial -------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_a_sub_second_timeout_is_said_as_given(ray_session, cli, write_grid, tmp_path):
    out = tmp_path / "out"
    result = cli(
        "run",
        write_grid(tiny_grid(gpus=1, precisions=["fp32"], timeout_s=0.0001)),
        "--cluster",
        "local",
        "--output",
        out,
        "--no-progress",
    )
    assert result.exit_code == 3, result.output
    (row,) = store.read_table(out).to_pylist()
    assert row["status"] == "timeout" and "trial ran past the 0.0001 s limit" in row["error"], row["error"]


@pytest.mark.integration
def test_a_resume_of_a_finished_grid_runs_nothing_and_exits_0(ray_session, cli, write_grid, tmp_path):
    grid, out = write_grid(tiny_grid(gpus=1, precisions=["fp32"])), tmp_path / "out"
    assert cli("run", grid, "--cluster", "local", "--output", out, "--no-progress").exit_code == 0
    result = wide("run", grid, "--cluster", "local", "--output", out, "--resume", "--no-progress")
    assert result.exit_code == 0, result.output
    assert f"results: {out} (all 1 trial already recorded; nothing to run)" in result.stderr
    assert "(run " not in result.output and len(store.read_table(out)) == 1
