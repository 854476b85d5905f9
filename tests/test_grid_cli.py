"""Grid files through the CLI, as a user writes them: `sweep plan` / `sweep run` on a YAML file.

The README's own grid block, `memory_cap:` read from a file, inline models that must stay apart in the
results, inline specs that cannot train refused before anything runs, and grid mistakes reported in one
line that names every one of them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sweep.record import store

GRIDS_DOC = Path(__file__).resolve().parents[1] / "docs" / "grids.md"


def readme_grid() -> str:
    """The yaml block under docs/grids.md's "## The grid file" heading, as a user would copy it."""
    text = GRIDS_DOC.read_text(encoding="utf-8")
    section = text[text.index("\n## The grid file\n") :]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


def run_rows(cli, grid: Path, out: Path) -> list[dict]:
    """`sweep run` of a grid file on the local (CPU) profile; the rows it wrote."""
    result = cli("run", grid, "--cluster", "local", "--output", out, "--no-progress")
    assert result.exit_code == 0, result.output
    return store.read_table(out).to_pylist()


def error_line(result) -> str:
    """The one line a user mistake prints: exit 2, `error: ...` on stderr, no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


# -- the README's grid block, every documented key through the real path ---------------------------------


def test_the_readme_grid_block_plans_as_written(cli, write_grid):
    result = cli("plan", write_grid(readme_grid()), "--cluster", "h200")
    assert result.exit_code == 0, result.output
    assert "18 trials on h200" in result.stdout  # 2 models x 3 precisions x 3 batches


def test_the_readme_search_line_plans_with_one_start_batch(cli, write_grid):
    grid = readme_grid().replace("# search: max_batch", "search: max_batch")
    assert "\nsearch: max_batch" in grid
    result = cli("plan", write_grid(grid), "--cluster", "h200", "--batch-size", "1")
    assert result.exit_code == 0, result.output
    assert "6 trials on h200" in result.stdout and "max-batch search" in result.stdout


# -- memory_cap in a grid file ----------------------------------------------------------------------------


@pytest.mark.parametrize("text, size", [("4GiB", 4 * 1024**3), ("80GiB", 80 * 1024**3), ('"4096MiB"', 4 * 1024**3)])
def test_memory_cap_in_a_grid_file_reaches_the_trials(cli, write_grid, text, size):
    from sweep.service import prepare

    grid = write_grid(f"models: [gpt-tiny]\nbatch_sizes: [1, 2]\nmemory_cap: {text}\n")
    result = cli("plan", grid, "--cluster", "local")
    assert result.exit_code == 0, result.output
    _, _, trials = prepare(grid, "local", None)  # the trials `sweep run` executes, from the same path
    assert [t.memory_cap_bytes for t in trials] == [size, size]


@pytest.mark.integration
def test_a_grid_files_memory_cap_really_caps_the_ranks(ray_session, cli, write_grid, tmp_path):
    # Logits dominate memory (B x T x V floats): batch 32 cannot fit in 128 MiB more than the rank holds,
    # batch 1 can (tests/test_oom.py caps the same model with --memory-cap).
    grid = write_grid(
        "models: [{arch: gpt, name: wide-vocab, n_layers: 1, d_embd: 64, n_heads: 4, vocab_size: 4096,"
        " max_seq_len: 128}]\nbatch_sizes: [1, 32]\ncompile: none\nseq_len: 128\n"
        "steps: {warmup: 1, measure: 1}\non_oom: {policy: none}\nmemory_cap: 128MiB\n"
    )
    rows = {r["batch_size"]: r for r in run_rows(cli, grid, tmp_path / "out")}
    assert rows[1]["status"] == "ok", rows[1]["error"]
    assert rows[32]["status"] == "oom" and "allocat" in rows[32]["error"]
    assert {r["memory_cap_gib"] for r in rows.values()} == {0.125}


# -- a model's identity: its whole spec -------------------------------------------------------------------

TWO_VOCABS = """
models:
  - {arch: gpt, n_layers: 1, d_embd: 64, n_heads: 4, vocab_size: 256, max_seq_len: 64}
  - {arch: gpt, n_layers: 1, d_embd: 64, n_heads: 4, vocab_size: 512, max_seq_len: 64}
