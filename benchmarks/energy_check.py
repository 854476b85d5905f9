"""Check the energy-one-gpu campaign's rows against issue 32's acceptance, and print its table.

    python3 benchmarks/energy_check.py RESULTS_DIR [--idle-w 80]

RESULTS_DIR holds both repeats (benchmarks/device/energy.sh writes them to RESULTS_DIR/repeat-1 and repeat-2).
Per config (model × precision × batch × ...): every energy column recorded; energy from the counter; the
repeats' joules per token within 3 % (max / min - 1); each row's avg_power_w above idle and at most its power
limit; the counter's energy within 5 % of sampled power × time. Prints one line per check (ok / FAIL); exits 1
when a check failed, 2 when there are no rows. The table: `sweep results export RESULTS_DIR -f md` (energy.sh
prints it after the checks).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when sweep is not installed

from sweep.record.energy import ENERGY_COLUMNS  # noqa: E402
from sweep.results import aggregate  # noqa: E402
from sweep.results.query import CONFIG_KEYS  # noqa: E402

REPEAT_PCT, SAMPLED_PCT = 3.0, 5.0


def _name(row: dict) -> str:
    return f"{row['model']} {row['precision']} batch {row['batch_size']}"


def checks(rows: list[dict], idle_w: float) -> list[tuple[bool, str]]:
    """(passed, what) for every check of every ok row and config in ``rows``."""
    out: list[tuple[bool, str]] = []
    configs: dict[tuple, list[dict]] = defaultdict(list)
    for row in (r for r in rows if r["status"] == "ok"):
        configs[tuple(row[k] for k in CONFIG_KEYS)].append(row)
        name = _name(row)
        missing = [c for c in ENERGY_COLUMNS if row.get(c) is None]
        out.append(
            (
                not missing,
                f"{name}: every energy column recorded" + (f" (null: {', '.join(missing)})" if missing else ""),
            )
        )
        if missing:
            continue
        out.append((row["energy_source"] == "counter", f"{name}: energy from the {row['energy_source']}"))
        power, limit = row["avg_power_w"], row["power_limit_w"]
        out.append((idle_w < power <= limit, f"{name}: avg power {power:.1f} W in ({idle_w:g}, {limit:g}] W"))
        gap = 100 * abs(row["energy_j"] / row["energy_sampled_j"] - 1)
        out.append(
            (
                gap <= SAMPLED_PCT,
                f"{name}: counter {row['energy_j']:.0f} J vs sampled "
                f"{row['energy_sampled_j']:.0f} J: {gap:.2f} % (≤ {SAMPLED_PCT:g} %)",
            )
        )
    for group in configs.values():
        name = _name(group[0])
        jpt = [r["joules_per_token"] for r in group if r.get("joules_per_token") is not None]
        if len(jpt) < 2:
            out.append((False, f"{name}: {len(jpt)} repeat(s) with joules per token; 2 needed"))
            continue
        spread = 100 * (max(jpt) / min(jpt) - 1)
        out.append(
            (spread <= REPEAT_PCT, f"{name}: {len(jpt)} repeats' J/token within {spread:.2f} % (≤ {REPEAT_PCT:g} %)")
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--idle-w", type=float, default=80.0, help="the GPU's idle draw (H200: 78-80 W)")
    args = parser.parse_args(argv)
    rows = aggregate.load_rows(args.results, extra=ENERGY_COLUMNS).to_pylist()
    if not rows:
        print(f"error: no result rows under {args.results}", file=sys.stderr)
        return 2
    results = checks(rows, args.idle_w)
    for passed, what in results:
        print(f"{'ok  ' if passed else 'FAIL'} {what}")
    failed = sum(not p for p, _ in results)
    print(f"{len(results) - failed} of {len(results)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
