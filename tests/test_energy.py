"""The energy meter (trainer.energy) behind its interface, with a fake GPU: the counter and its readings are the
only part faked. The row's energy columns (sweep.record.energy) from the reports, with their formulas."""

from __future__ import annotations

import sys
import time

import pytest

from sweep.record.energy import ENERGY_COLUMNS, energy_columns, power_limit_mismatch
from trainer import energy
from trainer.energy import DeviceMeter, EnergyReport, NullMeter, integrate_j, window_energy_j
from trainer.energy_backends import DeviceIdentity, parse_bdf


class FakeGpu:
    """A GPU whose counter and sensors the test sets; `clock` is the meter's clock too."""

    def __init__(self, *, power_w=300.0, counter_mj=1_000_000.0, modulus=None, fail=()):
        self.t, self.power, self.counter, self.counter_modulus_mj, self.fail = 0.0, power_w, counter_mj, modulus, fail

    def clock(self) -> float:
        return self.t

    def run(self, seconds: float, power_w: float | None = None) -> None:
        """The GPU draws `power_w` for `seconds`: its counter advances as a real one would."""
        self.power = self.power if power_w is None else power_w
        self.t += seconds
        if self.counter is not None:
            self.counter += self.power * seconds * 1000

    def _read(self, name, value):
        if name in self.fail:
            raise RuntimeError(f"NVMLError_NotSupported: {name}")
        return value

    def energy_mj(self):
        return self._read("energy", self.counter)

    def power_w(self):
        return self._read("power", self.power)

    def power_limit_w(self):
        return self._read("limit", 700.0)

    def sm_clock_mhz(self):
        return self._read("clock", 1500.0 + self.power)

    def sm_clock_max_mhz(self):
        return self._read("clock", 1980.0)

    def temperature_c(self):
        return self._read("temp", 40.0 + self.power / 10)


def _metered(gpu: FakeGpu, phases: list[tuple[float, float]]) -> EnergyReport:
    """Open a window, draw each (seconds, watts) phase with a sample after it, close the window."""
    meter = DeviceMeter(gpu, clock=gpu.clock, threaded=False)
    meter.start()
    for seconds, watts in phases:
        gpu.run(seconds, watts)
        meter.sampler.sample()
    return meter.stop()


def test_the_window_is_the_counter_between_start_and_stop():
    gpu = FakeGpu()
    gpu.run(5.0, 80.0)  # idle before the measured steps: outside the window
    report = _metered(gpu, [(1.0, 300.0), (1.0, 500.0)])
    gpu.run(3.0, 80.0)
    assert (report.source, report.energy_j, report.seconds) == ("counter", pytest.approx(800.0), pytest.approx(2.0))
    assert report.avg_power_w == pytest.approx(400.0)
    assert (report.power_limit_w, report.sm_clock_max_mhz) == (700.0, 1980.0)
    assert report.temperature_c == pytest.approx(40.0 + 50.0)  # the hottest sample
    # samples at 0 s (80 W: the window opened on an idle read), 1 s (300), 2 s (500), and the stop's (500)
    assert report.sampled_j == pytest.approx((80 + 300) / 2 + (300 + 500) / 2)
    assert report.sm_clock_mhz == pytest.approx(1500 + (80 + 300 + 500 + 500) / 4)


def test_without_a_counter_the_sampled_power_is_the_energy():
    gpu = FakeGpu(power_w=250.0, counter_mj=None)
    report = _metered(gpu, [(0.5, 250.0)] * 4)
    assert (report.source, report.energy_j, report.sampled_j) == ("sampled", pytest.approx(500.0), pytest.approx(500.0))


def test_an_unsupported_counter_read_falls_back_to_samples():
    report = _metered(FakeGpu(power_w=200.0, fail=("energy",)), [(1.0, 200.0)])
    assert (report.source, report.energy_j) == ("sampled", pytest.approx(200.0))


def test_a_counter_that_went_backwards_is_no_figure_unless_it_says_where_it_wraps():
    assert window_energy_j(5_000.0, 1_000.0) is None  # reset (a driver reload): no figure beats a wrong one
    assert window_energy_j(None, 1_000.0) is None and window_energy_j(1_000.0, None) is None
    assert window_energy_j(9_000.0, 1_000.0, modulus_mj=10_000.0) == pytest.approx(2.0)
    assert window_energy_j(1_000.0, 3_500.0) == pytest.approx(2.5)
    gpu = FakeGpu(power_w=100.0, counter_mj=9_950_000.0, modulus=10_000_000.0)
    meter = DeviceMeter(gpu, clock=gpu.clock, threaded=False)
    meter.start()
    gpu.run(1.0)  # 100 J: past the modulus
    gpu.counter -= gpu.counter_modulus_mj
    assert meter.stop().energy_j == pytest.approx(100.0)


