"""benchmarks/: every campaign grid plans through the CLI on the profile it is run on, the runner runs a
campaign the way benchmarks/README.md tells a user to, and every command the docs give names a campaign."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_grid

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
CAMPAIGNS = sorted(p for p in (BENCH / "campaigns").iterdir() if p.is_dir())
H200X2 = BENCH / "profiles" / "h200x2.yaml"
# multinode runs its grid on both profiles (benchmarks/device/job.sh multinode); layouts each grid on its own
# (benchmarks/device/layouts.sh)
PROFILES = {
    "multinode": [H200X2, BENCH / "profiles" / "h200-2nodes.yaml"],
    "layouts/a-two-gpus": [H200X2],
    "layouts/b-two-nodes": [BENCH / "profiles" / "h200-2nodes.yaml"],
    "layouts/c-four-gpus": [BENCH / "profiles" / "h200x4.yaml"],
    "layouts/d-four-gpus-two-nodes": [BENCH / "profiles" / "h200x4-2nodes.yaml"],
    "cold-sweep/a-grid-80gb": [BENCH / "profiles" / "h100x1.yaml"],  # benchmarks/device/cold_sweep.sh with GRID
    "cold-sweep/d-steps-80gb": [BENCH / "profiles" / "h100x1.yaml"],
}
GRIDS = [
    (grid, profile)
    for campaign in CAMPAIGNS
    for grid in sorted(campaign.glob("*.yaml"))
    for profile in PROFILES.get(f"{campaign.name}/{grid.stem}", PROFILES.get(campaign.name, [H200X2]))
]


def test_the_layouts_script_runs_every_grid_of_its_campaign_on_the_profile_its_test_plans_it_on():
    script = (BENCH / "device" / "layouts.sh").read_text()
    for grid in sorted((BENCH / "campaigns" / "layouts").glob("*.yaml")):
        (profile,) = PROFILES[f"layouts/{grid.stem}"]
        assert f"layout_grid {grid.stem} benchmarks/profiles/{profile.name}" in script, grid.name


def test_there_are_campaigns_and_each_has_a_grid():
    assert len(CAMPAIGNS) >= 5
    assert all(list(c.glob("*.yaml")) for c in CAMPAIGNS)


@pytest.mark.parametrize("grid,profile", GRIDS, ids=[f"{g.parent.name}/{g.name}@{p.stem}" for g, p in GRIDS])
def test_campaign_grid_plans_on_its_profile(grid, profile, cli):
    """`sweep plan` accepts the grid as shipped; its first line says the question and the RESULTS.md figure,
    and its name says campaign and file (the rows' grid_name)."""
    result = cli("plan", grid, "--cluster", profile)
    assert result.exit_code == 0, result.output
    name = re.search(r"^name: (\S+)$", grid.read_text(), re.M)
    assert re.search(rf"\d+ trials? on {profile.stem} ", result.stdout)  # each profile's name is its file's
    first = grid.read_text().splitlines()[0]
    assert first.startswith("# ") and "RESULTS.md" in first, first
    assert name and name.group(1) == f"{grid.parent.name}/{grid.stem}"


def _commands(text: str) -> set[str]:
    """The campaign named by each `benchmarks/run.sh X` and `benchmarks/device/job.sh X` in a document."""
    return set(re.findall(r"benchmarks/(?:device/job|run)\.sh\s+([A-Za-z0-9._-]+)", text))


def test_the_docs_name_every_campaign_and_only_campaigns():
    """benchmarks/README.md says what every campaign answers, RESULTS.md gives the command of every campaign
    (each reproduces one of its figures), and every command in them or the project README names a campaign
    folder that exists."""
    assert (BENCH / "run.sh").is_file() and (BENCH / "device" / "job.sh").is_file()
    names = {c.name for c in CAMPAIGNS}
    readme = (BENCH / "README.md").read_text()
    assert {n for n in names if f"`{n}`" not in readme and f"campaigns/{n}" not in readme} == set()
    for doc in (BENCH / "README.md", BENCH / "RESULTS.md", ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        assert _commands(doc.read_text()) - names - {"CAMPAIGN"} == set(), doc.name
    assert _commands((BENCH / "RESULTS.md").read_text()) >= names


@pytest.mark.integration  # run.sh's `sweep run` starts a real Ray (in its own process) for the bf16 grid
def test_run_sh_runs_every_grid_past_one_that_measured_nothing_then_exports(tmp_path, sweep_env):
    """A campaign whose first grid measures nothing (TE on CPU ranks: unsupported, exit 3) still runs the
    next grid into the same folder, prints `sweep results export`'s table of both, and exits 3."""
    bench = tmp_path / "benchmarks"
    (bench / "campaigns" / "tiny").mkdir(parents=True)
    shutil.copy(BENCH / "run.sh", bench / "run.sh")
    (bench / "campaigns" / "tiny" / "a-te.yaml").write_text(tiny_grid(precisions=["fp8-te-delayed"], seq_len=64))
    (bench / "campaigns" / "tiny" / "b-bf16.yaml").write_text(tiny_grid(precisions=["bf16"], seq_len=64))
    env = {**sweep_env(), "SWEEP": f"{sys.executable} -m sweep"}
    out = tmp_path / "rows"
    done = subprocess.run(
        ["bash", str(bench / "run.sh"), "tiny", "local", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 3, done.stderr
    assert "measured nothing" in done.stderr
    table = done.stdout[done.stdout.index("| precision") :]  # the export, after the runs' own tables
    assert re.search(r"^\| bf16 \| ok \|", table, re.M) and re.search(
        r"^\| fp8-te-delayed \| unsupported \|", table, re.M
    )
    assert len(list(out.glob("cluster=local/run=*"))) == 2  # one run per grid, one folder


def test_run_sh_refuses_an_unknown_campaign_and_lists_the_real_ones():
    done = subprocess.run(["bash", str(BENCH / "run.sh"), "no-such-campaign", "local"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "no campaign 'no-such-campaign'" in done.stderr and "llama3-8b-torch-vs-probes" in done.stderr
