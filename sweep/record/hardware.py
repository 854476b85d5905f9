"""Whether a row ran on the accelerator its cluster profile names. Pure: rows are dicts.

The profile's accelerator sets the memory the plan predicts against (a trial predicted not to fit is never run) and
the peaks MFU divides by; a profile for one part run on another gets both wrong without an error. Session 29 ran the
H200 profile on a lent H100: a batch predicted to fit in 139.7 GiB ran into an OOM on 78 (benchmarks/RESULTS.md "Cold
sweep"). The rows know the GPU (`gpu_name`, from the device); this compares its model with the profile's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# A part's model in a device name ("NVIDIA H100 80GB HBM3", "AMD Instinct MI300X") and in a catalog key ("h100-pcie",
# "mi300x"): a letter or two, then digits, an optional X. Names without one (a declared part, a CPU) compare nothing.
_MODEL = re.compile(r"\b(a|h|b|gb|l|mi)(\d{2,3})(x?)\b", re.IGNORECASE)


def _model(name: str) -> str | None:
    found = _MODEL.search(name.replace("-", " ").replace("_", " "))
    return "".join(found.groups()).lower() if found else None


def accelerator_mismatch(row: Mapping[str, Any]) -> str | None:
    """Why a row's GPU is not the part its profile names (`accelerator`), or None (the same part, or either unknown)."""
    declared, gpu = row.get("accelerator"), row.get("gpu_name")
    if not declared or not gpu:
        return None
    want, got = _model(str(declared)), _model(str(gpu))
    if want is None or got is None or want == got:
        return None
    return (
        f"cluster {row.get('cluster')} names its accelerator {declared}, but its ranks run on {gpu}: memory "
        f"predictions and MFU use {declared}'s memory and peaks (give the profile the accelerator it runs on)"
    )
