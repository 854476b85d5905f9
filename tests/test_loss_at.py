"""Losses at the same tokens trained: the pure reading of a loss curve (`sweep.results.loss_at`), the row's curve
from its ranks (`sweep.record.rows`), and `results compare` / `show` reading every side at one token count."""

from __future__ import annotations

import csv
import io

import pytest

from sweep.record.rows import loss_curve_columns
from sweep.record.schema import TRAINING_DEFAULTS
from sweep.record.store import write_row, write_verdicts
from sweep.results.loss_at import Curve, LossAt, common_tokens, compare, median_at, row_at
from trainer.result import RankResult


def test_a_curve_is_read_exactly_on_a_step_and_linearly_between_two():
    curve = Curve((0, 100, 200), (11.0, 10.0, 9.0))
    assert curve.at(100) == 10.0 and curve.at(0) == 11.0 and curve.at(200) == 9.0
    assert curve.at(150) == pytest.approx(9.5) and curve.at(125) == pytest.approx(9.75)
    assert curve.at(201) is None and curve.at(-1) is None  # never read past its ends
    assert Curve((0,), (11.0,)).at(0) == 11.0  # one step: its loss, at 0 tokens trained


def test_the_common_count_is_the_largest_every_curve_reached():
    short, long = Curve((0, 50, 100), (1.0, 2.0, 3.0)), Curve(tuple(range(0, 1000, 10)), (0.0,) * 100)
    assert common_tokens([short, long]) == 100 and common_tokens([long]) == 990
    assert common_tokens([]) is None


def test_compare_reads_both_sides_at_one_count_and_takes_the_median_of_repeats():
    # the baseline ran 28 steps, the other side 6: their last losses are 22 steps apart
    base = [Curve(tuple(i * 10 for i in range(28)), tuple(11 - 0.1 * i for i in range(28)))]
    side = [Curve(tuple(i * 10 for i in range(6)), tuple(11 - 0.2 * i + d for i in range(6))) for d in (0.0, 0.3, 0.1)]
    at = compare(side, base)
    assert at.tokens == 50
    assert at.loss == pytest.approx(11 - 1.0 + 0.1) and at.base_loss == pytest.approx(11 - 0.5)
    assert compare(side, []) == compare([], base) == LossAt(None, None, None)  # a side without a curve
    assert median_at(side, None) is None


def test_row_at_and_rows_without_a_curve():
    assert row_at({"loss_curve": [3.0, 1.0], "loss_curve_tokens": [0, 10]}, 5) == pytest.approx(2.0)
    assert row_at({"loss_curve": None, "loss_curve_tokens": None}, 5) is None  # a row before schema 1.9
    assert row_at({"loss_curve": [3.0, 1.0], "loss_curve_tokens": [0, 10]}, None) is None
    with pytest.raises(ValueError):
        Curve((0, 1), (1.0,))


def test_a_rows_curve_is_the_mean_over_ranks_at_the_tokens_trained_before_each_step():
    # 2 ranks, grad_accum 2 x batch 3 x seq 8 on each: 96 tokens a step; step 1's loss is the untrained model's
    ranks = [
        RankResult(status="ok", losses=[10.0, 9.0, 8.0], tokens_per_step=96),
        RankResult(status="ok", losses=[10.5, 8.0, 7.5], tokens_per_step=96),
    ]
    assert loss_curve_columns(ranks) == {"loss_curve": [10.25, 8.5, 7.75], "loss_curve_tokens": [0, 96, 192]}


# --- through the CLI --------------------------------------------------------------------------------

BASE = {
    "attempt": 1,
    "cluster": "h200",
    "accelerator": "h200",
    "world_size": 2,
    "model": "llama3-8b",
    "compile": "regional",
    "ac": "none",
    "seq_len": 4096,
    "status": "ok",
    "tflops_per_gpu": 500.0,
    **TRAINING_DEFAULTS,
}
# (trial, precision, batch, steps, loss fall per step): tokens per step = batch * 4096 * 2 ranks
CURVES = [("a", "bf16", 2, 28, 0.1), ("b", "fp8-te", 2, 6, 0.2), ("c", "bf16", 3, 6, 0.2), ("d", "fp8-te", 3, 10, 0.15)]


