"""`sweep plan` / `sweep run` warn about grids that run but mislead, and gate very large grids behind --yes."""

from __future__ import annotations

import pytest

EAGER_TORCHAO = """
models: [llama3-8b]
precisions: [bf16, fp8-torchao-tensorwise]
batch_sizes: [2]
compile: [none, regional]
seq_len: 4096
gpus: 2
"""


def test_plan_warns_about_torchao_fp8_without_compile_on_gpus(cli, write_grid):
    result = cli("plan", write_grid(EAGER_TORCHAO), "--cluster", "h200")
    assert result.exit_code == 0, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("warning:")]
    assert "torchao FP8 with compile: none (1 trial)" in line and "compile: regional" in line


def test_no_warning_when_torchao_fp8_is_compiled_or_on_cpu_ranks(cli, write_grid):
    compiled = cli("plan", write_grid(EAGER_TORCHAO.replace("[none, regional]", "regional")), "--cluster", "h200")
    cpu = cli(
        "plan",
        write_grid(EAGER_TORCHAO.replace("llama3-8b", "gpt-tiny").replace("4096", "64"), "cpu.yaml"),
        "--cluster",
        "local",
    )
    for result in (compiled, cpu):
        assert result.exit_code == 0, result.output
        assert "warning:" not in result.output


def _many(n: int) -> list:
    return [a for b in range(1, n + 1) for a in ("--batch-size", b)]


def test_a_grid_of_more_than_1000_trials_is_named_in_the_plan_and_run_needs_yes(cli, tmp_path):
    axes = ["--model", "gpt-tiny", "--precision", "fp32", "--compile", "none", "--compile", "regional", *_many(501)]
    plan = cli("plan", *axes, "--cluster", "local")
    assert plan.exit_code == 0, plan.output
    assert "warning: 1002 trials (more than 1000; widest axes: 501 batch_size, 2 compile)" in plan.output

    run = cli("run", *axes, "--cluster", "local", "--output", tmp_path / "out", "--no-progress")
    assert run.exit_code == 2
    assert run.stderr.strip() == (
        "error: 1002 trials (more than 1000): check the grid with `sweep plan`, then run it with --yes"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("n, warned", [(1000, False), (1001, True)])
def test_the_size_gate_starts_past_1000(cli, n, warned):
    result = cli(
        "plan", "--model", "gpt-tiny", "--precision", "fp32", "--compile", "none", *_many(n), "--cluster", "local"
    )
    assert result.exit_code == 0
    assert ("more than 1000" in result.output) is warned
