"""Energy through `sweep results` (the CLI, over rows written as `sweep run` writes them) and the profile keys."""

from __future__ import annotations

import csv
import datetime as dt
import io

import pyarrow.parquet as pq
import pytest
from conftest import result_row

from sweep.record import store
from sweep.record.energy import ENERGY_COLUMNS
from sweep.record.schema import VERSION_KEY, to_table
from sweep.record.store import write_row

T0 = dt.datetime(2026, 12, 1, 9, 0, tzinfo=dt.timezone.utc)
NEW = (*ENERGY_COLUMNS, "power_cost_per_kwh", "pue", "profile_power_limit_w")  # the columns of schema 1.10


# One H200 trial of GPT-2 1.5B at its measured speed, on `result_row`'s ok trial.
_H200 = {
    "run_id": "r1",
    "cluster": "h200",
    "accelerator": "h200",
    "model": "gpt2-1.5b",
    "compile": "regional",
    "batch_size": 12,
    "seq_len": 1024,
    "tflops_per_gpu": 470.0,
    "mfu": 0.475,
    "tokens_per_s_per_gpu": 24_000.0,
    "peak_mem_gib": 60.0,
    "loss_first": 10.9,
    "loss_last": 7.1,
    "started_at": T0,
    "finished_at": T0,
    "gpu_name": "NVIDIA H200",
}


def _row(trial_id: str, **changes) -> dict:
    return result_row(**{**_H200, "trial_id": trial_id, **changes})


def _energy(jpt: float, power: float = 650.0, **more) -> dict:
    return {
        "joules_per_token": jpt,
        "tokens_per_kwh": 3.6e6 / jpt,
        "tflops_per_watt": 9.4e9 / jpt / 1e12,
        "avg_power_w": power,
        "energy_j": jpt * 1e6,
        "energy_sampled_j": jpt * 1e6 * 1.01,
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1830.0,
        "sm_clock_max_mhz": 1980.0,
        "gpu_temp_c": 61.0,
        "energy_source": "counter",
        **more,
    }


def _csv(result, key: str = "cluster") -> dict[str, dict]:
    assert result.exit_code == 0, result.output
    return {r[key]: r for r in csv.DictReader(io.StringIO(result.stdout))}


def test_dollars_per_million_tokens_add_the_power_bill_where_the_profile_prices_power(tmp_path, cli):
    """GPU-hours: cost / 3600 / tok/s × 1e6; power: J/token × 1e6 / 3.6e6 kWh × PUE × $/kWh (PUE 1 when unset)."""
    clusters = {
        "base": (2.0, 0.10, 1.2, 0.027, 24_000.0),
        "no-pue": (3.0, 0.20, None, 0.020, 30_000.0),
        "no-price": (4.0, None, None, 0.025, 28_000.0),
    }
    for name, (cost, price, pue, jpt, tokens) in clusters.items():
        write_row(
            tmp_path,
            _row(
                name,
                cluster=name,
                cost_per_gpu_hour=cost,
                power_cost_per_kwh=price,
                pue=pue,
                tokens_per_s_per_gpu=tokens,
                **_energy(jpt),
            ),
        )
    got = _csv(cli("results", "compare", tmp_path, "--by", "cluster", "--baseline", "base", "-f", "csv"))

    def expected(name):
        cost, price, pue, jpt, tokens = clusters[name]
        gpu = cost / 3600 / tokens * 1e6
        power = None if price is None else jpt * 1e6 / 3.6e6 * (pue or 1.0) * price
        return gpu, power, gpu + (power or 0.0)

    for name in ("no-pue", "no-price"):
        gpu, power, total = expected(name)
        assert float(got[name]["usd_per_mtok_gpu"]) == pytest.approx(gpu)
        assert float(got[name]["usd_per_mtok"]) == pytest.approx(total)
        assert float(got[name]["base_usd_per_mtok"]) == pytest.approx(expected("base")[2])
        assert float(got[name]["usd_per_mtok_ratio"]) == pytest.approx(total / expected("base")[2])
    assert float(got["no-pue"]["usd_per_mtok_energy"]) == pytest.approx(expected("no-pue")[1])
    assert got["no-price"]["usd_per_mtok_energy"] == ""  # no power price: the GPU-hours alone, no 0 for power
    md = cli("results", "compare", tmp_path, "--by", "cluster", "--baseline", "base", "-f", "md")
    assert md.exit_code == 0, md.output
    assert "$/Mtok power" in md.stdout and f"${expected('no-pue')[2]:.4f}"[:6] in md.stdout


def test_compare_puts_perf_per_watt_beside_speed(tmp_path, cli):
    write_row(tmp_path, _row("a", **_energy(0.030)))
    write_row(tmp_path, _row("b", precision="fp8-torchao-tensorwise", tflops_per_gpu=500.0, **_energy(0.024)))
    got = _csv(cli("results", "compare", tmp_path, "-f", "csv"), "precision")["fp8-torchao-tensorwise"]
    assert float(got["watt_ratio"]) == pytest.approx(0.030 / 0.024)
    table = cli("results", "compare", tmp_path, "-f", "md")
    assert "perf/W vs bf16" in table.stdout and "1.25× (+25.0 %)" in table.stdout


