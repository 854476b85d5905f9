"""Multi-node scheduling on a real Ray cluster of two nodes, both on this machine.

`ray.cluster_utils.Cluster` starts a head and a second node of two CPUs each; a profile written here
(`gpus_per_node: 1`, one CPU per rank) points at it, and `sweep run` joins it as a driver of its own, in a subprocess
(this test process may already be connected to the session's Ray, and a process joins one Ray only). A 2-rank
trial is then spread over both nodes although either could hold both ranks (on CPU nodes `gpus_per_node`
bounds a trial's ranks per node, as a GPU count does), with FSDP2 over gloo between them; 1-rank trials run
at the same time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweep.record import store

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]

GRID = """
name: two-nodes
models: [gpt-tiny]
precisions: [fp32]
batch_sizes: [2, 4]
compile: none
seq_len: 32
gpus: [1, 2]
steps: {warmup: 1, measure: 5}
"""


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory, sweep_env):
    from ray.cluster_utils import Cluster

    folder = tmp_path_factory.mktemp("two-nodes")
    # The cluster's processes start with this process's environment, including its RAY_AUTH_MODE (the session
    # Ray's ray.init writes "token" there, if it ran first); a driver joins only in the same mode, as the shell
    # of an operator who ran `ray start` has it. Nothing else of this process's Ray variables goes along.
    auth_mode = os.environ.get("RAY_AUTH_MODE", "disabled")
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        (folder / "grid.yaml").write_text(GRID)
        (folder / "profile.yaml").write_text(f"""
name: two-nodes
accelerator: cpu
ray_address: "{cluster.address}"
nodes: 2
gpus_per_node: 1
cpus_per_rank: 1
""")
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "sweep",
                "run",
                folder / "grid.yaml",
                "--cluster",
                folder / "profile.yaml",
                "--output",
                folder / "out",
                "--no-progress",
            ],
            cwd=ROOT,
            env={**sweep_env(), "RAY_AUTH_MODE": auth_mode},
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        node_ids = {n.node_id for n in cluster.list_all_nodes()}
    finally:
        cluster.shutdown()
    return store.read_table(folder / "out").to_pylist(), node_ids


@pytest.mark.timeout(300)
def test_a_two_rank_trial_spans_both_nodes_and_trains(two_node_run):
    rows, node_ids = two_node_run
    two_rank = [r for r in rows if r["world_size"] == 2]
    assert len(two_rank) == 2
    for r in two_rank:
        assert r["status"] == "ok", r["error"]
        assert r["cluster"] == "two-nodes"
        # one rank per node (ceil(2 / gpus_per_node 1) nodes), each rank knows its node
        assert len(r["node_ids"]) == 2 and set(r["node_ids"]) == node_ids
        assert r["nodes"] == 2 and len(r["hosts"]) == 2
        assert r["loss_last"] < r["loss_first"]  # FSDP2 over gloo across the two nodes trained
        assert len(r["params_local"]) == 2 and sum(r["params_local"]) >= r["n_params"]


@pytest.mark.timeout(300)
def test_one_rank_trials_run_at_once(two_node_run):
    rows, _ = two_node_run  # Ray may place both on one node: each node has room for two ranks
    one_rank = [r for r in rows if r["world_size"] == 1]
    assert len(one_rank) == 2
    a, b = one_rank
    assert a["status"] == b["status"] == "ok", (a["error"], b["error"])
    assert a["nodes"] == b["nodes"] == 1
    # their [started_at, finished_at] intervals intersect: neither waited for the other
    assert a["started_at"] < b["finished_at"] and b["started_at"] < a["finished_at"]
