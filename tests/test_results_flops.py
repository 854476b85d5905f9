"""`--flops megatron|torchtitan` on `results show/export/compare/max-batch`: TFLOP/s and MFU as those tools
count them, recounted from each row's model spec, and every table names its convention.

Llama3-8B at T 8192 costs 61.07 GFLOP per token as sweep counts it (every parameter, full T×T attention),
57.91 as torchtitan does (no input embedding) and 51.47 as Megatron-LM does (no embedding, causal half).
"""

from __future__ import annotations

import csv
import io

import pytest
from conftest import invoke, result_row

from sweep.record.store import write_row
from trainer.flops import spec_flops_per_token
from trainer.models.specs import REGISTRY, ModelSpec

LLAMA = REGISTRY["llama3-8b"]
SEQ = 8192
GFLOP = {"sweep": 61.066469376, "torchtitan": 57.91444992, "megatron": 51.470401536}  # per token, Llama3-8B, T 8192
PEAK = 989.0
# an unnamed inline spec: its label is a hash, and only the row's model_spec says what it is
INLINE = ModelSpec(arch="gpt", n_layers=4, d_embd=256, n_heads=4, vocab_size=1024, max_seq_len=SEQ)


# Two H200 ranks at T 8192, on `result_row`'s trial; the speed alone measured (no step times).
_H200 = {
    "run_id": "r",
    "cluster": "h200",
    "accelerator": "h200",
    "world_size": 2,
    "compile": "regional",
    "batch_size": 1,
    "seq_len": SEQ,
    "peak_tflops": PEAK,
    "step_time_s": None,
    "step_time_p10_s": None,
    "step_time_p90_s": None,
}


def _row(trial_id: str, spec: ModelSpec, precision: str, tokens_per_s: float, **extra) -> dict:
    fpt = spec_flops_per_token(spec, SEQ)
    tflops = fpt * tokens_per_s / 1e12
    return result_row(
        **{
            **_H200,
            "trial_id": trial_id,
            "model": spec.label,
            "model_spec": spec.to_json(),
            "precision": precision,
            "tokens_per_s_per_gpu": tokens_per_s,
            "flops_per_token": fpt,
            "tflops_per_gpu": tflops,
            "mfu": tflops / PEAK,
            **extra,
        }
    )


@pytest.fixture
def results(tmp_path):
    write_row(tmp_path, _row("a", LLAMA, "bf16", 9000.0))
    write_row(tmp_path, _row("b", LLAMA, "fp8-te", 11000.0))
    write_row(tmp_path, _row("c", INLINE, "bf16", 2.0e6))
    return tmp_path


def _invoke(*args):
    return invoke("results", *args)


def _ok(*args) -> str:
    res = _invoke(*args)
    assert res.exit_code == 0, res.output
    return res.stdout


@pytest.mark.parametrize("convention", ["sweep", "megatron", "torchtitan"])
def test_export_counts_in_the_chosen_convention_and_says_so(results, convention):
    rows = {
        r["model"]: r
        for r in csv.DictReader(
            io.StringIO(_ok("export", results, "-f", "csv", "--flops", convention, "--where", "precision=bf16"))
        )
    }
    tflops = GFLOP[convention] * 1e9 * 9000.0 / 1e12  # the same speed, another count of FLOPs per token
    assert float(rows["llama3-8b"]["tflops_per_gpu"]) == pytest.approx(tflops, rel=1e-9)
    assert float(rows["llama3-8b"]["mfu"]) == pytest.approx(tflops / PEAK, rel=1e-9)
    assert float(rows["llama3-8b"]["tokens_per_s_per_gpu"]) == 9000.0
    md = _ok("export", results, "--flops", convention, "--where", "model=llama3-8b")
    assert md.splitlines()[0].endswith(f"· FLOPs: {convention}_")  # the caption names the convention
    assert f"| {tflops:.1f} |" in md  # 521.1 / 494.2 / 439.3 at 4 significant figures
    footer = md.splitlines()[-1]
    assert footer.startswith(f"- FLOPs per token: {convention} — 6·")


