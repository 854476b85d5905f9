"""The result schema: one row per attempt, declared once.

Every Parquet file that sweep writes carries this schema and its version in the file metadata
(key ``sweep.schema_version``). Readers check the version (see ``sweep.record.store``). Bump
``SCHEMA_VERSION`` when a column changes meaning or type; adding a nullable column is a minor bump
that older readers tolerate.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from sweep.record.row import Row as Row  # re-exported: the rows' Python type, held to RESULT_SCHEMA by tests
from trainer.options import OPTION_DEFAULTS, OPTION_DOCS

SCHEMA_VERSION = "1.18"  # 1.1: + traceback; 1.2: + cost_per_gpu_hour; 1.3: + grad_accum, grad_clip, fp8_lm_head;
#                          1.4: + reduce_dtype, grad_sync; 1.5: + step_time_ci_pct;
#                          1.6: + actor_reused, group_trial_index; 1.7: + profile_*_pct, trace_file;
#                          1.8: + process_start_s, import_s, process_setup_s, model_build_s;
#                          1.9: + ci_target_met, loss_curve, loss_curve_tokens;
#                          1.10: + energy_j ... energy_source (energy), power_cost_per_kwh, pue, profile_power_limit_w;
#                          1.11: + dynamic_batch; 1.12: + dp_replicate, tp, cp, dp_shard (the parallel layout);
#                          1.13: + attention, fp8_attention, compile_mode, fp8_pow2_scales, attention_kernel, loss,
#                                 step_times_s;
#                          1.14: + precompile_s, precompiled_graphs, compile_cache_hits, compile_cache_misses;
#                          1.15: + imported_before_placement; 1.16: + precompile_sides_ahead;
#                          1.17: + precompile_sides_given; 1.18: precompile_s and precompiled_graphs on every
#                                 trial that waited for side processes, not only a group's first
VERSION_KEY = b"sweep.schema_version"

STATUSES = ("ok", "oom", "error", "timeout", "unsupported")

# Training options (grid axes since 1.3) at their default: what rows written before they existed ran
# with. `sweep.record.store` fills an older row's missing option with its default when it reads the dataset.
TRAINING_DEFAULTS = dict(OPTION_DEFAULTS)
# The schema version that added each option's column: a new option is a new column, so a version bump.
_OPTION_SINCE = {
    "grad_accum": "1.3",
    "grad_clip": "1.3",
    "fp8_lm_head": "1.3",
    "reduce_dtype": "1.4",
    "grad_sync": "1.4",
    "dynamic_batch": "1.11",
    "attention": "1.13",
    "fp8_attention": "1.13",
    "compile_mode": "1.13",
    "fp8_pow2_scales": "1.13",
    "dp_replicate": "1.12",
    "tp": "1.12",
    "cp": "1.12",
    "loss": "1.13",
}
_ARROW_TYPES = {int: pa.int32(), float: pa.float64(), bool: pa.bool_(), str: pa.string()}


def _option_columns() -> list[tuple[str, pa.DataType, str]]:
    """One column per training option (`trainer.options.TrainingOptions`): its type, and its meaning with the
    value a row written before the column existed was read with."""
    missing = set(OPTION_DEFAULTS) - set(_OPTION_SINCE)
    if missing:
        raise RuntimeError(f"training options without a schema version in _OPTION_SINCE: {sorted(missing)}")
    columns = []
    for name, default in OPTION_DEFAULTS.items():
        shown = str(default).lower() if isinstance(default, bool) else default
        columns.append(
            (
                name,
                _ARROW_TYPES[type(default)],
                f"{OPTION_DOCS[name]} ({shown} in rows before schema {_OPTION_SINCE[name]})",
            )
        )
    return columns


_TS = pa.timestamp("us", tz="UTC")

# (name, type, description). The description lands in the field metadata so that
# `pq.read_schema(file)` documents itself.
_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    # identity and lineage
    ("run_id", pa.string(), "one `sweep run` / `sweep max-batch` invocation"),
    ("trial_id", pa.string(), "hash of the trial's config (and retry number): unique per attempt"),
    ("attempt", pa.int32(), "1 for a trial from the grid; parent's attempt + 1 for a retry"),
    ("parent_trial_id", pa.string(), "trial_id this attempt retries (OOM or infrastructure), else null"),
    ("search_id", pa.string(), "max-batch search this probe belongs to, else null"),
    ("grid_name", pa.string(), "the grid's `name`"),
    # where
    ("cluster", pa.string(), "cluster profile name"),
    ("accelerator", pa.string(), "accelerator catalog name (h200, mi300x, cpu, ...)"),
    ("cost_per_gpu_hour", pa.float64(), "the profile's $ per GPU-hour when the row was written, else null"),
    # the profile's power price, PUE and declared power limit when the row was written (null: unset; schema 1.10)
    ("power_cost_per_kwh", pa.float64(), "the profile's $ per kWh of facility power, else null"),
    ("pue", pa.float64(), "the profile's power usage effectiveness (facility / IT power), else null"),
    ("profile_power_limit_w", pa.float64(), "the power limit the profile declares its GPUs run at, else null"),
    ("world_size", pa.int32(), "ranks in the trial (one per GPU)"),
    ("nodes", pa.int32(), "distinct Ray nodes the ranks ran on"),
    ("node_ids", pa.list_(pa.string()), "Ray node id per rank"),
    ("hosts", pa.list_(pa.string()), "hostname per rank"),
    ("hostname", pa.string(), "host of rank 0"),
    # what
    ("model", pa.string(), "registry name, inline spec's name, or arch-L<n>-d<n>-<hash of the spec> when unnamed"),
    ("model_spec", pa.string(), "the model's full spec as JSON"),
    ("precision", pa.string(), "precision recipe name"),
    ("compile", pa.string(), "none | regional | full"),
    ("ac", pa.string(), "activation checkpointing: none | selective | full"),
    ("batch_size", pa.int32(), "per-GPU micro-batch (with tp or cp > 1: per tp x cp group of ranks)"),
    ("seq_len", pa.int32(), "tokens per sample"),
    ("warmup_steps", pa.int32(), "steps run before timing (steps: auto: as many as it took; null if none ran)"),
    ("measure_steps", pa.int32(), "timed steps (steps: auto: as many as it took; null if none ran)"),
    *_option_columns(),  # grad_accum, grad_clip, fp8_lm_head, reduce_dtype, grad_sync, ..., dp_replicate, tp, cp
    (
        "dp_shard",
        pa.int32(),
        "ranks each data-parallel replica shards the model over: world_size / (dp_replicate x "
        "tp x cp) (world_size in rows before schema 1.12)",
    ),
    ("memory_cap_gib", pa.float64(), "per-rank memory cap imposed by sweep, else null"),
    # outcome
    ("status", pa.string(), "ok | oom | error | timeout | unsupported"),
    ("error", pa.string(), "why the attempt did not succeed (first failing rank)"),
    ("traceback", pa.string(), "the failing rank's Python traceback (its last 4000 characters)"),
    # performance
    ("step_time_s", pa.float64(), "median optimizer-step time (grad_accum micro-batches) over the measured steps"),
    ("step_time_p10_s", pa.float64(), "10th percentile step time"),
    ("step_time_p90_s", pa.float64(), "90th percentile step time"),
    (
        "step_time_ci_pct",
        pa.float64(),
        "half-width of the median step time's 95 % confidence interval (order "
        "statistics), % of the median; null under 6 steps and before schema 1.5",
    ),
    (
        "ci_target_met",
        pa.bool_(),
        "steps: {measure: auto}: step_time_ci_pct within auto's ±1 % target (false: short "
        "of it, as when auto stops at its most steps or 300 s first); null for a fixed "
        "measure count, for rows that ran no steps and before schema 1.9",
    ),
    ("tokens_per_s_per_gpu", pa.float64(), "grad_accum * batch_size * seq_len / (tp x cp) / step_time_s"),
    ("tflops_per_gpu", pa.float64(), "flops_per_token * tokens_per_s_per_gpu / 1e12"),
    ("mfu", pa.float64(), "tflops_per_gpu / peak_tflops"),
    ("peak_tflops", pa.float64(), "the MFU divisor: accelerator peak dense TFLOP/s for this precision"),
    ("flops_per_token", pa.float64(), "6N + 12*L*H*D*T (PaLM appendix B), N = every parameter"),
    ("n_params", pa.int64(), "parameters of the model (tied weights once)"),
    ("params_local", pa.list_(pa.int64()), "parameter elements held by each rank after sharding"),
    ("peak_mem_gib", pa.float64(), "peak memory, max over ranks (CUDA allocated, or CPU peak RSS)"),
    ("reserved_mem_gib", pa.float64(), "peak reserved by the caching allocator, max over ranks"),
    ("alloc_retries", pa.int64(), "CUDA allocator retries (cudaMalloc after freeing cache), max over ranks"),
    ("loss_first", pa.float64(), "loss at the first step (rank 0)"),
    ("loss_last", pa.float64(), "loss at the last step (rank 0)"),
    (
        "loss_curve",
        pa.list_(pa.float64()),
        "every optimizer step's loss, warm-up first (step 1 on): the mean over "
        "ranks of each rank's loss, i.e. the step's global batch, computed before "
        "the step's update; null for rows that ran no steps and before schema 1.9",
    ),
    (
        "loss_curve_tokens",
        pa.list_(pa.int64()),
        "tokens trained when each loss_curve loss was computed: 0 at step 1, "
        "then grad_accum * batch_size * seq_len * world_size / (tp x cp) more per step",
    ),
    ("init_time_s", pa.float64(), "actor start (on a warm group: the trial's start) to model built, sharded and ready"),
    ("compile_time_s", pa.float64(), "first step's time beyond a steady step (compilation, autotuning)"),
    ("steps_time_s", pa.float64(), "sum of measured step times"),
    (
        "step_times_s",
        pa.list_(pa.float64()),
        "every step's time (s), warm-up first (the first warmup_steps of them; the first includes compiling), "
        "the slowest rank's at each step (schema 1.13)",
    ),
    # energy over the measured steps (sweep.record.energy has the formulas; trainer.energy measures): null on CPU ranks,
    # where a GPU could not be read, and before schema 1.10; never 0
    (
        "energy_j",
        pa.float64(),
        "joules the trial's GPUs drew over the measured steps, all GPUs summed (energy counter, "
        "else sampled power; energy_source says which)",
    ),
    (
        "energy_sampled_j",
        pa.float64(),
        "the same energy from power sampled at ~20 Hz and integrated: an independent check on the counter",
    ),
    ("avg_power_w", pa.float64(), "mean power per GPU over the measured steps: energy / window seconds"),
    ("joules_per_token", pa.float64(), "energy_j / tokens the measured steps trained (all GPUs)"),
    ("tokens_per_kwh", pa.float64(), "3.6e6 / joules_per_token"),
    ("tflops_per_watt", pa.float64(), "flops_per_token / joules_per_token / 1e12: TFLOP per joule, = TFLOP/s per W"),
    ("power_limit_w", pa.float64(), "the GPUs' enforced power limit (max over GPUs), as the driver reports it"),
    ("sm_clock_mhz", pa.float64(), "mean SM (AMD: GFX) clock sampled over the measured steps, mean over GPUs"),
    ("sm_clock_max_mhz", pa.float64(), "the part's maximum SM clock"),
    ("gpu_temp_c", pa.float64(), "hottest GPU temperature sampled over the measured steps"),
    (
        "energy_source",
        pa.string(),
        "counter (the GPU's cumulative energy counter) | sampled (no counter: power × time)",
    ),
    (
        "trial_wall_s",
        pa.float64(),
        "seen by the driver: placement of its group to the trial's end, or for a trial on "
        "a warm group (actor_reused) its start to its end",
    ),
    (
        "actor_reused",
        pa.bool_(),
        "ran on rank processes that had run an earlier trial of this run (a warm group); "
        "null for unsupported rows and before schema 1.6",
    ),
    ("group_trial_index", pa.int32(), "trials its group ran before it: 0 on fresh processes; null as actor_reused"),
    # start-up, in phases that follow one another inside trial_wall_s (null before schema 1.8); the in-rank
    # ones (all but process_start_s) are rank 0's and lie inside init_time_s
    (
        "process_start_s",
        pa.float64(),
        "driver's clock, a fresh group's first trial: placement ready to every rank "
        "process up (Ray spawns them, they import trainer.worker); null on a warm group",
    ),
    (
        "imported_before_placement",
        pa.bool_(),
        "a fresh group's first trial: every rank process had imported torch and the trainer before the group was "
        "placed (started ahead by Ray with trainer.preload: profile prestarted_ranks), so no GPU was held while "
        "they imported; null on a warm group and before schema 1.15",
    ),
    (
        "import_s",
        pa.float64(),
        "rank 0, a trial that started its process group: importing torch and the trainer; null on a warm group",
    ),
    (
        "process_setup_s",
        pa.float64(),
        "rank 0, a trial that started its process group: device (CUDA context), "
        "rendezvous, process group (NCCL or gloo), baseline barrier and release (a compiled first trial's "
        "on CUDA imports inductor there); null when warm",
    ),
    (
        "model_build_s",
        pa.float64(),
        "rank 0: the trial's own set-up in the trainer, fresh or warm: model built, "
        "converted, wrapped for compile, sharded, optimizer made, ranks ready to step",
    ),
    # compiling ahead (trainer.precompile) and the compile cache (null before schema 1.14)
    (
        "precompile_s",
        pa.float64(),
        "waiting, after the rank's imports and process group, for the side processes compiling the group's graphs "
        "ahead: those compiling the trial's own (and the rest where the trial's expected peak memory does not fit "
        "beside them; inside init_time_s; counted as compile); null when none were left (before schema 1.18: a "
        "group's first trial alone, which waited for all)",
    ),
    (
        "precompiled_graphs",
        pa.int32(),
        "of the sets of graphs compiled ahead in the side processes the trial waited for (each precision's, and "
        "batch size's unless symbolic: its blocks and, where the loss is a graph of its own, its loss apart), how "
        "many compiled; null as precompile_s",
    ),
    (
        "precompile_sides_ahead",
        pa.int32(),
        "of the side processes that compiled them, how many the run had started ahead, imported before the group "
        "was placed (trainer.side_pool); on a group's first trial; null on the others, and before schema 1.16",
    ),
    (
        "precompile_sides_given",
        pa.int32(),
        "of those, how many the run gave their graphs as it started them (one rank a node): compiling while Ray "
        "started and the group was placed; null as precompile_sides_ahead, and before schema 1.17",
    ),
    ("compile_cache_hits", pa.int32(), "rank 0: graphs this trial loaded from inductor's FX graph cache"),
    (
        "compile_cache_misses",
        pa.int32(),
        "rank 0: graphs this trial generated itself (not in inductor's FX graph cache)",
    ),
    # where the time goes (`profile: true`): shares of the profiled steps' wall time, adding up to 100
    # (trainer.profiling)
    *[
        (f"profile_{kind}_pct", pa.float64(), f"% of the profiled step time {what}; null unless profiled (schema 1.7)")
        for kind, what in (
            ("gemm", "in matrix multiplies"),
            ("attention", "in fused attention"),
            ("comm_exposed", "in communication that no computation overlaps"),
            ("optimizer", "in the optimizer phase (clip, step, zero_grad)"),
            ("other", "in everything else, idle time included"),
        )
    ],
    (
        "trace_file",
        pa.string(),
        "the profiled steps' Chrome/Perfetto trace (gzipped JSON, rank 0), relative to the "
        "results directory; null unless profiled (schema 1.7)",
    ),
    (
        "attention_kernel",
        pa.string(),
        "attention kernels the profiled steps ran, by their names: flash, cudnn, efficient, math (+ joins "
        "several); null unless profiled or none is named (compiled math; schema 1.13)",
    ),
    # software and hardware
    ("torch_version", pa.string(), "torch version the ranks ran"),
    ("ray_version", pa.string(), "Ray version"),
    ("te_version", pa.string(), "transformer-engine, if importable"),
    ("torchao_version", pa.string(), "torchao, if importable"),
    ("gpu_name", pa.string(), "device name reported by torch"),
    ("driver_version", pa.string(), "GPU driver version"),
    ("cuda_version", pa.string(), "CUDA or HIP runtime torch was built with"),
    ("git_sha", pa.string(), "commit of sweep that produced the row"),
    ("started_at", _TS, "when the attempt started (UTC)"),
    ("finished_at", _TS, "when the attempt ended (UTC)"),
]

RESULT_SCHEMA = pa.schema(
    [pa.field(name, typ, metadata={b"doc": doc.encode()} if doc else None) for name, typ, doc in _COLUMNS],
    metadata={VERSION_KEY: SCHEMA_VERSION.encode()},
)
COLUMNS = tuple(RESULT_SCHEMA.names)


def to_table(rows: Sequence[Row]) -> pa.Table:
    """Rows (dicts) to a table of RESULT_SCHEMA. Unknown keys are a bug, so they raise."""
    for row in rows:
        extra = set(row) - set(COLUMNS)
        if extra:
            raise KeyError(f"row has columns not in the result schema: {sorted(extra)}")
        if row.get("status") not in STATUSES:
            raise ValueError(f"status {row.get('status')!r} is not one of {STATUSES}")
    return pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)


def int_range(column: str) -> tuple[int, int]:
    """The least and the largest value an integer column can hold, from its Arrow type: what a size given by
    the user (a batch, a step count) must lie within to be recorded at all."""
    typ = RESULT_SCHEMA.field(column).type
    if not pa.types.is_integer(typ):
        raise TypeError(f"column {column} is {typ}, not an integer")
    bits = typ.bit_width
    if pa.types.is_signed_integer(typ):
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1
