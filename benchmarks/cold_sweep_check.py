"""Check the cold-sweep campaign's rows against issue 28's acceptance, and print its tables.

    python3 benchmarks/cold_sweep_check.py RESULTS_DIR

RESULTS_DIR holds what benchmarks/device/cold_sweep.sh writes: {base,current,each,late,all}-{cold,warm} (the campaign's
grid run by the base tree, by the current one, by the current one with --no-precompile, with its rank processes started
once placed (prestarted_ranks 0) and with every wait for all side processes, with an empty and then a filled compile
cache) and {base,current}-searches (the OOM-retry grid and the max-batch search), and kept-{cold,warm} (the current tree
keeping its side processes' kernel timings too, SWEEP_AUTOTUNE_STORE=all; the default keeps only its trials'). For each
pair that is there: the GPU-s held on the same trials (current at most half of base's; a run that lacks some fails), the
mean seconds a trial holds beyond its measured steps (at most 8 cold, 4 warm), the compile a new batch of an already
compiled graph pays (under 2 s), TFLOP/s per trial against base's (within 1 %); the OOM grid's share of GPU-s in OOM
attempts (at most 5 %); max-batch's cost in fresh trials of its fastest batch (at most 1.5); and every clean row's
predicted peak against its measured one, calibrated on the campaign's other clean rows of the same precision and compile
mode (within 10 %). One line per check (ok / FAIL); exits 1 when one failed, 2 when there are no rows. Arithmetic from
sweep.record.cost and sweep.memory.model.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when sweep is not installed

from sweep.memory.calibration import leave_one_out  # noqa: E402
from sweep.memory.model import GiB  # noqa: E402
from sweep.memory.predictor import sample  # noqa: E402
from sweep.record import store  # noqa: E402
from sweep.record.cost import attempt_seconds, fresh_trial_s, gpu_seconds  # noqa: E402

HALF, HELD_S, NEW_BATCH_COMPILE_S, TFLOPS_PCT = 0.5, {"cold": 8.0, "warm": 4.0}, 2.0, 1.0
OOM_SHARE, MAX_BATCH_COST, PREDICTION_PCT = 0.05, 1.5, 10.0


def _rows(folder: Path) -> list[dict]:
    return store.read_table(folder).to_pylist() if store.result_files(folder) else []


def _config(r: dict) -> tuple:
    """A row's trial in the grid, (precision, batch size): what two runs of the grid are compared on."""
    return r["precision"], r["batch_size"]


def _ok_by_config(rows: list[dict]) -> dict[tuple, dict]:
    """The ok rows of one run by `_config`."""
    return {_config(r): r for r in rows if r["status"] == "ok"}


def _name(r: dict) -> str:
    return f"{r['precision']} batch {r['batch_size']}"


def _beyond_measured(r: dict) -> float:
    """What an ok attempt held beyond its measured steps (its wall less them; per rank)."""
    parts = attempt_seconds(r)
    return sum(parts.values()) - parts["measured steps"]


def _held_beyond(rows: list[dict]) -> tuple[float, str]:
    """The mean seconds an ok trial of `rows` held beyond its measured steps, and each trial's, in `rows`' order."""
    beyond = [_beyond_measured(r) for r in rows if r["status"] == "ok"]
    return (statistics.mean(beyond) if beyond else float("nan")), ", ".join(f"{b:.1f}" for b in beyond)


def _intervals(current: dict, base: dict) -> str:
    """Both rows' 95 % intervals of their step-time medians (`step_time_ci_pct`): how far apart two medians can lie
    by the noise of their few measured steps alone."""
    ci = [r.get("step_time_ci_pct") for r in (current, base)]
    shown = ["?" if c is None else f"±{c:.2f} %" for c in ci]
    return f"medians' 95 % intervals {shown[0]} current, {shown[1]} base"


def _trials(rows: list[dict]) -> set[tuple]:
    """The grid's trials a run attempted, by (precision, batch size), whatever became of them (an OOM, a prediction
    that skipped it): a run the job's deadline cut short lacks its last ones."""
    return {_config(r) for r in rows}


