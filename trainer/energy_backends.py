"""The GPU management libraries behind `trainer.energy.GpuDevice`: NVML (nvidia-ml-py's `pynvml`) and amdsmi.

A rank finds its GPU by the identity torch gives the device (its UUID, else its PCI address), never by its
index: Ray sets CUDA_VISIBLE_DEVICES (HIP_VISIBLE_DEVICES) per actor, so torch's cuda:0 is whichever GPU Ray
gave the rank, while NVML and amdsmi number every GPU of the machine. Neither library is needed to import
this module; each is imported when a rank opens its device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class Unavailable(Exception):
    """The rank's GPU cannot be read (no library, not found): its energy is not measured."""


@dataclass(frozen=True)
class DeviceIdentity:
    """How torch names a device, in the forms the management libraries look GPUs up by."""

    uuid: str | None  # "GPU-8e1c...", NVML's form
    pci: tuple[int, int, int] | None  # (domain, bus, device)

    @property
    def pci_bus_id(self) -> str | None:
        """'0000:19:00.0': the form NVML's nvmlDeviceGetHandleByPciBusId and amdsmi's BDF take."""
        return None if self.pci is None else "{:04x}:{:02x}:{:02x}.0".format(*self.pci)


def parse_bdf(text: str) -> tuple[int, int, int] | None:
    """(domain, bus, device) of '0000:19:00.0' or '00000000:19:00.0'; None when it is not one."""
    try:
        domain, bus, rest = text.strip().split(":")
        return int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
    except ValueError:
        return None


def identity(index: int | None) -> DeviceIdentity:
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index)
    uuid = getattr(props, "uuid", None)
    uuid = None if uuid is None else str(uuid)
    if uuid is not None and not uuid.startswith("GPU-"):
        uuid = "GPU-" + uuid
    parts = [getattr(props, f"pci_{name}_id", None) for name in ("domain", "bus", "device")]
    return DeviceIdentity(uuid=uuid, pci=None if None in parts else tuple(parts))  # type: ignore[arg-type]


def open_device(index: int | None) -> NvmlDevice | AmdSmiDevice:
    """The rank's GPU through NVML (CUDA builds of torch) or amdsmi (ROCm builds); raises Unavailable."""
    import torch

    backend = AmdSmiDevice if torch.version.hip else NvmlDevice
    backend.library()  # before asking torch: a machine without the library says so, whatever its devices
    return backend(identity(index))


def driver_version() -> str | None:
    """The NVIDIA driver's version from NVML (its init and shutdown are counted: an open device stays open); None
    where NVML does not answer."""
    try:
        nvml = NvmlDevice.library()
        nvml.nvmlInit()
        try:
            version = nvml.nvmlSystemGetDriverVersion()
        finally:
            nvml.nvmlShutdown()
    except Exception:  # Unavailable, or NVML's own error: the caller asks nvidia-smi
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


class _Library:
    """What the NVML and amdsmi devices share: the library imported when a rank opens its GPU, initialised, and
    the rank's GPU found in it; a failure of any of these is Unavailable (the energy is not measured)."""

    module = ""  # the Python module of the library
    missing = ""  # what Unavailable says when it does not import
    label = ""  # the library's name in Unavailable's message

    @classmethod
    def library(cls) -> Any:
        import importlib

        try:
            return importlib.import_module(cls.module)
        except ImportError:
            raise Unavailable(cls.missing) from None

    def __init__(self, who: DeviceIdentity) -> None:
        self.lib = self.library()
        try:
            self._start()
            self.handle = self._find(who)
        except self._error() as e:
            raise Unavailable(f"{self.label}: {e}") from None

    def _start(self) -> None:
        raise NotImplementedError

    def _error(self) -> type[Exception]:
        raise NotImplementedError

    def _find(self, who: DeviceIdentity) -> Any:
        raise NotImplementedError


