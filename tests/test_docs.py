"""README.md and docs/: short, current, without history, and every command they show is one the CLI takes.

The reference pages under docs/reference/ are generated from the code (`python -m sweep.docs_gen`, `make docs`);
a page that differs from what the code generates fails here. Every `sweep ...` line of a shell block in README.md
and docs/*.md is parsed by the real CLI (the command exists, every option is its own and of the right type),
and the grid-less `sweep plan` lines are run.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from sweep import docs_gen
from sweep.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
USER_DOCS = [README, *PAGES, *sorted((ROOT / "docs" / "reference").glob("*.md"))]
# a session, an issue or a commit of the project's own history; a bare hex word of 7+ characters with a digit
HISTORY = re.compile(
    r"\bsessions? \d+|\bissue \d+|\bcommit [0-9a-f]{7}|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"
)


def shown_commands(text: str) -> list[str]:
    """Each `sweep ...` line of the bash/console blocks of a page, continuations joined, comments dropped."""
    commands = []
    for block in re.findall(r"```(?:bash|console)\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"^\$ ", "", line.strip())
            if line.startswith("sweep "):
                commands.append(line.split(" #", 1)[0].strip())
    return commands


ALL_SHOWN = sorted({(doc.name, c) for doc in [README, *PAGES] for c in shown_commands(doc.read_text())})


def test_readme_is_short_and_answers_the_three_tasks_early():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, len(lines)
    early = "\n".join(lines[:120])
    for needed in ("ray start --head", "sweep max-batch", "sweep tune", "--format md", "make demo", "make test"):
        assert needed in early, needed


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_docs_carry_no_history(doc):
    assert HISTORY.findall(doc.read_text()) == []


def test_the_history_pattern_finds_what_it_must():
    text = "as session 9 found (issue 16's table, commit eeca41d); trial 110ec589"
    assert len(HISTORY.findall(text)) == 4
    assert HISTORY.findall("fp8 e4m3fnuz on gfx942, model gpt-L1-d64-6ff793, 1048576 tokens") == []


def test_every_local_link_resolves():
    for doc in [README, *PAGES, *sorted((ROOT / "docs" / "reference").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text()):
            assert (doc.parent / target).exists(), f"{doc.name}: {target}"


def test_the_committed_reference_is_what_the_code_generates():
    done = subprocess.run(
        [sys.executable, "-m", "sweep.docs_gen", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_the_check_fails_on_a_stale_page(tmp_path, monkeypatch):
    monkeypatch.setattr(docs_gen, "REFERENCE", tmp_path)
    assert docs_gen.main([]) == 0 and docs_gen.stale() == []
    page = tmp_path / "grid.md"
    page.write_text(page.read_text().replace("`batch_sizes`", "`batch_size`"))
    assert docs_gen.stale() == [page] and docs_gen.main(["--check"]) == 1


def test_the_reference_has_every_key_column_and_command():
    from sweep.record.schema import RESULT_SCHEMA
    from sweep.spec.grid import GridSpec

    grid, columns, cli = (docs_gen.grid_page(), docs_gen.columns_page(), docs_gen.cli_page())
    assert all(f"| `{key}` |" in grid for key in GridSpec.model_fields)
    assert all(f"| `{name}` |" in columns for name in RESULT_SCHEMA.names)
    for command in ("run", "plan", "max-batch", "tune", "results compare", "results query", "clusters show"):
        assert f"## `sweep {command}`" in cli


def _resolve(args: list[str]):
    """The click command an argument list names, and the arguments left for it."""
    command, path = typer.main.get_command(app), ["sweep"]
    while hasattr(command, "commands") and args and args[0] in command.commands:
        path.append(args[0])
        command, args = command.commands[args[0]], args[1:]
    assert not hasattr(command, "commands"), f"{' '.join(path)}: no such command"
    return command, " ".join(path), args


@pytest.mark.parametrize("doc,command", ALL_SHOWN, ids=[f"{d}: {c[:60]}" for d, c in ALL_SHOWN])
def test_every_command_shown_is_one_the_cli_takes(doc, command):
    cmd, name, args = _resolve(shlex.split(command)[1:])
    cmd.make_context(name, args)  # unknown option, bad choice or type, missing argument: raises


def test_the_shown_commands_are_many_and_a_wrong_one_is_refused():
    assert len(ALL_SHOWN) >= 30
    cmd, name, args = _resolve(["results", "export", "results", "--format", "xlsx"])
    with pytest.raises(typer.BadParameter):  # xlsx is not a --format choice
        cmd.make_context(name, args)


PLANS = [(d, c) for d, c in ALL_SHOWN if c.startswith("sweep plan --")]


@pytest.mark.parametrize("doc,command", PLANS, ids=[f"{d}: {c[:60]}" for d, c in PLANS])
def test_every_grid_less_plan_shown_plans(doc, command, cli):
    result = cli(*shlex.split(command)[1:])
    assert result.exit_code == 0, result.output
