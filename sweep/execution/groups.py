"""Which trials a warm group of rank processes may run, and in what order. Pure: no Ray, no torch.

A group (`sweep.execution.scheduler`) runs trial after trial in the same processes. It may run a trial when the trial
has its kind (`warm_group_key`: ranks, memory cap, process family) and does not come at an earlier `stack_stage`
than a trial the group already ran. Its first trial is the one it was placed for, stage permitting
(`opener`); after that it takes the lowest stage first, then the smallest (`pick`). A process that a trial
may have changed is not measured on again: the scheduler also retires a group after a failed trial and when
its memory did not return to the baseline (`returned_to_baseline`).
"""

from __future__ import annotations

from collections.abc import Iterable

from sweep.spec.grid import AC_MEMORY, Trial
from trainer.recipes import RECIPES
from trainer.result import RankResult

# A precision stack's process family and its stage in it. Plain torch and torchao share processes, plain torch
# first: torchao's float8 conversion patches inductor's Triton min/max code generation for the whole process
# (torchao.float8._inductor_patch, from convert_to_float8_training), so no plain-torch trial may follow it;
# torchao after plain torch finds the process as a fresh one would, plus caches. Transformer Engine keeps
# process-wide FP8 state (its global amax buffers and autocast stack): its own family.
STACKS = {"torch": ("torch", 0), "torchao": ("torch", 1), "te": ("te", 0)}


def _stack(trial: Trial) -> tuple[str, int]:
    """The trial's process family and its stage in it (`STACKS`)."""
    return STACKS[RECIPES[trial.precision].backend]


# A warm group's kind (`warm_group_key`): its ranks, its memory cap (bytes, or None), its process family.
WarmGroupKey = tuple[int, int | None, str]


def warm_group_key(trial: Trial) -> WarmGroupKey:
    """The trials one group can run one after the other: the same ranks (the process group and its placement
    stay), the same memory cap (set per trial, but a CPU cap is measured from the process's size, which an
    earlier trial grew), the same process family (`STACKS`; within it, `stack_stage` orders them)."""
    return trial.gpus, trial.memory_cap_bytes, _stack(trial)[0]


def stack_stage(trial: Trial) -> int:
    """The trial's place in its family's order (`STACKS`): a group that ran a later stage runs no earlier one."""
    return _stack(trial)[1]


def fits(key: WarmGroupKey, stage: int, trial: Trial) -> bool:
    """Whether a group of `key` that has run up to `stage` may run `trial`."""
    return warm_group_key(trial) == key and stack_stage(trial) >= stage


def footprint(trial: Trial) -> tuple[int, bool, int, int]:
    """What orders the trials of one stage a warm group runs, smallest first: the model, then whether the trial
    compiles static shapes, then the tokens per micro-batch, then the most activation checkpointing. A trial that
    runs out of memory then comes after those that fit, so the OOM retires a group with the least left to run (each
    retirement costs a group start), and an on_oom policy (bisect) knows which smaller batches fit. Where in a group
    a trial runs did not show in its speed on 2xH200: Llama3-8B bf16 batch 4 (24-44 allocator retries) read 1.6 %
    below fresh as a group's first trial and 5.9 % below to 5.4 % above as its fourth, and varies as much between
    fresh runs (RESULTS.md, sessions 6-8). Static-shape compiled trials (`dynamic_batch` false, or folded to it:
    torchao rowwise) come after a model's others because each drops the compiled code the group keeps
    (trainer.release): run between two batches of a symbolic-batch config, one made the second compile again (6.8 s
    of torchao tensorwise on one H200, benchmarks/RESULTS.md "Cold sweep")."""
    static = trial.compile != "none" and not trial.dynamic_batch
    return trial.model.n_params(), static, trial.batch_size * trial.seq_len, AC_MEMORY[trial.ac]


def pick(key: WarmGroupKey, stage: int, queue: Iterable[Trial]) -> Trial | None:
    """The trial a group of `key` at `stage` runs next: of those it may run, the lowest stage (what comes later
    in the family can still follow), then the smallest (`footprint`; of equals the oldest); None when none."""
    return min((t for t in queue if fits(key, stage, t)), key=lambda t: (stack_stage(t), footprint(t)), default=None)


def run_order(key: WarmGroupKey, stage: int, waiting: Iterable[Trial]) -> list[Trial]:
    """The trials of `waiting` a group of `key` at `stage` would run, in the order it would pick them (`pick`, its
    stage advancing with each): what a fresh group compiles ahead (trainer.precompile)."""
    order, left = [], [t for t in waiting if fits(key, stage, t)]
    while (t := pick(key, stage, left)) is not None:
        order.append(t)
        left.remove(t)
        stage = max(stage, stack_stage(t))
    return order


def opener(first: Trial, queue: Iterable[Trial]) -> Trial:
    """The trial a new group runs first: the one it was placed for (the oldest waiting: placement keeps
    submission order), unless a queued trial it may run comes at an earlier stage; then the oldest of the
    earliest, so that a grid listing torchao before bf16 still runs both on one group."""
    key, stage = warm_group_key(first), stack_stage(first)
    earlier = [t for t in queue if fits(key, 0, t) and stack_stage(t) < stage]
    return min(earlier, key=stack_stage) if earlier else first


# What a rank may hold after a trial beyond its baseline and still measure as a fresh process would: small
# process-wide caches a library keeps (Transformer Engine 2.20 kept 3072 and 512 bytes after two trials on an
# H200, RESULTS.md session 10), never a trial's weights, optimizer state or activations (MiB to GiB).
KEPT_BYTES_ALLOWED = 1 << 20


def returned_to_baseline(ranks: list[RankResult]) -> bool:
    """Whether every rank, after its trial, holds at most `KEPT_BYTES_ALLOWED` more tensor memory than before its
    group's first trial (`trainer.worker.RankWorker`: CUDA allocated bytes, or the CPU's live tensor storages)."""
    return all(
        r.held_bytes is not None
        and r.baseline_bytes is not None
        and r.held_bytes <= r.baseline_bytes + KEPT_BYTES_ALLOWED
        for r in ranks
    )


def kept_note(trial: Trial, ranks: list[RankResult]) -> str:
    """What a group retired for its memory kept: the note the run prints."""
    kept = max((r.held_bytes or 0) - (r.baseline_bytes or 0) for r in ranks)
    return (
        f"{trial.describe()}: a rank kept {kept / 2**20:.1f} MiB of tensor memory beyond what it held before "
        "its group's first trial; the group is retired and the next trial starts fresh processes"
    )