class NvmlDevice(_Library):
    """An NVIDIA GPU through NVML. The energy counter is mJ since the driver loaded (Volta and later)."""

    counter_modulus_mj: float | None = None  # unsigned long long mJ: never wraps
    module, missing, label = "pynvml", "nvidia-ml-py (pynvml) is not installed", "NVML"

    def _start(self) -> None:
        self.nvml = self.lib
        self.instant = True  # until the driver refuses the instant power field
        self.nvml.nvmlInit()

    def _error(self) -> type[Exception]:
        return self.lib.NVMLError

    def _find(self, who: DeviceIdentity) -> Any:
        if who.uuid is not None:
            try:
                return self.nvml.nvmlDeviceGetHandleByUUID(who.uuid)
            except self.nvml.NVMLError:
                pass  # a MIG slice's UUID, say: try the PCI address
        if who.pci_bus_id is None:
            raise Unavailable("torch gives the device neither a UUID nor a PCI address")
        return self.nvml.nvmlDeviceGetHandleByPciBusId(who.pci_bus_id)

    def energy_mj(self) -> float | None:
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)

    def power_w(self) -> float | None:
        """The instantaneous reading where the driver has it (field NVML_FI_DEV_POWER_INSTANT, driver 535+):
        nvmlDeviceGetPowerUsage is a one-second average on Hopper, whose lag put an 8 s window's integral 6 %
        under the counter on an H200, where the instant field came within 0.3 %."""
        field = getattr(self.nvml, "NVML_FI_DEV_POWER_INSTANT", None)
        if field is not None and self.instant:
            value = self.nvml.nvmlDeviceGetFieldValues(self.handle, [field])[0]
            if value.nvmlReturn == self.nvml.NVML_SUCCESS:
                return value.value.uiVal / 1000.0  # mW
            self.instant = False  # not on this driver: the average from now on
        return self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0  # mW

    def power_limit_w(self) -> float | None:
        return self.nvml.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1000.0  # mW

    def sm_clock_mhz(self) -> float | None:
        return self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM)

    def sm_clock_max_mhz(self) -> float | None:
        return self.nvml.nvmlDeviceGetMaxClockInfo(self.handle, self.nvml.NVML_CLOCK_SM)

    def temperature_c(self) -> float | None:
        return self.nvml.nvmlDeviceGetTemperature(self.handle, self.nvml.NVML_TEMPERATURE_GPU)


def _number(value: Any) -> float | None:
    """amdsmi answers 'N/A' for a field a part lacks."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class AmdSmiDevice(_Library):
    """An AMD GPU through amdsmi (ROCm ships it). Energy: accumulator ticks × counter_resolution µJ; power in
    W; the power cap in µW; clocks in MHz (the GFX clock is the SM clock's counterpart)."""

    counter_modulus_mj: float | None = None  # a 64-bit accumulator
    module, missing, label = "amdsmi", "amdsmi is not importable (ROCm's share/amd_smi on PYTHONPATH?)", "amdsmi"

    def _start(self) -> None:
        self.smi = self.lib
        self.smi.amdsmi_init()

    def _error(self) -> type[Exception]:
        return self.lib.AmdSmiException

    def _find(self, who: DeviceIdentity) -> Any:
        if who.pci is None:
            raise Unavailable("torch gives the device no PCI address")
        for handle in self.smi.amdsmi_get_processor_handles():
            if parse_bdf(self.smi.amdsmi_get_gpu_device_bdf(handle)) == who.pci:
                return handle
        raise Unavailable(f"no GPU at {who.pci_bus_id} among amdsmi's processors")

    def energy_mj(self) -> float | None:
        count = self.smi.amdsmi_get_energy_count(self.handle)
        ticks = count.get("energy_accumulator", count.get("power"))  # renamed in ROCm 6.x
        resolution = _number(count.get("counter_resolution"))
        return None if _number(ticks) is None or resolution is None else ticks * resolution / 1000.0  # µJ

    def power_w(self) -> float | None:
        info = self.smi.amdsmi_get_power_info(self.handle)
        for key in ("socket_power", "current_socket_power", "average_socket_power"):  # ROCm 7, MI300, older
            if _number(info.get(key)) is not None:
                return _number(info[key])
        return None

    def power_limit_w(self) -> float | None:
        cap = _number(self.smi.amdsmi_get_power_cap_info(self.handle).get("power_cap"))
        return None if cap is None else cap / 1e6

    def _gfx_clock(self) -> dict:
        return self.smi.amdsmi_get_clock_info(self.handle, self.smi.AmdSmiClkType.GFX)

    def sm_clock_mhz(self) -> float | None:
        info = self._gfx_clock()
        return _number(info.get("clk", info.get("cur_clk")))

    def sm_clock_max_mhz(self) -> float | None:
        return _number(self._gfx_clock().get("max_clk"))

    def temperature_c(self) -> float | None:
        return _number(
            self.smi.amdsmi_get_temp_metric(
                self.handle, self.smi.AmdSmiTemperatureType.HOTSPOT, self.smi.AmdSmiTemperatureMetric.CURRENT
            )
        )
