"""A warm-up one step shorter, replayed (session 44): see warmup-shorter-replay-2026-12-07-s44.md beside this file.

python3 benchmarks/history/warmup-shorter-replay-2026-12-07-s44.py STEP_TIMES.jsonl...
"""

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: steps_check, which finds the checkout

from steps_check import warmup_replays  # noqa: E402

MEASURED = 8  # steps.measure_max's default (sweep/spec/grid.py)

out = []
for _, r, taken in warmup_replays([Path(a) for a in sys.argv[1:]]):
    times = r["step_times_s"]
    reference = statistics.median(times[r["warmup_steps"] :])
    now = 100 * (statistics.median(times[taken : taken + MEASURED]) / reference - 1)
    shorter = 100 * (statistics.median(times[taken - 1 : taken - 1 + MEASURED]) / reference - 1)
    out.append((shorter, now, r["precision"], r["batch_size"], r["source"]))
for shorter, now, precision, batch, source in sorted(out, key=lambda o: -abs(o[0])):
    print(f"{precision} batch {batch} ({source}): one step shorter {shorter:+.2f} %, as now {now:+.2f} %")
worst_shorter, worst_now = (max(abs(o[i]) for o in out) for i in (0, 1))
print(f"{len(out)} rows: worst one step shorter {worst_shorter:.2f} %, as now {worst_now:.2f} %")
