"""Where a step's time goes: a few steps under torch.profiler after the measured ones, and their summary.

With `profile: true` every rank runs one more step and then `recorded_steps` (PROFILE_STEPS micro-batches'
worth) once the measurement is done (so the measured steps are the same as without it), those under
torch.profiler; rank 0 sends back its Chrome/Perfetto trace, gzipped, with the shares of the wall step
time spent in five kinds of work:

    gemm          matrix multiplies (cuBLAS/cuBLASLt/CUTLASS/nvjet/hipBLASLt kernels; aten::mm, addmm, bmm,
                  linear on CPU)
    attention     fused attention (flash, fmha, sdpa kernels; aten::scaled_dot_product_attention on CPU)
    comm_exposed  collectives (NCCL/RCCL kernels; c10d and gloo ops on CPU) while no computation runs: the
                  communication the step waits for, not what overlaps with compute
    optimizer     everything the optimizer phase issues (clip, step, zero_grad), communication apart
    other         the rest: elementwise and normalisation kernels, copies, and idle time (launch
                  overhead, waits), so that the five add up to the step

It also names the attention kernels the profiled steps ran (`attention_kernels`: flash, cudnn, efficient or
math, as the trial's `attention` option names them), from the kernels' and operators' names: the measured steps ran
the same code. The arithmetic (`classify`, `shares`, `summarize`, `attention_kernels`) is pure, over interval
records and the trace's JSON, and is tested without the profiler; the profiler glue is `profile_steps` at the end.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from trainer.options import TrainingOptions


class ProfiledStep(Protocol):
    """What `profile_steps` drives (a trainer.train.TrainStep): one optimizer step per call."""

    label: Any  # wraps each phase of a step: record_function while profiled
    options: TrainingOptions

    def __call__(self, i: int) -> Any: ...


class ProfiledRank(Protocol):
    """Where `profile_steps` runs (a trainer.train.Rank)."""

    @property
    def device(self) -> torch.device: ...

    @property
    def rank(self) -> int: ...


PROFILE_STEPS = 3  # micro-batches recorded, in whole steps (after one step that is run but not recorded)


def recorded_steps(grad_accum: int) -> int:
    """Steps to record: PROFILE_STEPS micro-batches' worth, at least one step. A trace holds every kernel and
    op of every micro-batch, so 3 steps of 8 micro-batches would be 8 times the trace for no more insight."""
    return max(1, -(-PROFILE_STEPS // grad_accum))


# The five kinds of work and the summary's key for each
SHARE_KEYS = {
    "gemm": "gemm_pct",
    "attention": "attention_pct",
    "comm": "comm_exposed_pct",
    "optimizer": "optimizer_pct",
    "other": "other_pct",
}
# What an instant counts as when several kinds run at once (kernels on several streams; CPU threads):
# computation first, then the optimizer, then anything else; communication only when nothing else runs.
PRIORITY = ("gemm", "attention", "optimizer", "other", "comm")

# record_function labels TrainStep puts around its phases while profiled (trainer.train.TrainStep.label)
STEP, FORWARD, BACKWARD, OPTIMIZER = "sweep/step", "sweep/forward", "sweep/backward", "sweep/optimizer"

_COMM_KERNEL = ("nccl", "rccl")
_ATTENTION_KERNEL = ("flash", "fmha", "sdpa", "attention")  # before GEMM: CUTLASS fmha kernels say cutlass too
_GEMM_KERNEL = ("gemm", "cutlass", "nvjet", "xmma", "scaled_mm", "cijk")  # cijk: hipBLASLt/Tensile on ROCm
# Collective ops by their namespaces (c10d::_allgather_base_, _c10d_functional::wait_tensor, gloo:all_gather):
# a bare "all_gather" would also take FSDP's copies in and out of the all-gather buffer (fsdp::all_gather_copy_in)
_COMM_OP = ("c10d", "gloo", "nccl", "record_param_comms")
_ATTENTION_OP = ("scaled_dot_product", "flash_attention")
_GEMM_OP = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear", "aten::matmul", "aten::_scaled_mm"}


def kernel_kind(name: str) -> str:
    """The kind of a device kernel, from its name."""
    low = name.lower()
    for kind, marks in (("comm", _COMM_KERNEL), ("attention", _ATTENTION_KERNEL), ("gemm", _GEMM_KERNEL)):
        if any(m in low for m in marks):
            return kind
    return "other"


def op_kind(name: str) -> str:
    """The kind of a CPU operator (a CPU run, gloo), from its name."""
    low = name.lower()
    if any(m in low for m in _COMM_OP):
        return "comm"
    if any(m in low for m in _ATTENTION_OP):
        return "attention"
    return "gemm" if low in _GEMM_OP else "other"


@dataclass(frozen=True)
class Span:
    """One interval of a trace, in microseconds: a device kernel, or a CPU operator."""

    name: str
    start: float
    end: float
    lane: object = 0  # its thread or stream: CPU operators of one thread nest, kernels of one stream follow
    issued: float | None = None  # a kernel: when the CPU launched it, which says the phase that issued it


def classify(
    spans: list[Span], name_kind: Callable[[str], str], optimizer: list[tuple[float, float]]
) -> list[tuple[float, float, str]]:
    """(start, end, kind) of each span. `name_kind` names a span's kind; a span inside a classified one of its
    lane (aten::t under aten::linear, aten::empty under c10d::allgather_) takes its kind; a span issued
    within an `optimizer` interval is optimizer work unless it communicates."""
    kinds: dict[int, str] = {}
    open_: dict[object, list[tuple[float, str]]] = {}  # per lane: (end, kind) of the enclosing spans, innermost last
    for i in sorted(range(len(spans)), key=lambda i: (spans[i].start, -spans[i].end)):
        s, enclosing = spans[i], open_.setdefault(spans[i].lane, [])
        while enclosing and enclosing[-1][0] <= s.start:
            enclosing.pop()
        kind = name_kind(s.name)
        if kind == "other" and enclosing:
            kind = enclosing[-1][1]
        enclosing.append((s.end, kind))
        at = s.start if s.issued is None else s.issued
        kinds[i] = "optimizer" if kind != "comm" and any(lo <= at < hi for lo, hi in optimizer) else kind
    return [(s.start, s.end, kinds[i]) for i, s in enumerate(spans)]


def shares(intervals: list[tuple[float, float, str]], window: tuple[float, float]) -> dict[str, float]:
    """Per cent of `window` spent on each kind: each instant counts once, as the first of PRIORITY running
    then; communication only when nothing else runs (exposed); an instant with nothing running is other.
    The five add up to 100."""
    lo, hi = window
    if hi <= lo:
        raise ValueError(f"empty profile window {window}")
    edges = []  # (time, +1 start / -1 end, kind), clipped to the window
    for start, end, kind in intervals:
        start, end = max(start, lo), min(end, hi)
        if end > start:
            edges += [(start, 1, kind), (end, -1, kind)]
    heapq.heapify(edges)
    running = dict.fromkeys(SHARE_KEYS, 0)
    spent = dict.fromkeys(SHARE_KEYS, 0.0)
    at = lo
    while edges:
        t, delta, kind = heapq.heappop(edges)
        if t > at:
            spent[next((k for k in PRIORITY if running[k]), "other")] += t - at
            at = t
        running[kind] += delta
    spent["other"] += hi - at
    return {key: 100.0 * spent[kind] / (hi - lo) for kind, key in SHARE_KEYS.items()}


def summarize(trace: dict) -> dict[str, float]:
    """The five shares of a Chrome trace that torch.profiler exported around `STEP`-labelled steps: over
    device kernels when it recorded any (a GPU run), else over CPU operators."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    labels = _labelled(events)
    if not labels.get(STEP):
        raise ValueError(f"the trace has no {STEP!r} ranges: not a profile of trainer.profiling")
    window = (min(lo for lo, _ in labels[STEP]), max(hi for _, hi in labels[STEP]))
    recorded = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    launches = {}  # a kernel's correlation id -> when its launch was called
    if any(e["cat"] == "kernel" for e in recorded):
        launches = {
            e["args"]["correlation"]: e["ts"]
            for e in events
            if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
        }
        name_kind = kernel_kind
    else:
        # gloo runs each collective on a thread of its own, recorded as a "gloo:..." range, not an operator
        recorded = [
            e
            for e in events
            if e.get("cat") == "cpu_op" or (e.get("cat") == "user_annotation" and e["name"].startswith("gloo:"))
        ]
        name_kind = op_kind
    spans = [
        Span(
            e["name"],
            e["ts"],
            e["ts"] + e["dur"],
            lane=e.get("tid"),
            issued=launches.get(e.get("args", {}).get("correlation")),
        )
        for e in recorded
    ]
    return shares(classify(spans, name_kind, labels.get(OPTIMIZER, [])), window)


