"""What `sweep run`, `sweep plan`, `sweep max-batch` and `sweep tune` do between their options and their output:
load the cluster profile and the grid, expand it to trials, pick the plan, check the output folder, run, and
complete and record a search's verdicts. The commands (sweep.commands) parse options and print.

Heavy modules (the runner, hence Ray) are imported inside the functions that need them: `sweep plan` and
`--help` never load them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from sweep.search.max_batch_verdict import MaxBatchMeasures, MaxBatchVerdict

if TYPE_CHECKING:
    from clusters.schema import ClusterProfile
    from sweep.execution.runner import RunReport
    from sweep.memory.predictor import Predictor
    from sweep.record.schema import Row
    from sweep.search.plan import Plan, Verdict
    from sweep.spec.grid import GridSpec, Trial


class Prepared(NamedTuple):
    """A grid ready to plan: every user error in the profile, the grid or the options has surfaced."""

    profile: ClusterProfile
    """The cluster profile the trials run on."""
    spec: GridSpec
    """The validated grid, options on top, its steps decided for the profile's ranks (`GridSpec.on`)."""
    trials: list[Trial]
    """The grid's trials, in its stable order."""


def prepare(grid: Path | None, cluster: str, memory_cap: str | None, options: dict[str, Any] | None = None) -> Prepared:
    """Load profile and grid, expand to trials: every user error surfaces here, before anything runs.
    `options`: grid keys the command's options set, on top of the file's (an axis given replaces the file's)."""
    from clusters import load_profile
    from clusters._load import display_path
    from clusters.schema import parse_memory_size
    from sweep.errors import UserError
    from sweep.spec.expand import expand
    from sweep.spec.grid import parse_grid, read_grid

    profile = load_profile(cluster)
    data, source = (read_grid(grid), display_path(grid)) if grid is not None else ({}, "<options>")
    data = data | (options or {})
    if grid is None and "models" not in data:  # a grid file's own omissions: parse_grid says what is missing
        raise UserError("no models: give a grid file or --model")
    if grid is None and "batch_sizes" not in data:
        raise UserError("no batch sizes: give a grid file with batch_sizes or --batch-size")
    spec = parse_grid(data, source).on(gpu=profile.is_gpu)  # steps it leaves out: auto on GPUs, counts on CPU ranks
    try:
        cap = parse_memory_size(memory_cap) if memory_cap else None
    except ValueError as e:
        raise UserError(f"--memory-cap: {e}") from None
    # the cap: --memory-cap, else the grid's memory_cap, else the profile's memory_per_device
    trials = expand(
        spec,
        cluster=profile.name,
        source=source,
        max_ranks=profile.total_ranks,
        timeout_s=profile.timeout_s,
        memory_cap_bytes=cap,
        default_memory_cap=profile.memory_per_device_bytes,
        ranks_per_node=profile.ranks_per_node,
    )
    return Prepared(profile, spec, trials)


def prepare_search(command: str, cluster: str, memory_cap: str | None, options: dict[str, Any], start: int) -> Prepared:
    """`prepare` for a search from options alone (`sweep max-batch`, `sweep tune`): no grid file, so a model is
    needed, and `start` (--start, already `options`' one batch) is the batch its searches start from."""
    from sweep.errors import UserError
    from sweep.spec.grid import unstorable

    if not options.get("models"):
        raise UserError(f"{command} needs --model")
    if problem := unstorable("--start", "batch_size", [start]):  # the grid key would name an option not given
        raise UserError(problem)
    return prepare(None, cluster, memory_cap, options)


def make_plan(
    spec: GridSpec, trials: list[Trial], profile: ClusterProfile, *, step: int = 1, predictor: Predictor | None = None
) -> Plan:
    """What runs: the grid's trials (with OOM retries), or the search its `search:` asks for. `step`: a
    max-batch search's granularity (`sweep max-batch --step`; a grid's search goes to the batch). `predictor`
    (sweep.memory.predictor): where OOM retries and a max-batch search's first probes go."""
    from sweep.search.max_batch import MaxBatchPlan
    from sweep.search.policy import GridPlan

    # where a probe or a retry goes: the model's estimate itself, not the batch it would refuse past its margin (on
    # one H200, uncalibrated, a bf16 retry from 24 went to 12, inside the margin, and ran out of memory; 10 fits)
    point = (lambda t: predictor.max_batch(t, point=True)) if predictor else None
    if spec.search == "max_batch":
        return MaxBatchPlan(
            trials,
            capacity_bytes=capacity(profile, trials),
            step=step,
            predicted_max=point,
            peak_model=predictor.peak_curve if predictor else None,
            headroom=headroom(profile, trials),
        )
    if spec.search == "fastest":
        from sweep.search.fastest.plan import TunePlan

        return TunePlan(
            trials,
            spec,
            capacity_bytes=capacity(profile, trials),
            is_gpu=profile.is_gpu,
            ranks_per_node=profile.ranks_per_node,
            predicted_max=predictor.max_batch if predictor else None,
        )
    return GridPlan(trials, spec.on_oom, predicted_max=point)


