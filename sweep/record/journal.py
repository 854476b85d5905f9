"""The journal of result-file merges (``sweep.record.compact``), one per ``cluster=`` folder: which merged file
replaced which files. ``store.result_files`` reads it after listing a folder, to leave out the inputs of a merge
that is done; ``compact`` writes it (read here, so that ``store`` needs nothing of ``compact``)."""

from __future__ import annotations

import json
from pathlib import Path

JOURNAL = "_merges.json"


def excluded(folder: Path, listed: set[Path]) -> set[Path]:
    """The files of ``folder``'s journal that a merged file in ``listed`` replaced (read after the listing)."""
    out: set[Path] = set()
    for entry in read(folder):
        if folder / entry["output"] in listed:
            out.update(folder / name for name in entry["inputs"])
    return out


def read(folder: Path) -> list[dict]:
    try:
        return json.loads((folder / JOURNAL).read_text())["merges"]
    except FileNotFoundError:
        return []
