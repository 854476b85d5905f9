"""The cluster profile schema: one pydantic model that every `clusters/*.yaml` must satisfy.

Validation is strict (no "2" for 2, no 0 for "0") and unknown keys are errors: a typo in a profile
would otherwise silently run the benchmark with a default.
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationInfo,
    field_validator,
    model_validator,
)

from clusters._load import unknown_name
from clusters.catalog import PRECISION_FAMILIES, Accelerator, load_catalog

_MEMORY_UNITS = {
    "b": 1,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}  # fmt: skip
_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$", re.IGNORECASE)

# `local` | `auto` | `ray://host:port` | `host:port` (host may be a bracketed IPv6 address).
_RAY_ADDRESS_RE = re.compile(r"^(?:ray://)?(?P<host>\[[0-9a-fA-F:.]+\]|[^\s:/\[\]]+):(?P<port>\d{1,5})$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Ray assigns devices to each rank actor and sweep sets the rank layout; a profile that set these
# would fight both. (Ray's AMD support sets HIP_VISIBLE_DEVICES and raises when it finds
# ROCR_VISIBLE_DEVICES without it.)
RESERVED_ENV = frozenset({
    "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
})  # fmt: skip

DEFAULT_CPUS_PER_RANK = {"cpu": 1, "gpu": 4}
# Ray retries an address nothing answers on for many minutes: sweep gives up after this (profile: connect_timeout_s)
DEFAULT_CONNECT_TIMEOUT_S = 30.0
# The XDG default cache directory: each node's own disk (~ is the home of the node a rank runs on).
DEFAULT_COMPILE_CACHE = "~/.cache/sweep/inductor"


def _env_name(name: Any) -> str:
    if not isinstance(name, str) or not _ENV_NAME_RE.match(name):
        raise ValueError("not an environment variable name (letters, digits and _, not starting with a digit)")
    if name in RESERVED_ENV:
        raise ValueError("set per rank by Ray and sweep; remove it from the profile")
    return name


def _env_value(value: Any) -> str:
    if not isinstance(value, str):
        # YAML reads `NCCL_NVLS_ENABLE: 0` as an int; guessing its string form ("0"? "False"?) is worse.
        raise ValueError("values must be strings; quote it in the YAML")
    return value


EnvName = Annotated[str, PlainValidator(_env_name)]
EnvValue = Annotated[str, PlainValidator(_env_value)]


def _catalog_or_declared(value: Any) -> Any:
    """A catalog name to its entry; a mapping declares a part the catalog lacks and goes on to be validated
    as a catalog entry is (so its errors name `accelerator.<key>`)."""
    catalog = load_catalog()
    if isinstance(value, str):
        if value not in catalog:
            hint = "(or a mapping that declares the part: name, vendor, memory_gib, peak_tflops, sources, ...)"
            raise ValueError(unknown_name("accelerator", value, sorted(catalog), hint))
        return catalog[value]
    if isinstance(value, dict):
        name = value.get("name")
        if isinstance(name, str) and name in catalog:
            # one name, one set of peaks: results would otherwise hold two different `h100`s
            raise ValueError(
                f"name {name!r} is a catalog accelerator; write `accelerator: {name}`, or give the "
                f"part you declare a name of its own"
            )
        return value
    raise ValueError("expected a name from clusters/accelerators.yaml, or a mapping that declares the part")


def parse_memory_size(text: str) -> int:
    """Bytes in a size like `80GiB`, `192GB`, `512MiB`, `0.5 TiB` (units case-insensitive).

    Binary units (KiB, MiB, GiB, TiB) are powers of 1024; decimal ones (KB, MB, GB, TB) powers of 1000.
    Raises ValueError naming the allowed units.
    """
    match = _MEMORY_RE.match(text)
    unit = _MEMORY_UNITS.get(match.group(2).lower()) if match else None
    if match is None or not unit:
        units = "B, KiB, MiB, GiB, TiB, KB, MB, GB, TB"
        raise ValueError(f"expected a size with a unit, like 80GiB or 192GB; units: {units}")
    size = int(float(match.group(1)) * unit)
    if size <= 0:
        raise ValueError("must be more than 0 bytes")
    return size


def ray_address_parts(address: str) -> tuple[str, int] | None:
    """(host, port) of a `host:port` or `ray://host:port` address (an IPv6 host without its brackets); None for
    `local` and `auto`."""
    match = _RAY_ADDRESS_RE.match(address)
    return (match.group("host").strip("[]"), int(match.group("port"))) if match else None


def usable_cpus() -> int:
    """CPUs this process may run on: the affinity mask where the OS has one (taskset, cgroup cpusets)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class ClusterProfile(BaseModel):
    """Where trials run: a Ray cluster of identical nodes, the accelerator in them, and rank settings."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """Profile name; recorded in every result row's `cluster` column."""
    accelerator_info: Annotated[Accelerator, BeforeValidator(_catalog_or_declared)] = Field(alias="accelerator")
    """`accelerator:` in the YAML: a key of clusters/accelerators.yaml, or a mapping that declares a part the
    catalog lacks (its name and the keys of a catalog entry). The device every rank gets, and its peaks for MFU."""
    ray_address: str
    """`local` (embedded Ray started in-process), `auto` (a running cluster), `ray://host:port`, or `host:port`."""
    nodes: int = Field(ge=1)
    """Nodes in the cluster; trials may use fewer."""
    gpus_per_node: int | Literal["auto"]
    """Ranks per node (one per GPU), or `auto` on a local CPU profile: one rank per `cpus_per_rank` usable CPUs."""
    memory_per_device: str | None = None
    """Usable memory per device when it differs from the catalog (a cap, a MIG slice, a CPU rank's share)."""
    env: dict[EnvName, EnvValue] = {}
    """Environment variables for trainer processes (NCCL/RCCL settings, allocator config)."""
    cost_per_gpu_hour: float | None = Field(default=None, ge=0)
    """Price of one device for one hour, for cost-per-token comparisons; null if unknown."""
    power_cost_per_kwh: float | None = Field(default=None, ge=0)
    """Price of one kWh of facility power: `results compare --by cluster` adds the measured energy's cost (energy ×
    PUE × this) to the GPU-hours' in $ per million tokens; null leaves energy out of the cost."""
    pue: float | None = Field(default=None, ge=1)
    """Power usage effectiveness: facility power over IT power (1.1-1.6 is typical); with power_cost_per_kwh.
    Null counts 1.0 (the GPUs' own energy only)."""
    power_limit_w: float | None = Field(default=None, gt=0)
    """The power limit (W) the cluster's GPUs run at, recorded on each row; a run warns when the GPUs enforce
    another. sweep never changes a GPU's power limit: set it yourself (`nvidia-smi -pl`) and say so here."""
    timeout_s: float | None = Field(default=None, gt=0)
    """Default per-trial timeout in seconds; null leaves it to the run's own default."""
    connect_timeout_s: float = Field(default=DEFAULT_CONNECT_TIMEOUT_S, gt=0)
    """Seconds to reach a running cluster (`ray_address` other than local) before giving up with exit 2."""
    cpus_per_rank: int = Field(ge=1)
    """Ray CPUs reserved per rank actor. Default: 1 on CPU profiles, 4 on GPU profiles."""
    compile_cache: str = DEFAULT_COMPILE_CACHE
    """Inductor's persistent cache directory (FX graph and AOTAutograd caches) on each node, shared by every
    trial and run there: a trial that compiles graphs an earlier one compiled loads them. `~` and `${VAR}` are
    expanded on each node. The profile's `env` wins if it sets TORCHINDUCTOR_CACHE_DIR itself."""
    prestarted_ranks: int | Literal["auto"] = "auto"
    """Rank processes that Ray starts, torch and the trainer imported in them (`trainer.preload`), as sweep starts
    Ray (`ray_address: local`) and before any group is placed: a group placed later takes them, so its GPUs are not
    held while they import. `auto`: two groups' worth of a node's ranks on a GPU profile (a run's first group and
    one more, such as Transformer Engine's after torch's), none on a CPU profile (its cores are its ranks: importing
    ahead only takes their time, and no GPU is held); 0: each rank starts and imports once placed. At least a node's
    ranks when on. Only in the Ray that sweep starts: on a running cluster each rank starts once placed."""
    description: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_cpus_per_rank(cls, data: Any) -> Any:
        # The default depends on another field, so it is filled in before field validation.
        if isinstance(data, dict) and data.get("cpus_per_rank") is None:
            given = data.get("accelerator")
            if isinstance(given, dict):  # a declared part
                vendor = given.get("vendor")
            else:
                known = load_catalog().get(given) if isinstance(given, str) else None
                vendor = known and known.vendor
            data = {**data, "cpus_per_rank": DEFAULT_CPUS_PER_RANK["cpu" if vendor == "cpu" else "gpu"]}
        return data

    @field_validator("ray_address")
    @classmethod
    def _valid_ray_address(cls, value: str) -> str:
        if value in ("local", "auto"):
            return value
        match = _RAY_ADDRESS_RE.match(value)
        if not match or not 1 <= int(match.group("port")) <= 65535:
            raise ValueError("expected 'local', 'auto', 'ray://host:port' or 'host:port'")
        return value

    @field_validator("nodes")
    @classmethod
    def _one_node_when_embedded(cls, value: int, info: ValidationInfo) -> int:
        if value > 1 and info.data.get("ray_address") == "local":
            raise ValueError("ray_address 'local' starts Ray on this machine only; nodes must be 1")
        return value

    @field_validator("gpus_per_node", mode="plain")
    @classmethod
    def _whole_or_auto(cls, value: Any, info: ValidationInfo) -> int | str:
        if value == "auto":
            accelerator = info.data.get("accelerator_info")  # absent when it failed its own validation
            if accelerator is not None and accelerator.is_gpu:
                raise ValueError("'auto' is only for CPU profiles (accelerator: cpu); give the GPUs per node")
            if info.data.get("ray_address", "local") != "local":
                # `auto` counts the CPUs of the machine sweep runs on, which says nothing about remote nodes.
                raise ValueError("'auto' needs ray_address: local; give the ranks per node of a remote cluster")
            return "auto"
        if type(value) is not int or value < 1:  # bool is an int subclass: `true` is not a count
            raise ValueError("expected a whole number >= 1, or 'auto' on a CPU profile")
        count: int = value
        return count

    @field_validator("prestarted_ranks", mode="plain")
    @classmethod
    def _prestart_count(cls, value: Any, info: ValidationInfo) -> int | str:
        if value == "auto":
            return "auto"
        if type(value) is not int or value < 0:
            raise ValueError("expected a whole number >= 0, or 'auto'")
        if value and info.data.get("ray_address", "local") != "local":
            raise ValueError(
                "rank processes are started ahead only by the Ray that sweep starts (ray_address: local); "
                "on a running cluster each rank starts once placed: remove the key or set it to 0"
            )
        count: int = value
        return count

    @field_validator("compile_cache")
    @classmethod
    def _absolute_cache(cls, value: str) -> str:
        # Relative to what? A rank's working directory is a Ray session folder, gone after the run.
        if not (value.startswith(("/", "$")) or value == "~" or value.startswith("~/")):
            raise ValueError("expected an absolute path, or one starting with ~/ or ${VAR} (expanded on each node)")
        return value

    @field_validator("memory_per_device", mode="before")
    @classmethod
    def _parsable_memory(cls, value: Any) -> Any:
        if value is not None:
            # A bare number (YAML `80`) is refused too: GB or GiB is exactly the ambiguity to avoid.
            parse_memory_size(value if isinstance(value, str) else "")
        return value

    @property
    def accelerator(self) -> str:
        """The accelerator's name, as result rows record it."""
        return self.accelerator_info.name

    @property
    def declares_accelerator(self) -> bool:
        """True when the profile declares its own part rather than naming a catalog entry."""
        return self.accelerator not in load_catalog()

    @property
    def is_gpu(self) -> bool:
        return self.accelerator_info.is_gpu

    @property
    def is_embedded(self) -> bool:
        """True when sweep starts Ray itself, in-process (`ray_address: local`)."""
        return self.ray_address == "local"

    @property
    def ranks_per_node(self) -> int:
        """`gpus_per_node`, with `auto` resolved against the CPUs this process may use."""
        if self.gpus_per_node == "auto":
            return max(1, usable_cpus() // self.cpus_per_rank)
        return self.gpus_per_node

    @property
    def prestart_count(self) -> int:
        """`prestarted_ranks` resolved: 0 where sweep does not start Ray; else at least a node's ranks, or none."""
        if not self.is_embedded or self.prestarted_ranks == 0:
            return 0
        if self.prestarted_ranks == "auto":
            return 2 * self.ranks_per_node if self.is_gpu else 0
        return max(self.prestarted_ranks, self.ranks_per_node)

    @property
    def compile_cache_env(self) -> str:
        """`compile_cache` as a rank's TORCHINDUCTOR_CACHE_DIR: a leading ~ becomes ${HOME}, which Ray expands
        (with any other ${VAR}) in the rank's own process, so it names the home of the node the rank runs on."""
        if self.compile_cache == "~" or self.compile_cache.startswith("~/"):
            return "${HOME}" + self.compile_cache[1:]
        return self.compile_cache

    @property
    def total_ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def memory_per_device_bytes(self) -> int | None:
        """`memory_per_device` in bytes; None when the profile leaves it to the device."""
        return None if self.memory_per_device is None else parse_memory_size(self.memory_per_device)

    def peak_tflops(self, family: str) -> float | None:
        """Peak dense TFLOP/s per device for `family` ('fp32' | 'bf16' | 'fp8'); None on CPU ranks."""
        if family not in PRECISION_FAMILIES:
            raise ValueError(f"unknown precision family {family!r}; valid: {', '.join(PRECISION_FAMILIES)}")
        return self.accelerator_info.peak_tflops[family]  # type: ignore[index]