# An attention kernel's family by its name, first match: a device kernel (cuDNN's SDPA kernels say flash too,
# cudnn_generated_fort_native_sdpa_sm90_flash_fprop_...; the memory-efficient ones are fmha_cutlassF/B_...; torch's
# and flash-attn's are flash_fwd/bwd_...) or an operator (aten::_scaled_dot_product_cudnn_attention,
# _efficient_attention, _flash_attention[_for_cpu], _attention_math; the composite scaled_dot_product_attention
# says none). Compiled math attention is matmuls and a softmax: no name says so, and it is not named.
ATTENTION_FAMILIES = (
    ("cudnn", ("cudnn",)),
    ("efficient", ("fmha_cutlass", "efficient_attention")),
    ("flash", ("flash",)),
    ("math", ("attention_math",)),
)


def attention_family(name: str) -> str | None:
    """The attention kernel family (ATTENTION_FAMILIES) a kernel or operator name says, or None."""
    low = name.lower()
    return next((family for family, marks in ATTENTION_FAMILIES if any(m in low for m in marks)), None)


def attention_kernels(trace: dict) -> str | None:
    """The attention kernel families the trace ran (device kernels and CPU operators of attention's kind), sorted
    and joined by "+" if several (a cuDNN forward with a flash backward: "cudnn+flash"); None if none is named."""
    families = set()
    for e in trace["traceEvents"]:
        kind = {"kernel": kernel_kind, "cpu_op": op_kind}.get(e.get("cat", "")) if e.get("ph") == "X" else None
        if kind is not None and kind(e["name"]) == "attention" and (family := attention_family(e["name"])):
            families.add(family)
    return "+".join(sorted(families)) or None


