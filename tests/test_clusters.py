"""Cluster profiles, the accelerator catalog and `sweep clusters`: pure, no Ray, no torch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import invoke

import clusters
from clusters import Accelerator, ClusterProfile, load_catalog, load_profile, parse_memory_size, profile_names
from clusters.errors import ProfileError

SHIPPED = ["b200", "h100", "h200", "local", "mi300x", "mi325x", "mi355x"]

VALID = {"name": "mine", "accelerator": "h100", "ray_address": "auto", "nodes": 2, "gpus_per_node": 8}


def write_profile(tmp_path: Path, body: str | dict, filename: str = "mine.yaml") -> Path:
    path = tmp_path / filename
    path.write_text(body if isinstance(body, str) else yaml.safe_dump(body), encoding="utf-8")
    return path


def load_error(tmp_path: Path, body: str | dict) -> str:
    with pytest.raises(ProfileError) as info:
        load_profile(str(write_profile(tmp_path, body)))
    message = str(info.value)
    assert "\n" not in message
    return message


# --- the registry and the shipped profiles -------------------------------------------------------


def test_registry_lists_exactly_the_shipped_profiles():
    assert profile_names() == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_profile_loads_and_is_consistent(name):
    profile = load_profile(name)
    assert profile.name == name  # file stem and name agree, so results name the profile users asked for
    assert profile.accelerator in load_catalog()
    assert profile.total_ranks == profile.nodes * profile.ranks_per_node >= 1
    assert "ROCR_VISIBLE_DEVICES" not in profile.env
    if profile.is_gpu:
        assert profile.ray_address == "auto" and profile.nodes == 1 and profile.gpus_per_node == 8
        assert profile.cpus_per_rank == 4
        assert profile.peak_tflops("bf16") > 0 and profile.peak_tflops("fp8") > 0
        vendor = profile.accelerator_info.vendor
        alloc_conf = {"nvidia": "PYTORCH_CUDA_ALLOC_CONF", "amd": "PYTORCH_HIP_ALLOC_CONF"}[vendor]
        assert profile.env[alloc_conf] == "expandable_segments:True"


def test_local_profile_is_embedded_cpu_one_rank_per_usable_cpu(monkeypatch):
    profile = load_profile("local")
    assert profile.is_embedded and not profile.is_gpu
    assert profile.gpus_per_node == "auto" and profile.cpus_per_rank == 1
    monkeypatch.setattr("clusters.schema.usable_cpus", lambda: 12)
    assert profile.ranks_per_node == 12 and profile.total_ranks == 12
    assert [profile.peak_tflops(f) for f in ("fp32", "bf16", "fp8")] == [None, None, None]


def test_h200_keeps_nvlink_multicast_off():
    env = load_profile("h200").env
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ProfileError, match=r"unknown cluster 'nope'; valid: b200, h100, h200, local, mi300x"):
        load_profile("nope")
    with pytest.raises(ProfileError, match="unknown cluster 'accelerators'"):  # the catalog is not a profile
        load_profile("accelerators")


def test_a_path_loads_and_resolves(tmp_path, monkeypatch):
    body = {**VALID, "memory_per_device": "64GiB", "cost_per_gpu_hour": 3, "timeout_s": 900, "env": {"A": "1"}}
    path = write_profile(tmp_path, body)
    profile = load_profile(str(path))
    assert profile.name == "mine" and profile.total_ranks == 16
    assert profile.memory_per_device_bytes == 64 * 2**30
    assert profile.cost_per_gpu_hour == 3.0 and profile.timeout_s == 900.0
    assert profile.cpus_per_rank == 4  # the GPU default
    assert profile.peak_tflops("bf16") == 989.4 and not profile.is_embedded
    monkeypatch.chdir(tmp_path)
    assert load_profile("mine.yaml") == profile  # a bare file name is a path too (it ends in .yaml)


def test_missing_file(tmp_path):
    with pytest.raises(ProfileError, match="cluster profile file not found: .*nothere.yaml"):
        load_profile(str(tmp_path / "nothere.yaml"))


# --- the catalog ----------------------------------------------------------------------------------


def test_catalog_figures_are_dense_and_sourced():
    catalog = load_catalog()
    assert set(catalog) == {
        "a100",
        "h100",
        "h100-pcie",
        "h100-nvl",
        "h200",
        "b200",
        "mi300x",
        "mi325x",
        "mi355x",
        "cpu",
    }
    assert catalog["h100"].peak_tflops == {"fp32": 494.7, "bf16": 989.4, "fp8": 1978.9}
    assert catalog["h200"].peak_tflops == catalog["h100"].peak_tflops
    assert (
        catalog["mi325x"].peak_tflops == catalog["mi300x"].peak_tflops == {"fp32": 163.4, "bf16": 1307.4, "fp8": 2614.9}
    )
    assert (catalog["b200"].peak_tflops["bf16"], catalog["b200"].peak_tflops["fp8"]) == (2250, 4500)
    assert (catalog["mi355x"].peak_tflops["bf16"], catalog["mi355x"].peak_tflops["fp8"]) == (2516.6, 5033.2)
    assert catalog["a100"].peak_tflops == {"fp32": 156, "bf16": 312, "fp8": None}  # Ampere: no FP8
    assert catalog["h100-pcie"].peak_tflops == {"fp32": 378, "bf16": 756.5, "fp8": 1513}
    assert catalog["h100-nvl"].peak_tflops == {"fp32": 417.5, "bf16": 835.5, "fp8": 1670.5}
    memory = {name: acc.memory_gib for name, acc in catalog.items()}
    assert memory == {
        "a100": 80,
        "h100": 80,
        "h100-pcie": 80,
        "h100-nvl": 94,
        "h200": 141,
        "b200": 180,
        "mi300x": 192,
        "mi325x": 256,
        "mi355x": 288,
        "cpu": None,
    }
    for acc in catalog.values():
        if acc.is_gpu:
            assert all(acc.sources[f] for f in acc.peak_tflops if acc.peak_tflops[f] is not None)
            assert "https://" in acc.sources["bf16"] and acc.sources["memory_gib"]
            if acc.peak_tflops["fp8"] is not None:
                assert acc.peak_tflops["fp8"] == pytest.approx(2 * acc.peak_tflops["bf16"], rel=1e-3)


def test_fp8_flavour_follows_the_hardware():
    flavours = {name: acc.fp8_flavour for name, acc in load_catalog().items()}
    assert flavours == {
        "h100": "e4m3fn", "h100-pcie": "e4m3fn", "h100-nvl": "e4m3fn", "h200": "e4m3fn", "b200": "e4m3fn",
        "mi355x": "e4m3fn", "mi300x": "e4m3fnuz", "mi325x": "e4m3fnuz", "a100": None, "cpu": None,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"peak_tflops": {"fp32": 1.0, "bf16": 2.0}}, "give every family"),
        ({"sources": {"fp32": "x", "bf16": "y"}}, "every peak needs a source; missing for ['fp8']"),
        ({"fp8_flavour": None}, "fp8_flavour: set it exactly when peak_tflops.fp8 is set"),
        ({"vendor": "cpu"}, "must be null for a cpu accelerator"),
        ({"fp8_flavour": "e5m2"}, "fp8_flavour"),
        ({"compute_capability": None}, "compute_capability: give it for an nvidia accelerator"),
        ({"vendor": "amd", "fp8_flavour": "e4m3fnuz"}, "compute_capability: give it for an nvidia accelerator"),
    ],
)
def test_catalog_entries_are_checked(change, expected):
    entry = {
        "name": "x", "vendor": "nvidia", "compute_capability": 9.0, "memory_gib": 80, "fp8_flavour": "e4m3fn",
        "peak_tflops": {"fp32": 1.0, "bf16": 2.0, "fp8": 4.0}, "sources": {"fp32": "a", "bf16": "b", "fp8": "c"},
    }  # fmt: skip
    Accelerator.model_validate(entry)
    with pytest.raises(ValueError, match=re.escape(expected)):
        Accelerator.model_validate({**entry, **change})


def test_peak_tflops_rejects_an_unknown_family():
    with pytest.raises(ValueError, match="unknown precision family 'fp16'; valid: fp32, bf16, fp8"):
        load_profile("h100").peak_tflops("fp16")


# --- malformed profiles: one line, naming the field -----------------------------------------------


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"nodez": 2}, r"unknown key 'nodez' — did you mean 'nodes'\?"),
        ({"zzz": 2}, r"unknown key 'zzz'; valid keys: accelerator, .*timeout_s"),
        ({"nodes": "two"}, r"nodes: Input should be a valid integer \(got 'two'\)"),
        ({"nodes": "2"}, r"nodes: Input should be a valid integer"),  # strict: a quoted number is a mistake
        ({"nodes": -1}, r"nodes: Input should be greater than or equal to 1 \(got -1\)"),
        ({"nodes": True}, r"nodes: Input should be a valid integer"),
        ({"gpus_per_node": 0}, r"gpus_per_node: expected a whole number >= 1, or 'auto'"),
        ({"gpus_per_node": "auto"}, r"gpus_per_node: 'auto' is only for CPU profiles"),
        ({"accelerator": "a1000"}, r"accelerator: unknown accelerator 'a1000' — did you mean 'a100'\?$"),
        (
            {"accelerator": "gaudi3"},
            r"accelerator: unknown accelerator 'gaudi3'; valid: a100, b200, cpu, h100, h100-nvl, "
            r"h100-pcie, h200, mi300x, mi325x, mi355x \(or a mapping that declares the part",
        ),
        ({"accelerator": ["h100"]}, r"accelerator: expected a name from clusters/accelerators.yaml, or a mapping"),
        ({"ray_address": "http://head"}, r"ray_address: expected 'local', 'auto', 'ray://host:port' or 'host:port'"),
        ({"ray_address": "head:99999"}, r"ray_address: expected"),
        ({"ray_address": "local"}, r"nodes: ray_address 'local' starts Ray on this machine only; nodes must be 1"),
        ({"memory_per_device": "80 gigs"}, r"memory_per_device: expected a size with a unit, like 80GiB"),
        ({"memory_per_device": 80}, r"memory_per_device: expected a size with a unit.*\(got 80\)"),
        ({"env": {"NCCL_NVLS_ENABLE": 0}}, r"env\.NCCL_NVLS_ENABLE: values must be strings; quote it"),
        ({"env": {"ROCR_VISIBLE_DEVICES": "0"}}, r"env\.ROCR_VISIBLE_DEVICES: set per rank by Ray and sweep"),
        ({"env": {"1BAD": "x"}}, r"env\.1BAD: not an environment variable name"),
        ({"env": ["A=1"]}, r"env: Input should be a valid dictionary"),
        ({"cost_per_gpu_hour": -1}, r"cost_per_gpu_hour: Input should be greater than or equal to 0"),
        ({"timeout_s": 0}, r"timeout_s: Input should be greater than 0"),
        ({"cpus_per_rank": 0}, r"cpus_per_rank: Input should be greater than or equal to 1"),
        ({"name": "has space"}, r"name: String should match pattern"),
    ],
)
def test_schema_violations_name_the_field(tmp_path, change, expected):
    message = load_error(tmp_path, {**VALID, **change})
    assert message.startswith("Invalid cluster profile ") and "mine.yaml: " in message
    assert re.search(expected, message), message


def test_a_missing_required_key_is_named(tmp_path):
    body = {k: v for k, v in VALID.items() if k != "accelerator"}
    assert load_error(tmp_path, body).endswith("mine.yaml: accelerator: required key is missing")


def test_auto_ranks_need_an_embedded_cpu_cluster(tmp_path):
    body = {**VALID, "accelerator": "cpu", "gpus_per_node": "auto"}
    assert "gpus_per_node: 'auto' needs ray_address: local" in load_error(tmp_path, body)
    profile = load_profile(str(write_profile(tmp_path, {**body, "ray_address": "local", "nodes": 1})))
    assert profile.cpus_per_rank == 1  # the CPU default


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("name: [unclosed\n", r"YAML error at line 2, column 1: expected ',' or ']'"),
        ("", r"the file is empty"),
        ("# nothing but a comment\n", r"the file is empty"),
        ("- a\n- b\n", r"expected a mapping of keys, got a list"),
        ("name: !!python/object/apply:os.system ['echo pwned']\n", r"could not determine a constructor for the tag"),
        ("!!python/object:os.system {}\n", r"could not determine a constructor for the tag"),
        ("name: a\nnodes: 1\nnodes: 2\n", r"YAML error at line 3, column 1: key 'nodes' appears twice"),
        ("env: {A: '1'}\nenv: {B: '2'}\n", r"key 'env' appears twice"),  # YAML alone would keep only B
    ],
)
def test_unreadable_yaml_is_one_line(tmp_path, body, expected):
    message = load_error(tmp_path, body)
    assert message.startswith("Invalid cluster profile ")
    assert re.search(expected, message), message


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("80GiB", 80 * 2**30), ("192GB", 192 * 10**9), ("512MiB", 512 * 2**20), ("512mb", 512 * 10**6),
        ("4KiB", 4096), ("1024B", 1024), ("0.5 gib", 2**29), (" 2TiB ", 2 * 2**40),
    ],
)  # fmt: skip
def test_memory_sizes(text, size):
    assert parse_memory_size(text) == size


@pytest.mark.parametrize("text", ["80", "GiB", "80 GiBs", "-1GiB", "0GiB", "80 Gb/s", ""])
def test_bad_memory_sizes(text):
    with pytest.raises(ValueError):
        parse_memory_size(text)


def test_profile_module_imports_neither_torch_nor_ray():
    assert clusters.ClusterProfile is ClusterProfile
    code = (
        "import clusters, sys; clusters.load_profile('h100'); print([m for m in ('torch', 'ray') if m in sys.modules])"
    )
    repo = Path(__file__).parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo)
    assert out.stdout.strip() == "[]"


# --- the CLI --------------------------------------------------------------------------------------


def test_cli_list():
    result = invoke("clusters", "list", env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    for name in SHIPPED:
        assert name in result.stdout
    assert "1 × 8" in result.stdout and "192 GiB" in result.stdout


def test_cli_show(tmp_path):
    result = invoke("clusters", "show", "mi300x", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for text in (
        "mi300x (amd)",
        "e4m3fnuz",
        "1307.4",
        "2614.9",
        "163.4",
        "AMD Instinct MI300X",
        "PYTORCH_HIP_ALLOC_CONF",
    ):
        assert text in result.stdout

    path = write_profile(tmp_path, {**VALID, "memory_per_device": "64GiB", "env": {"NCCL_DEBUG": "[WARN]"}})
    result = invoke("clusters", "show", str(path), env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "2 × 8 = 16" in result.stdout and "68,719,476,736 bytes" in result.stdout
    assert "NCCL_DEBUG=[WARN]" in result.stdout  # printed as written, not eaten as Rich markup

    result = invoke("clusters", "show", "local")
    assert result.exit_code == 0 and "MFU is not defined" in result.stdout


def test_cli_show_unknown_is_one_line_exit_2(monkeypatch):
    monkeypatch.delenv("SWEEP_DEBUG", raising=False)
    result = invoke("clusters", "show", "nope")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: unknown cluster 'nope'; valid: b200, h100, h200, local, mi300x, mi325x, mi355x "
        "(or a path to a profile .yaml)"
    ]
    assert "Traceback" not in result.output


def test_cli_show_invalid_file_is_one_line_exit_2(tmp_path):
    path = write_profile(tmp_path, {**VALID, "nodes": -1})
    result = invoke("clusters", "show", str(path))
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert (
        line.startswith("error: Invalid cluster profile ")
        and "nodes: Input should be greater than or equal to 1 (got -1)" in line
    )


# --- a part the catalog lacks, declared in the profile ---------------------------------------------

A100_40GB = {
    "name": "a100-40gb", "vendor": "nvidia", "compute_capability": 8.0, "memory_gib": 40,
    "peak_tflops": {"fp32": 156, "bf16": 312, "fp8": None},
    "sources": {"fp32": "NVIDIA A100 datasheet, A100 40GB SXM: TF32 156 TFLOPS dense",
                "bf16": "NVIDIA A100 datasheet, A100 40GB SXM: BF16 312 TFLOPS dense"},
}  # fmt: skip


def declared(tmp_path: Path, **part) -> Path:
    """`my.yaml`: one node of eight parts declared in the profile (an A100 40GB unless `part` changes it)."""
    accelerator = {k: v for k, v in {**A100_40GB, **part}.items() if v != "drop"}
    return write_profile(tmp_path, {**VALID, "name": "my-a100", "nodes": 1, "accelerator": accelerator}, "my.yaml")


def _plan_verdicts(result) -> dict[str, str]:
    """precision -> the `runs` cell of each row of `sweep plan`'s table."""
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in result.stdout.splitlines() if line.startswith("│")]
    return {row[1]: row[-1] for row in cells}