def held_check(base: list[dict], current: list[dict], phase: str) -> tuple[bool, str]:
    """The GPU-s the current tree held against the base's (at most HALF of them), on the same trials: where one run
    lacks trials the other attempted, the check fails and the ratio is the one over the trials both attempted."""
    runs = {"base": base, "current": current}
    attempted = {tree: _trials(rows) for tree, rows in runs.items()}
    both = attempted["base"] & attempted["current"]
    seconds = {tree: gpu_seconds(r for r in rows if _config(r) in both) for tree, rows in runs.items()}
    held = {tree: sum(parts.values()) for tree, parts in seconds.items()}
    measured = {tree: parts["measured steps"] for tree, parts in seconds.items()}
    line = (
        f"{phase}: GPU-s held {held['current']:.1f} against base {held['base']:.1f} "
        f"({held['current'] / held['base']:.2f}x; at most {HALF:g}x); measured steps "
        f"{measured['current']:.1f} / {measured['base']:.1f} GPU-s"
    )
    lacking = {"current": attempted["base"] - both, "base": attempted["current"] - both}
    missing = [
        f"{tree} lacks {', '.join(f'{p} batch {b}' for p, b in sorted(trials))}"
        for tree, trials in lacking.items()
        if trials
    ]
    if missing:
        every = len(attempted["base"] | attempted["current"])
        return False, f"{line}, on the trials both runs attempted ({len(both)} of {every}): {'; '.join(missing)}"
    return held["current"] <= HALF * held["base"], line


def grid_checks(base: list[dict], current: list[dict], phase: str) -> list[tuple[bool, str]]:
    out = [held_check(base, current, phase)]
    for tree, rows in (("base", base), ("current", current)):
        mean, each = _held_beyond(rows)
        line = f"{phase}, {tree}: a trial holds {mean:.1f} s beyond its measured steps on average (per trial {each})"
        out.append(
            (mean <= HELD_S[phase], line + f"; at most {HELD_S[phase]:g} s")
            if tree == "current"
            else (True, line + " (the baseline)")
        )
    seen: set[str] = set()
    for r in sorted(current, key=lambda r: r.get("group_trial_index") or 0):
        if r["status"] != "ok":
            continue
        if r["precision"] in seen:  # a new batch size of a graph this group compiled already
            c = r.get("compile_time_s") or 0.0
            out.append(
                (
                    c < NEW_BATCH_COMPILE_S,
                    f"{phase}: {_name(r)} (a new batch of a compiled graph) compiled in "
                    f"{c:.2f} s (under {NEW_BATCH_COMPILE_S:g} s)",
                )
            )
        seen.add(r["precision"])
    by_config = _ok_by_config(base)
    for r in (r for r in current if r["status"] == "ok"):
        b = by_config.get(_config(r))
        if b is None:
            out.append((False, f"{phase}: {_name(r)} has no ok base row to compare with"))
            continue
        pct = 100 * (r["tflops_per_gpu"] / b["tflops_per_gpu"] - 1)
        out.append(
            (
                abs(pct) <= TFLOPS_PCT,
                f"{phase}: {_name(r)} {r['tflops_per_gpu']:.1f} TFLOP/s against base "
                f"{b['tflops_per_gpu']:.1f} ({pct:+.2f} %; within {TFLOPS_PCT:g} %; {_intervals(r, b)})",
            )
        )
    return out


def precompile_lines(ahead: list[dict], each: list[dict], phase: str) -> list[tuple[bool, str]]:
    """What compiling ahead changed (trainer.precompile): the current tree (it compiles ahead by default) against
    the same with --no-precompile, by part of the GPU-s, and the graphs its trials found in the cache; figures, not
    checks (issue 28's targets are against the base)."""
    parts = {name: gpu_seconds(rows) for name, rows in (("ahead", ahead), ("each", each))}
    held = {name: sum(p.values()) for name, p in parts.items()}
    by_part = ", ".join(f"{k} {parts['ahead'][k]:.1f} / {parts['each'][k]:.1f}" for k in parts["each"])
    waited = [r["precompile_s"] for r in ahead if r.get("precompile_s") is not None]
    found = sum(r.get("compile_cache_hits") or 0 for r in ahead), sum(r.get("compile_cache_misses") or 0 for r in ahead)
    return [
        (
            True,
            f"{phase}: compiling ahead: GPU-s held {held['ahead']:.1f} against {held['each']:.1f} with "
            f"--no-precompile ({held['ahead'] / held['each']:.2f}x; {by_part}); the first trial waited "
            f"{', '.join(f'{w:.1f}' for w in waited) or 'never'} s for its side processes; its trials found "
            f"{found[0]} graphs in the cache and compiled {found[1]}",
        )
    ]


def wait_lines(current: list[dict], wait_all: list[dict], phase: str) -> list[tuple[bool, str]]:
    """What waiting for its own side processes alone changed (trainer.worker, since session 33): the current tree
    against the same with every wait for all of them (SWEEP_PRECOMPILE_WAIT=all), each trial's wait and the mean held
    beyond measured steps; figures, not checks."""

    def line(rows: list[dict]) -> str:
        waited = [r["precompile_s"] for r in rows if r.get("precompile_s") is not None]
        sets = [r["precompiled_graphs"] for r in rows if r.get("precompiled_graphs") is not None]
        mean, each = _held_beyond(rows)
        waits = ", ".join(f"{w:.1f}" for w in waited) or "never"
        return f"waited {waits} s for {sets or '-'} sets, held beyond measured {mean:.1f} s ({each})"

    return [(True, f"{phase}: waiting for a trial's own side processes: {line(current)}; for all: {line(wait_all)}")]


