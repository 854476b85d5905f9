"""Where a group's ranks go and what their processes start with, from the cluster profile. Pure: no Ray.

`placement(profile, ranks)` gives the placement group's bundles and strategy, `bundle_index` the bundle
of each rank's actor, `rank_env(profile)` the rank processes' environment, and `rank_jobs` what each rank
is sent for a trial once they run (`sweep.execution.scheduler` uses them).
"""

from __future__ import annotations

import socket
from dataclasses import replace
from typing import Any

from clusters.schema import ClusterProfile
from sweep.memory.calibration import NO_ROWS
from sweep.spec.grid import Trial
from trainer.job import PG_TIMEOUT_S, RankJob, TrialConfig

# The loopback interface ('lo' on Linux, 'lo0' on macOS): gloo and NCCL sockets of an embedded trial.
_LOOPBACK = next((name for _, name in socket.if_nameindex() if name.startswith("lo")), None)


def bundle(profile: ClusterProfile) -> dict[str, int]:
    """One rank's resources."""
    cpus = profile.cpus_per_rank
    return {"CPU": cpus, "GPU": 1} if profile.is_gpu else {"CPU": cpus}


def placement(profile: ClusterProfile, ranks: int) -> tuple[list[dict[str, int]], str]:
    """The placement group's bundles and strategy for `ranks` ranks.

    One node if it fits (STRICT_PACK keeps NVLink/xGMI traffic on the node). Else each node's share of the
    ranks (gpus_per_node of them, the last share what remains) is one bundle, and the bundles go to distinct
    nodes (STRICT_SPREAD): ranks fill nodes in rank order (`bundle_index`), so a trial's TP group (tp consecutive
    ranks, tp dividing gpus_per_node: sweep.spec.layout) is on one node and its HSDP replicas (dp_shard x tp
    consecutive ranks each) fill nodes one after another. A GPU count bounds a node's ranks; a CPU node has no
    such count (PACK would put every rank on one big node): there gpus_per_node bounds them, as on GPUs.
    """
    per_node = profile.ranks_per_node
    if ranks <= per_node:
        return [bundle(profile) for _ in range(ranks)], "STRICT_PACK"
    shares = [min(per_node, ranks - start) for start in range(0, ranks, per_node)]
    return [{key: amount * n for key, amount in bundle(profile).items()} for n in shares], "STRICT_SPREAD"


def bundle_index(profile: ClusterProfile, rank: int, ranks: int) -> int:
    """The bundle a rank's actor goes into (see `placement`): its node's share, in rank order."""
    return rank // profile.ranks_per_node if ranks > profile.ranks_per_node else rank


def rank_env(profile: ClusterProfile) -> dict[str, str]:
    """The rank processes' environment: the profile's `env`, and defaults for what it leaves unset."""
    env = {str(k): str(v) for k, v in (profile.env or {}).items()}
    if not profile.is_gpu:  # CPU ranks: one intra-op thread pool per rank, sized to its CPUs
        env.setdefault("OMP_NUM_THREADS", str(profile.cpus_per_rank))
        # A fixed threshold: glibc otherwise raises it as large blocks are freed, and keeps later ones in its
        # heap after free. That kept heap would be a later trial's headroom under a CPU memory cap (RLIMIT_DATA,
        # counted from the process's size when the trial starts) in a warm process.
        env.setdefault("MALLOC_MMAP_THRESHOLD_", str(128 * 1024))
    if profile.is_embedded and _LOOPBACK:  # one machine: rank-to-rank sockets stay on loopback
        env.setdefault("GLOO_SOCKET_IFNAME", _LOOPBACK)
        env.setdefault("NCCL_SOCKET_IFNAME", _LOOPBACK)
    # One inductor cache per node, kept across trials and runs: a graph compiled once loads from disk
    # after (FX graph + AOTAutograd caches; their env switches force them on whatever torch's default).
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", profile.compile_cache_env)
    env.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    env.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
    return env


def trial_config(trial: Trial) -> TrialConfig:
    """What every rank of `trial` trains."""
    return TrialConfig(
        model_spec_json=trial.model.to_json(),
        precision=trial.precision,
        compile=trial.compile,
        ac=trial.ac,
        batch_size=trial.batch_size,
        seq_len=trial.seq_len,
        warmup_steps=trial.warmup_steps,
        measure_steps=trial.measure_steps,
        options=trial.options(),
        memory_cap_bytes=trial.memory_cap_bytes,
        profiled=trial.profiled,
        auto_max=trial.auto_max,
    )


def node_groups(profile: ClusterProfile, max_concurrent: int | None) -> int:
    """How many one-rank groups of a node may compile ahead at once, sharing its cores (`trainer.precompile`)."""
    return min(profile.ranks_per_node, max_concurrent or profile.ranks_per_node)


def node_key(info: dict[str, Any]) -> str:
    """Which node a rank runs on, from its node_info: Ray's node id, else its address."""
    return str(info["node_id"] or info["ip"])


def rank_jobs(
    trial: Trial,
    nodes: list[dict[str, Any]],
    *,
    device_type: str,
    pg_timeout_s: float = PG_TIMEOUT_S,
    precompile: tuple[TrialConfig, ...] = (),
    node_groups: int = 1,
) -> list[RankJob]:
    """What each rank of `trial` is sent, given where its ranks run (`nodes`: node_info per rank, rank 0's
    address and held port becoming the rendezvous); `precompile`: the graphs a fresh group compiles ahead
    (`trainer.job.compile_ahead`), `node_groups` the one-rank groups of its node that may do so at once. Pure: no
    Ray."""
    # the memory model's peak, for the trial that runs (not for every queued one the scheduler looks ahead to):
    # whether it may start beside side processes still compiling (trainer.worker)
    config = replace(trial_config(trial), expected_peak_bytes=int(NO_ROWS.predict_trial(trial).bytes))
    seen: dict[str, int] = {}
    jobs = []
    for rank, info in enumerate(nodes):  # local rank = index among the ranks on the same node
        key = node_key(info)
        jobs.append(
            RankJob(
                trial=config,
                rank=rank,
                world_size=trial.gpus,
                local_rank=seen.get(key, 0),
                master_addr=nodes[0]["ip"],
                master_port=nodes[0]["port"],
                device_type=device_type,
                pg_timeout_s=pg_timeout_s,
                precompile=precompile,
                node_groups=node_groups,
            )
        )
        seen[key] = seen.get(key, 0) + 1
    return jobs