def test_cli_show_a_declared_part(tmp_path, monkeypatch):
    declared(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = invoke("clusters", "show", "my.yaml", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for text in (
        "a100-40gb (nvidia, declared in this profile)",
        "40 GiB",
        "compute capability  8.0",
        "312",
        "BF16 312 TFLOPS dense",
        "no FP8: those recipes are unsupported on a100-40gb",
    ):
        assert text in result.stdout, text
    profile = load_profile("my.yaml")
    assert profile.accelerator == "a100-40gb" and profile.declares_accelerator and profile.is_gpu
    assert (profile.peak_tflops("bf16"), profile.peak_tflops("fp8"), profile.cpus_per_rank) == (312, None, 4)
    assert not load_profile("h100").declares_accelerator


def test_plan_on_a_declared_part_without_fp8(tmp_path):
    path = declared(tmp_path)
    args = [
        "plan",
        "--cluster",
        str(path),
        "--model",
        "llama3-8b",
        "--batch-size",
        "2",
        "--gpus",
        "8",
        "-p",
        "bf16",
        "-p",
        "fp8-torchao-tensorwise",
        "-p",
        "fp8-torchao-rowwise",
    ]
    result = invoke(*args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "on my-a100 (a100-40gb, 8 ranks)" in result.stdout
    assert _plan_verdicts(result) == {
        "bf16": "yes",
        "fp8-torchao-tensorwise": "no (1)",
        "fp8-torchao-rowwise": "no (2)",
    }
    assert "fp8-torchao-tensorwise needs CUDA compute capability >= 8.9; a100-40gb has 8.0" in result.stdout

    # a part whose capability would allow FP8 but which declares no FP8 peak: the declaration decides
    path = declared(tmp_path, name="no-fp8-hopper", compute_capability=9.0)
    result = invoke(*args[:2], path, *args[3:], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert _plan_verdicts(result)["fp8-torchao-tensorwise"] == "no (1)"
    assert "fp8-torchao-tensorwise needs FP8 tensor cores; no-fp8-hopper has none" in result.stdout


@pytest.mark.parametrize(
    ("part", "expected"),
    [
        (
            {"peak_tflops": {"fp32": 156, "bf16": 0, "fp8": None}},
            "accelerator.peak_tflops.bf16: Input should be greater than 0 (got 0)",
        ),
        ({"vendor": "intel"}, "accelerator.vendor: Input should be 'nvidia', 'amd' or 'cpu' (got 'intel')"),
        ({"vendr": "nvidia", "vendor": "drop"}, "accelerator: unknown key 'vendr' — did you mean 'vendor'?"),
        ({"name": "drop"}, "accelerator.name: required key is missing"),
        ({"name": "h100"}, "accelerator: name 'h100' is a catalog accelerator; write `accelerator: h100`"),
        ({"compute_capability": "drop"}, "accelerator: compute_capability: give it for an nvidia accelerator"),
        ({"fp8_flavour": "e4m3fn"}, "accelerator: fp8_flavour: set it exactly when peak_tflops.fp8 is set"),
        ({"sources": {"fp32": "x"}}, "accelerator: sources: every peak needs a source; missing for ['bf16']"),
        ({"peak_tflops": {"fp32": 156, "bf16": 312}}, "accelerator: peak_tflops: give every family"),
        ({"memory_gib": "40GB"}, "accelerator.memory_gib: Input should be a valid number (got '40GB')"),
    ],
)
def test_a_bad_declared_part_is_one_line_exit_2(tmp_path, part, expected):
    path = declared(tmp_path, **part)
    for args in (["clusters", "show", str(path)], ["plan", "--cluster", str(path), "-m", "gpt-tiny", "-b", "1"]):
        result = invoke(*args)
        assert result.exit_code == 2 and result.stdout == ""
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"error: Invalid cluster profile {path}: ") and expected in line, line
