"""Which vendor's Transformer Engine is installed: NVIDIA's (`pip install 'sweep[te]'`) cannot drive an AMD GPU,
nor ROCm's an NVIDIA one. Told from the installed distributions, so it is checked on a CPU without TE: the pure
function with the names, and `sweep plan` with a distribution record as pip leaves it (a .dist-info folder)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from trainer.recipes import RECIPES, te_build_reason, unsupported_reason

NVIDIA_TE = frozenset({"transformer-engine-cu12"})
ROCM_TE = frozenset({"transformer-engine-rocm"})
MI300X_NAMES = dict(accelerator="mi300x", vendor="amd")
MI300X = dict(**MI300X_NAMES, has_fp8=True)
H200 = dict(accelerator="h200", vendor="nvidia", compute_capability=9.0)


@pytest.mark.parametrize("recipe", ["bf16-te", "fp8-te-delayed", "fp8-te-current"])
def test_nvidia_te_on_an_amd_part_names_the_fix(recipe):
    reason = unsupported_reason(RECIPES[recipe], **MI300X, have_te=True, te_builds=NVIDIA_TE)
    assert reason == (
        f"{recipe} on mi300x needs ROCm's Transformer Engine, but NVIDIA's is installed "
        "(transformer-engine-cu12): pip uninstall -y transformer-engine transformer-engine-torch "
        "transformer-engine-cu12, then use ROCm's Transformer Engine (github.com/ROCm/TransformerEngine: "
        "the one in AMD's ROCm containers, its transformer_engine_rocm wheels, or a source build), "
        "not pip install 'sweep[te]'"
    )


def test_the_matching_build_or_an_unnamed_one_runs():
    recipe = RECIPES["fp8-te-delayed"]
    assert unsupported_reason(recipe, **MI300X, have_te=True, te_builds=ROCM_TE) is None
    assert unsupported_reason(recipe, **H200, have_te=True, te_builds=frozenset({"transformer-engine-cu13"})) is None
    # a source build (plain transformer-engine, either vendor's) says nothing: given the benefit of the doubt
    assert unsupported_reason(recipe, **MI300X, have_te=True, te_builds=frozenset()) is None


def test_rocm_te_on_an_nvidia_part_and_what_it_leaves_alone():
    reason = te_build_reason(RECIPES["bf16-te"], accelerator="h200", vendor="nvidia", distributions=ROCM_TE)
    assert reason.startswith(
        "bf16-te on h200 needs NVIDIA's Transformer Engine, but ROCm's is installed "
        "(transformer-engine-rocm): pip uninstall -y transformer-engine transformer-engine-torch "
        "transformer-engine-rocm, then pip install 'sweep[te]'"
    )
    # only TE recipes care, and only on GPUs
    assert te_build_reason(RECIPES["fp8-torchao-rowwise"], **MI300X_NAMES, distributions=NVIDIA_TE) is None
    assert te_build_reason(RECIPES["bf16-te"], accelerator="cpu", vendor="cpu", distributions=NVIDIA_TE) is None
    # the hardware answer comes first: no TE build runs MXFP8 on an MI300X
    assert "not available on AMD" in unsupported_reason(RECIPES["fp8-te-mxfp8"], **MI300X, te_builds=NVIDIA_TE)


def test_missing_te_on_an_amd_part_does_not_point_at_nvidias():
    reason = unsupported_reason(RECIPES["bf16-te"], **MI300X, have_te=False, te_builds=frozenset())
    assert reason.startswith("bf16-te needs Transformer Engine: use ROCm's Transformer Engine")
    assert reason.endswith("not pip install 'sweep[te]'")
    reason = unsupported_reason(RECIPES["bf16-te"], **H200, have_te=False, te_builds=frozenset())
    assert reason.endswith("pip install 'sweep[te]' (transformer-engine[pytorch]>=2.10)")


def _install_record(site: Path, name: str) -> None:
    """What pip leaves for an installed distribution: NAME-VERSION.dist-info/METADATA (wheel names use _)."""
    info = site / f"{name.replace('-', '_')}-2.10.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('-', '_')}\nVersion: 2.10.0\n")


def _plan(cluster: str, site: Path, sweep_env) -> subprocess.CompletedProcess:
    env = sweep_env()
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{site}"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sweep",
            "plan",
            "--cluster",
            cluster,
            "--model",
            "gpt-tiny",
            "--batch-size",
            "1",
            "--precision",
            "bf16-te",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_plan_on_mi300x_with_nvidias_te_installed(tmp_path, sweep_env):
    _install_record(tmp_path / "site", "transformer-engine-cu12")
    proc = _plan("mi300x", tmp_path / "site", sweep_env)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # Rich wraps the reason
    assert "no (1)" in text
    assert (
        "(1) unsupported: bf16-te on mi300x needs ROCm's Transformer Engine, but NVIDIA's is installed "
        "(transformer-engine-cu12): pip uninstall -y transformer-engine transformer-engine-torch "
        "transformer-engine-cu12, then use ROCm's Transformer Engine"
    ) in text

    # the same install on an NVIDIA profile is the right one: what is left is TE itself, absent here
    proc = _plan("h200", tmp_path / "site", sweep_env)
    text = " ".join(proc.stdout.split())
    assert "needs ROCm's" not in text and "bf16-te needs Transformer Engine: pip install 'sweep[te]'" in text