def test_show_and_export_gain_energy_columns_only_when_rows_have_them(tmp_path, cli):
    write_row(tmp_path, _row("cpu", cluster="local", accelerator="cpu", gpu_name=None))
    for command in (("show",), ("export", "-f", "md")):
        plain = cli("results", *command, tmp_path)
        assert plain.exit_code == 0, plain.output
        assert (
            "tok/kWh" not in plain.stdout and "TFLOP/s/W" not in plain.stdout and "power and clocks" not in plain.stdout
        )
    assert "tokens_per_kwh" not in cli("results", "export", tmp_path, "-f", "csv").stdout
    write_row(tmp_path, _row("gpu", **_energy(0.025)))
    for command in (("show",), ("export", "-f", "md")):
        shown = cli("results", *command, tmp_path)
        assert "tok/kWh" in shown.stdout and "TFLOP/s/W" in shown.stdout and "144,000,000" in shown.stdout
    exported = _csv(cli("results", "export", tmp_path, "-f", "csv"))
    assert float(exported["h200"]["tokens_per_kwh"]) == pytest.approx(3.6e6 / 0.025)
    assert exported["local"]["tokens_per_kwh"] == ""  # a CPU rank: null, never 0
    footer = cli("results", "export", tmp_path, "-f", "md").stdout
    assert "- power and clocks: limit 700 W; SM clock median 1,830 MHz, max 1,980 MHz; energy from: counter" in footer


def test_rows_of_schema_1_8_read_back_with_null_energy(tmp_path, cli):
    old = to_table([_row("old")]).drop_columns(list(NEW)).replace_schema_metadata({VERSION_KEY: b"1.8"})
    pq.write_table(old, tmp_path / "old.parquet")
    (back,) = store.read_table(tmp_path).to_pylist()
    assert all(back[c] is None for c in NEW) and back["tflops_per_gpu"] == 470.0
    shown = cli("results", "show", tmp_path)
    assert shown.exit_code == 0, shown.output
    assert "tok/kWh" not in shown.stdout


def test_plot_puts_tokens_per_kwh_on_the_axis_where_rows_measured_it(tmp_path, cli):
    write_row(tmp_path, _row("a"))
    refused = cli("results", "plot", tmp_path, "-o", tmp_path / "p.png", "--metric", "tokens-per-kwh")
    assert refused.exit_code == 2 and "no row" in refused.output and "Traceback" not in refused.output
    write_row(tmp_path, _row("b", batch_size=16, **_energy(0.02)))
    done = cli("results", "plot", tmp_path, "-o", tmp_path / "p.png", "--metric", "tokens-per-kwh")
    assert done.exit_code == 0, done.output
    assert (tmp_path / "p.png").stat().st_size > 0


PROFILE = """name: h200-capped
accelerator: h200
ray_address: auto
nodes: 1
gpus_per_node: 8
"""


def test_profile_power_keys_show_and_are_checked(tmp_path, cli):
    path = tmp_path / "p.yaml"
    path.write_text(PROFILE + "power_limit_w: 500\npower_cost_per_kwh: 0.12\npue: 1.3\n")
    shown = cli("clusters", "show", path)
    assert shown.exit_code == 0, shown.output
    assert "limit 500 W · $0.12/kWh · PUE 1.3" in shown.stdout
    path.write_text(PROFILE + "pue: 0.9\n")
    bad = cli("clusters", "show", path)
    assert bad.exit_code == 2 and "pue" in bad.output and "Traceback" not in bad.output


def test_the_campaign_checker_passes_agreeing_repeats_and_names_what_fails(tmp_path, sweep_env):
    """benchmarks/energy_check.py over rows as the energy-one-gpu campaign writes them (two repeat folders)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "energy_check.py"
    write_row(tmp_path / "repeat-1", _row("a", run_id="r1", **_energy(0.0250)))
    write_row(tmp_path / "repeat-2", _row("a", run_id="r2", **_energy(0.0255)))  # +2 %: agrees
    ok = subprocess.run([sys.executable, script, tmp_path], capture_output=True, text=True, env=sweep_env())
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "repeats' J/token within 2.00 %" in ok.stdout and "FAIL" not in ok.stdout
    write_row(tmp_path / "repeat-2", _row("b", run_id="r2", batch_size=8, **_energy(0.02, power=750.0)))
    bad = subprocess.run([sys.executable, script, tmp_path], capture_output=True, text=True, env=sweep_env())
    assert bad.returncode == 1
    assert "FAIL gpt2-1.5b bf16 batch 8: avg power 750.0 W in (80, 700] W" in bad.stdout
    assert "FAIL gpt2-1.5b bf16 batch 8: 1 repeat(s) with joules per token; 2 needed" in bad.stdout
