"""A Rich table as Rich prints it where there is no terminal (a pipe, a file): the same characters, drawn directly.

Rich lays out every cell as styled segments, about 300 table rows a second: a 200-row `max-batch` or `compare` table
costs half a second. Without a terminal Rich prints no colour or style, at a fixed width, and a table that fits
that width keeps every column at its widest cell: that text is drawn here in one pass (the title and caption, a
line or two, still by Rich). Whatever Rich would lay out otherwise (a table wider than the console, a cell that
Rich reads as markup or emoji codes, a cell on several lines or with leading or trailing blanks) returns None, and
Rich draws it as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console, JustifyMethod

# box.HEAVY_HEAD, as Rich's Table draws it by default: (left, between, right, fill) per kind of line
_TOP, _HEAD, _RULE, _ROW, _BOTTOM = (
    ("┏", "┳", "┓", "━"),
    ("┃", "┃", "┃", " "),
    ("┡", "╇", "┩", "━"),
    ("│", "│", "│", " "),
    ("└", "┴", "┘", "─"),
)


def _plain(text: str) -> bool:
    """Whether Rich prints ``text`` as it is: no markup, no emoji code, one line, nothing it would strip."""
    from rich._emoji_replace import _emoji_replace

    return "[" not in text and text.isprintable() and text == text.strip() and _emoji_replace(text) == text


def draw(
    console: Console,
    title: str | None,
    caption: str | None,
    headers: Sequence[str],
    right: Sequence[bool],
    rows: Sequence[Sequence[str]],
) -> str | None:
    """The table Rich's colourless ``console`` prints for ``Table(title=title, caption=caption,
    title_justify="left")`` with a column per header (right-justified where ``right``) and ``rows`` of plain cells;
    None where Rich must lay it out itself."""
    from rich.cells import cell_len

    if not headers or not all(_plain(h) for h in headers):
        return None
    widths = [cell_len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            if cell and not _plain(cell):  # markup escaped by the caller still reads as this text
                return None
            widths[i] = max(widths[i], cell_len(cell))
    total = sum(widths) + 3 * len(widths) + 1  # one blank each side of a cell, a border between and around
    if total > console.width:
        return None
    lines = _annotation(console, title, "left", total)
    lines.append(_rule(_TOP, widths))
    lines.append(_cells(_HEAD, headers, widths, right, cell_len))
    lines.append(_rule(_RULE, widths))
    lines += [_cells(_ROW, row, widths, right, cell_len) for row in rows]
    lines.append(_rule(_BOTTOM, widths))
    lines += _annotation(console, caption, "center", total)
    return "\n".join(lines) + "\n"


def _annotation(console: Console, text: str | None, justify: JustifyMethod, width: int) -> list[str]:
    """A title or caption as Rich's Table lays it out (its markup read, wrapped and justified to the table's
    width): one short text, so Rich itself renders it."""
    if not text:
        return []
    options = console.options.update(width=width, highlight=False, height=None, justify=justify)
    rendered = console.render_lines(console.render_str(text, highlight=False), options, pad=False)
    return ["".join(segment.text for segment in line) for line in rendered]


def _rule(box: tuple[str, str, str, str], widths: Sequence[int]) -> str:
    left, between, right, fill = box
    return left + between.join(fill * (w + 2) for w in widths) + right


def _cells(
    box: tuple[str, str, str, str],
    cells: Sequence[str],
    widths: Sequence[int],
    right: Sequence[bool],
    cell_len: Callable[[str], int],
) -> str:
    left, between, end, _ = box
    parts = []
    for cell, w, r in zip(cells, widths, right):
        pad = " " * (w - cell_len(cell))
        parts.append(f" {pad}{cell} " if r else f" {cell}{pad} ")
    return left + between.join(parts) + end