def _labelled(events: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """The CPU ranges of each of our record_function labels."""
    out: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        if e.get("cat") == "user_annotation" and e["name"] in (STEP, FORWARD, BACKWARD, OPTIMIZER):
            out.setdefault(e["name"], []).append((e["ts"], e["ts"] + e["dur"]))
    return out


def profile_steps(step: ProfiledStep, first: int, rank: ProfiledRank) -> dict[str, Any] | None:
    """Run 1 + `recorded_steps` steps of `step` (a trainer.train.TrainStep) from step index `first` on every
    rank, the last `recorded_steps` under the profiler. Every rank records, so that each carries the profiler's
    overhead and none waits for rank 0 in the collectives more than it would unprofiled; rank 0 returns the
    shares (`summarize`), the attention kernels that ran (`attention_kernels`) and `trace_gz`, its gzipped Chrome
    trace; the other ranks None."""
    import gzip
    import json
    import os
    import tempfile

    from torch.profiler import ProfilerActivity, profile, record_function

    from trainer.sync import device_sync

    step.label = record_function  # the phases' labels, in these steps only: the measured ones carry none

    def run(i: int) -> None:
        with record_function(STEP):
            step(i)
            device_sync(rank.device)  # the step's kernels end inside its range: the window is the wall step

    run(first)  # the profiled steps start from a steady one
    activities = [ProfilerActivity.CPU]
    if rank.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
        # Kineto leaves CUPTI attached after the profile unless told otherwise, and its callbacks slow every
        # later launch (pytorch/pytorch#144455): a warm rank's next trial would measure them. On an H200
        # (torch 2.11, CUDA 13) a kernel launch took 25-80 % longer after a profile, and about what it took
        # before with teardown. Torch sets "0" itself where teardown is unsafe (CUDA graphs on CUDA < 12.6).
        os.environ.setdefault("TEARDOWN_CUPTI", "1")
    with profile(activities=activities) as prof:
        for i in range(first + 1, first + 1 + recorded_steps(step.options.grad_accum)):
            run(i)
    if rank.rank != 0:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path, "rb") as f:
            text = f.read()
    trace = json.loads(text)
    return {
        **summarize(trace),
        "attention_kernel": attention_kernels(trace),
        "trace_gz": gzip.compress(text, compresslevel=6),
    }
