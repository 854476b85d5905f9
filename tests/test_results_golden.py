"""Every `sweep results` command prints, byte for byte, what it printed when these golden files were taken
(tests/golden/results/, on the ~1,000 rows of tests/results_golden_rows.py): a faster aggregation must not change
a cell, a caption, a CSV float or a figure's data. After an intended change to the output, take them again:

    SWEEP_GOLDEN_UPDATE=1 python -m pytest -q tests/test_results_golden.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import invoke
from results_golden_rows import write_folder

GOLDEN = Path(__file__).parent / "golden" / "results"
UPDATE = os.environ.get("SWEEP_GOLDEN_UPDATE") == "1"

CASES = {
    "show": ["show", "results"],
    "show-all": ["show", "results", "--limit", "0"],
    "show-where": ["show", "results", "--where", "precision=fp8-te", "--where", "batch_size>=4", "--limit", "30"],
    "show-megatron": ["show", "results", "--flops", "megatron", "--where", "model!=gpt2-1.5b", "--limit", "20"],
    "show-empty": ["show", "results", "--where", "precision=bf16", "--where", "status=unsupported"],
    "max-batch": ["max-batch", "results"],
    "max-batch-md": ["max-batch", "results", "-f", "md"],
    "max-batch-csv": ["max-batch", "results", "-f", "csv"],
    "max-batch-where": [
        "max-batch",
        "results",
        "-w",
        "cluster=h200,b200",
        "-f",
        "md",
        "--flops",
        "torchtitan",
        "-w",
        "model!=gpt2-1.5b",
    ],
    "compare": ["compare", "results"],
    "compare-md": ["compare", "results", "-f", "md"],
    "compare-csv": ["compare", "results", "-f", "csv"],
    "compare-limit": ["compare", "results", "--limit", "20"],
    "compare-cluster-limit": ["compare", "results", "--by", "cluster", "--baseline", "b200", "--limit", "7"],
    "compare-cluster": ["compare", "results", "--by", "cluster", "--baseline", "h200"],
    "compare-cluster-md": ["compare", "results", "--by", "cluster", "--baseline", "h200", "-f", "md"],
    "compare-cluster-csv": ["compare", "results", "--by", "cluster", "--baseline", "h200", "-f", "csv"],
    "compare-compile-md": ["compare", "results", "--by", "compile", "-f", "md", "-w", "cluster=b200"],
    "compare-best": ["compare", "results", "--best"],
    "compare-best-md": ["compare", "results", "--best", "-f", "md"],
    "compare-best-csv": ["compare", "results", "--best", "-f", "csv"],
    "compare-no-baseline": ["compare", "results", "--by", "cluster"],
    "export-md": ["export", "results"],
    "export-csv": ["export", "results", "-f", "csv"],
    "export-where-md": [
        "export",
        "results",
        "-w",
        "grad_accum=1",
        "-w",
        "cluster=h200",
        "--flops",
        "megatron",
        "-w",
        "model!=gpt2-1.5b",
    ],
    "export-empty": ["export", "results", "-w", "cluster=h200", "-w", "batch_size>64"],
}
PLOTS = {"plot": [], "plot-energy": ["--metric", "tokens-per-kwh"], "plot-where": ["-w", "model=llama3-8b"]}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("golden")
    write_folder(root / "results")
    return root


def _run(folder: Path, args: list[str], monkeypatch) -> str:
    monkeypatch.chdir(folder)  # the folder is named `results` in every title, wherever the test runs
    res = invoke("results", *args)
    return f"exit {res.exit_code}\n--- stdout\n{res.stdout}--- stderr\n{res.stderr}"


def _check(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: take it with SWEEP_GOLDEN_UPDATE=1"
    assert text == path.read_text()


@pytest.fixture(scope="module")
def merged(folder, tmp_path_factory) -> Path:
    """The folder with its files merged (sweep.record.compact), two at a time so that every level is there."""
    import shutil

    from sweep.record import compact

    root = tmp_path_factory.mktemp("golden-merged")
    shutil.copytree(folder / "results", root / "results")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compact, "FAN_IN", 2)
        done = compact.compact(root / "results")
    assert {compact.level(f) for f in done.written} >= {1, 2}, done.written
    return root


@pytest.mark.parametrize("name", CASES)
def test_output_is_what_it_was(folder, name, monkeypatch):
    text = _run(folder, CASES[name], monkeypatch)
    assert "Traceback" not in text
    _check(name, text)


@pytest.mark.parametrize("name", CASES)
def test_merged_files_print_the_same(merged, name, monkeypatch):
    """The rows of merged files (one file of the current schema from many, the old 1.2 file among them) read as
    they did: every command prints what it printed from the files `sweep run` wrote."""
    text = _run(merged, CASES[name], monkeypatch)
    assert text == (GOLDEN / f"{name}.txt").read_text()  # compared only: golden files are taken as written


def _figure_data(fig) -> dict:
    """What a figure shows: titles, tick labels, every line's and marker's points, bars, annotations, legend."""
    axes = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        axes.append(
            {
                "title": ax.get_title(),
                "xlabel": ax.get_xlabel(),
                "ylabel": ax.get_ylabel(),
                "xscale": ax.get_xscale(),
                "ylim": [repr(v) for v in ax.get_ylim()],
                "xticks": [repr(float(v)) for v in ax.get_xticks()],
                "xticklabels": [t.get_text() for t in ax.get_xticklabels()],
                "lines": [[repr(float(v)) for v in (*line.get_xdata(), *line.get_ydata())] for line in ax.get_lines()],
                # every marker's place, pooled over the axes' collections: how they are grouped into collections
                # (one per series or one per panel) is not what the figure shows
                "points": sorted([repr(float(x)), repr(float(y))] for c in ax.collections for x, y in c.get_offsets()),
                "bars": [  # width and height: the max-batch bars are horizontal
                    [repr(float(p.get_width())), repr(float(p.get_height())), str(p.get_facecolor()), p.get_hatch()]
                    for p in ax.patches
                ],
                "texts": [t.get_text() for t in ax.texts],
                # the line collections' segments (min-max bars and their caps, grid lines), "x0 y0 x1 y1" each
                "segments": [
                    " ".join(repr(float(v)) for v in segment.ravel())
                    for c in ax.collections
                    if hasattr(c, "get_segments")
                    for segment in c.get_segments()
                ],
            }
        )
    legend = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    return {
        "suptitle": fig._suptitle.get_text() if fig._suptitle else None,
        "axes": axes,
        "legend": legend,
        "size": [repr(float(v)) for v in fig.get_size_inches()],
    }


@pytest.mark.parametrize("name", PLOTS)
def test_plot_shows_what_it_showed(folder, name, monkeypatch):
    from sweep.results import plot

    drawn = []
    figure = plot.figure
    monkeypatch.setattr(plot, "figure", lambda *a, **k: drawn.append(figure(*a, **k)) or drawn[-1])
    text = _run(folder, ["plot", "results", "--out", "fig.png", *PLOTS[name]], monkeypatch)
    assert text.startswith("exit 0") and len(drawn) == 1, text
    _check(name, text + json.dumps(_figure_data(drawn[0]), indent=1, ensure_ascii=False) + "\n")
