"""bench_results' commands on one folder: first runs (its _cache/ removed) and later runs, medians of 3.

PYTHONPATH=. python benchmarks/history/heldout-s21/time.py /tmp/heldout/rows
"""

import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_results as bench  # noqa: E402


def cell(runs: list[tuple[float, int, int, float]]) -> str:
    return f"{statistics.median(r[0] for r in runs):.2f} s / {max(r[1] for r in runs) / 2**20:.0f} MiB"


folder, tmp = Path(sys.argv[1]), tempfile.mkdtemp()
for name, template in bench.COMMANDS.items():
    argv = [a.format(dir=folder, tmp=tmp) for a in template]
    first = []
    for _ in range(3):
        shutil.rmtree(folder / "_cache", ignore_errors=True)
        first.append(bench.run_once(argv))
    print(f"| `{name}` | {cell(first)} | {cell([bench.run_once(argv) for _ in range(3)])} |", flush=True)