def _write(folder) -> None:
    for trial_id, precision, batch, steps, fall in CURVES:
        losses = [11 - fall * i for i in range(steps)]
        write_row(
            folder,
            {
                **BASE,
                "run_id": "r1",
                "trial_id": trial_id,
                "precision": precision,
                "batch_size": batch,
                "loss_first": losses[0],
                "loss_last": losses[-1],
                "loss_curve": losses,
                "loss_curve_tokens": [i * batch * 4096 * 2 for i in range(steps)],
            },
        )
    # a row written before schema 1.9: no curve, so no loss at any count, and it sets no count either
    write_row(folder, {**BASE, "run_id": "r0", "trial_id": "e", "precision": "bf16", "batch_size": 4, "loss_last": 7.0})


def _md(text: str) -> list[dict]:
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def _caption(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("_"))


def test_compare_reads_each_side_at_the_tokens_both_reached(cli, tmp_path):
    _write(tmp_path)
    res = cli("results", "compare", tmp_path, "-f", "md", "--where", "batch_size=2")
    assert res.exit_code == 0, res.output
    (row,) = _md(res.stdout)
    # fp8-te ran 6 steps (5 x 16,384 tokens trained at the last), bf16 28: both read at step 6
    assert (row["loss @ tokens"], row["bf16 loss @ tokens"]) == ("10.00", "10.50")
    assert (row["last loss"], row["bf16 last loss"]) == ("10.00", "8.300")  # 22 steps apart: what misled
    assert "at tokens" not in row and "loss @ tokens: at 81,920 tokens trained" in _caption(res.stdout)
    # pairs read at different counts say each at how many
    res = cli("results", "compare", tmp_path, "-f", "md")
    got = {r["batch"]: r for r in _md(res.stdout)}
    assert (got["2"]["at tokens"], got["3"]["at tokens"]) == ("81,920", "122,880")
    assert (got["3"]["loss @ tokens"], got["3"]["bf16 loss @ tokens"]) == ("10.25", "10.00")
    table = {
        r["batch_size"]: r for r in csv.DictReader(io.StringIO(cli("results", "compare", tmp_path, "-f", "csv").stdout))
    }
    assert table["3"]["loss_at_tokens"] == "122880" and float(table["3"]["loss_at"]) == pytest.approx(10.25)
    assert float(table["3"]["base_loss_at"]) == pytest.approx(10.0)
    assert "loss @ tokens" in cli("results", "compare", tmp_path).stdout  # the terminal table too


def _rich_rows(text: str) -> tuple[list[str], list[list[str]]]:
    """A Rich table's header cells and body rows (the header is drawn with ┃, the body with │)."""
    cells = lambda line, bar: [c.strip() for c in line.strip(bar + " ").split(bar)]  # noqa: E731
    lines = text.splitlines()
    header = next(cells(line, "┃") for line in lines if line.startswith("┃"))
    return header, [cells(line, "│") for line in lines if line.startswith("│")]


def test_show_reads_every_row_at_the_tokens_all_reached(cli, tmp_path):
    _write(tmp_path)
    res = cli("results", "show", tmp_path)
    assert res.exit_code == 0, res.output
    header, rows = _rich_rows(res.stdout)
    at = header.index("loss @ tokens")
    by = {(r[header.index("precision")], r[header.index("batch")]): r[at] for r in rows}
    # 81,920 tokens: batch 2's 6th step; batch 3 between its 4th and 5th (3.33 steps of 24,576), interpolated
    assert by == {
        ("bf16", "2"): "10.50",
        ("fp8-te", "2"): "10.00",
        ("bf16", "3"): "10.33",
        ("fp8-te", "3"): "10.50",
        ("bf16", "4"): "—",
    }
    assert "loss @ tokens: at 81,920 tokens trained, the most every ok row reached" in " ".join(res.stdout.split())


# --- compare --best: each precision's best configuration, whatever its batch, read at the tokens both reached ---

