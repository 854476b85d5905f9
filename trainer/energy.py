"""A rank's GPU energy over its measured steps: a small meter interface, and the GPU it reads.

`EnergyMeter` is what `trainer.train` holds: `start()` at the first measured step's device sync, `stop()` after
the last measured step's (the syncs the step timing already makes; the meter adds none) returns an
`EnergyReport`, or None where nothing was measured (CPU ranks, no management library).

The window's energy comes from the GPU's cumulative energy counter where it has one (NVML's
`nvmlDeviceGetTotalEnergyConsumption`, mJ; amdsmi's `amdsmi_get_energy_count`, ticks × resolution µJ): the
counter read at `stop` less the one read at `start`. A background thread samples power (and SM clock and
temperature) at `SAMPLE_HZ` through the window; the trapezoid integral of those samples is a second,
independent figure (`sampled_j`), and the energy itself on a part without a counter (`source` "sampled").

The window runs from the start read to the stop read, so it holds the measured steps and what lies between
them (a young-generation collection, rank 0's phase broadcast: milliseconds a step); its power is its energy
over its own seconds. Everything here but the backends is pure and is tested with a fake `GpuDevice`.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

SAMPLE_HZ = 20.0  # NVML refreshes its power reading every ~20-100 ms (part-dependent): faster adds nothing


@dataclass(frozen=True)
class EnergyReport:
    """What one GPU drew over one trial's measured steps."""

    seconds: float  # the window: start read to stop read
    energy_j: float | None  # the counter's, else the sampled figure (`source` says which); None: neither
    source: str | None  # "counter" | "sampled" | None
    sampled_j: float | None  # power samples integrated over the window (None under two samples)
    samples: int
    power_limit_w: float | None  # the enforced limit at the start of the window
    sm_clock_mhz: float | None  # mean of the samples
    sm_clock_max_mhz: float | None  # the part's maximum SM clock
    temperature_c: float | None  # the hottest sample

    @property
    def avg_power_w(self) -> float | None:
        return self.energy_j / self.seconds if self.energy_j is not None and self.seconds > 0 else None


class GpuDevice(Protocol):
    """One GPU through its management library. Every reading is None where the part does not give it."""

    counter_modulus_mj: float | None  # where the counter wraps (None: a 64-bit counter that never does)

    def energy_mj(self) -> float | None: ...

    def power_w(self) -> float | None: ...

    def power_limit_w(self) -> float | None: ...

    def sm_clock_mhz(self) -> float | None: ...

    def sm_clock_max_mhz(self) -> float | None: ...

    def temperature_c(self) -> float | None: ...


class EnergyMeter(Protocol):
    def start(self) -> None: ...

    def stop(self) -> EnergyReport | None: ...


class NullMeter:
    """CPU ranks, and GPUs sweep cannot read: no report, so the row's energy columns stay null (never 0)."""

    def start(self) -> None:
        pass

    def stop(self) -> EnergyReport | None:
        return None


def window_energy_j(start_mj: float | None, end_mj: float | None, modulus_mj: float | None = None) -> float | None:
    """Joules between two counter reads; None when either read failed, or when the counter went backwards and
    does not declare where it wraps (a driver reload resets it: no figure beats a wrong one)."""
    if start_mj is None or end_mj is None:
        return None
    delta = end_mj - start_mj
    if delta < 0:
        if not modulus_mj:
            return None
        delta += modulus_mj  # wrapped once: a window is seconds long, a 32-bit µJ counter wraps in hours
    return delta / 1000.0


def integrate_j(samples: list[tuple[float, float]], start: float, end: float) -> float | None:
    """Trapezoid integral of (time s, power W) samples over [start, end], in joules. Samples outside the window
    are left out; the window's ends take the nearest sample's power. None under two samples in the window."""
    inside = sorted((t, p) for t, p in samples if start <= t <= end)
    if len(inside) < 2:
        return None
    joules = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(inside, inside[1:]))
    return joules + (inside[0][0] - start) * inside[0][1] + (end - inside[-1][0]) * inside[-1][1]


