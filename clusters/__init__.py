"""Cluster profiles: one YAML per cluster, one schema, one registry, and the accelerator catalog.

    from clusters import load_profile
    profile = load_profile("mi300x")          # or a path: load_profile("~/my-h200.yaml")
    profile.total_ranks, profile.env, profile.peak_tflops("bf16")

Imports only pydantic and PyYAML, so the CLI and the scheduler's driver can use it cheaply.
"""

from clusters.catalog import PRECISION_FAMILIES, Accelerator, load_catalog
from clusters.registry import load_profile, profile_names
from clusters.schema import ClusterProfile, parse_memory_size

__all__ = [
    "PRECISION_FAMILIES",
    "Accelerator",
    "ClusterProfile",
    "load_catalog",
    "load_profile",
    "parse_memory_size",
    "profile_names",
]
