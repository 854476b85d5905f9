"""`loss: full | chunked` through the grid and the CLI: accepted, refused with one line when misspelt, folded to full
where a chunked loss cannot run (tp > 1, an FP8 head), shown by `sweep plan`, varied by the tune, and its memory
predicted. Pure planning: nothing trains here (tests/test_loss_run.py trains it)."""

from __future__ import annotations

from conftest import tiny_grid
from test_grid_cli import error_line

from sweep.search.fastest.space import Space
from sweep.service import prepare
from sweep.spec.grid import parse_grid


def _trials(write_grid, **keys):
    return prepare(write_grid(tiny_grid(**keys)), "local", None).trials


def test_a_grid_lists_both_losses_and_plan_shows_the_chunked_one(cli, write_grid):
    grid = write_grid(tiny_grid(models=["llama-tiny", "gpt-tiny"], loss=["full", "chunked"]))
    result = cli("plan", grid, "--cluster", "local")
    assert result.exit_code == 0, result.output
    assert "4 trials on local" in result.stdout and result.stdout.count("loss=chunked") == 2
    trials = prepare(grid, "local", None).trials
    assert sorted((t.model.label, t.loss) for t in trials) == [
        ("gpt-tiny", "chunked"),
        ("gpt-tiny", "full"),
        ("llama-tiny", "chunked"),
        ("llama-tiny", "full"),
    ]
    assert {t.trial_id for t in trials if t.loss == "chunked"}.isdisjoint(
        t.trial_id for t in trials if t.loss == "full"
    )


def test_a_misspelt_loss_is_one_line_naming_the_choices(cli, write_grid):
    line = error_line(cli("plan", write_grid(tiny_grid(loss="fused")), "--cluster", "local"))
    assert "loss.0: Input should be 'full' or 'chunked' (got 'fused')" in line


def test_with_tensor_parallel_a_chunked_loss_folds_to_full(write_grid):
    """tp > 1 keeps the logits vocab-sharded (loss_parallel): the head cannot be fused into a chunked loss there,
    so the trial runs (and records) the full loss, one trial with the full one it equals."""
    trials = _trials(write_grid, models=["llama-tiny"], gpus=2, tp=[1, 2], loss=["full", "chunked"])
    assert sorted((t.tp, t.loss) for t in trials) == [(1, "chunked"), (1, "full"), (2, "full")]


def test_with_an_fp8_head_a_chunked_loss_folds_to_full(write_grid):
    """An FP8 recipe's FP8 head would run in bf16 inside the chunked loss: the head stays FP8, the loss full. In bf16
    the FP8 head folds away first, so there chunked stays."""
    trials = _trials(
        write_grid,
        models=["llama-tiny"],
        precisions=["bf16", "fp8-torchao-tensorwise"],
        fp8_lm_head=[False, True],
        loss=["full", "chunked"],
    )
    assert sorted((t.precision, t.fp8_lm_head, t.loss) for t in trials) == [
        ("bf16", False, "chunked"),
        ("bf16", False, "full"),
        ("fp8-torchao-tensorwise", False, "chunked"),
        ("fp8-torchao-tensorwise", False, "full"),
        ("fp8-torchao-tensorwise", True, "full"),
    ]


def test_plan_predicts_that_a_chunked_loss_fits_where_the_full_one_does_not(cli, write_grid):
    """On a GPU profile the plan predicts each trial's peak (sweep.memory.model): at batch 64, T 4096, V 128,256 the
    full loss's logits alone are 201 GB, past an H200; the chunked loss holds ~2.5 GiB of chunk and 0.7 GiB of head
    gradients instead, and fits."""
    model = {
        "arch": "llama",
        "name": "wide-vocab",
        "n_layers": 2,
        "d_embd": 1024,
        "n_heads": 8,
        "n_kv_heads": 8,
        "ffn_hidden": 4096,
        "vocab_size": 128256,
    }
    grid = write_grid(tiny_grid(models=[model], batch_sizes=[64], seq_len=4096, gpus=1, loss=["full", "chunked"]))
    result = cli("plan", grid, "--cluster", "h200")
    assert result.exit_code == 0, result.output
    full, chunked = sorted(prepare(grid, "h200", None).trials, key=lambda t: t.loss != "full")
    (full_line,) = [line for line in result.stdout.splitlines() if full.trial_id[:8] in line]
    (chunked_line,) = [line for line in result.stdout.splitlines() if chunked.trial_id[:8] in line]
    assert "no (1)" in full_line and "loss=chunked" in chunked_line and "yes" in chunked_line
    assert "(1) unsupported: predicted OOM" in result.stdout
    (full_max, chunked_max) = [line for line in result.stdout.splitlines() if line.startswith("predicted max batch")]
    assert "loss" not in full_max and ", loss=chunked): " in chunked_max  # the two lines say which is which
    from sweep.memory.model import Shape, breakdown

    saved = breakdown(Shape.of(full)).peak - breakdown(Shape.of(chunked)).peak
    assert saved == 6 * 64 * 4096 * 128256 - (10 * 2092 * 128256 + 6 * 128256 * 1024 + 2 * 64 * 4096 * 1024)


def test_the_tune_varies_the_loss_only_where_it_can_run():
    spec = parse_grid(
        {
            "models": ["llama-tiny"],
            "batch_sizes": [2],
            "gpus": 2,
            "tp": [1, 2],
            "search": "fastest",
            "tune": {"vary": ["batch_size", "loss", "tp"]},
        }
    )
    from sweep.spec.expand import expand

    by_tp = {t.tp: t for t in expand(spec, cluster="local")}
    configs = {tp: Space(t, spec, spec.tune).configs({"none": [2]}) for tp, t in by_tp.items()}
    assert sorted(c.loss for c in configs[1]) == ["chunked", "full"]
    assert [c.loss for c in configs[2]] == ["full"]  # folded: one candidate
