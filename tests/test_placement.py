"""Where a group's ranks go and what their processes start with (sweep.execution.placement), from cluster profiles
built as `sweep run` builds them (clusters.registry, clusters.schema). Pure: no Ray, no torch."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import tiny_trial

from clusters import ClusterProfile, load_profile
from sweep.execution import placement as placement_module
from sweep.execution.placement import bundle, bundle_index, placement, rank_env, rank_jobs
from sweep.spec.grid import Trial
from trainer.job import PG_TIMEOUT_S
from trainer.models.specs import REGISTRY
from trainer.options import TrainingOptions

INDUCTOR = {
    "TORCHINDUCTOR_CACHE_DIR": "${HOME}/.cache/sweep/inductor",
    "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
    "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
}


def _profile(**keys: Any) -> ClusterProfile:
    """A profile from its YAML keys, validated as a profile file is (strict: strings for env values)."""
    base = {"name": "test", "accelerator": "cpu", "ray_address": "local", "nodes": 1, "gpus_per_node": 2}
    return ClusterProfile.model_validate({**base, **keys})


def _h200(nodes: int = 1, **keys: Any) -> ClusterProfile:
    """The shipped h200 profile (8 GPUs a node, 4 CPUs a rank), on `nodes` nodes."""
    data = {**load_profile("h200").model_dump(by_alias=True, exclude={"accelerator_info"}), "accelerator": "h200"}
    return ClusterProfile.model_validate({**data, "nodes": nodes, **keys})


def _trial(**changes: Any) -> Trial:
    return tiny_trial(**{"cluster": "c", **changes})


# -- bundles and strategy ----------------------------------------------------------------------------------


def test_the_ranks_of_one_gpu_node_are_one_gpu_bundle_each_strictly_packed():
    h200 = _h200()
    assert bundle(h200) == {"CPU": 4, "GPU": 1}
    assert placement(h200, 1) == ([{"CPU": 4, "GPU": 1}], "STRICT_PACK")
    assert placement(h200, 8) == ([{"CPU": 4, "GPU": 1}] * 8, "STRICT_PACK")  # a whole node: still one node
    assert [bundle_index(h200, rank, 8) for rank in range(8)] == list(range(8))  # a bundle of its own each


def test_cpu_ranks_ask_for_cpus_only_and_pack_onto_one_node_when_they_fit():
    cpu = _profile(cpus_per_rank=3)
    assert not cpu.is_gpu and bundle(cpu) == {"CPU": 3}  # no GPU key: a CPU node has none to give
    assert placement(cpu, 2) == ([{"CPU": 3}, {"CPU": 3}], "STRICT_PACK")
    assert [bundle_index(cpu, rank, 2) for rank in range(2)] == [0, 1]


def test_past_one_node_each_nodes_share_is_one_bundle_on_a_node_of_its_own():
    """16 ranks on 8-GPU nodes: two bundles of 8 GPUs, STRICT_SPREAD; 12: a full node, then what remains."""
    h200 = _h200(nodes=2)
    assert placement(h200, 16) == ([{"CPU": 32, "GPU": 8}] * 2, "STRICT_SPREAD")
    assert placement(h200, 12) == ([{"CPU": 32, "GPU": 8}, {"CPU": 16, "GPU": 4}], "STRICT_SPREAD")
    assert [bundle_index(h200, rank, 12) for rank in range(12)] == [0] * 8 + [1] * 4  # nodes fill in rank order
    assert placement(h200, 8)[1] == "STRICT_PACK"  # what fits one node of a larger cluster stays on one


def test_on_cpu_nodes_gpus_per_node_bounds_a_nodes_share_as_a_gpu_count_would():
    """A CPU node has no device count to bound its ranks: gpus_per_node does (PACK would take one big node)."""
    cpus = _profile(ray_address="auto", nodes=3, gpus_per_node=2, cpus_per_rank=2)
    bundles, strategy = placement(cpus, 5)
    assert (bundles, strategy) == ([{"CPU": 4}, {"CPU": 4}, {"CPU": 2}], "STRICT_SPREAD")
    assert [bundle_index(cpus, rank, 5) for rank in range(5)] == [0, 0, 1, 1, 2]


def test_a_bundle_per_rank_or_per_node_asks_for_every_ranks_resources():
    for profile, ranks in ((_h200(nodes=2), 13), (_profile(ray_address="auto", nodes=3, cpus_per_rank=2), 6)):
        bundles, _ = placement(profile, ranks)
        for key, amount in bundle(profile).items():
            assert sum(b[key] for b in bundles) == amount * ranks
        assert max(bundle_index(profile, rank, ranks) for rank in range(ranks)) == len(bundles) - 1


# -- the rank processes' environment -----------------------------------------------------------------------


def test_gpu_ranks_get_the_profiles_env_and_one_inductor_cache_per_node():
    h200 = _h200()
    env = rank_env(h200)
    assert env == {**h200.env, **INDUCTOR}  # a running cluster's sockets are its own: no interface forced
    assert "OMP_NUM_THREADS" not in env and "MALLOC_MMAP_THRESHOLD_" not in env


def test_cpu_ranks_get_a_thread_pool_of_their_cpus_and_a_fixed_mmap_threshold():
    env = rank_env(_profile(ray_address="auto", cpus_per_rank=3))
    assert env == {"OMP_NUM_THREADS": "3", "MALLOC_MMAP_THRESHOLD_": str(128 * 1024), **INDUCTOR}


@pytest.mark.skipif(placement_module._LOOPBACK is None, reason="no loopback interface")
def test_an_embedded_clusters_rank_sockets_stay_on_loopback():
    env = rank_env(_profile(cpus_per_rank=1))
    loopback = placement_module._LOOPBACK
    assert loopback is not None and loopback.startswith("lo")
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == loopback
    assert env["OMP_NUM_THREADS"] == "1"


def test_what_the_profile_sets_wins_over_every_default():
    mine = {
        "OMP_NUM_THREADS": "7",
        "MALLOC_MMAP_THRESHOLD_": "65536",
        "GLOO_SOCKET_IFNAME": "eth0",
        "NCCL_SOCKET_IFNAME": "eth0",
        "TORCHINDUCTOR_CACHE_DIR": "/scratch/inductor",
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "0",
    }
    assert rank_env(_profile(env=mine)) == mine


def test_the_compile_cache_setting_names_the_ranks_inductor_cache():
    assert rank_env(_h200(compile_cache="/scratch/cache"))["TORCHINDUCTOR_CACHE_DIR"] == "/scratch/cache"
    assert rank_env(_h200(compile_cache="~/ind"))["TORCHINDUCTOR_CACHE_DIR"] == "${HOME}/ind"  # each node's home


# -- what each rank is sent --------------------------------------------------------------------------------


def test_rank_zero_is_the_rendezvous_and_local_ranks_count_per_node():
    """Rank 0's address and held port are every rank's MASTER_ADDR/PORT; a rank's local rank is its index among
    the ranks of its node (by node id, or by address where Ray gave none)."""
    nodes = [
        {"ip": "10.0.0.7", "port": 5000, "node_id": None},
        {"ip": "10.0.0.8", "port": 1, "node_id": None},
        {"ip": "10.0.0.7", "port": 2, "node_id": None},
        {"ip": "10.0.0.8", "port": 3, "node_id": None},
    ]
    jobs = rank_jobs(_trial(gpus=4), nodes, device_type="cpu")
    assert [(j.rank, j.local_rank, j.world_size) for j in jobs] == [(0, 0, 4), (1, 0, 4), (2, 1, 4), (3, 1, 4)]
    assert {(j.master_addr, j.master_port, j.device_type, j.pg_timeout_s) for j in jobs} == {
        ("10.0.0.7", 5000, "cpu", PG_TIMEOUT_S)
    }


def test_every_rank_is_sent_the_same_trial_with_what_only_a_trial_says():
    trial = _trial(
        gpus=1, profiled=True, auto_max=(3, 5), warmup_steps="auto", measure_steps="auto", memory_cap_bytes=2**30
    )
    (job,) = rank_jobs(trial, [{"ip": "127.0.0.1", "port": 9, "node_id": "n"}], device_type="cuda", pg_timeout_s=5.0)
    config = job.trial
    assert (config.profiled, config.auto_max, config.warmup_steps, config.measure_steps, config.memory_cap_bytes) == (
        True,
        (3, 5),
        "auto",
        "auto",
        2**30,
    )
    assert config.options == TrainingOptions() and job.pg_timeout_s == 5.0 and job.device_type == "cuda"
    assert REGISTRY["gpt-tiny"].model_validate_json(config.model_spec_json) == REGISTRY["gpt-tiny"]
    # the memory model's (uncalibrated) peak, which decides whether it starts beside side processes still compiling
    from sweep.memory.calibration import NO_ROWS

    assert config.expected_peak_bytes == int(NO_ROWS.predict_trial(trial).bytes) > 0
