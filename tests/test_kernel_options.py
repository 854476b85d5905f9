"""The kernel options (issue 34): attention, fp8_attention, compile_mode, fp8_pow2_scales.

Through the CLI where a user meets them (`sweep plan` of a grid file: accepted, refused in one line, folded away,
recorded unsupported with the reason), through the tune's candidate space (numerics ones vary only when named),
and through the trainer on CPU ranks (a compiled tiny model under each attention backend CPU has, a compile mode
that reaches torch.compile, torchao's power-of-2 scales, TE's recipe fields and attention switches).
GPU-only kernels (cuDNN, memory-efficient, TE's) are left for the device: here their refusals and mappings.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from conftest import tiny_grid

from sweep.search.fastest.space import Config, Space
from sweep.spec.advice import discouraged
from sweep.spec.expand import expand
from sweep.spec.grid import NUMERICS_CHANGING, TuneSpec, parse_grid
from trainer.kernels import kernel_unsupported
from trainer.models.specs import REGISTRY
from trainer.options import TrainingOptions
from trainer.recipes import RECIPES, have_module

KERNEL_KEYS = {
    "attention": ["auto", "flash", "cudnn", "efficient"],
    "fp8_attention": [False, True],
    "compile_mode": ["default", "max-autotune-no-cudagraphs"],
    "fp8_pow2_scales": [False, True],
}


def plan_out(cli, write_grid, **keys) -> str:
    """`sweep plan` of a tiny grid with `keys`, on the local (CPU) profile: its output."""
    result = cli("plan", write_grid(tiny_grid(**keys)), "--cluster", "local", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.stdout


def n_trials(out: str) -> int:
    return int(re.search(r"(\d+) trials? on local", out).group(1))


# -- the grid: accepted, refused, folded --------------------------------------------------------------------


@pytest.mark.parametrize("key", list(KERNEL_KEYS))
def test_a_grid_accepts_every_value_of_each_kernel_option(cli, write_grid, key):
    precision = {"fp8_attention": "fp8-te-delayed", "fp8_pow2_scales": "fp8-torchao-tensorwise"}.get(key, "bf16")
    out = plan_out(cli, write_grid, precisions=[precision], compile="regional", **{key: KERNEL_KEYS[key]})
    assert n_trials(out) == len(KERNEL_KEYS[key])  # none folds away in a trial where it does something


@pytest.mark.parametrize(
    ("key", "bad", "says"),
    [
        ("attention", "flash2", "flash2"),
        ("attention", "math", "math"),
        ("fp8_attention", "yes", "fp8_attention"),
        ("compile_mode", "max-autotune", "max-autotune"),
        ("compile_mode", "reduce-overhead", "reduce-overhead"),  # CUDA graphs: not offered (see docs/grids.md)
        ("fp8_pow2_scales", 1, "fp8_pow2_scales"),
    ],
)
def test_a_bad_kernel_option_value_is_one_line_and_exit_2(cli, write_grid, key, bad, says):
    result = cli("plan", write_grid(tiny_grid(**{key: bad})), "--cluster", "local")
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0] and says in lines[0], lines


@pytest.mark.parametrize(
    ("keys", "trials"),
    [
        ({"precisions": ["bf16"], "fp8_pow2_scales": [False, True]}, 1),  # no FP8 scales in bf16
        ({"precisions": ["fp8-torchao-rowwise"], "fp8_pow2_scales": [False, True]}, 1),  # rowwise rounds already
        ({"precisions": ["fp8-torchao-tensorwise"], "fp8_pow2_scales": [False, True]}, 2),
        ({"precisions": ["fp8-torchao-tensorwise"], "fp8_attention": [False, True]}, 1),  # TE's, not torchao's
        ({"precisions": ["bf16-te"], "fp8_attention": [False, True]}, 1),  # TE without FP8
        ({"precisions": ["fp8-te-delayed"], "fp8_attention": [False, True]}, 2),
        ({"compile": "none", "compile_mode": ["default", "max-autotune-no-cudagraphs"]}, 1),  # nothing compiled
        ({"compile": ["none", "regional"], "compile_mode": ["default", "max-autotune-no-cudagraphs"]}, 3),
    ],
)
def test_an_option_that_can_do_nothing_folds_away(cli, write_grid, keys, trials):
    assert n_trials(plan_out(cli, write_grid, **keys)) == trials


def test_plan_shows_the_options_and_why_a_kernel_cannot_run_here(cli, write_grid):
    out = plan_out(
        cli,
        write_grid,
        models=["llama-tiny"],
        compile="regional",
        attention=["flash", "cudnn", "efficient"],
        compile_mode="max-autotune-no-cudagraphs",
    )
    assert "attention=flash" in out and "compile_mode=max-autotune-no-cudagraphs" in out
    # CPU ranks: the flash trial runs, cuDNN and memory-efficient attention are GPU kernels
    assert re.search(r"attention=flash.*\byes\b", out), out
    assert "attention: cudnn needs a GPU" in out and "attention: efficient needs a GPU" in out


def test_plan_on_a_gpu_profile_refuses_the_efficient_kernel_for_grouped_query_attention(cli, write_grid):
    h200 = Path(__file__).resolve().parents[1] / "benchmarks" / "profiles" / "h200x2.yaml"
    grid = write_grid(tiny_grid(models=["llama-tiny", "gpt-tiny"], compile="regional", attention="efficient"))
    result = cli("plan", grid, "--cluster", h200, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "attention: efficient with grouped-query attention (llama-tiny: n_kv_heads 2 < n_heads 4)" in result.stdout
    assert re.search(r"gpt-tiny .*\byes\b", result.stdout) and re.search(r"llama-tiny .*no \(1\)", result.stdout)


# -- the refusals, pure (the GPU's can only be asked of the rules here) -----------------------------------


def _why(precision: str, model: str = "llama-tiny", vendor: str = "nvidia", cc: float | None = 9.0, **options):
    return kernel_unsupported(
        TrainingOptions(**options),
        recipe=RECIPES[precision],
        model=REGISTRY[model],
        vendor=vendor,
        compute_capability=cc,
    )


def test_kernel_refusals_on_gpus():
    assert _why("bf16", attention="flash") is None and _why("bf16", attention="cudnn") is None
    assert "grouped-query" in _why("bf16", attention="efficient")  # llama-tiny: 2 KV heads of 4
    assert _why("bf16", "gpt-tiny", attention="efficient") is None  # multi-head attention
    assert "bf16 or fp16" in _why("fp32", attention="flash") and _why("fp32", "gpt-tiny", attention="efficient") is None
    assert "NVIDIA" in _why("bf16", vendor="amd", attention="cudnn") and _why("bf16", vendor="amd") is None
    # TE layers: TE's flash and fused (cuDNN) attention; FP8 attention where TE runs it
    assert _why("fp8-te-delayed", attention="cudnn", fp8_attention=True) is None
    assert _why("fp8-te-delayed", attention="auto", fp8_attention=True) is None
    assert "TE layers run" in _why("bf16-te", attention="efficient")
    assert "fused (cuDNN) attention only" in _why("fp8-te-delayed", attention="flash", fp8_attention=True)
    assert "no FP8 attention" in _why("fp8-te-block", fp8_attention=True)
    assert "sm_100+" in _why("fp8-te-current", fp8_attention=True)  # Hopper: no FP8 current-scaling attention
    assert _why("fp8-te-current", cc=10.0, fp8_attention=True) is None
    # TE's flash backend is the flash-attn package (one H200 without it: "No dot product attention backend")
    flash = _why("fp8-te-delayed", attention="flash")
    assert (flash is None) if have_module("flash_attn") else ("pip install flash-attn" in flash)


def test_cpu_ranks_have_flash_and_math_only():
    assert _why("bf16", vendor="cpu", cc=None, attention="flash") is None
    assert _why("fp32", vendor="cpu", cc=None, attention="flash") is None  # CPU's flash kernel takes fp32
    for kernel in ("cudnn", "efficient"):
        assert "needs a GPU" in _why("bf16", "gpt-tiny", vendor="cpu", cc=None, attention=kernel)


# -- the tune: which values a search may try ------------------------------------------------------------------


def _space(vary: list[str], *, precision: str = "bf16", model: str = "llama-tiny", is_gpu: bool = True, **axes):
    spec = parse_grid(
        {
            "models": [model],
            "precisions": [precision],
            "batch_sizes": [2],
            "seq_len": 32,
            "search": "fastest",
            "tune": {"vary": vary},
            **axes,
        }
    )
    (template,) = expand(spec, cluster="local")
    tune = spec.tune or TuneSpec()
    return Space(template, spec, tune, avoid=discouraged(precision, is_gpu=is_gpu))


def test_the_tune_may_vary_the_kernel_options_when_named():
    assert set(NUMERICS_CHANGING) >= {"fp8_attention", "fp8_pow2_scales"}  # numerics: only when named
    assert {"attention", "compile_mode"}.isdisjoint(NUMERICS_CHANGING)  # the same arithmetic, other kernels
    space = _space(["batch_size", "attention", "compile_mode"], model="gpt-tiny")
    assert space.values["attention"] == ["auto", "flash", "cudnn", "efficient"]
    assert space.values["compile_mode"] == ["default", "max-autotune-no-cudagraphs"]
    assert space.values["fp8_attention"] == [False] and space.values["fp8_pow2_scales"] == [False]
    # what no accelerator runs is not tried: llama's grouped-query attention in SDPA's efficient kernel, TE's none
    assert "efficient" not in _space(["attention"]).values["attention"]
    te_kernels = ["auto", "flash", "cudnn"] if have_module("flash_attn") else ["auto", "cudnn"]
    assert _space(["attention"], precision="fp8-te-delayed").values["attention"] == te_kernels
    # on CPU ranks: flash and math only
    assert _space(["attention"], model="gpt-tiny", is_gpu=False).values["attention"] == ["auto", "flash"]


def test_the_numerics_kernel_options_vary_only_when_named_and_fold_in_each_candidate():
    te = _space(["batch_size", "compile"], precision="fp8-te-delayed")
    assert te.values["fp8_attention"] == [False]  # not named: stays
    named = _space(["batch_size", "fp8_attention"], precision="fp8-te-delayed")
    assert named.values["fp8_attention"] == [False, True]
    torchao = _space(["fp8_pow2_scales", "fp8_attention"], precision="fp8-torchao-tensorwise")
    configs = torchao.configs({"none": [2]})
    # fp8_attention folds away for torchao (one value left); power-of-2 scales are two candidates
    assert {(c.fp8_attention, c.fp8_pow2_scales) for c in configs} == {(False, False), (False, True)}
    # compile none has no mode: a candidate without compile folds it to default
    modes = _space(["compile", "compile_mode"], model="gpt-tiny")
    c = modes.fold(
        Config(2, "none", "none", 1, "fp32", "micro_batch", False, compile_mode="max-autotune-no-cudagraphs")
    )
    assert c.compile_mode == "default"


# -- the trainer: what the options build and train ---------------------------------------------------------

TOLERANCE = 1e-4  # relative, on each loss: the same arithmetic (tests/test_layouts_run.py's)
BF16_TOLERANCE = 2e-2  # other kernels for the same bf16 arithmetic (tests/test_fsdp_options.py's)


def test_a_compiled_llama_trains_the_same_under_flash_as_under_auto(run_one_rank):
    """On CPU, auto is SDPA's flash kernel for llama-tiny (test below): attention flash, chosen inside the compiled
    blocks, trains the same losses; compile max-autotune-no-cudagraphs compiles and trains them within bf16's."""
    spec = REGISTRY["llama-tiny"]
    common = dict(compile="regional", seq_len=32, measure_steps=3)
    auto = run_one_rank(spec, "bf16", **common)
    flash = run_one_rank(spec, "bf16", attention="flash", **common)
    tuned = run_one_rank(spec, "bf16", compile_mode="max-autotune-no-cudagraphs", **common)
    for result in (auto, flash, tuned):
        assert result.status == "ok", result.error
        assert result.losses[-1] < result.losses[0] and result.compile_time_s > 0
    assert flash.losses == pytest.approx(auto.losses, rel=TOLERANCE)
    assert tuned.losses == pytest.approx(auto.losses, rel=BF16_TOLERANCE)