def _safe(read: Callable[[], float | None]) -> float | None:
    """A reading, or None when the library refuses it (not supported, a transient error): a sample lost is no
    reason to lose the trial."""
    try:
        value = read()
    except Exception:  # noqa: BLE001 - pynvml and amdsmi raise their own exception classes
        return None
    return None if value is None else float(value)


class _Sampler(threading.Thread):
    """Reads power, SM clock and temperature every 1/hz s until stopped (a daemon: never holds the process)."""

    def __init__(self, device: GpuDevice, hz: float, clock: Callable[[], float]) -> None:
        super().__init__(daemon=True, name="sweep-energy-sampler")
        self.device, self.period, self.clock = device, 1.0 / hz, clock
        self.power: list[tuple[float, float]] = []
        self.clocks: list[float] = []
        self.temperatures: list[float] = []
        self.halt = threading.Event()

    def sample(self) -> None:
        power = _safe(self.device.power_w)
        if power is not None:
            self.power.append((self.clock(), power))
        for read, into in ((self.device.sm_clock_mhz, self.clocks), (self.device.temperature_c, self.temperatures)):
            value = _safe(read)
            if value is not None:
                into.append(value)

    def run(self) -> None:
        while not self.halt.wait(self.period):
            self.sample()


class DeviceMeter:
    """The meter of one GPU (`GpuDevice`): counter reads at start and stop, power samples between them."""

    def __init__(
        self,
        device: GpuDevice,
        hz: float = SAMPLE_HZ,
        clock: Callable[[], float] = time.perf_counter,
        threaded: bool = True,
    ) -> None:
        self.device, self.hz, self.clock, self.threaded = device, hz, clock, threaded
        self.sampler: _Sampler | None = None
        self.started_at = 0.0
        self.start_mj: float | None = None
        self.limit_w: float | None = None

    def start(self) -> None:
        """Open the window (again after a stop: a process runs many trials). A window left open by a trial that
        failed inside it is dropped."""
        if self.sampler is not None:
            self.sampler.halt.set()
        self.sampler = _Sampler(self.device, self.hz, self.clock)
        self.limit_w = _safe(self.device.power_limit_w)
        self.start_mj = _safe(self.device.energy_mj)
        self.started_at = self.clock()
        self.sampler.sample()  # a sample at each end: a window shorter than one period still integrates
        if self.threaded:
            self.sampler.start()

    def stop(self) -> EnergyReport | None:
        sampler, self.sampler = self.sampler, None
        if sampler is None:
            return None
        sampler.halt.set()
        if sampler.is_alive():
            sampler.join()
        sampler.sample()
        end_mj = _safe(self.device.energy_mj)
        ended_at = self.clock()
        counter = window_energy_j(self.start_mj, end_mj, self.device.counter_modulus_mj)
        sampled = integrate_j(sampler.power, self.started_at, ended_at)
        clocks, temps = sampler.clocks, sampler.temperatures
        return EnergyReport(
            seconds=ended_at - self.started_at,
            energy_j=counter if counter is not None else sampled,
            source="counter" if counter is not None else "sampled" if sampled is not None else None,
            sampled_j=sampled,
            samples=len(sampler.power),
            power_limit_w=self.limit_w,
            sm_clock_mhz=sum(clocks) / len(clocks) if clocks else None,
            sm_clock_max_mhz=_safe(self.device.sm_clock_max_mhz),
            temperature_c=max(temps) if temps else None,
        )


def _log(text: str) -> None:
    print(f"sweep energy: {text}", file=sys.stderr, flush=True)


@functools.cache  # one meter per device and process: the library is initialised once, and a warm rank keeps it
def meter_for(device_type: str, index: int | None = None) -> EnergyMeter:
    """The meter of this rank's device: NVML on NVIDIA, amdsmi on ROCm, NullMeter on CPU or when the library
    is missing or cannot find the device (one log line says why; the energy columns stay null)."""
    if device_type != "cuda":
        return NullMeter()
    from trainer import energy_backends

    try:
        device = energy_backends.open_device(index)
    except energy_backends.Unavailable as e:
        _log(f"not measured on this rank: {e}")
        return NullMeter()
    return DeviceMeter(device)
