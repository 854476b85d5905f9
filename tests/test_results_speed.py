"""What makes `sweep results` fast on a million rows, held to what it was before: the footers are checked once, by
DuckDB, with the pyarrow check's answer; a folder that is not clean still gets the pyarrow check's message; `plot`
lays its figure out once, not once per panel, and draws it once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import invoke
from results_golden_rows import write_folder

from sweep.record.store import check_files
from sweep.results import footers, scan


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return write_folder(tmp_path_factory.mktemp("speed") / "results")


def test_duckdb_reads_the_footers_as_pyarrow_does(folder):
    found = footers.checked(scan.connect(), folder)
    assert found == check_files(folder)
    old = folder / "cluster=h200" / "run=h200-old" / "old.parquet"  # an older minor schema: fewer columns
    assert "loss_curve" not in found[old] and "loss_curve" in found[next(f for f in found if f != old)]


def test_a_folder_with_a_foreign_file_gets_the_pyarrow_check(folder, tmp_path):
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    tree = tmp_path / "results"
    shutil.copytree(folder, tree)
    pq.write_table(pa.table({"x": [1]}), tree / "foreign.parquet")
    with pytest.raises(Exception) as raised:
        footers.checked(scan.connect(), tree)
    with pytest.raises(Exception) as expected:
        check_files(tree)
    assert str(raised.value) == str(expected.value) and "foreign.parquet" in str(raised.value)
    assert footers.checked(scan.connect(), tree, skip_bad=True) == check_files(tree, skip_bad=True)


def test_plot_lays_the_figure_out_once_and_draws_it_once(folder, tmp_path, monkeypatch):
    """No layout engine runs (the panels are placed from text widths, `plot_layout`), and saving draws the figure
    once: no draw to measure, none to lay out. (The one other figure drawn is the tiny one that loads the fonts
    while DuckDB aggregates, `plot._import_matplotlib`.)"""
    from matplotlib.figure import Figure
    from matplotlib.layout_engine import LayoutEngine

    layouts, draws = [], []
    draw = Figure.draw
    for engine in LayoutEngine.__subclasses__():
        monkeypatch.setattr(engine, "execute", lambda self, fig: layouts.append(fig))
    monkeypatch.setattr(Figure, "draw", lambda fig, renderer: draws.append(fig) or draw(fig, renderer))
    res = invoke("results", "plot", folder, "--out", tmp_path / "fig.png")
    assert res.exit_code == 0, res.output
    assert layouts == [] and len(draws) == 2  # the warm-up figure, drawn first, then the plot
    panels = [ax for ax in draws[1].axes if ax.get_visible()]
    assert len(panels) == 6 and draws[1].get_layout_engine() is None  # three models, a speed and a max-batch panel each


def test_a_results_command_imports_neither_the_grid_nor_the_catalog(sweep_env):
    """`sweep results ...` builds its own sub-app alone (sweep.cli.main): the run and tune commands' modules
    import the grid schema and the cluster catalog (~0.2 s of every results command's start at 10^6 rows)."""
    code = (
        "import sys; sys.argv = ['sweep', 'results', 'show', '--help']\nfrom sweep.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('sweep.spec.grid', 'clusters.catalog', 'torch', 'ray') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=sweep_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
