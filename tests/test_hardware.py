"""A row's GPU against its profile's accelerator (sweep.record.hardware): pure, on the device names that NVML and ROCm
report."""

from __future__ import annotations

import pytest

from sweep.record.hardware import accelerator_mismatch


@pytest.mark.parametrize(
    "accelerator, gpu",
    [
        ("h200", "NVIDIA H200"),
        ("h100", "NVIDIA H100 80GB HBM3"),
        ("h100-pcie", "NVIDIA H100 PCIe"),
        ("mi300x", "AMD Instinct MI300X"),
        ("b200", "NVIDIA B200"),
        ("cpu", None),  # CPU ranks: no GPU name
        ("my-part", "NVIDIA H100 80GB HBM3"),  # a declared part whose name says no model: nothing to compare
    ],
)
def test_the_same_part_or_an_unknown_one_says_nothing(accelerator, gpu):
    assert accelerator_mismatch({"cluster": "c", "accelerator": accelerator, "gpu_name": gpu}) is None


def test_an_h200_profile_on_an_h100_is_named_with_what_it_gets_wrong():
    row = {"cluster": "h200x1", "accelerator": "h200", "gpu_name": "NVIDIA H100 80GB HBM3"}
    said = accelerator_mismatch(row)
    assert said is not None
    assert said.startswith("cluster h200x1 names its accelerator h200, but its ranks run on NVIDIA H100 80GB HBM3")
    assert "memory predictions and MFU" in said
    assert accelerator_mismatch({**row, "accelerator": "mi300x", "gpu_name": "AMD Instinct MI325X"}) is not None