def test_integration_is_the_trapezoid_over_the_window_only():
    samples = [(-1.0, 900.0), (0.5, 100.0), (1.5, 300.0), (9.0, 900.0)]
    # the window's ends take the nearest sample's power; samples outside it are left out
    assert integrate_j(samples, 0.0, 2.0) == pytest.approx(0.5 * 100 + 200 + 0.5 * 300)
    assert integrate_j([(0.5, 100.0)], 0.0, 2.0) is None
    assert integrate_j([], 0.0, 2.0) is None


def test_a_threaded_sampler_integrates_constant_power_to_power_times_time():
    gpu = FakeGpu(power_w=250.0, counter_mj=None)
    meter = DeviceMeter(gpu, hz=50.0)  # the real clock and thread
    meter.start()
    time.sleep(0.3)
    report = meter.stop()
    assert report.samples >= 3 and report.source == "sampled"
    assert report.energy_j == pytest.approx(250.0 * report.seconds)
    assert meter.stop() is None  # closed: a second stop measures nothing


def test_a_window_left_open_by_a_failed_trial_is_dropped_at_the_next_start():
    gpu = FakeGpu()
    meter = DeviceMeter(gpu, clock=gpu.clock, threaded=False)
    meter.start()
    gpu.run(10.0, 600.0)  # the trial failed here; nobody stopped the meter
    meter.start()
    gpu.run(1.0, 300.0)
    assert meter.stop().energy_j == pytest.approx(300.0)


def test_cpu_ranks_get_the_null_meter():
    assert isinstance(energy.meter_for("cpu"), NullMeter)
    assert NullMeter().stop() is None


