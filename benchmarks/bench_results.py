"""How long `sweep results` takes to aggregate 100 000 attempts.

Writes synthetic result rows (4 clusters × 6 models × 4 precisions × 3 compile modes × 2 AC modes ×
7 batch sizes × 2 sequence lengths, run after run until N rows; OOM above a per-model limit, a few
errors and timeouts, one precision unsupported on one cluster) as one big Parquet file per
(cluster, run), with the sweep schema and its version metadata. Then times, in this process,
loading + aggregating for max-batch, compare and export (first call, which pays the DuckDB import,
and the best of three), and the whole CLI in a fresh interpreter.

    PYTHONPATH=. python benchmarks/bench_results.py [--rows 100000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from sweep.schema import to_table

CLUSTERS = {"h100": (989.0, 380.0, 80), "h200": (989.0, 420.0, 141), "b200": (2250.0, 900.0, 180), "mi300x": (1307.0, 460.0, 192)}
MODELS = {"llama3-1b": 1.2e9, "llama3-3b": 3.2e9, "llama3-8b": 8.0e9, "qwen2.5-14b": 14.8e9, "mistral-24b": 23.6e9, "llama3-70b": 70.6e9}
PRECISIONS = {"bf16": 1.0, "fp8-te": 1.12, "fp8-torchao": 1.07, "mxfp8-te": 1.2}
COMPILES, ACS, BATCHES, SEQS = ("none", "regional", "full"), ("none", "selective"), (1, 2, 4, 8, 16, 32, 64), (2048, 8192)


def _rows_for_run(cluster: str, run: int, rng: random.Random, start: int) -> list[dict]:
    peak, speed, mem = CLUSTERS[cluster]
    t0 = dt.datetime(2025, 6, 1, tzinfo=dt.timezone.utc) + dt.timedelta(days=run)
    rows = []
    for model, n_params in MODELS.items():
        for precision, factor in PRECISIONS.items():
            for compile_ in COMPILES:
                for ac in ACS:
                    for seq in SEQS:
                        # Largest batch that fits: memory over a crude per-sample footprint.
                        per_sample = n_params / 8 / 1e9 * seq / 2048 * (0.4 if ac == "selective" else 1.0) / (1.3 if precision != "bf16" else 1)
                        limit = max(0.0, mem - 18 * n_params / 8 / 1e9) / max(per_sample, 1e-3)
                        for batch in BATCHES:
                            n = start + len(rows)
                            status, error, metrics = "ok", None, {}
                            if cluster == "mi300x" and precision == "mxfp8-te":
                                status, error = "unsupported", "MXFP8 needs sm100"
                            elif batch > limit:
                                status, error = "oom", "CUDA out of memory. Tried to allocate 4.00 GiB"
                            elif rng.random() < 0.01:
                                status, error = rng.choice([("error", "NCCL watchdog timeout"), ("timeout", "trial exceeded 900 s")])
                            else:
                                tf = speed * factor * (1 - 0.3 / batch) * (1.08 if compile_ != "none" else 1) * rng.uniform(0.97, 1.03)
                                tokens = tf * 1e12 / (6 * n_params)
                                metrics = dict(tflops_per_gpu=tf, mfu=tf / peak, tokens_per_s_per_gpu=tokens,
                                               step_time_s=batch * seq / tokens, peak_mem_gib=min(mem, 10 + batch * per_sample),
                                               peak_tflops=peak, flops_per_token=6 * n_params)
                            rows.append({"run_id": f"{cluster}-{run}", "trial_id": f"t{n:07d}", "attempt": 1, "cluster": cluster,
                                         "accelerator": cluster, "world_size": 8, "nodes": 1, "model": model, "precision": precision,
                                         "compile": compile_, "ac": ac, "batch_size": batch, "seq_len": seq, "status": status,
                                         "error": error, "started_at": t0 + dt.timedelta(seconds=30 * n), **metrics})
    return rows


def write_dataset(out: Path, n_rows: int) -> int:
    """Write about ``n_rows`` rows (cut at exactly n_rows) as one file per cluster and run; return files."""
    rng, written, files, run = random.Random(0), 0, 0, 0
    while written < n_rows:
        run += 1
        for cluster in CLUSTERS:
            rows = _rows_for_run(cluster, run, rng, written)[: n_rows - written]
            if not rows:
                break
            path = out / f"cluster={cluster}" / f"run={cluster}-{run}" / "part-0.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(to_table(rows), path)
            written, files = written + len(rows), files + 1
    return files


def _time(fn, repeat: int = 3) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times[0], min(times)


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.system()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--keep", type=Path, help="write the dataset here and keep it")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        out = args.keep or Path(tmp)
        t = time.perf_counter()
        files = write_dataset(out, args.rows)
        print(f"wrote {args.rows} rows in {files} files to {out} ({time.perf_counter() - t:.1f} s)")
        print(f"machine: {_machine()}")

        from sweep.results import aggregate, render

        n_configs = aggregate.configs(out).num_rows
        cases = {
            "max-batch": lambda: aggregate.max_batch(out),
            "compare --baseline bf16": lambda: aggregate.compare(out, "bf16"),
            "compare --by cluster --baseline h100": lambda: aggregate.compare(out, "h100", "cluster"),
            "export --format md": lambda: render.markdown(aggregate.configs(out).to_pylist(), render.EXPORT_COLS),
            "export --format csv": lambda: render.csv_text(*(lambda t: (t.to_pylist(), t.column_names))(aggregate.configs(out))),
        }
        print(f"{args.rows} rows -> {n_configs} configs; seconds (first call, best of 3), load from disk included:")
        for name, fn in cases.items():
            first, best = _time(fn)
            print(f"  {name:<38} {first:6.3f}  {best:6.3f}")

        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")]))}
        print("whole CLI in a fresh interpreter (python -m sweep results ...), seconds:")
        for argv in (["max-batch", str(out)], ["compare", str(out)], ["export", str(out)], ["query", str(out), "SELECT count(*) FROM results"]):
            t = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "sweep", "results", *argv], env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t
            print(f"  {' '.join(argv[:1] + argv[2:]):<38} {wall:6.3f}" + ("" if done.returncode == 0 else f"  (exit {done.returncode}: {done.stderr.strip()[-200:]})"))


if __name__ == "__main__":
    main()
