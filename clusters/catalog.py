"""The accelerator catalog (`clusters/accelerators.yaml`): peak dense TFLOP/s, memory, FP8 flavour.

The peaks are the MFU divisor, so each one names its source. They are dense (no 2:4 sparsity) and
per device, at the vendor's boost clock.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from clusters._load import read_mapping, validation_message
from clusters.errors import ProfileError

CATALOG_PATH = Path(__file__).with_name("accelerators.yaml")

PrecisionFamily = Literal["fp32", "bf16", "fp8"]
# What a peak is quoted for. fp32 is the matmul path torch takes for fp32: TF32 tensor cores on
# NVIDIA, FP32 matrix cores on AMD (see accelerators.yaml on why these are not like for like).
PRECISION_FAMILIES: tuple[str, ...] = ("fp32", "bf16", "fp8")

PositiveTflops = Annotated[float, Field(gt=0)]


class Accelerator(BaseModel):
    """One device type: a catalog entry (the name is its key in accelerators.yaml), or a part a cluster
    profile declares under `accelerator:` (validated the same way)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """Catalog key (h100, mi300x, cpu, ...) or a declared part's name; recorded in every result row."""
    vendor: Literal["nvidia", "amd", "cpu"]
    compute_capability: Annotated[float, Field(gt=0)] | None = None
    """NVIDIA only: CUDA compute capability (9.0 for sm_90), what decides which precision recipes run."""
    memory_gib: Annotated[float, Field(gt=0)] | None = None
    """Device memory from the datasheet; null for CPU ranks (they share host RAM)."""
    fp8_flavour: Literal["e4m3fn", "e4m3fnuz"] | None = None
    """FP8 E4M3 encoding the hardware computes in: OCP `e4m3fn`, or `e4m3fnuz` on MI300X/MI325X."""
    peak_tflops: dict[PrecisionFamily, PositiveTflops | None]
    """Peak dense TFLOP/s per precision family; null where MFU is not defined (CPU ranks)."""
    sources: dict[str, str] = {}
    """Where each figure comes from, keyed like peak_tflops (plus `memory_gib`)."""

    @model_validator(mode="after")
    def _consistent(self) -> Accelerator:
        missing = [f for f in PRECISION_FAMILIES if f not in self.peak_tflops]
        if missing:
            raise ValueError(f"peak_tflops: give every family {list(PRECISION_FAMILIES)}; missing {missing}")
        unsourced = [f for f, peak in self.peak_tflops.items() if peak is not None and not self.sources.get(f)]
        if unsourced:
            raise ValueError(f"sources: every peak needs a source; missing for {unsourced}")
        if self.vendor == "cpu":
            if any(peak is not None for peak in self.peak_tflops.values()):
                raise ValueError("peak_tflops: must be null for a cpu accelerator (MFU is not defined on CPU ranks)")
        elif self.peak_tflops["bf16"] is None or self.memory_gib is None:
            raise ValueError(f"a {self.vendor} accelerator needs peak_tflops.bf16 and memory_gib")
        if (self.vendor == "nvidia") != (self.compute_capability is not None):
            raise ValueError("compute_capability: give it for an nvidia accelerator (e.g. 9.0), and only there")
        if (self.fp8_flavour is None) != (self.peak_tflops["fp8"] is None):
            raise ValueError("fp8_flavour: set it exactly when peak_tflops.fp8 is set")
        return self

    @property
    def is_gpu(self) -> bool:
        return self.vendor != "cpu"


@functools.lru_cache(maxsize=1)
def load_catalog() -> dict[str, Accelerator]:
    """Every accelerator in accelerators.yaml by name. Read once per process; raises ProfileError if invalid."""
    raw = read_mapping(CATALOG_PATH, "accelerator catalog")
    catalog = {}
    for name, entry in raw.items():
        if not isinstance(entry, dict):
            raise ProfileError(f"Invalid accelerator catalog {CATALOG_PATH.name}: {name}: expected a mapping")
        try:
            catalog[str(name)] = Accelerator.model_validate({**entry, "name": str(name)})
        except ValidationError as e:
            message = validation_message(e, Accelerator)
            raise ProfileError(f"Invalid accelerator catalog {CATALOG_PATH.name}: {name}: {message}") from None
    return catalog
