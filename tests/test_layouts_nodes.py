"""HSDP x TP over two nodes of a real Ray cluster (both on this machine, as tests/test_multinode.py starts them).

A profile of two nodes of two ranks runs HSDP 2 x TP 2 (dp_shard 1) on four ranks through `sweep run` in a
subprocess: ranks fill nodes in rank order (sweep.execution.placement), so each TP group (ranks 0-1, 2-3) is on one node
and the two replicas are on different nodes; the row's node_ids say so, and the trial trains.
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
models: [llama-tiny]
precisions: [fp32]
batch_sizes: [2]
compile: none
seq_len: 32
gpus: 4
dp_replicate: 2
tp: 2
steps: {warmup: 1, measure: 2}
"""


@pytest.mark.timeout(300)
def test_hsdp_replicas_span_nodes_and_each_tp_group_stays_on_one(tmp_path, sweep_env):
    from ray.cluster_utils import Cluster

    auth_mode = os.environ.get("RAY_AUTH_MODE", "disabled")  # as tests/test_multinode.py: the driver's mode
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        (tmp_path / "grid.yaml").write_text(GRID)
        (tmp_path / "profile.yaml").write_text(
            f'name: two-by-two\naccelerator: cpu\nray_address: "{cluster.address}"\n'
            f"nodes: 2\ngpus_per_node: 2\ncpus_per_rank: 1\n"
        )
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "sweep",
                "run",
                tmp_path / "grid.yaml",
                "--cluster",
                tmp_path / "profile.yaml",
                "--output",
                tmp_path / "out",
                "--no-progress",
            ],
            cwd=ROOT,
            env={**sweep_env(), "RAY_AUTH_MODE": auth_mode},
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert run.returncode == 0, run.stdout + run.stderr
    finally:
        cluster.shutdown()
    (row,) = store.read_table(tmp_path / "out").to_pylist()
    assert row["status"] == "ok", row["error"]
    assert (row["dp_replicate"], row["dp_shard"], row["tp"], row["nodes"]) == (2, 1, 2, 2)
    nodes = row["node_ids"]
    assert nodes[0] == nodes[1] and nodes[2] == nodes[3] and nodes[0] != nodes[2]
    assert row["loss_curve"][-1] < row["loss_curve"][0]
