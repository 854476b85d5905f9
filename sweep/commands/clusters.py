"""`sweep clusters list` and `sweep clusters show NAME_OR_PATH`: what each cluster profile resolves to."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from sweep.commands._common import user_errors

if TYPE_CHECKING:
    from clusters import ClusterProfile

app = typer.Typer(no_args_is_help=True, help="List and show cluster profiles.")

# Cells are rich Text, never markup strings: a profile's own values ("[...]" in an env var) print as written.
_NONE = "-"


def _ranks(profile: ClusterProfile) -> str:
    per_node = f"auto ({profile.ranks_per_node})" if profile.gpus_per_node == "auto" else str(profile.gpus_per_node)
    return f"{profile.nodes} × {per_node}"


def _memory(profile: ClusterProfile) -> Text:
    """The profile's own memory_per_device, else the accelerator's figure (catalog or declared), dimmed."""
    if profile.memory_per_device is not None:
        return Text(profile.memory_per_device)
    memory_gib = profile.accelerator_info.memory_gib
    return Text(_NONE if memory_gib is None else f"{memory_gib:g} GiB", style="dim")


def _cost(profile: ClusterProfile) -> str:
    return _NONE if profile.cost_per_gpu_hour is None else f"${profile.cost_per_gpu_hour:.2f}"


def _power(profile: ClusterProfile) -> str:
    """'limit 700 W · $0.12/kWh · PUE 1.3' from the profile's power keys; - when it sets none."""
    parts = (
        ([f"limit {profile.power_limit_w:g} W"] if profile.power_limit_w is not None else [])
        + ([f"${profile.power_cost_per_kwh:g}/kWh"] if profile.power_cost_per_kwh is not None else [])
        + ([f"PUE {profile.pue:g}"] if profile.pue is not None else [])
    )
    return " · ".join(parts) or _NONE


@app.command("list")
@user_errors
def list_clusters() -> None:
    """List the shipped cluster profiles."""
    from clusters import load_profile, profile_names

    # in words: "dim" (the style of a datasheet figure) means nothing without colour, or in a pasted table
    table = Table(caption="memory: the profile's memory_per_device, else the datasheet figure", caption_justify="left")
    for header in ("name", "accelerator", "nodes × gpus", "memory", "ray address", "$/GPU-h"):
        table.add_column(header, no_wrap=True)
    for name in profile_names():
        profile = load_profile(name)
        cells = (
            profile.name,
            profile.accelerator,
            _ranks(profile),
            _memory(profile),
            profile.ray_address,
            _cost(profile),
        )
        table.add_row(*(cell if isinstance(cell, Text) else Text(cell) for cell in cells))
    Console().print(table)


@app.command("show")
@user_errors
def show_cluster(
    name_or_path: Annotated[
        str, typer.Argument(help="A profile name (see `sweep clusters list`) or a path to a YAML file.")
    ],
) -> None:
    """Show a profile as sweep resolves it, with its accelerator's peaks and their sources."""
    from clusters import PRECISION_FAMILIES, load_profile

    profile = load_profile(name_or_path)
    accelerator = profile.accelerator_info
    memory = _memory(profile)
    if profile.memory_per_device_bytes is not None:
        memory.append(f" = {profile.memory_per_device_bytes:,} bytes")
    declared = ", declared in this profile" if profile.declares_accelerator else ""
    rows: dict[str, str | Text] = {
        "description": profile.description or _NONE,
        "accelerator": f"{accelerator.name} ({accelerator.vendor}{declared})",
        "ray address": profile.ray_address + (" (embedded Ray, started in-process)" if profile.is_embedded else ""),
        "ranks": f"{_ranks(profile)} = {profile.total_ranks}",
        "cpus per rank": str(profile.cpus_per_rank),
        "memory/device": memory,
        "fp8 flavour": accelerator.fp8_flavour or _NONE,
        "compute capability": _NONE
        if accelerator.compute_capability is None
        else f"{accelerator.compute_capability:.1f}",
        "cost": _cost(profile) + (" per GPU-hour" if profile.cost_per_gpu_hour is not None else ""),
        "power": _power(profile),
        "trial timeout": _NONE if profile.timeout_s is None else f"{profile.timeout_s:g} s",
        "compile cache": profile.compile_cache,
        "env": "\n".join(f"{key}={value}" for key, value in profile.env.items()) or _NONE,
    }
    fields = Table(show_header=False, box=None, title=f"cluster {profile.name}", title_justify="left")
    fields.add_column(style="bold", no_wrap=True)
    fields.add_column()
    for key, value in rows.items():
        fields.add_row(key, value if isinstance(value, Text) else Text(value))

    console = Console()
    console.print(fields)
    if all(profile.peak_tflops(family) is None for family in PRECISION_FAMILIES):
        console.print(Text(f"{accelerator.name}: no peak TFLOP/s; MFU is not defined on {accelerator.vendor} ranks"))
        return
    peaks = Table(title=f"{accelerator.name} peak dense TFLOP/s (the MFU divisor)", title_justify="left")
    peaks.add_column("precision", no_wrap=True)
    peaks.add_column("TFLOP/s", justify="right", no_wrap=True)
    peaks.add_column("source")
    for family in PRECISION_FAMILIES:
        peak = profile.peak_tflops(family)
        source = accelerator.sources.get(family) or (
            f"no {family.upper()}: those recipes are unsupported on {accelerator.name}" if peak is None else _NONE
        )
        peaks.add_row(family, _NONE if peak is None else f"{peak:g}", Text(source))
    if "memory_gib" in accelerator.sources:
        peaks.caption = Text(f"memory: {accelerator.sources['memory_gib']}")
        peaks.caption_justify = "left"
    console.print(peaks)
