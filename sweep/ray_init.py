"""Connecting to Ray for a cluster profile.

`ray_address: local` starts Ray inside this process (the embedded default): bound to 127.0.0.1, no
dashboard, so nothing listens beyond this machine. Any other address joins an existing cluster that the
user runs on a private network (Ray's ports execute code: never expose them).
"""

from __future__ import annotations

import os


def connect(profile) -> bool:
    """Connect for `profile`; returns True if this call started Ray (and so should shut it down)."""
    import ray

    if ray.is_initialized():  # a library user or a test session already connected
        return False
    quiet = not os.environ.get("SWEEP_DEBUG")
    common = dict(logging_level="ERROR" if quiet else "INFO", log_to_driver=not quiet, configure_logging=True)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if profile.is_embedded:
        num_cpus = None if profile.is_gpu else profile.ranks_per_node * profile.cpus_per_rank
        ray.init(num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1", **common)
    else:
        ray.init(address=profile.ray_address, **common)
    return True


def disconnect(started: bool) -> None:
    import ray

    if started and ray.is_initialized():
        ray.shutdown()
