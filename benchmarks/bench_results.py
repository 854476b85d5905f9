"""How long every `sweep results` command takes, and how much memory, on 10³, 10⁵ and 10⁶ result rows.

Writes synthetic result rows with the sweep schema (4 clusters × 6 models × 4 precisions × 3 compile modes ×
2 AC modes × 7 batch sizes × 2 sequence lengths, run after run until N rows; OOM above a per-model limit, a
few errors and timeouts, one precision unsupported on one cluster; loss curves from the later runs on, energy
on the GPUs that measure it, the software stack, the model spec) as one Parquet file per (cluster, run), merged
after each run as `sweep run` merges a cluster's files when a run ends (``sweep.record.compact``): 10⁶ rows are
~500 runs and ~80 files. Each folder is written once under --data and reused (rewritten when the schema version it
was written with is not the current one). Then runs each command as a user does, `python -m sweep results ...`
in a fresh interpreter (process start and imports included), RUNS times, and prints a markdown table of the
median wall time and the peak RSS (the child's own, from wait4) per command and row count, against the targets
of issue 31: ≤ 2 s, ≤ 1 GB, and ≤ 3× the command's time at 10³.

A command keeps its slow answers under the folder (``sweep/results/memo.py``, ``<folder>/_cache/``), so a run
after the first on unchanged files reads them back. Each command's first run therefore starts with that cache
removed (it builds the cache: what a user pays once after a sweep adds rows), RUNS times, and is reported in a
table of its own; the RUNS runs after the last of them are the first table's.

    PYTHONPATH=. python benchmarks/bench_results.py [--data /tmp/sweep-bench] [--rows 1000 100000 1000000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = {
    "h100": (989.0, 380.0, 80),
    "h200": (989.0, 420.0, 141),
    "b200": (2250.0, 900.0, 180),
    "mi300x": (1307.0, 460.0, 192),
}
MODELS = {
    "llama3-1b": (1.2e9, 16, 2048),
    "llama3-3b": (3.2e9, 28, 3072),
    "llama3-8b": (8.0e9, 32, 4096),
    "qwen2.5-14b": (14.8e9, 48, 5120),
    "mistral-24b": (23.6e9, 40, 5120),
    "llama3-70b": (70.6e9, 80, 8192),
}
PRECISIONS = {"bf16": 1.0, "fp8-te": 1.12, "fp8-torchao": 1.07, "mxfp8-te": 1.2}
COMPILES, ACS, BATCHES, SEQS = (
    ("none", "regional", "full"),
    ("none", "selective"),
    (1, 2, 4, 8, 16, 32, 64),
    (2048, 8192),
)
# the files as `sweep run` leaves them since runs merge theirs (a folder written before: written again)
LAYOUT = "merged-sorted-16k"
CURVES_FROM_RUN = 4  # the first runs predate loss curves (schema 1.9) and energy (1.10)
TARGET_S, TARGET_BYTES, TARGET_RATIO = 2.0, 1 << 30, 3.0
COMMANDS = {
    "show": ["show", "{dir}"],
    "max-batch": ["max-batch", "{dir}"],
    "compare": ["compare", "{dir}", "--baseline", "bf16"],
    "compare --by cluster": ["compare", "{dir}", "--by", "cluster", "--baseline", "h100"],
    "compare --best": ["compare", "{dir}", "--best"],
    "export md": ["export", "{dir}"],
    "export csv": ["export", "{dir}", "-f", "csv"],
    # a figure one can read: 16 series a panel (precision × cluster); all 8,064 configs are 192 series a panel,
    # which `plot` refuses (over --max-series 32) in ~1 s, naming a --where that narrows them
    "plot": ["plot", "{dir}", "--out", "{tmp}/plot.png", "-w", "seq_len=2048", "-w", "ac=none", "-w", "compile=none"],
}


def _spec(model: str) -> str:
    import json

    _, layers, width = MODELS[model]
    return json.dumps(
        {
            "arch": "llama",
            "name": model,
            "n_layers": layers,
            "d_embd": width,
            "n_heads": width // 128,
            "vocab_size": 128256,
            "n_kv_heads": 8,
            "ffn_hidden": width * 7 // 2,
            "max_seq_len": 8192,
            "rope_theta": 500000.0,
            "norm_eps": 1e-05,
        }
    )


def _ok_columns(
    rng: random.Random,
    cluster: str,
    model: str,
    precision: str,
    compile_: str,
    batch: int,
    seq: int,
    run: int,
    per_sample: float,
) -> dict:
    peak, speed, mem = CLUSTERS[cluster]
    n_params = MODELS[model][0]
    tf = (
        speed
        * PRECISIONS[precision]
        * (1 - 0.3 / batch)
        * (1.08 if compile_ != "none" else 1)
        * rng.uniform(0.97, 1.03)
    )
    tokens = tf * 1e12 / (6 * n_params)
    step, measure = batch * seq / tokens, rng.choice((10, 20, 30))
    row = dict(
        tflops_per_gpu=tf,
        mfu=tf / peak,
        tokens_per_s_per_gpu=tokens,
        step_time_s=step,
        step_time_p10_s=step * 0.98,
        step_time_p90_s=step * 1.02,
        step_time_ci_pct=rng.uniform(0.2, 3.0),
        peak_mem_gib=min(mem, 10 + batch * per_sample),
        reserved_mem_gib=min(mem, 12 + batch * per_sample),
        alloc_retries=0,
        peak_tflops=peak,
        flops_per_token=6 * n_params,
        n_params=int(n_params),
        loss_first=10.9,
        loss_last=10.9 - 3 * rng.random(),
        warmup_steps=3,
        measure_steps=measure,
        steps_time_s=step * measure,
        compile_time_s=rng.uniform(0, 40),
        init_time_s=rng.uniform(10, 60),
        trial_wall_s=step * (measure + 3) + 60,
        gpu_name=f"NVIDIA {cluster.upper()}",
        driver_version="570.86",
        cuda_version="12.8",
        torch_version="2.11.0+cu128",
        torchao_version="0.14.0",
        te_version="2.8",
    )
    if run >= CURVES_FROM_RUN:
        per_step = batch * seq * 8
        row.update(
            loss_curve=[10.9 - 0.1 * i for i in range(3 + measure)],
            loss_curve_tokens=[per_step * i for i in range(3 + measure)],
            ci_target_met=True,
        )
        if cluster != "mi300x":
            jpt = 700 / tokens / 8
            row.update(
                energy_j=jpt * tokens * 8 * step * measure,
                avg_power_w=680.0,
                joules_per_token=jpt,
                tokens_per_kwh=3.6e6 / jpt,
                tflops_per_watt=6 * n_params / jpt / 1e12,
                power_limit_w=700.0,
                sm_clock_mhz=1800.0,
                sm_clock_max_mhz=1980.0,
                gpu_temp_c=70.0,
                energy_source="counter",
            )
    return row


def _rows_for_run(cluster: str, run: int, rng: random.Random, start: int) -> list[dict]:
    mem = CLUSTERS[cluster][2]
    t0 = dt.datetime(2025, 6, 1, tzinfo=dt.timezone.utc) + dt.timedelta(days=run)
    rows = []
    for model, (n_params, _, _) in MODELS.items():
        spec = _spec(model)
        for precision in PRECISIONS:
            for compile_ in COMPILES:
                for ac in ACS:
                    for seq in SEQS:
                        # Largest batch that fits: memory over a crude per-sample footprint.
                        per_sample = (
                            n_params
                            / 8
                            / 1e9
                            * seq
                            / 2048
                            * (0.4 if ac == "selective" else 1.0)
                            / (1.3 if precision != "bf16" else 1)
                        )
                        limit = max(0.0, mem - 18 * n_params / 8 / 1e9) / max(per_sample, 1e-3)
                        for batch in BATCHES:
                            n = start + len(rows)
                            status, error, metrics = "ok", None, {}
                            if cluster == "mi300x" and precision == "mxfp8-te":
                                status, error = "unsupported", "MXFP8 needs sm100"
                            elif batch > limit:
                                status, error = "oom", "CUDA out of memory. Tried to allocate 4.00 GiB"
                            elif rng.random() < 0.01:
                                status, error = rng.choice(
                                    [("error", "NCCL watchdog timeout"), ("timeout", "trial exceeded 900 s")]
                                )
                            else:
                                metrics = _ok_columns(
                                    rng, cluster, model, precision, compile_, batch, seq, run, per_sample
                                )
                            started = t0 + dt.timedelta(seconds=30 * (n % 2880))
                            rows.append(
                                {
                                    "run_id": f"{cluster}-{run}",
                                    "trial_id": f"t{n:07d}",
                                    "attempt": 1,
                                    "grid_name": "bench",
                                    "cluster": cluster,
                                    "accelerator": cluster,
                                    "cost_per_gpu_hour": 2.5,
                                    "world_size": 8,
                                    "nodes": 1,
                                    "hostname": f"{cluster}-node{run % 4}",
                                    "model": model,
                                    "model_spec": spec,
                                    "precision": precision,
                                    "compile": compile_,
                                    "ac": ac,
                                    "batch_size": batch,
                                    "seq_len": seq,
                                    "status": status,
                                    "error": error,
                                    "ray_version": "2.40.0",
                                    "git_sha": f"{run:07x}",
                                    "started_at": started,
                                    "finished_at": started + dt.timedelta(seconds=25),
                                    **metrics,
                                }
                            )
    return rows


def write_dataset(out: Path, n_rows: int) -> int:
    """Write exactly ``n_rows`` rows as one file per cluster and run, each cluster's files merged as `sweep run`
    merges them when a run ends (``sweep.record.compact``); return the number of files."""
    import pyarrow.parquet as pq

    from sweep.record.compact import compact
    from sweep.record.schema import to_table
    from sweep.record.store import result_files

    rng, written, run = random.Random(0), 0, 0
    per_file = max(1, n_rows // 8)  # a small folder still spans every cluster (compare --by cluster)
    while written < n_rows:
        run += 1
        for cluster in CLUSTERS:
            rows = _rows_for_run(cluster, run, rng, written)[: min(n_rows - written, per_file)]
            if not rows:
                break
            path = out / f"cluster={cluster}" / f"run={cluster}-{run}" / "part-0.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(to_table(rows), path)
            compact(out, [out / f"cluster={cluster}"])  # the run's end
            written = written + len(rows)
    return len(result_files(out))


def folder(data: Path, n_rows: int) -> Path:
    """``data/rows-N``, written the first time and again when the schema has changed since (a ``.done`` file says
    it is whole and names the schema version it was written with: rows of an older schema lack columns, config
    keys among them, and would time a different query)."""
    import shutil

    from sweep.record.schema import SCHEMA_VERSION

    out, done = data / f"rows-{n_rows}", data / f"rows-{n_rows}" / ".done"
    if not done.exists() or done.read_text().split()[1:] != [SCHEMA_VERSION, LAYOUT]:
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        files = write_dataset(out, n_rows)
        done.write_text(f"{files} {SCHEMA_VERSION} {LAYOUT}\n")
        print(f"wrote {n_rows:,} rows in {files} files to {out} ({time.perf_counter() - t:.0f} s)", file=sys.stderr)
    return out


def run_once(argv: list[str]) -> tuple[float, int, int, float]:
    """(wall seconds, peak RSS bytes, exit status, CPU seconds) of one `python -m sweep results ...` in a fresh
    interpreter. CPU (user + system, the child's own) moves less than wall when neighbours load the machine."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    t = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "sweep", "results", *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(child.pid, 0)  # this child's own peak, not the largest of all children so far
    wall = time.perf_counter() - t
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        sys.stderr.write(f"{' '.join(argv)}: exit {child.returncode}: {child.stderr.read().decode()[-300:]}\n")
    child.stderr.close()
    return wall, usage.ru_maxrss * 1024, child.returncode, usage.ru_utime + usage.ru_stime


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


Found = dict[tuple[str, int], tuple[float, int, float]]  # (command, rows) -> (wall s, peak RSS bytes, CPU s)


def measure(data: Path, sizes: list[int], runs: int, loads: list[float]) -> tuple[Found, Found]:
    """(the runs after the first: median wall, largest peak RSS, median CPU; the first runs, each on a folder
    without the kept answers: the same); ``loads`` gets the 1-minute load average after each command (the
    machine is shared: a figure means little without it)."""
    import shutil

    from sweep.results.memo import FOLDER

    found, first = {}, {}
    for n in sizes:
        out = folder(data, n)
        for name, argv in COMMANDS.items():
            argv = [a.format(dir=out, tmp=data) for a in argv]
            firsts = []
            for _ in range(runs):  # a first run RUNS times, each with nothing kept (it keeps its answers)
                shutil.rmtree(out / FOLDER.parts[0], ignore_errors=True)
                firsts.append(run_once(argv))
            first[name, n] = _summary(firsts)
            found[name, n] = _summary([run_once(argv) for _ in range(runs)])  # on the answers the last first run kept
            loads.append(os.getloadavg()[0])
            print(f"{name:<22} {n:>9,} rows: {_cell(first[name, n])} first, {_cell(found[name, n])}", file=sys.stderr)
    return found, first


def _summary(samples: list[tuple[float, int, int, float]]) -> tuple[float, int, float]:
    """Runs of one command as (median wall, largest peak RSS, median CPU)."""
    return (
        statistics.median(s[0] for s in samples),
        max(s[1] for s in samples),
        statistics.median(s[3] for s in samples),
    )


def _cell(measured: tuple[float, int, float]) -> str:
    wall, rss, cpu = measured
    return f"{wall:.2f} / {cpu:.2f} / {rss / 2**20:.0f}"


def table(found: Found, sizes: list[int]) -> str:
    """The markdown table: per command, wall, CPU and peak RSS at each size, and whether the largest meets the
    targets (on wall time)."""
    head = " | ".join(f"{n:,} rows: wall s / CPU s / MiB" for n in sizes)
    lines = [
        f"| command | {head} | ≤ {TARGET_S:g} s, ≤ 1 GiB, ≤ {TARGET_RATIO:g}× the {sizes[0]:,}-row time |",
        "|---|" + "---:|" * len(sizes) + "---|",
    ]
    for name in COMMANDS:
        cells = [_cell(found[name, n]) for n in sizes]
        wall, rss, _ = found[name, sizes[-1]]
        misses = [
            m
            for m, bad in (
                ("time", wall > TARGET_S),
                ("memory", rss > TARGET_BYTES),
                ("growth", wall > TARGET_RATIO * found[name, sizes[0]][0]),
            )
            if bad
        ]
        lines.append(
            f"| `{name}` | " + " | ".join(cells) + f" | {'met' if not misses else 'missed: ' + ', '.join(misses)} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", type=Path, default=Path("/tmp/sweep-bench"), help="where the folders are written once"
    )
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000, 100_000, 1_000_000])
    parser.add_argument("--runs", type=int, default=3, help="runs of each command (the median wall is shown)")
    parser.add_argument(
        "--row-group",
        type=int,
        help="rows per row group of the merged files (sweep.record.compact.ROW_GROUP), in folders of their own "
        "under --data/row-group-N",
    )
    args = parser.parse_args()
    if args.row_group:
        from sweep.record import compact

        compact.ROW_GROUP, args.data = args.row_group, args.data / f"row-group-{args.row_group}"
    loads: list[float] = []
    found, first = measure(args.data, sorted(args.rows), args.runs, loads)
    print(
        f"{dt.date.today()}, {machine()}: `PYTHONPATH=. python benchmarks/bench_results.py`"
        f"{f' --row-group {args.row_group}' if args.row_group else ''} "
        f"(median of {args.runs} runs after the first, a fresh interpreter each; 1-minute load average "
        f"{min(loads):.1f}–{max(loads):.1f}, median {statistics.median(loads):.1f})\n"
    )
    print(table(found, sorted(args.rows)), end="")
    print(f"\nThe first run of each command (no answers kept yet: it keeps them), median of {args.runs}:\n")
    print(table(first, sorted(args.rows)), end="")


if __name__ == "__main__":
    main()
