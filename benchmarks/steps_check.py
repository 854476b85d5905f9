"""Should `auto` steps be the default (issue 28, item 4)? Replays the step rules on steps a GPU really took.

    python3 benchmarks/steps_check.py RESULTS_DIR

RESULTS_DIR holds rows of trials run with many fixed steps (benchmarks/campaigns/cold-sweep/d-steps.yaml: 10 warm-up +
30 measured), whose `step_times_s` column is every step's time, warm-up first. For each clean row, the `auto` rules
(trainer/stopping.py: warm-up until the last 2 steps agree within 10 %, measurement until the median's 95 % interval is
within ±1 %) and the counts (warm-up 3, measured 10: sweep.spec.steps, every grid's default before session 47, a CPU
rank's since) are fed the same steps one at a time, as a trial's rank 0 feeds them, and each median is compared with the
row's own (its 30 measured steps). `auto` measures at most steps.measure_max steps, as a grid's `measure: auto` does (8;
`--cap M` replays another cap, `--cap 0` none). Cost is the seconds of the steps each rule takes after the first (the
first holds the compile, which both pay). `auto` becomes the default only if, on every row, its median is within 1 % of
the reference and its cost is lower than the default's (the condition issue 15 set), or the default's own median is not
within 1 % there (a cost saved by a wrong median is no saving: session 47's held-out bf16 row, whose 3 warm-up steps
left noisy ones in the default's 10). Prints a markdown table and the verdict; exits 1 when the condition does not hold
(auto stays opt-in), 2 when there are no rows.

    python3 benchmarks/steps_check.py --warmup RESULTS_DIR...

checks the `auto` warm-up alone on any rows with enough steps (`warmup_check`). ROWS is a results folder or a
JSON-lines file that `--save OUT.jsonl DIR...` wrote from folders: benchmarks/history keeps the step times so.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when sweep is not installed

from sweep.record import store  # noqa: E402
from sweep.spec.steps import CPU_MEASURE, CPU_WARMUP, MEASURE_MAX_DEFAULT  # noqa: E402
from trainer.stopping import Schedule, StepsSpec, WarmUp  # noqa: E402

DEFAULT: tuple[StepsSpec, StepsSpec] = (CPU_WARMUP, CPU_MEASURE)
WARMUP_MAX = 50  # `--cap` lowers the measured steps' maximum alone: the warm-up keeps WarmUp's own
SAME_PCT = 1.0


def replay(
    times: list[float], warmup: StepsSpec, measure: StepsSpec, auto_max: tuple[int, int] | None = None
) -> tuple[int, list[float]] | None:
    """The steps a schedule takes on these step times and its measured ones; None if it is not done by the last."""
    schedule = Schedule(warmup, measure, auto_max)
    for used, step in enumerate(times, start=1):
        schedule.add(step)
        if schedule.phase == "done":
            return used, schedule.measure.times
    return None


def _reading(
    times: list[float], rule: tuple[StepsSpec, StepsSpec], reference: float, auto_max: tuple[int, int] | None = None
) -> tuple[int, float, float, int] | None:
    """A rule's steps taken, its median's % off the reference, the seconds of its steps after the first (which holds
    the compile), and its measured steps; None if it is not done by the last step."""
    run = replay(times, *rule, auto_max)
    if run is None:
        return None
    used, measured = run
    return used, 100 * (statistics.median(measured) / reference - 1), sum(times[1:used]), len(measured)


STEP_FIELDS = ("status", "precision", "batch_size", "warmup_steps", "step_times_s")


def read_rows(path: Path) -> list[dict]:
    """A results folder's rows, or a JSON-lines file of rows' STEP_FIELDS (`--save`: what benchmarks/history keeps of
    row folders that stay off the tree)."""
    if path.is_file():
        return [json.loads(line) for line in path.read_text().splitlines() if line]
    return store.read_table(path).to_pylist() if store.result_files(path) else []


def save(folders: list[Path], out: Path) -> int:
    """`--save OUT DIR...`: the STEP_FIELDS of every clean row with step times, one JSON line each, `source` its
    folder's name."""
    with out.open("w") as f:
        for folder in folders:
            for r in read_rows(folder):
                if r["status"] == "ok" and r.get("step_times_s"):
                    f.write(json.dumps({"source": folder.name, **{k: r[k] for k in STEP_FIELDS}}) + "\n")
    return 0


