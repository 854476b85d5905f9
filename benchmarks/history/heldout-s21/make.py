"""A held-out 10^6-row results folder (session 21): 497 daily runs of one cluster each, every run a whole grid of
2,016 configs in shuffled order, seed 1 (bench_results writes 8 runs a cluster of rows in grid order, seed 0).

Written as DATA/rows-1000000 with bench_results' `.done` marker, so bench_results times it as its own folder:
PYTHONPATH=. python benchmarks/history/heldout-s21/make.py /tmp/heldout
PYTHONPATH=. python benchmarks/bench_results.py --data /tmp/heldout --rows 1000 1000000
"""

import random
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from sweep.record.compact import compact
from sweep.record.schema import SCHEMA_VERSION, to_table
from sweep.record.store import result_files

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import bench_results as bench  # noqa: E402

n_rows = 1_000_000
out = Path(sys.argv[1]) / f"rows-{n_rows}"
rng, written, run, t = random.Random(1), 0, 0, time.perf_counter()
clusters = list(bench.CLUSTERS)
while written < n_rows:
    run += 1
    cluster = clusters[run % 4]
    rows = bench._rows_for_run(cluster, run, rng, written)
    rng.shuffle(rows)
    rows = rows[: n_rows - written]
    path = out / f"cluster={cluster}" / f"run={cluster}-{run}" / "part-0.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(to_table(rows), path)
    compact(out, [out / f"cluster={cluster}"])  # the run's end, as `sweep run` merges
    written += len(rows)
(out / ".done").write_text(f"{len(result_files(out))} {SCHEMA_VERSION} {bench.LAYOUT}\n")  # as bench_results.folder
print(f"{written} rows, {run} runs, {len(result_files(out))} files, {time.perf_counter() - t:.0f} s")