batch_sizes: [2]
compile: none
seq_len: 32
steps: {warmup: 1, measure: 1}
"""


def test_unnamed_inline_models_that_differ_get_different_labels(cli, write_grid):
    result = cli("plan", write_grid(TWO_VOCABS), "--cluster", "local")
    assert result.exit_code == 0, result.output
    assert "2 trials" in result.stdout
    assert len(set(re.findall(r"gpt-L1-d64-[0-9a-f]{6}", result.stdout))) == 2, result.stdout


@pytest.mark.integration
def test_unnamed_inline_models_that_differ_stay_apart_in_the_results(ray_session, cli, write_grid, tmp_path):
    out = tmp_path / "out"
    rows = run_rows(cli, write_grid(TWO_VOCABS), out)
    assert [r["status"] for r in rows] == ["ok", "ok"], [r["error"] for r in rows]
    assert len({r["model"] for r in rows}) == 2
    export = cli("results", "export", out, "--format", "csv")
    assert export.exit_code == 0, export.output
    lines = [line for line in export.stdout.splitlines() if line.strip()]
    assert len(lines) == 1 + 2, export.stdout  # header and one line per model, not one merged line of n 2


def test_a_name_stands_for_one_spec(cli, write_grid):
    spec = "{{arch: gpt, name: {name}, n_layers: 1, d_embd: 64, n_heads: 4, vocab_size: {vocab}}}"
    same = write_grid(
        f"models: [{spec.format(name='mine', vocab=256)}, {spec.format(name='mine', vocab=256)}]\nbatch_sizes: [1]\n"
    )
    result = cli("plan", same, "--cluster", "local")
    assert result.exit_code == 0 and "1 trial on local" in result.stdout, result.output  # one spec, given twice
    two = write_grid(
        f"models: [{spec.format(name='mine', vocab=256)}, {spec.format(name='mine', vocab=512)}]\nbatch_sizes: [1]\n"
    )
    assert "models.1: two different specs are named 'mine'" in error_line(cli("plan", two, "--cluster", "local"))
    registry = write_grid(f"models: [{spec.format(name='gpt-tiny', vocab=256)}]\nbatch_sizes: [1]\n")
    line = error_line(cli("plan", registry, "--cluster", "local"))
    assert "models.0: name 'gpt-tiny' is a registry model with other dims" in line


# -- inline specs that cannot train are refused at plan time ----------------------------------------------

LLAMA = "{arch: llama, n_layers: 1, d_embd: 64, n_heads: 4, n_kv_heads: 2, ffn_hidden: 128, vocab_size: 128}"


@pytest.mark.parametrize(
    "change, needle",
    [
        ("d_embd: 36", "models.0: head dim d_embd / n_heads = 36 / 4 = 9 is odd; llama's RoPE needs an even head dim"),
        ("d_embd: 30", "models.0: d_embd (30) must be divisible by n_heads (4)"),
        ("n_kv_heads: 3", "models.0: n_heads (4) must be divisible by n_kv_heads (3)"),
        ("n_layers: 0", "models.0.n_layers: Input should be greater than 0 (got 0)"),
        ("ffn_hidden: -1", "models.0.ffn_hidden: Input should be greater than 0 (got -1)"),
        ("vocab_size: '128'", "models.0.vocab_size: Input should be a valid integer (got '128')"),
        ("name: ''", "models.0.name: String should have at least 1 character"),
    ],
)
def test_inline_specs_that_cannot_train_are_refused_at_plan_time(cli, write_grid, change, needle):
    key = change.split(":")[0]
    spec = re.sub(rf"{key}: [^,}}]+", change, LLAMA) if key in LLAMA else LLAMA.replace("}", f", {change}}}")
    line = error_line(cli("plan", write_grid(f"models: [{spec}]\nbatch_sizes: [1]\n"), "--cluster", "local"))
    assert needle in line, line


# -- grid mistakes: every one named, the likely fix suggested ---------------------------------------------

MISTAKES = {
    "misspelt key": ("models: [gpt-tiny]\nbatchsizes: [1]\n", "unknown key 'batchsizes' — did you mean 'batch_sizes'?"),
    "misspelt nested key": (
        "models: [gpt-tiny]\nbatch_sizes: [1]\nsteps: {warmpu: 1}\n",
        "steps: unknown key 'warmpu' — did you mean 'warmup'?",
    ),
    "misspelt inline key": (
        "models: [{arch: gpt, n_layers: 1, d_embd: 64, n_heads: 4, vocab: 64}]\nbatch_sizes: [1]\n",
        "models.0: unknown key 'vocab' — did you mean 'vocab_size'?",
    ),
    "misspelt model": (
        "models: [gpt-tny]\nbatch_sizes: [1]\n",
        "models.0: unknown model 'gpt-tny' — did you mean 'gpt-tiny'?",
    ),
    "misspelt precision": (
        "models: [gpt-tiny]\nbatch_sizes: [1]\nprecisions: [bf16, fp8-torchao-tensorwize]\n",
        "precisions.1: unknown precision 'fp8-torchao-tensorwize' — did you mean 'fp8-torchao-tensorwise'?",
    ),
    "duplicate key": (
        "models: [gpt-tiny]\nbatch_sizes: [1]\nbatch_sizes: [2]\n",
        "line 3, column 1: key 'batch_sizes' appears twice",
    ),
    "duplicate nested key": (
        "models: [gpt-tiny]\nbatch_sizes: [1]\nsteps: {warmup: 1, warmup: 2}\n",
        "key 'warmup' appears twice",
    ),
    "quoted number": (
        'models: [gpt-tiny]\nbatch_sizes: ["4"]\n',
        "batch_sizes.0: Input should be a valid integer (got '4')",
    ),
    "quoted number in steps": (
        'models: [gpt-tiny]\nbatch_sizes: [1]\nsteps: {measure: "5"}\n',
        "steps.measure: expected a whole number >= 1, or auto (got '5')",
    ),
    "yes for a boolean": (
        'models: [gpt-tiny]\nbatch_sizes: [1]\nfp8_lm_head: "yes"\n',
        "fp8_lm_head.0: Input should be a valid boolean (got 'yes')",
    ),
    "off for none": (
        "models: [gpt-tiny]\nbatch_sizes: [1]\nac: off\n",
        "ac.0: Input should be 'none', 'selective' or 'full' (got False: YAML reads an unquoted "
        "on/off/yes/no as a boolean; quote it)",
    ),
}


@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_grid_mistakes_are_named_with_the_likely_fix(case, cli, write_grid):
    text, needle = MISTAKES[case]
    line = error_line(cli("plan", write_grid(text), "--cluster", "local"))
    assert needle in line, line
    assert "required key is missing" not in line  # a misspelt key's consequence is not a second mistake


def test_every_mistake_is_reported_unknown_keys_first(cli, write_grid):
    grid = write_grid("models: [gpt-tiny, falcon-40b]\nbatch_size: [1]\nprecisions: [bf61]\nseq_len: [0]\n")
    line = error_line(cli("plan", grid, "--cluster", "local"))
    valid = "gpt-tiny, gpt2-1.5b, llama-tiny, llama3-70b, llama3-70b-proxy, llama3-8b, mistral-7b"
    assert line == (
        f"error: Invalid grid {grid}: unknown key 'batch_size' — did you mean 'batch_sizes'?; "
        f"models.1: unknown model 'falcon-40b'; valid: {valid} "
        "(or an inline mapping: arch, n_layers, ...); "
        "precisions.0: unknown precision 'bf61' — did you mean 'bf16'?; "
        "seq_len.0: Input should be greater than 0 (got 0)"
    )


def test_a_misspelt_cluster_gets_the_closest_name(cli, write_grid):
    line = error_line(cli("plan", write_grid("models: [gpt-tiny]\nbatch_sizes: [1]\n"), "--cluster", "h20"))
    assert line == "error: unknown cluster 'h20' — did you mean 'h200'?"