def main(folder: Path, cap: int = MEASURE_MAX_DEFAULT) -> int:
    """The table and verdict; `cap`: `auto` measures at most this many steps (a trial's `auto_max`), by default as a
    grid's `measure: auto` does (steps.measure_max); `--cap M` replays another, `--cap 0` none (auto before it)."""
    rows = [r for r in read_rows(folder) if r["status"] == "ok" and r.get("step_times_s")]
    if not rows:
        print(f"no clean rows with step_times_s in {folder}", file=sys.stderr)
        return 2
    header = f"| precision | batch | reference median s | default {DEFAULT[0]} + {DEFAULT[1]}: median, cost "
    print(header + "| auto: steps (warm-up), median, cost |")
    print("|---|---:|---:|---|---|")
    holds = True
    for r in sorted(rows, key=lambda r: (r["precision"], r["batch_size"])):
        times = r["step_times_s"]
        reference = statistics.median(times[r["warmup_steps"] :])
        auto_max = (WARMUP_MAX, cap) if cap else None
        default, auto = _reading(times, DEFAULT, reference), _reading(times, ("auto", "auto"), reference, auto_max)
        default_cell = "not done" if default is None else f"{default[1]:+.2f} %, {default[2]:.2f} s"
        if auto is None:
            auto_cell, holds = f"not done in {len(times)} steps", False
        else:
            used, off, cost, measured = auto
            warmup = used - measured
            auto_cell = f"{used} ({warmup}) steps, {off:+.2f} %, {cost:.2f} s"
            cheaper = default is None or cost < default[2] or abs(default[1]) > SAME_PCT  # or the default is wrong
            holds = holds and abs(off) <= SAME_PCT and cheaper
        print(f"| {r['precision']} | {r['batch_size']} | {reference:.4f} | {default_cell} | {auto_cell} |")
    verdict = (
        "auto becomes the default"
        if holds
        else "auto stays opt-in (not the same median at a lower cost, or a right one where the default's is wrong, on "
        "every row)"
    )
    print(f"\n{len(rows)} rows: {verdict}")
    return 0 if holds else 1


def warmup_replays(folders: list[Path]) -> Iterator[tuple[Path, dict, int]]:
    """Every clean row with at least 5 steps after its own warm-up and after `WarmUp`'s, with the steps `WarmUp` takes
    on its step times: (its folder or file, the row, the steps taken)."""
    for folder in folders:
        for r in read_rows(folder):
            times, own = r.get("step_times_s"), r["warmup_steps"]
            if r["status"] != "ok" or not times or len(times) - own < 5:
                continue
            rule = WarmUp()
            taken = next((i for i, t in enumerate(times, start=1) if rule.add(t)), len(times))
            if len(times) - taken >= 5:
                yield folder, r, taken


def warmup_check(folders: list[Path]) -> int:
    """`--warmup`: does the `auto` warm-up leave out enough? For every clean row with at least 5 steps after its own
    warm-up, the steps `WarmUp` takes on its step times, and the median of the steps after them against the median of
    the row's own measured steps. Prints one line per row, worst first; exits 1 if one is over SAME_PCT off."""
    lines = []
    for folder, r, taken in warmup_replays(folders):
        times, own = r["step_times_s"], r["warmup_steps"]
        off = 100 * (statistics.median(times[taken:]) / statistics.median(times[own:]) - 1)
        lines.append(
            (
                off,
                f"{r['precision']} batch {r['batch_size']} ({r.get('source', folder.name)}): warm-up {taken} steps "
                f"(the row's {own}), median {off:+.2f} %",
            )
        )
    for _, line in sorted(lines, key=lambda x: -abs(x[0])):
        print(line)
    worst = max((abs(off) for off, _ in lines), default=0.0)
    print(f"\n{len(lines)} rows: worst {worst:.2f} % (at most {SAME_PCT:g} %)")
    return 2 if not lines else int(worst > SAME_PCT)


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--save":
        sys.exit(save([Path(a) for a in sys.argv[3:]], Path(sys.argv[2])))
    if len(sys.argv) > 2 and sys.argv[1] == "--warmup":
        sys.exit(warmup_check([Path(a) for a in sys.argv[2:]]))
    if len(sys.argv) == 4 and sys.argv[1] == "--cap":  # 0: no cap
        sys.exit(main(Path(sys.argv[3]), cap=int(sys.argv[2])))
    if len(sys.argv) != 2:
        sys.exit(
            "usage: python3 benchmarks/steps_check.py ROWS | --cap M ROWS | --warmup ROWS... | --save OUT.jsonl DIR..."
        )
    sys.exit(main(Path(sys.argv[1])))