def capacity(profile: ClusterProfile, trials: list[Trial]) -> float | None:
    """Memory a rank may use: the cap if one is set, else the device's memory (GPU profiles)."""
    caps = {t.memory_cap_bytes for t in trials}
    cap = caps.pop() if len(caps) == 1 else None
    if cap is not None:
        return float(cap)
    if not profile.is_gpu:
        return None
    gib = profile.accelerator_info.memory_gib  # a GPU part always declares it (clusters.catalog)
    return profile.memory_per_device_bytes or (None if gib is None else gib * 1024**3)


def headroom(profile: ClusterProfile, trials: list[Trial]) -> float:
    """What a max-batch search leaves free of `capacity` when the model calls a probe fitting: GPU_HEADROOM of a
    GPU's declared memory; none of a memory cap (the cap is the limit itself)."""
    from sweep.memory.capacity import GPU_HEADROOM

    capped = any(t.memory_cap_bytes is not None for t in trials)
    return GPU_HEADROOM if profile.is_gpu and not capped else 0.0


def check_output(output: Path) -> None:
    """Refuse an --output that cannot take rows before any Ray or GPU time is spent (a measurement that
    cannot be written is lost). Writes nothing: the folder itself is made when the first row lands."""
    import errno
    import os
    import tempfile

    from sweep.errors import UserError

    path = Path(output).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        what = "is a file" if existing == path else f"is under {existing}, which is a file"
        raise UserError(f"--output {output}: {what}; give a folder")
    try:  # os.access says yes to root on a read-only mount: try it
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        reason = os.strerror(e.errno) if e.errno else str(e)
        if e.errno == errno.ENOENT:  # "no such file" of a folder that is there: /proc, /sys make no new files
            reason = f"{existing} refuses new files ({reason})"
        what = f"cannot write in {path}" if existing == path else f"cannot create the folder {path}"
        raise UserError(f"--output {output}: {what}: {reason}") from None


def load_predictor(profile: ClusterProfile, output: Path) -> Predictor:
    """The memory model, calibrated on --output's clean rows of this cluster."""
    from sweep.memory.predictor import Predictor

    return Predictor.load(profile, output)


def run_plan(
    plan: Plan,
    profile: ClusterProfile,
    output: Path,
    predictor: Predictor,
    *,
    grid_name: str | None = None,
    resume: bool = False,
    max_concurrent: int | None = None,
    progress: bool = True,
    reuse_actors: bool = True,
    precompile: bool = False,
) -> RunReport:
    """Run `plan` on `profile`'s cluster under a new run id, one row per attempt under `output`
    (sweep.execution.runner.execute says how)."""
    from sweep.execution.runner import execute, new_run_id

    return execute(
        plan,
        profile=profile,
        output=output,
        run_id=new_run_id(),
        predictor=predictor,
        grid_name=grid_name,
        resume=resume,
        max_concurrent=max_concurrent,
        progress=progress,
        reuse_actors=reuse_actors,
        precompile=precompile,
    )


def complete_verdicts(verdicts: list[Verdict], rows: list[Row]) -> list[Verdict]:
    """The verdicts with what their rows say: a max-batch verdict completed (`complete_verdict`), a
    fastest-configuration one (sweep.search.fastest) as it comes, whole."""
    return [complete_verdict(v, rows) if isinstance(v, MaxBatchVerdict) else v for v in verdicts]


def complete_verdict(v: MaxBatchVerdict, rows: list[Row]) -> MaxBatchVerdict:
    """`v` with what its rows say: allocator retries, speed and what the search cost (a new verdict: `v` stays)."""
    from sweep.record import cost
    from sweep.results.render import thrash_note

    probes = [r for r in rows if r.get("search_id") == v.search_id]
    by_batch = {r["batch_size"]: r for r in probes if r["status"] == "ok"}
    none: Row = {}  # a batch with no ok probe
    at_max = by_batch.get(v.max_batch, none).get("alloc_retries")
    at_fastest = by_batch.get(v.fastest_batch, none).get("alloc_retries")
    fast = by_batch.get(v.fastest_batch, none)
    wall = sum(r.get("trial_wall_s") or 0 for r in probes)
    one = cost.fresh_trial_s(fast, probes)  # what the search cost against measuring the answer once, fresh
    return replace(
        v,
        measured=MaxBatchMeasures(
            alloc_retries_at_max=at_max,
            alloc_retries_at_fastest=at_fastest,
            # a batch that fits only because the caching allocator freed and retried runs slower
            allocator=thrash_note(v.max_batch, at_max, v.fastest_batch, at_fastest),
            tflops_at_fastest=fast.get("tflops_per_gpu"),
            search_wall_s=wall,
            cost_vs_one_trial=wall / one if one else None,
        ),
    )


def verdict_json(v: Verdict) -> dict[str, Any]:
    """The verdict as saved and printed."""
    return v.to_json()


def record_verdicts(output: Path, run_id: str, verdicts: list[Verdict]) -> Path:
    """Record a search's verdicts beside the rows (`_search/<run_id>.json`, ignored as data)."""
    from sweep.record import store

    return store.write_verdicts(output, run_id, [verdict_json(v) for v in verdicts])