def store_lines(kept_rows: list[dict], own_rows: list[dict], base: list[dict], phase: str) -> list[tuple[bool, str]]:
    """What keeping a side process's kernel timings changed (trainer.autotune_store): the current tree keeping them
    (SWEEP_AUTOTUNE_STORE=all) against the same keeping only its trials' own (the default), TFLOP/s and compile seconds
    per trial, the base's TFLOP/s beside where it ran, each run's GPU-s and what a trial held beyond its measured steps;
    figures, not checks."""
    kept, own, before = _ok_by_config(kept_rows), _ok_by_config(own_rows), _ok_by_config(base)
    parts = []
    for key in sorted(kept.keys() & own.keys()):
        a, b = kept[key], own[key]
        beside = f", base {before[key]['tflops_per_gpu']:.1f}" if key in before else ""
        parts.append(
            f"{_name(a)} {a['tflops_per_gpu']:.1f} / {b['tflops_per_gpu']:.1f}{beside} TFLOP/s, compile "
            f"{a.get('compile_time_s') or 0:.2f} / {b.get('compile_time_s') or 0:.2f} s"
        )
    text = "; ".join(parts) or "no trial ok in both"
    (kept_beyond, kept_each), (own_beyond, own_each) = _held_beyond(kept_rows), _held_beyond(own_rows)
    kept_s, own_s = (sum(gpu_seconds(rows).values()) for rows in (kept_rows, own_rows))
    held = (
        f"GPU-s held {kept_s:.1f} / {own_s:.1f}; held beyond measured steps {kept_beyond:.1f} ({kept_each}) / "
        f"{own_beyond:.1f} s ({own_each})"
    )
    what = "side processes' kernel timings kept / only the trials' (SWEEP_AUTOTUNE_STORE)"
    return [(True, f"{phase}: {what}: {text}; {held}")]


def prestart_lines(ahead: list[dict], late: list[dict], phase: str) -> list[tuple[bool, str]]:
    """What starting rank processes ahead changed (profile prestarted_ranks, sweep.execution.prestart): the current
    tree against the same with `prestarted_ranks: 0`, GPU-s held and the first trial's start-up; figures, not checks."""
    held = {name: sum(gpu_seconds(rows).values()) for name, rows in (("ahead", ahead), ("late", late))}

    def first(rows: list[dict]) -> str:
        r = min((r for r in rows if r["status"] == "ok"), key=lambda r: r["started_at"], default=None)
        if r is None:
            return "no ok trial"
        phases = ("process_start_s", "import_s", "process_setup_s", "precompile_s", "compile_time_s")
        return (
            f"{_beyond_measured(r):.1f} s beyond its measured steps (spawn, import, set-up, waiting for side "
            f"processes, compile {' / '.join(f'{r.get(k) or 0:.1f}' for k in phases)} s; ready before placement: "
            f"{r.get('imported_before_placement')}; side processes started ahead: {r.get('precompile_sides_ahead')}, "
            f"given their graphs as they started: {r.get('precompile_sides_given')})"
        )

    def beyond(rows: list[dict]) -> str:
        mean, each = _held_beyond(sorted(rows, key=lambda r: r["started_at"]))
        return f"{mean:.1f} s ({each})"

    return [
        (
            True,
            f"{phase}: ranks started ahead: GPU-s held {held['ahead']:.1f} against {held['late']:.1f} with "
            f"prestarted_ranks 0 ({held['ahead'] / held['late']:.2f}x); first trial {first(ahead)} against "
            f"{first(late)}; held beyond measured steps, mean per trial {beyond(ahead)} against {beyond(late)} "
            f"(issue 28: at most {HELD_S[phase]:g} s)",
        )
    ]