def test_the_attention_modules_take_the_trials_backend_and_auto_sets_none():
    import torch
    from torch.nn.attention import SDPBackend

    from trainer.models import build_model
    from trainer.models.attention import SDPAttention, set_attention

    for name in ("llama-tiny", "gpt-tiny"):
        model = build_model(REGISTRY[name])
        attention = [m for m in model.modules() if isinstance(m, SDPAttention)]
        assert len(attention) == REGISTRY[name].n_layers
        set_attention(model, "cudnn")
        assert {m.attention_kernel for m in attention} == {"cudnn"}
        with attention[0].sdpa_context():  # the backends SDPA may use inside: cuDNN's alone
            assert torch._C._get_cudnn_sdp_enabled() and not torch._C._get_flash_sdp_enabled()
        set_attention(model, "auto")
        with attention[0].sdpa_context():  # auto: nothing changed
            assert torch._C._get_flash_sdp_enabled() and torch._C._get_mem_efficient_sdp_enabled()
    # the backend is chosen in the traced code, and dynamo guards on it: a compiled block under cuDNN (no CPU kernel)
    # fails while tracing; the same compiled block under flash traces anew and runs
    block, x = model.blocks[0], torch.randn(1, 8, REGISTRY["gpt-tiny"].d_embd)
    block.compile()
    set_attention(model, "cudnn")
    with pytest.raises(Exception, match="scaled_dot_product_attention"):
        block(x)
    set_attention(model, "flash")
    assert block(x).shape == x.shape
    torch.compiler.reset()
    # what CPU's auto picks for llama-tiny's grouped-query attention: its flash kernel (torch's own rule)
    q, kv = torch.randn(2, 4, 32, 16), torch.randn(2, 2, 32, 16)
    assert torch._fused_sdp_choice(q, kv, kv, is_causal=True, enable_gqa=True) == SDPBackend.FLASH_ATTENTION.value


