"""A deterministic results folder of about a thousand rows for the golden test of every `sweep results` command
(tests/test_results_golden.py): three clusters, three models, three precisions, five batches, two compile modes and
three runs (repeats), a grad_accum variant, OOM above a per-model limit, errors and timeouts, an unsupported
precision, loss curves of different lengths, energy and prices on some clusters, intervals that missed their
target, allocator retries, several software stacks, a file of an older minor schema (no training options, no
curves), and a fastest search's verdict."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sweep.record.schema import RESULT_SCHEMA, TRAINING_DEFAULTS, VERSION_KEY, to_table
from sweep.record.store import write_verdicts
from trainer.models.specs import REGISTRY

CLUSTERS = {"h200": (989.0, 420.0, 141, 3.5), "mi300x": (1307.0, 470.0, 192, None), "b200": (2250.0, 900.0, 180, 6.0)}
MODELS = {"gpt2-1.5b": 1.5e9, "llama3-8b": 8.0e9, "llama3-70b": 70.6e9}
PRECISIONS = {"bf16": 1.0, "fp8-te": 1.12, "fp8-torchao": 1.07}
BATCHES = (1, 2, 4, 8, 16)
SEQ = 2048


def _spec_json(model: str) -> str:
    return REGISTRY[model].to_json()


def _limit(cluster: str, model: str, precision: str) -> int:
    mem = CLUSTERS[cluster][2]
    base = {"gpt2-1.5b": 16, "llama3-8b": 4, "llama3-70b": 2}[model] * (2 if mem > 150 else 1)
    return base if precision == "bf16" else 2 * base


def _curve(rng: random.Random, steps: int, tokens_per_step: int, fine: bool) -> tuple[list[float], list[int]]:
    start = 10.8 + rng.uniform(-0.05, 0.05)
    end = (7.2 if fine else 10.5) + rng.uniform(-0.1, 0.1)
    losses = [start + (end - start) * (i / (steps - 1)) ** 0.5 for i in range(steps)]
    return losses, [i * tokens_per_step for i in range(steps)]


def _metrics(
    rng: random.Random, cluster: str, model: str, precision: str, batch: int, accum: int, compile_: str, run: int
) -> dict:
    peak, speed, _, _ = CLUSTERS[cluster]
    n_params = MODELS[model]
    tf = (
        speed
        * PRECISIONS[precision]
        * (1 - 0.25 / batch)
        * (1.06 if compile_ != "none" else 1)
        * rng.uniform(0.96, 1.04)
    )
    if precision == "fp8-torchao" and batch == _limit(cluster, model, precision):
        tf *= 0.8  # slower at its limit: its fastest batch is a smaller one
    tokens = tf * 1e12 / (6 * n_params)
    warmup, measure = 3, rng.choice((8, 10, 12))
    step = accum * batch * SEQ / tokens
    losses, at = _curve(
        rng, warmup + measure, accum * batch * SEQ * 8, fine=precision != "fp8-torchao" or model != "gpt2-1.5b"
    )
    row = dict(
        tflops_per_gpu=tf,
        mfu=tf / peak,
        tokens_per_s_per_gpu=tokens,
        step_time_s=step,
        step_time_p10_s=step * 0.98,
        step_time_p90_s=step * 1.03,
        peak_tflops=peak,
        flops_per_token=6 * n_params,
        n_params=int(n_params),
        peak_mem_gib=12.0 + 9.5 * batch * n_params / 8e9 + rng.random(),
        reserved_mem_gib=14.0 + 9.5 * batch,
        alloc_retries=rng.choice((0, 0, 0, 0, 3, 41)),
        loss_first=losses[0],
        loss_last=losses[-1],
        warmup_steps=warmup,
        measure_steps=measure,
        steps_time_s=step * measure,
        compile_time_s=rng.uniform(1, 30) if compile_ != "none" else 0.4,
        init_time_s=rng.uniform(20, 40),
        trial_wall_s=step * (warmup + measure) + rng.uniform(30, 60),
        step_time_ci_pct=rng.uniform(0.3, 4.0),
        ci_target_met=rng.random() > 0.15,
        model_build_s=rng.uniform(5, 15),
        actor_reused=batch > 1,
        group_trial_index=BATCHES.index(batch),
    )
    if run >= 2:  # curves since schema 1.9
        row.update(loss_curve=losses, loss_curve_tokens=at)
    if batch == 1:
        row.update(process_start_s=rng.uniform(2, 6), import_s=rng.uniform(3, 9), process_setup_s=rng.uniform(1, 4))
    if cluster != "mi300x" and run >= 2:  # energy measured on these GPUs (schema 1.10)
        joules_per_token = 700 / tokens * rng.uniform(0.9, 1.1)
        row.update(
            energy_j=joules_per_token * tokens * 8 * step * measure,
            energy_sampled_j=None,
            avg_power_w=680 + rng.uniform(-30, 20),
            joules_per_token=joules_per_token / 8,
            tokens_per_kwh=3.6e6 / (joules_per_token / 8),
            tflops_per_watt=6 * n_params / (joules_per_token / 8) / 1e12,
            power_limit_w=700.0 if cluster == "h200" else 1000.0,
            sm_clock_mhz=1800 + rng.uniform(-60, 60),
            sm_clock_max_mhz=1980.0,
            gpu_temp_c=60 + rng.uniform(0, 15),
            energy_source="counter" if cluster == "h200" else "sampled",
        )
    return row


def _status(rng: random.Random, cluster: str, model: str, precision: str, batch: int) -> tuple[str, str | None]:
    if cluster == "mi300x" and precision == "fp8-torchao":
        return "unsupported", "torchao float8 needs sm89+, got gfx942"
    if batch > _limit(cluster, model, precision):
        return "oom", f"CUDA out of memory. Tried to allocate {batch * 0.5:.2f} GiB"
    roll = rng.random()
    if roll < 0.03:
        return "error", "NCCL watchdog timeout\nrank 3 ...\n"
    if roll < 0.05:
        return "timeout", "trial exceeded 900 s"
    if roll < 0.07:
        return "oom", "CUDA out of memory (fragmentation)"
    return "ok", None


def make_rows() -> list[dict]:
    rng = random.Random(31)
    rows: list[dict] = []
    t0 = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.timezone.utc)
    for cluster, (_peak, _, _, cost) in CLUSTERS.items():
        for run in (1, 2, 3):
            variants = [(1, c) for c in ("none", "regional")] + ([(4, "none")] if cluster == "h200" else [])
            for model in MODELS:
                for precision in PRECISIONS:
                    for accum, compile_ in variants:
                        for batch in BATCHES:
                            n = len(rows) + 1
                            status, error = _status(rng, cluster, model, precision, batch)
                            started = t0 + dt.timedelta(days=run - 1, minutes=n)
                            row = {
                                "run_id": f"{cluster}-run{run}",
                                "trial_id": f"t{n:05d}",
                                "attempt": 1,
                                "grid_name": "golden",
                                "cluster": cluster,
                                "accelerator": cluster,
                                "cost_per_gpu_hour": cost,
                                "world_size": 8,
                                "nodes": 1,
                                "hostname": f"{cluster}-node0",
                                "model": model,
                                "model_spec": _spec_json(model) if model != "gpt2-1.5b" else None,
                                "precision": precision,
                                "compile": compile_,
                                "ac": "none",
                                "batch_size": batch,
                                "seq_len": SEQ,
                                **TRAINING_DEFAULTS,
                                "grad_accum": accum,
                                "status": status,
                                "error": error,
                                "ray_version": "2.40.0",
                                "git_sha": f"abc{run}def",
                                "started_at": started,
                                "finished_at": started + dt.timedelta(seconds=50),
                            }
                            if cluster == "b200" and run == 3:
                                row.update(power_cost_per_kwh=0.12, pue=1.3)
                            if status == "ok":
                                row.update(
                                    _metrics(rng, cluster, model, precision, batch, accum, compile_, run),
                                    gpu_name=f"NVIDIA {cluster.upper()}" if cluster != "mi300x" else "AMD MI300X",
                                    driver_version="570.86" if run < 3 else "575.51",
                                    cuda_version="12.8",
                                    torch_version="2.11.0+cu128" if run == 1 else "2.12.0+cu128",
                                    torchao_version="0.14.0",
                                    te_version=None if cluster == "mi300x" else "2.8",
                                )
                            rows.append(row)
    return rows


def old_rows() -> pa.Table:
    """Rows as schema 1.2 wrote them: no training options, no curves, no energy (read back at the defaults)."""
    rng = random.Random(5)
    t0 = dt.datetime(2025, 12, 1, 8, 0, tzinfo=dt.timezone.utc)
    rows = []
    for i, (precision, batch) in enumerate((p, b) for p in PRECISIONS for b in BATCHES):
        status, _ = _status(rng, "h200", "llama3-8b", precision, batch)
        row = {
            "run_id": "h200-old",
            "trial_id": f"old{i:03d}",
            "attempt": 1,
            "cluster": "h200",
            "accelerator": "h200",
            "world_size": 8,
            "model": "llama3-8b",
            "precision": precision,
            "compile": "none",
            "ac": "none",
            "batch_size": batch,
            "seq_len": SEQ,
            "status": status,
            "error": None if status == "ok" else "CUDA out of memory",
            "started_at": t0 + dt.timedelta(minutes=i),
            "finished_at": t0 + dt.timedelta(minutes=i, seconds=40),
        }
        if status == "ok":
            row.update(
                {
                    k: v
                    for k, v in _metrics(rng, "h200", "llama3-8b", precision, batch, 1, "none", 1).items()
                    if k
                    in (
                        "tflops_per_gpu",
                        "mfu",
                        "tokens_per_s_per_gpu",
                        "step_time_s",
                        "peak_mem_gib",
                        "loss_first",
                        "loss_last",
                        "flops_per_token",
                        "peak_tflops",
                    )
                }
            )
            row["gpu_name"] = "NVIDIA H200"
        rows.append(row)
    old = [
        f
        for f in RESULT_SCHEMA
        if f.name
        not in (*TRAINING_DEFAULTS, "loss_curve", "loss_curve_tokens", "step_time_ci_pct", "ci_target_met", "energy_j")
    ]
    return pa.Table.from_pylist(rows, schema=pa.schema(old, metadata={VERSION_KEY: b"1.2"}))


def write_folder(out: Path) -> Path:
    """The folder: one Parquet file per (cluster, run), the old file, and a fastest search's verdict."""
    rows = make_rows()
    for run_id in sorted({r["run_id"] for r in rows}):
        mine = [r for r in rows if r["run_id"] == run_id]
        path = out / f"cluster={mine[0]['cluster']}" / f"run={run_id}" / "part-0.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(to_table(mine), path)
    old = out / "cluster=h200" / "run=h200-old" / "old.parquet"
    old.parent.mkdir(parents=True)
    pq.write_table(old_rows(), old)
    best = next(
        r
        for r in rows
        if r["cluster"] == "h200"
        and r["model"] == "llama3-8b"
        and r["precision"] == "fp8-te"
        and r["batch_size"] == 2
        and r["status"] == "ok"
        and r["compile"] == "regional"
    )
    write_verdicts(
        out,
        "h200-run3",
        [
            {
                "kind": "fastest",
                "cluster": "h200",
                "model": "llama3-8b",
                "precision": "fp8-te",
                "seq_len": SEQ,
                "gpus": 8,
                "best_trial_id": best["trial_id"],
                "aborted": None,
            }
        ],
    )
    return out