def search_checks(rows: list[dict], tree: str) -> list[tuple[bool, str]]:
    out = []
    oom = [r for r in rows if r.get("grid_name") == "cold-sweep/b-oom"]
    if oom:
        seconds = gpu_seconds(oom)
        share = seconds["OOM attempts"] / sum(seconds.values())
        path = " -> ".join(f"{r['batch_size']} {r['status']}" for r in sorted(oom, key=lambda r: r["attempt"]))
        line = f"OOM grid, {tree}: {share:.1%} of {sum(seconds.values()):.1f} GPU-s in OOM attempts ({path})"
        out.append((share <= OOM_SHARE, line + f"; at most {OOM_SHARE:.0%}") if tree == "current" else (True, line))
    probes = [r for r in rows if r.get("grid_name") == "cold-sweep/c-max-batch"]
    ok = [r for r in probes if r["status"] == "ok"]
    if ok:
        fastest = max(ok, key=lambda r: r["tokens_per_s_per_gpu"])
        one = fresh_trial_s(fastest, probes)
        spent = sum(gpu_seconds(probes).values())
        path = ", ".join(f"{r['batch_size']} {r['status']}" for r in probes)
        out.append(
            (
                one is not None and spent <= MAX_BATCH_COST * one,
                f"max-batch, {tree}: {spent:.1f} GPU-s for {len(probes)} probes ({path}) = "
                f"{spent / one:.2f}x one fresh trial of its fastest batch {fastest['batch_size']} (estimated from "
                f"the search's rows, {one:.1f} s; at most {MAX_BATCH_COST:g}x; `max-batch alone` measures one)"
                if one
                else f"max-batch, {tree}: no fresh trial to compare with",
            )
        )
    return out


def max_batch_cost_check(search: list[dict], one: list[dict]) -> list[tuple[bool, str]]:
    """The max-batch part: the search's GPU-s against one `sweep run` of the batch it found fastest (fresh
    processes, static shapes, an empty cache of its own), both measured in the same job."""
    if not search or not one:
        return []
    spent, once = sum(gpu_seconds(search).values()), sum(gpu_seconds(one).values())
    path = ", ".join(f"{r['batch_size']} {r['status']}" for r in search)
    return [
        (
            spent <= MAX_BATCH_COST * once,
            f"max-batch alone: {spent:.1f} GPU-s for {len(search)} probes ({path}) = {spent / once:.2f}x one"
            f" measured trial of batch {one[0]['batch_size']} ({once:.1f} GPU-s, {one[0]['status']};"
            f" at most {MAX_BATCH_COST:g}x)",
        )
    ]


def prediction_checks(rows: list[dict]) -> list[tuple[bool, str]]:
    """Every clean GPU row's predicted peak, calibrated leave-one-out, against its measured peak."""
    clean = [(r, s) for r in rows if (s := sample(r)) is not None]  # the calibration's own notion of clean
    samples = [s for _, s in clean]
    out = []
    for (r, s), calibrated in zip(clean, leave_one_out(samples)):
        raw = 100 * (s.predicted / s.measured - 1)
        if calibrated is None:
            out.append(
                (
                    False,
                    f"prediction: {_name(r)} ({r['grid_name']}): no other clean row to calibrate on (raw {raw:+.1f} %)",
                )
            )
            continue
        err = 100 * (calibrated / s.measured - 1)
        out.append(
            (
                abs(err) <= PREDICTION_PCT,
                f"prediction: {_name(r)} ({r['grid_name']}, {r['run_id'][:8]}): {calibrated / GiB:.1f} "
                f"GiB against {r['peak_mem_gib']:.1f} measured ({err:+.1f} %; raw {raw:+.1f} %; within "
                f"{PREDICTION_PCT:g} %)",
            )
        )
    return out


def main() -> int:
    root = Path(sys.argv[1])
    folders = {d.name: _rows(d) for d in sorted(root.iterdir()) if d.is_dir()} if root.is_dir() else {}
    if not any(folders.values()):
        print(f"cold_sweep_check: no rows under {root}")
        return 2
    checks: list[tuple[bool, str]] = []
    for phase in ("cold", "warm"):
        base, current = folders.get(f"base-{phase}"), folders.get(f"current-{phase}")
        if base and current:
            checks += grid_checks(base, current, phase)
        if current and (each := folders.get(f"each-{phase}")):
            checks += precompile_lines(current, each, phase)
        if current and (wait_all := folders.get(f"all-{phase}")):
            checks += wait_lines(current, wait_all, phase)
        if current and (kept := folders.get(f"kept-{phase}")):
            checks += store_lines(kept, current, base or [], phase)
        if current and (late := folders.get(f"late-{phase}")):
            checks += prestart_lines(current, late, phase)
    for tree in ("base", "current"):
        checks += search_checks(folders.get(f"{tree}-searches") or [], tree)
    checks += max_batch_cost_check(folders.get("max-batch-search") or [], folders.get("max-batch-one-trial") or [])
    checks += prediction_checks([r for rows in folders.values() for r in rows])
    for ok, line in checks:
        print(("ok   " if ok else "FAIL ") + line)
    print(f"cold_sweep_check: {sum(ok for ok, _ in checks)} of {len(checks)} checks hold")
    return 0 if all(ok for ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