# (trial, precision, batch, steps, loss fall per step, TFLOP/s): bf16 is fastest at batch 2, fp8-te at batch 3
BEST = [
    ("a", "bf16", 2, 28, 0.1, 500.0),
    ("c", "bf16", 3, 6, 0.2, 400.0),
    ("b", "fp8-te", 2, 6, 0.2, 700.0),
    ("d", "fp8-te", 3, 10, 0.2, 800.0),
]
# a fastest search's short probe of fp8-te's best config (the finalist is d): faster, 2 steps
PROBE = ("p", "fp8-te", 3, 2, 0.2, 900.0)


def _write_best(folder, trials, **extra) -> None:
    for trial_id, precision, batch, steps, fall, tflops in trials:
        losses = [11 - fall * i for i in range(steps)]
        write_row(
            folder,
            {
                **BASE,
                "run_id": "r1",
                **extra,
                "trial_id": trial_id,
                "precision": precision,
                "batch_size": batch,
                "tflops_per_gpu": tflops,
                "loss_first": losses[0],
                "loss_last": losses[-1],
                "loss_curve": losses,
                "loss_curve_tokens": [i * batch * 4096 * 2 for i in range(steps)],
            },
        )


def test_compare_best_reads_each_best_at_the_tokens_both_reached(cli, tmp_path):
    _write_best(tmp_path, BEST)
    res = cli("results", "compare", tmp_path, "--best", "-f", "md")
    assert res.exit_code == 0, res.output
    (row,) = _md(res.stdout)
    assert (row["best config"], row["bf16 best config"]) == ("batch 3 · compile regional", "batch 2 · compile regional")
    # fp8-te's best ran 9 x 24,576 tokens, bf16's 27 x 16,384: both read at 221,184 (bf16 between its steps 13, 14)
    assert (row["loss @ tokens"], row["bf16 loss @ tokens"]) == ("9.200", "9.650")
    assert (row["last loss"], row["bf16 last loss"]) == ("9.200", "8.300")  # 18 steps further for bf16
    assert "at tokens" not in row
    assert "loss @ tokens: at 221,184 tokens trained, the most both sides reached" in _caption(res.stdout)
    (got,) = csv.DictReader(io.StringIO(cli("results", "compare", tmp_path, "--best", "-f", "csv").stdout))
    assert got["loss_at_tokens"] == "221184" and float(got["loss_at"]) == pytest.approx(9.2)
    assert float(got["base_loss_at"]) == pytest.approx(9.65)
    assert "loss @ tokens" in cli("results", "compare", tmp_path, "--best").stdout  # the terminal table too


def test_compare_best_reads_a_searchs_best_by_its_finalists_curve_not_its_probes(cli, tmp_path):
    """A search's best is its finalist's figures: its loss too, not cut short at a probe's 2 steps. Where no
    search ran (mi300x), the best config's ok attempts are all its side, the probe among them."""
    _write_best(tmp_path, [*BEST, PROBE])
    _write_best(tmp_path, [*BEST, PROBE], cluster="mi300x", accelerator="mi300x", run_id="r2")
    write_verdicts(
        tmp_path,
        "r1",
        [
            {
                "kind": "fastest",
                "cluster": "h200",
                "model": "llama3-8b",
                "precision": "fp8-te",
                "seq_len": 4096,
                "gpus": 2,
                "best_trial_id": "d",
                "aborted": None,
            }
        ],
    )
    res = cli("results", "compare", tmp_path, "--best", "-f", "md")
    assert res.exit_code == 0, res.output
    got = {r["cluster"]: r for r in _md(res.stdout)}
    assert (got["h200"]["at tokens"], got["h200"]["loss @ tokens"], got["h200"]["bf16 loss @ tokens"]) == (
        "221,184",
        "9.200",
        "9.650",
    )
    assert (got["mi300x"]["at tokens"], got["mi300x"]["loss @ tokens"], got["mi300x"]["bf16 loss @ tokens"]) == (
        "24,576",
        "10.80",
        "10.85",
    )
    assert "loss @ tokens: at the `at tokens` column's count, the most both sides reached" in _caption(res.stdout)
    table = {
        r["cluster"]: r
        for r in csv.DictReader(io.StringIO(cli("results", "compare", tmp_path, "--best", "-f", "csv").stdout))
    }
    assert (table["h200"]["loss_at_tokens"], table["mi300x"]["loss_at_tokens"]) == ("221184", "24576")
