"""The memory check before any GPU time: training state (16 B per parameter over the ranks) against each
rank's memory. The arithmetic is checked pure; the verdicts through `sweep plan` and `sweep run`."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from conftest import ROOT, invoke

from sweep.memory.capacity import BYTES_PER_PARAM, per_rank_memory, state_bytes_per_rank, state_reason
from sweep.record import store
from trainer.models import REGISTRY

GiB = 2**30
LLAMA3_70B = REGISTRY["llama3-70b"]


# -- the arithmetic ------------------------------------------------------------------------------------


def test_llama3_70b_is_the_real_one_beside_its_proxy():
    assert LLAMA3_70B.n_params() == 70_553_706_496  # Meta's model card: 70.6B
    dims = ("d_embd", "n_heads", "n_kv_heads", "ffn_hidden", "vocab_size", "rope_theta")
    proxy = REGISTRY["llama3-70b-proxy"]
    assert (LLAMA3_70B.n_layers, proxy.n_layers) == (80, 4)
    assert (
        [getattr(LLAMA3_70B, d) for d in dims]
        == [getattr(proxy, d) for d in dims]
        == [8192, 64, 8, 28672, 128256, 500000.0]
    )


def test_state_is_16_bytes_per_parameter_over_the_ranks():
    # fp32 master + fp32 gradient + AdamW's exp_avg and exp_avg_sq in fp32
    assert BYTES_PER_PARAM == 4 + 4 + 4 + 4
    assert state_bytes_per_rank(LLAMA3_70B.n_params(), 2) == 16 * 70_553_706_496 / 2
    assert state_bytes_per_rank(1000, 8) == 2000


def test_reason_names_the_figures():
    h200 = per_rank_memory(memory_cap=None, memory_per_device=None, accelerator="h200", memory_gib=141)
    assert h200 == (141 * GiB, "per h200")
    assert state_reason(n_params=LLAMA3_70B.n_params(), ranks=2, memory=h200) == (
        "weights, gradients and AdamW state need 526 GiB per rank (16 B × 70.6B params / 2 ranks) > 141 GiB per h200"
    )
    mi300x = per_rank_memory(memory_cap=None, memory_per_device=None, accelerator="mi300x", memory_gib=192)
    assert state_reason(n_params=LLAMA3_70B.n_params(), ranks=8, memory=mi300x) is None  # 131 GiB of 192


def test_exactly_full_fits_and_one_byte_more_does_not():
    memory = (16_000.0, "per rank (the memory cap)")
    assert state_reason(n_params=1000, ranks=1, memory=memory) is None
    assert state_reason(n_params=1001, ranks=1, memory=memory) == (
        "weights, gradients and AdamW state need 15.6 KiB per rank (16 B × 1K params / 1 rank) "
        "> 15.6 KiB per rank (the memory cap)"
    )


def test_per_rank_memory_is_the_cap_else_the_profile_else_the_device():
    figures = dict(memory_cap=2 * GiB, memory_per_device=64 * GiB, accelerator="h200", memory_gib=141)
    assert per_rank_memory(**figures) == (2 * GiB, "per rank (the memory cap)")
    assert per_rank_memory(**{**figures, "memory_cap": None}) == (
        64 * GiB,
        "per rank (the profile's memory_per_device)",
    )
    assert per_rank_memory(**{**figures, "memory_cap": None, "memory_per_device": None}) == (141 * GiB, "per h200")
    # a CPU rank: no datasheet memory, so nothing to check against unless a cap is given
    cpu = dict(memory_cap=None, memory_per_device=None, accelerator="cpu", memory_gib=None)
    assert per_rank_memory(**cpu) is None
    assert state_reason(n_params=10**12, ranks=1, memory=None) is None


# -- through the CLI -------------------------------------------------------------------------------------


def _verdict(result) -> str:
    """The `runs` cell of a one-trial `sweep plan` table, and the reasons printed under it."""
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if line.startswith("│")]
    assert len(rows) == 1, result.stdout
    return rows[0].split("│")[-2].strip()


@pytest.fixture
def plan():
    def plan(*args):
        return invoke("plan", "--batch-size", "1", *args, env={"COLUMNS": "250"})

    return plan


def test_plan_llama3_70b_on_two_h200s_is_unsupported_with_the_figures(plan):
    result = plan("--cluster", "h200", "--model", "llama3-70b", "--gpus", 2, "--precision", "bf16")
    assert _verdict(result) == "no (1)"
    assert (
        "(1) unsupported: weights, gradients and AdamW state need 526 GiB per rank "
        "(16 B × 70.6B params / 2 ranks) > 141 GiB per h200"
    ) in result.stdout


def test_plan_llama3_70b_on_eight_mi300x_is_runnable(plan):
    assert _verdict(plan("--cluster", "mi300x", "--model", "llama3-70b", "--gpus", 8, "--precision", "bf16")) == "yes"
    # the same state on 8 H100s (80 GiB each) does not fit: the check reads each part's memory
    assert _verdict(plan("--cluster", "h100", "--model", "llama3-70b", "--gpus", 8, "--precision", "bf16")) == "no (1)"


def test_plan_takes_the_memory_cap_before_the_device(plan):
    result = plan("--cluster", "mi300x", "--model", "llama3-70b", "--gpus", 8, "--memory-cap", "120GiB")
    assert _verdict(result) == "no (1)"
    assert "need 131 GiB per rank (16 B × 70.6B params / 8 ranks) > 120 GiB per rank (the memory cap)" in result.stdout


def test_cpu_profiles_are_checked_only_under_a_cap(plan):
    assert _verdict(plan("--cluster", "local", "--model", "gpt-tiny")) == "yes"  # no memory figure: no check
    result = plan("--cluster", "local", "--model", "gpt-tiny", "--memory-cap", "1MiB")
    assert _verdict(result) == "no (1)"
    assert "need 3.03 MiB per rank (16 B × 198K params / 1 rank) > 1 MiB per rank (the memory cap)" in result.stdout


def test_run_records_the_trial_unsupported_without_reaching_ray(tmp_path, sweep_env):
    """A CPU profile whose memory_per_device the state overflows, and whose Ray address has nothing behind it:
    had sweep tried to start the trial, it would have failed to reach Ray (exit 2, no rows)."""
    profile = tmp_path / "tiny-ranks.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "name": "tiny-ranks",
                "accelerator": "cpu",
                "ray_address": "127.0.0.1:9",
                "nodes": 1,
                "gpus_per_node": 2,
                "memory_per_device": "1MiB",
            }
        )
    )
    out = tmp_path / "results"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sweep",
            "run",
            "--cluster",
            profile,
            "--model",
            "gpt-tiny",
            "--batch-size",
            "1",
            "--gpus",
            "2",
            "--output",
            out,
            "--no-progress",
        ],
        cwd=ROOT,
        env=sweep_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3, proc.stderr  # nothing measured
    assert "no trial measured anything: 1 unsupported" in proc.stderr
    (row,) = store.read_table(out).to_pylist()
    assert row["status"] == "unsupported" and row["cluster"] == "tiny-ranks" and row["world_size"] == 2
    assert row["error"] == (
        "weights, gradients and AdamW state need 1.51 MiB per rank (16 B × 198K params / "
        "2 ranks) > 1 MiB per rank (the memory cap)"
    )
    assert row["memory_cap_gib"] == pytest.approx(1 / 1024)
