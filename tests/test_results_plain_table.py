"""A terminal table printed into a pipe is drawn without Rich's layout (sweep.results.plain_table), and reads
character for character as Rich prints it; what Rich would lay out otherwise is still Rich's."""

from __future__ import annotations

import pytest

from sweep.results import plain_table, render
from sweep.results.render import Col

COLS = [
    Col("model", "model", lambda r: r["model"], numeric=False),
    Col("status", "status", lambda r: r["status"], numeric=False),
    Col("tflops_per_gpu", "TFLOP/s/GPU", lambda r: r["tflops"]),
    Col("note", "note", lambda r: r["note"], numeric=False),
]


def _rows(n: int, note: str = "", model: str = "llama3-8b") -> list[dict]:
    return [
        {
            "model": f"{model}-{i % 3}",
            "status": "ok" if i % 4 else "oom",
            "tflops": f"{100 + 37 * i:,}",
            "note": note * (i % 3),
            "batch_size": i,
        }
        for i in range(n)
    ]


def _printed(capsys, monkeypatch, rows, title, note, by_rich: bool, cols=COLS) -> tuple[str, int]:
    drawn = []
    draw = plain_table.draw
    monkeypatch.setattr(plain_table, "draw", lambda *a: None if by_rich else drawn.append(draw(*a)) or drawn[-1])
    render.rich_table(rows, list(cols), title, note)
    return capsys.readouterr().out, sum(d is not None for d in drawn)


CASES = {
    "plain": (_rows(12), "results: 12 of 12 rows", ""),
    "no rows": ([], "results: none", "a caption"),
    "no title": (_rows(3), "", ""),
    "wide characters": (_rows(5, note="→ ≥ 日本"), "results", "β · ±1 %"),
    "a caption longer than the table wraps": (
        _rows(4),
        "results",
        " · ".join(f"note {i}: the most every ok row reached" for i in range(12)),
    ),
    "a title longer than the table wraps": (_rows(2), "results " + "x" * 60 + " y" * 40, ""),
    "markup in the title": (_rows(3), "results [bold]x[/bold] [1, 2]", ""),
}


@pytest.mark.parametrize("name", CASES)
def test_a_table_reads_as_rich_prints_it(capsys, monkeypatch, name):
    rows, title, note = CASES[name]
    ours, fast = _printed(capsys, monkeypatch, rows, title, note, by_rich=False)
    assert fast == 1  # drawn without Rich's layout
    assert ours == _printed(capsys, monkeypatch, rows, title, note, by_rich=True)[0]


@pytest.mark.parametrize(
    "rows",
    [
        _rows(3, note="[red]x[/red] "),
        _rows(3, note=":thumbs_up:"),
        _rows(3, note="a\nb"),
        _rows(3, note="trailing "),
        _rows(3, note="x" * 200),
    ],
    ids=["markup", "emoji code", "two lines", "trailing blank", "wider than the console"],
)
def test_what_rich_would_lay_out_is_left_to_rich(capsys, monkeypatch, rows):
    ours, fast = _printed(capsys, monkeypatch, rows, "results", "", by_rich=False)
    assert fast == 0
    assert ours == _printed(capsys, monkeypatch, rows, "results", "", by_rich=True)[0]
