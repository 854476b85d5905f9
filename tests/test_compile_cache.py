"""The persistent inductor cache a profile names (`compile_cache:`), through the real CLI and real ranks.

The grid is torchao's FP8 (emulated on CPU ranks) over 2 ranks, its weights all-gathered in FP8: its graphs are the
ones torch alone left out of AOTAutograd's cache (trainer.compile_keys), so a later run that finds everything there
skips their forward and backward trace, and trains the same."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import yaml
from conftest import invoke

GRID = {
    "models": ["gpt-tiny"],  # its block compiles faster than llama-tiny's
    "precisions": ["fp8-torchao-tensorwise"],
    "batch_sizes": [2],
    "seq_len": 32,
    "gpus": 2,
    "compile": "regional",
    "steps": {"warmup": 1, "measure": 1},
}


def write_profile(folder: Path, **keys) -> Path:
    path = folder / "profile.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "cached",
                "accelerator": "cpu",
                "ray_address": "local",
                "nodes": 1,
                "gpus_per_node": 2,
                "cpus_per_rank": 1,
                **keys,
            }
        )
    )
    return path


def run(folder: Path, profile: Path, name: str) -> list[dict]:
    grid = folder / f"{name}.yaml"
    grid.write_text(yaml.safe_dump(GRID))
    out = folder / name
    result = invoke("run", grid, "--cluster", profile, "--output", out, "--no-progress")
    assert result.exit_code == 0, result.output
    return ds.dataset(out, format="parquet").to_table().to_pylist()


def entries(folder: Path) -> dict[str, int]:
    """The cache entries under a cache sub-folder (fxgraph/, aotautograd/): relative path -> mtime (ns)."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


@pytest.mark.integration
def test_ranks_compile_into_the_profile_cache_a_later_run_reuses_it_and_a_profile_env_overrides_it(
    ray_session, tmp_path
):
    cache = tmp_path / "cache"
    profile = write_profile(tmp_path, compile_cache=str(cache))
    (first,) = run(tmp_path, profile, "first")
    assert first["status"] == "ok" and first["compile"] == "regional"
    graphs, autograd = entries(cache / "fxgraph"), entries(cache / "aotautograd")
    assert graphs and autograd  # the compiled blocks and loss, forward and backward, on disk
    keys = {name: {str(Path(entry).parent) for entry in found} for name, found in (("fx", graphs), ("aot", autograd))}
    assert len(keys["fx"]) == 2 * len(keys["aot"])  # every graph's forward and backward under an AOTAutograd key

    # A second run, in fresh rank processes, compiles the same graphs: each is a hit, so no entry is written
    # (a miss writes its entry, a new one or the same one again).
    (second,) = run(tmp_path, profile, "second")
    assert second["status"] == "ok" and second["loss_curve"] == first["loss_curve"]
    assert entries(cache / "fxgraph") == graphs and entries(cache / "aotautograd") == autograd
    assert (second["compile_cache_hits"], second["compile_cache_misses"]) == (4, 0)

    # A profile's env overrides the cache dir. Its folder, a copy of that cache with one compiled graph taken
    # out (a cold cache would compile every graph again): the ranks compile that graph into it, and the
    # profile's compile_cache folder is never made.
    mine = tmp_path / "mine"
    shutil.copytree(cache, mine)
    gone = (mine / "fxgraph" / min(graphs)).parent  # a graph's key: its entries (one a rank that wrote it)
    shutil.rmtree(gone)
    profile = write_profile(
        tmp_path, compile_cache=str(tmp_path / "unused"), env={"TORCHINDUCTOR_CACHE_DIR": str(mine)}
    )
    (env,) = run(tmp_path, profile, "env")
    assert env["status"] == "ok"
    assert gone.is_dir() and any(gone.iterdir()), "the graph taken out was not compiled into the env's cache dir"
    assert not (tmp_path / "unused").exists()


@pytest.mark.parametrize("value", ["cache", "./cache", "~user/cache"])
def test_a_relative_cache_path_is_refused_in_one_line(tmp_path, value):
    result = invoke("clusters", "show", write_profile(tmp_path, compile_cache=value))
    assert result.exit_code == 2
    assert "compile_cache" in result.output and "absolute path" in result.output
    assert "Traceback" not in result.output


def test_the_default_is_under_the_users_cache_dir():
    result = invoke("clusters", "show", "local")
    assert result.exit_code == 0
    assert "~/.cache/sweep/inductor" in result.output


def test_the_readme_profile_sets_the_cache(tmp_path):
    """The profile block under docs/clusters.md's "## Profiles", as a user would copy it, keeps its compile_cache."""
    section = (Path(__file__).resolve().parents[1] / "docs" / "clusters.md").read_text().split("## Profiles", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    assert "compile_cache:" in block
    path = tmp_path / "readme.yaml"
    path.write_text(block)
    result = invoke("clusters", "show", path)
    assert result.exit_code == 0, result.output
    assert "/scratch/inductor" in result.output
