"""A trial's energy columns from its ranks' reports (`trainer.energy.EnergyReport`). Pure: no torch, no Ray.

Over the measured steps (each GPU's window: its first measured step's sync to its last one's):

    energy_j          = sum over the trial's GPUs of each one's window energy (counter, else sampled power)
    energy_sampled_j  = the same sum of sampled power × time (the trapezoid of ~20 Hz samples): an independent
                        check on the counter
    avg_power_w       = mean over GPUs of (a GPU's energy / its window's seconds): per GPU
    tokens            = world_size × grad_accum × batch_size × seq_len × measured steps
    joules_per_token  = energy_j / tokens
    tokens_per_kwh    = 3.6e6 J/kWh / joules_per_token
    tflops_per_watt   = flops_per_token / joules_per_token / 1e12   (TFLOP per joule = TFLOP/s per W; counted
                        over the same window as the energy, not from the median step)
    power_limit_w     = the enforced limit (max over GPUs); sm_clock_mhz the mean of the GPUs' mean sampled SM
                        clocks; sm_clock_max_mhz the part's maximum; gpu_temp_c the hottest sample of any GPU

A trial where any GPU has no figure has none (a partial sum is no trial's energy): every column null, as on CPU
ranks, never 0. `energy_source` is "counter" when every GPU's came from its counter, else "sampled".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from sweep.record.schema import Row
from trainer.energy import EnergyReport

J_PER_KWH = 3.6e6

ENERGY_COLUMNS = (
    "energy_j",
    "energy_sampled_j",
    "avg_power_w",
    "joules_per_token",
    "tokens_per_kwh",
    "tflops_per_watt",
    "power_limit_w",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "gpu_temp_c",
    "energy_source",
)


def _all(values: list[float | None]) -> list[float] | None:
    present = [v for v in values if v is not None]
    return present if values and len(present) == len(values) else None


def energy_columns(reports: Sequence[EnergyReport | None], *, tokens: float, flops_per_token: float | None) -> Row:
    """The row's energy columns (ENERGY_COLUMNS) from one report per rank (None for a rank that measured none)."""
    out = cast(Row, dict.fromkeys(ENERGY_COLUMNS))  # every energy column, null unless measured below
    present = [r for r in reports if r is not None]
    if not reports or len(present) < len(reports):
        return out
    reports = present
    energies = _all([r.energy_j for r in reports])
    sampled = _all([r.sampled_j for r in reports])
    out["energy_sampled_j"] = sum(sampled) if sampled else None
    limits = [r.power_limit_w for r in reports if r.power_limit_w is not None]
    clocks = [r.sm_clock_mhz for r in reports if r.sm_clock_mhz is not None]
    max_clocks = [r.sm_clock_max_mhz for r in reports if r.sm_clock_max_mhz is not None]
    temps = [r.temperature_c for r in reports if r.temperature_c is not None]
    out.update(
        {
            "power_limit_w": max(limits, default=None),
            "sm_clock_mhz": sum(clocks) / len(clocks) if clocks else None,
            "sm_clock_max_mhz": max(max_clocks, default=None),
            "gpu_temp_c": max(temps, default=None),
        }
    )
    powers = _all([r.avg_power_w for r in reports])
    if energies is None or powers is None:
        return out
    energy = sum(energies)
    out.update(
        {
            "energy_j": energy,
            "avg_power_w": sum(powers) / len(powers),
            "energy_source": "counter" if all(r.source == "counter" for r in reports) else "sampled",
        }
    )
    if energy > 0 and tokens > 0:
        jpt = energy / tokens
        out.update(
            {
                "joules_per_token": jpt,
                "tokens_per_kwh": J_PER_KWH / jpt,
                "tflops_per_watt": flops_per_token / jpt / 1e12 if flops_per_token else None,
            }
        )
    return out


def power_limit_mismatch(row: Row, tolerance_w: float = 1.0) -> str | None:
    """Why a row's measured power limit is not the one its profile declares (`power_limit_w`), or None.
    sweep never sets a limit: a profile that says 700 W on GPUs capped at 350 W compares the wrong parts."""
    declared, measured = row.get("profile_power_limit_w"), row.get("power_limit_w")
    if declared is None or measured is None or abs(declared - measured) <= tolerance_w:
        return None
    return (
        f"cluster {row.get('cluster')} declares power_limit_w {declared:g} W, but its GPUs enforce "
        f"{measured:g} W (sweep never changes a GPU's power limit: fix the profile or the GPUs)"
    )