def test_a_gpu_without_nvidia_ml_py_is_not_measured_and_says_so_once(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    energy.meter_for.cache_clear()
    try:
        first, again = energy.meter_for("cuda", 0), energy.meter_for("cuda", 0)
    finally:
        energy.meter_for.cache_clear()
    assert isinstance(first, NullMeter) and again is first
    assert capsys.readouterr().err.splitlines() == [
        "sweep energy: not measured on this rank: nvidia-ml-py (pynvml) is not installed"
    ]


def test_the_device_is_found_by_its_pci_address_in_the_libraries_form():
    assert DeviceIdentity(uuid=None, pci=(0, 0x19, 0)).pci_bus_id == "0000:19:00.0"
    assert parse_bdf("00000000:19:00.0") == parse_bdf("0000:19:00.0") == (0, 0x19, 0)
    assert parse_bdf("N/A") is None


def _report(energy_j, seconds=2.0, source="counter", sampled=None, clock=1800.0, temp=60.0) -> EnergyReport:
    return EnergyReport(
        seconds=seconds,
        energy_j=energy_j,
        source=source,
        sampled_j=sampled or energy_j,
        samples=40,
        power_limit_w=700.0,
        sm_clock_mhz=clock,
        sm_clock_max_mhz=1980.0,
        temperature_c=temp,
    )


def test_row_columns_sum_energy_over_gpus_and_average_power_per_gpu():
    reports = [_report(1000.0, clock=1800.0, temp=60.0), _report(1200.0, sampled=1150.0, clock=1700.0, temp=65.0)]
    tokens, fpt = 2 * 4 * 1024 * 10, 6 * 1.5e9
    got = energy_columns(reports, tokens=tokens, flops_per_token=fpt)
    jpt = 2200.0 / tokens
    assert got == pytest.approx(
        {
            "energy_j": 2200.0,
            "energy_sampled_j": 2150.0,
            "avg_power_w": (500.0 + 600.0) / 2,
            "joules_per_token": jpt,
            "tokens_per_kwh": 3.6e6 / jpt,
            "tflops_per_watt": fpt / jpt / 1e12,
            "power_limit_w": 700.0,
            "sm_clock_mhz": 1750.0,
            "sm_clock_max_mhz": 1980.0,
            "gpu_temp_c": 65.0,
            "energy_source": "counter",
        }
    )


def test_a_trial_with_any_unmeasured_gpu_has_null_energy_never_zero():
    assert energy_columns([None], tokens=100, flops_per_token=1.0) == dict.fromkeys(ENERGY_COLUMNS)  # a CPU rank
    partial = energy_columns([_report(1000.0), None], tokens=100, flops_per_token=1.0)
    assert partial == dict.fromkeys(ENERGY_COLUMNS)
    unread = energy_columns([_report(None, source=None, sampled=None)], tokens=100, flops_per_token=1.0)
    assert unread["energy_j"] is None and unread["joules_per_token"] is None and unread["power_limit_w"] == 700.0
    sampled = energy_columns([_report(1000.0), _report(900.0, source="sampled")], tokens=100, flops_per_token=1.0)
    assert sampled["energy_source"] == "sampled"


def test_a_declared_power_limit_that_the_gpus_do_not_enforce_is_named():
    row = {"cluster": "h200-350", "profile_power_limit_w": 350.0, "power_limit_w": 700.0}
    assert "declares power_limit_w 350 W, but its GPUs enforce 700 W" in power_limit_mismatch(row)
    assert power_limit_mismatch({**row, "power_limit_w": 350.4}) is None
    assert power_limit_mismatch({**row, "power_limit_w": None}) is None  # CPU ranks
    assert power_limit_mismatch({**row, "profile_power_limit_w": None}) is None


LOCAL_PRICED = """name: local-priced
accelerator: cpu
ray_address: local
nodes: 1
gpus_per_node: 1
cpus_per_rank: 1
power_cost_per_kwh: 0.15
pue: 1.2
power_limit_w: 700
"""


@pytest.mark.integration
def test_cpu_ranks_write_null_energy_and_the_profile_power_keys(ray_session, cli, write_grid, tmp_path):
    """A real `sweep run` (Ray, FSDP2 over gloo): CPU ranks have no meter, so every energy column is null (never
    0), while the profile's power price, PUE and declared limit are recorded on the row."""
    from sweep.record import store

    grid = write_grid(
        "name: e\nmodels: [gpt-tiny]\nprecisions: [fp32]\nbatch_sizes: [2]\ncompile: none\n"
        "seq_len: 32\ngpus: 1\nsteps: {warmup: 1, measure: 3}\n"
    )
    profile = tmp_path / "local-priced.yaml"
    profile.write_text(LOCAL_PRICED)
    result = cli("run", grid, "--cluster", profile, "--output", tmp_path / "out", "--no-progress")
    assert result.exit_code == 0, result.output
    (row,) = store.read_table(tmp_path / "out").to_pylist()
    assert row["status"] == "ok" and row["tflops_per_gpu"] > 0
    assert {c: row[c] for c in ENERGY_COLUMNS} == dict.fromkeys(ENERGY_COLUMNS)
    assert (row["power_cost_per_kwh"], row["pue"], row["profile_power_limit_w"]) == (0.15, 1.2, 700.0)
    assert "power_limit_w" not in result.output  # nothing measured: nothing to warn of


class FakePynvml:
    """pynvml's surface that NvmlDevice uses (the library in front of the counter is the faked part here)."""

    NVML_CLOCK_SM, NVML_TEMPERATURE_GPU, NVML_FI_DEV_POWER_INSTANT, NVML_SUCCESS = 1, 0, 186, 0

    class NVMLError(Exception):
        pass

    def __init__(self, instant_ok: bool):
        self.instant_ok, self.looked_up = instant_ok, []

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.looked_up.append(uuid)
        raise self.NVMLError("Not Found")  # a MIG slice's UUID, say

    def nvmlDeviceGetHandleByPciBusId(self, bus_id):
        self.looked_up.append(bus_id)
        return "handle"

    def nvmlDeviceGetFieldValues(self, handle, fields):
        import types

        return [
            types.SimpleNamespace(nvmlReturn=0 if self.instant_ok else 3, value=types.SimpleNamespace(uiVal=691_500))
        ]

    def nvmlDeviceGetPowerUsage(self, handle):
        return 650_000

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 700_000


@pytest.mark.parametrize("instant_ok,watts", [(True, 691.5), (False, 650.0)])
def test_nvml_power_is_the_instant_field_where_the_driver_has_it(monkeypatch, instant_ok, watts):
    from trainer.energy_backends import NvmlDevice

    fake = FakePynvml(instant_ok)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpu = NvmlDevice(DeviceIdentity(uuid="GPU-bb25727c", pci=(0, 0, 6)))
    assert fake.looked_up == ["GPU-bb25727c", "0000:00:06.0"]  # the UUID first, then the PCI address
    assert (gpu.power_w(), gpu.power_w(), gpu.power_limit_w()) == (watts, watts, 700.0)