def test_inline_specs_are_recounted_from_the_row(results):
    """gpt's token embedding is the tied head (a matmul: every convention counts it); its position table is a
    lookup (torchtitan and megatron leave it out), and megatron also leaves out norms and biases."""
    rows = {
        r["model"]: r for r in csv.DictReader(io.StringIO(_ok("export", results, "-f", "csv", "--flops", "torchtitan")))
    }
    E, L, V, H, D = 256, 4, 1024, 4, 64
    n = INLINE.n_params()
    assert n == V * E + SEQ * E + L * (12 * E * E + 13 * E) + 2 * E
    want = (6 * (n - SEQ * E) + 12 * L * H * D * SEQ) * 2.0e6 / 1e12
    assert float(rows[INLINE.label]["tflops_per_gpu"]) == pytest.approx(want, rel=1e-9)
    rows = {
        r["model"]: r for r in csv.DictReader(io.StringIO(_ok("export", results, "-f", "csv", "--flops", "megatron")))
    }
    want = (6 * (L * 12 * E * E + V * E) + 6 * L * H * D * SEQ) * 2.0e6 / 1e12
    assert float(rows[INLINE.label]["tflops_per_gpu"]) == pytest.approx(want, rel=1e-9)


def test_compare_show_and_max_batch_take_the_convention(results):
    rows = list(csv.DictReader(io.StringIO(_ok("compare", results, "-f", "csv", "--flops", "megatron"))))
    (fp8,) = [r for r in rows if r["model"] == "llama3-8b"]
    assert float(fp8["tflops_per_gpu"]) == pytest.approx(GFLOP["megatron"] * 11000.0 / 1e3)
    assert float(fp8["base_tflops_per_gpu"]) == pytest.approx(GFLOP["megatron"] * 9000.0 / 1e3)
    assert float(fp8["ratio"]) == pytest.approx(11000.0 / 9000.0)  # a ratio of speeds: the same in every convention
    assert "FLOPs: megatron" in _ok("compare", results, "--flops", "megatron")
    shown = _ok("show", results, "--flops", "megatron", "--where", "precision=fp8-te")
    assert "FLOPs: megatron" in shown and f"{GFLOP['megatron'] * 11000.0 / 1e3:.1f}" in shown
    assert "FLOPs: sweep" in _ok("show", results)  # the default is named too
    md = _ok("max-batch", results, "-f", "md", "--flops", "torchtitan", "--where", "model=llama3-8b")
    assert "FLOPs: torchtitan" in md.splitlines()[0] and f"| {GFLOP['torchtitan'] * 11000.0 / 1e3:.1f} |" in md


def test_a_row_without_a_spec_of_an_unknown_model_is_one_line(tmp_path):
    row = _row("a", INLINE, "bf16", 2.0e6)
    write_row(tmp_path, {**row, "model_spec": None})  # written before rows carried their spec
    write_row(tmp_path, {**_row("b", LLAMA, "bf16", 9000.0), "model_spec": None})  # a registry name: looked up
    res = _invoke("export", tmp_path, "--flops", "megatron")
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.stderr.strip() == (
        f"error: --flops megatron: rows of model {INLINE.label!r} carry no model spec and "
        f"{INLINE.label!r} is not in the registry, so their FLOPs cannot be recounted "
        f"(leave them out: --where model!={INLINE.label})"
    )
    rows = list(
        csv.DictReader(
            io.StringIO(_ok("export", tmp_path, "-f", "csv", "--flops", "megatron", "--where", "model=llama3-8b"))
        )
    )
    assert float(rows[0]["tflops_per_gpu"]) == pytest.approx(GFLOP["megatron"] * 9000.0 / 1e3)
    res = _invoke("export", tmp_path, "--flops", "palm")
    assert res.exit_code == 2 and "'palm' is not one of" in res.output