@pytest.mark.parametrize("scope", ["regional", "full"])
def test_the_compile_mode_reaches_torch_compile(scope):
    """parallelize compiles each block (regional) or the model (full) with the trial's mode: the compiled callable's
    inductor config has max_autotune on for max-autotune-no-cudagraphs, off for default (no mode, as before)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from trainer.models import build_model
    from trainer.parallelize import parallelize
    from trainer.precision import precision_plan

    def autotuned(mode: str) -> bool:
        model = parallelize(
            build_model(REGISTRY["gpt-tiny"]),
            plan=precision_plan("fp32", device_type="cpu", sharded=False),
            compile_scope=scope,
            ac="none",
            mesh=mesh,
            compile_mode=mode,
        )
        compiled = model.blocks[0]._compiled_call_impl if scope == "regional" else model
        return compiled.get_compiler_config()["max_autotune"]

    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        assert autotuned("max-autotune-no-cudagraphs") and not autotuned("default")
    finally:
        dist.destroy_process_group()
        torch.compiler.reset()


def test_power_of_2_scales_reach_torchaos_float8_layers():
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear

    from trainer.models import build_model
    from trainer.precision import precision_plan
    from trainer.precision.torchao_fp8 import float8_config

    spec = REGISTRY["llama-tiny"]
    for recipe in RECIPES.values():  # the recipe table says what torchao's recipes do themselves
        if recipe.backend == "torchao":
            assert recipe.pow2_scales == Float8LinearConfig.from_recipe_name(recipe.scaling).round_scales_to_power_of_2
    tensorwise = RECIPES["fp8-torchao-tensorwise"]
    off = float8_config(tensorwise, device_type="cpu", sharded=False, options=TrainingOptions())
    assert off.round_scales_to_power_of_2 is False  # the default: tensorwise as before
    model = build_model(spec)
    precision_plan("fp8-torchao-tensorwise", device_type="cpu", options=TrainingOptions(fp8_pow2_scales=True)).convert(
        model
    )
    layers = [m for m in model.modules() if isinstance(m, Float8Linear)]
    assert layers and all(m.config.round_scales_to_power_of_2 for m in layers)


def test_fp8_attention_is_the_te_recipes_fp8_dpa():
    from trainer.precision.te import te_recipe_args

    delayed = RECIPES["fp8-te-delayed"]
    assert te_recipe_args(delayed) == delayed.scaling_args  # off: the recipe as before
    assert te_recipe_args(delayed, fp8_attention=True) == {**delayed.scaling_args, "fp8_dpa": True}
    if have_module("transformer_engine"):  # where TE is installed, its own class takes the fields
        from transformer_engine.common import recipe as te_recipes

        from trainer.precision.te import te_recipe

        built = te_recipe(delayed, te_recipes, fp8_attention=True)
        assert built.fp8_dpa is True and built.fp8_mha is False


def test_te_attention_switches_keep_one_backend_and_auto_gives_back_the_processes_own():
    from trainer.models import attention

    assert attention.te_attention_env("auto") == {}
    assert attention.te_attention_env("flash") == {
        "NVTE_FLASH_ATTN": "1",
        "NVTE_FUSED_ATTN": "0",
        "NVTE_UNFUSED_ATTN": "0",
    }
    assert attention.te_attention_env("cudnn") == {
        "NVTE_FLASH_ATTN": "0",
        "NVTE_FUSED_ATTN": "1",
        "NVTE_UNFUSED_ATTN": "0",
    }
    with pytest.raises(ValueError, match="no TE backend"):
        attention.te_attention_env("efficient")
    try:
        attention.apply_te_attention("cudnn")
        assert os.environ["NVTE_FLASH_ATTN"] == "0" and os.environ["NVTE_FUSED_ATTN"] == "1"
    finally:
        attention.apply_te_attention("auto")  # as this process started (read when the module was imported)
    assert {n: os.environ.get(n) for n in attention.TE_SWITCHES} == attention._started_with


# -- which attention kernel ran: named from a profiled trial's trace -----------------------------------------


def _trace(*names: tuple[str, str]) -> dict:
    return {"traceEvents": [{"ph": "X", "cat": cat, "name": name, "ts": 0, "dur": 1} for cat, name in names]}


@pytest.mark.parametrize(
    ("events", "named"),
    [
        # cuDNN's SDPA kernels say flash in their names too: they are cuDNN's
        (
            [
                ("kernel", "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x"),
                ("kernel", "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x"),
                ("cpu_op", "aten::_scaled_dot_product_cudnn_attention"),
            ],
            "cudnn",
        ),
        ([("kernel", "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>")], "flash"),
        (
            [("kernel", "fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel)")],
            "efficient",
        ),
        ([("cpu_op", "aten::_scaled_dot_product_flash_attention_for_cpu")], "flash"),
        (
            [("cpu_op", "aten::scaled_dot_product_attention"), ("cpu_op", "aten::_scaled_dot_product_attention_math")],
            "math",
        ),
        (
            [
                ("kernel", "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16"),
                ("kernel", "void flash_bwd_dq_dk_dv_loop_kernel<Flash_bwd_kernel_traits>"),
            ],
            "cudnn+flash",
        ),
        # compiled math attention is matmuls and a softmax; the composite op names no kernel: not said
        ([("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32"), ("cpu_op", "aten::scaled_dot_product_attention")], None),
        ([("cpu_op", "aten::mm"), ("kernel", "triton_per_fused__softmax_0")], None),
    ],
)
def test_the_attention_kernel_is_named_from_the_kernels_and_operators_that_ran(events, named):
    from trainer.profiling import attention_kernels

    assert attention_kernels(_trace(*events)) == named


def test_a_profiled_trial_names_the_attention_kernel_it_ran(run_one_rank):
    """On CPU ranks SDPA's auto runs its flash kernel for gpt-tiny (aten::_scaled_dot_product_flash_attention_for_cpu);
    the row's column comes from this (sweep.record.rows.profile_columns), and stays null unprofiled."""
    from sweep.record.rows import profile_columns

    result = run_one_rank(REGISTRY["gpt-tiny"], "fp32", profiled=True, measure_steps=2)
    assert result.status == "ok", result.error
    assert result.profile["attention_kernel"] == "flash"
    assert profile_columns(result.profile)["attention_kernel"] == "flash"
    assert "attention_kernel" not in profile_columns(None)
