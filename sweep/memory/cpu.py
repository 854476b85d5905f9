"""Predicted peak of a CPU rank under a memory cap (gloo, FSDP2 on the CPU): pure arithmetic (no torch, no Ray).

What is predicted is what trainer/memory.py measures: the resident set's high-water mark (VmHWM) above the RSS
at the trial's reset, which comes before the model is built. A CPU rank has no caching allocator: torch's CPU
allocator calls glibc, which returns a freed chunk of 32 MiB or more to the kernel (mmap threshold, mallopt(3))
and keeps smaller ones for reuse (the trainer hands them back before each trial's reset: `malloc_trim`). So the
peak is the tensors live at the worst moment of a step, in bytes, plus the process's own growth during a step.

    peak = max(init, state + copies + activations + loss)       (`cpu_breakdown`)

* State (sharded over the dp ranks by FSDP2): fp32 master weights (4 B/param) and AdamW's two fp32 moments (8)
  from the first step on; no gradients yet at the peak (below), `zero_grad(set_to_none=True)`; + 4 with
  grad_accum > 1 (the earlier micro-batches' sums). AdamW runs its per-tensor loop on the CPU (`fused` only on
  CUDA, trainer/train.py; torch's foreach default is for CUDA tensors): temporaries of one tensor at a time.
* Init: reset comes before the build, and a multi-rank CPU trial first initialises an unsharded fp32 copy of the
  model (trainer/tensor_parallel.py `whole_model`: 4 B/param) and copies each rank's shard from it (4 / dp).
* Compute copies: FSDP2 all-gathers a unit's parameters in the recipe's compute dtype (bf16, or fp32 for the
  fp32 recipe), the unit computing and the one prefetched; one rank is not sharded (autocast on the CPU keeps no
  weight cache in eager mode worth counting at these sizes: left to the calibration).
* Activations, what eager autograd saves per token (`cpu_layer_bytes`), counted on this machine (torch 2.13) with
  `torch.autograd.graph.saved_tensors_hooks` over each tiny model's forward, storages counted once, and derived
  op by op: torch's CPU SDPA runs its flash kernel for fp32 and bf16 (no T² scores: the same tokens at seq 32 and
  128 peak within 0.1 MiB) and saves q, k, v, its output and the fp32 log-sum-exp (H per token). GPT's block
  saves 16·E values as Korthikanti et al. 2022 §4.1 count them (sweep.memory.model; q, k and v are views of one
  qkv output, and the CPU kernel's output is laid out (B, T, H, D), so out_proj's input is a view of it). Llama's
  saves more eagerly: nn.RMSNorm's composite keeps its input, the normalised input and its output (3·E, the first
  two in fp32 whatever the compute dtype), wo's input is a contiguous copy of the attention's output (E), and
  SwiGLU keeps silu's output besides the gate, the up projection and their product (4·K). Values are the compute
  dtype's width: 4 B for fp32, 2 B otherwise (FSDP2 computes in bf16 with bf16 parameters; torchao's FP8 is
  emulated in bf16 on the CPU). The final norm's tensors are kept for the head's backward.
* Loss, eager on the CPU (trainer/train.py `cross_entropy`: `F.cross_entropy(logits.float())`): the peak of a
  step is in backward at the log-softmax, where its fp32 output (saved for backward), the fp32 gradient nll_loss
  hands it and the fp32 gradient it computes are live together: 12 B per logit, B·T·V of them, whatever the
  recipe (forward holds at most 10: bf16 logits, their fp32 upcast and the log-softmax). `loss: chunked` holds
  one chunk's (trainer/loss.py `_chunk`: the logits in the compute dtype, the fp32 log-softmax and the gradient
  in the compute dtype), the head weight's fp32 gradient sum and the hidden states' gradient.

Measured on this project's 2-core machine (2 gloo ranks, torch 2.13, docs/memory-cap.md): at batch 64, seq 128,
V 4096, one layer, the 12 B per logit come to 384 MiB of the 424 MiB fp32 peak; the rest within 2 MiB.

The figure is then corrected by an affine fit learned from the clean CPU rows of the same results folder
(`CpuCalibration`): measured ≈ overhead + slope · predicted. A ratio alone (the GPU calibration's) cannot fit a CPU
rank: the process grows by a few MiB during a step whatever the batch (autograd's graph, gloo's buffers, Python
objects), which at small batches is most of the peak, and a ratio fitted there would be far off at large batches.
The slope absorbs what the count misses per byte (bf16 ops that compute through fp32 temporaries, a compiled
graph's own buffers); the overhead absorbs the process. Both are fitted per config (compile fuses the loss and the
elementwise ops, so its bytes differ; bf16 ranks held 2-10 MiB more than the count at batch 64, not in proportion
to the tokens), or, with no rows of the config, only the overhead per (precision, compile). Nothing is refused on
a prediction: a CPU trial past its cap runs, and the cap makes a real allocation fail (tests/test_oom.py relies on it).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from sweep.memory.model import ACT_BYTES, Shape, _kv_width, _unit_params, activation_bytes, largest, least_squares
from trainer.loss_chunk import chunk_tokens

FP32 = 4
CPU_LOSS_BYTES = 4 + 4 + 4  # in backward: the fp32 log-softmax (saved), nll_loss's fp32 gradient and its own result
MIN_SPREAD = 1.2  # the largest predicted peak of a fit's rows over the smallest: below it the slope is not fitted


def compute_width(precision: str) -> int:
    """Bytes of an activation on a CPU rank: fp32 computes in fp32; every other recipe in bf16 (see the
    module's docstring)."""
    return FP32 if precision == "fp32" else ACT_BYTES


@dataclass(frozen=True)
class CpuBreakdown:
    """A CPU rank's predicted (uncalibrated) peak, in bytes, and its parts."""

    init: float
    """The build: the unsharded fp32 copy every rank initialises and its own fp32 shard."""
    state: float
    """fp32 weights and AdamW's moments of the rank's shard (+ the gradient sums with grad_accum > 1)."""
    compute_copies: float
    """FSDP2's gathered parameters in the compute dtype: the unit computing and the one prefetched."""
    activations: float
    """What forward saves for backward, in the compute dtype."""
    loss: float
    """The loss's temporaries at their most (in backward at the log-softmax, or a chunk's)."""

    @property
    def step(self) -> float:
        return self.state + self.compute_copies + self.activations + self.loss

    @property
    def peak(self) -> float:
        return max(self.init, self.step)


def cpu_loss_bytes(s: Shape, width: int) -> float:
    """The loss at its most (see the module's docstring): 12 B per logit, or what one chunk holds."""
    tokens = s.batch_size * s.seq_len
    if s.loss != "chunked":
        return CPU_LOSS_BYTES * tokens * s.vocab_size / s.tp
    chunk = min(tokens, chunk_tokens(s.vocab_size))
    held = (width + FP32 + width) * chunk * s.vocab_size  # trainer/loss.py _chunk: logits, log-softmax, gradient
    return held + FP32 * s.vocab_size * s.d_embd + width * tokens * s.d_embd


def _norm_bytes(s: Shape, width: int) -> float:
    """What one norm saves per token: LayerNorm its input (its mean and rstd are per token), and its output is the
    next matmul's saved input; RMSNorm's composite also its normalised input, input and that in fp32."""
    E = s.d_embd
    return 2 * width * E if s.arch == "gpt" else 2 * FP32 * E + width * E


def cpu_layer_bytes(s: Shape, width: int) -> float:
    """What one block saves per token on a CPU rank, eagerly (see the module's docstring)."""
    E, K = s.d_embd, s.ffn_hidden or 4 * s.d_embd
    lse = FP32 * s.n_heads
    if s.arch == "gpt":
        return 2 * _norm_bytes(s, width) + width * (3 * E + E + 8 * E) + lse
    attention = E + 2 * _kv_width(s) + E + E  # q, k, v, the output and wo's contiguous copy of it
    return 2 * _norm_bytes(s, width) + width * (attention + 4 * K) + lse


def cpu_breakdown(s: Shape, precision: str) -> CpuBreakdown:
    """The uncalibrated peak of one CPU rank for `s` trained in `precision`, part by part."""
    width = compute_width(precision)
    tokens = s.batch_size * s.seq_len
    sharded = s.ranks > 1
    state = (16 if s.grad_accum > 1 else 12) * s.n_params / s.ranks
    whole = FP32 * s.n_params if sharded else 0.0  # trainer/tensor_parallel.py whole_model: CPU, > 1 rank
    blocks = activation_bytes(s, cpu_layer_bytes(s, width), width)
    # with TP, sequence and column/row parallel split what a block keeps about tp ways (sweep.memory.model)
    activations = (blocks + _norm_bytes(s, width) * tokens) / s.tp
    return CpuBreakdown(
        init=whole + FP32 * s.n_params / s.ranks,
        state=state,
        compute_copies=2 * width * max(_unit_params(s)) / s.tp if sharded else 0.0,  # a block, or the root
        activations=activations,
        loss=cpu_loss_bytes(s, width),
    )


def cpu_predicted_bytes(s: Shape, precision: str) -> float:
    return cpu_breakdown(s, precision).peak


def config_of(shape: Shape, precision: str, compile: str, *, seq: bool = True) -> tuple[Shape, str, str]:
    """What a per-config fit is keyed by: the trial's model, layout, options and (`seq`) seq len, not its batch."""
    return replace(shape, batch_size=0, seq_len=shape.seq_len if seq else 0), precision, compile


@dataclass(frozen=True)
class CpuSample:
    """One clean measured CPU row: its config (`config_of`), predicted (uncalibrated) and measured peak."""

    config: tuple[Shape, str, str]
    """`config_of` the row's shape (with its seq len)."""
    predicted: float
    """`cpu_predicted_bytes` of the row's shape, in bytes."""
    measured: float
    """The row's peak_mem_gib, in bytes."""

    @property
    def any_seq(self) -> tuple[Shape, str, str]:
        """The config at any seq len."""
        return replace(self.config[0], seq_len=0), self.config[1], self.config[2]

    @property
    def kind(self) -> tuple[str, str]:
        """(precision, compile): what the fallback fit is keyed by."""
        return self.config[1], self.config[2]


@dataclass(frozen=True)
class AffineFit:
    """measured ≈ overhead + slope · predicted, fitted on `rows` clean rows (`fit_affine`, `fit_overhead`)."""

    overhead: float
    """Bytes the process adds to a step's peak whatever the batch."""
    slope: float
    """Measured bytes per predicted byte (1.0: not fitted)."""
    rows: int
    """How many rows it rests on."""
    scope: str = "config"
    """"config": rows of the trial's own config and seq len at other batch sizes; "model": of its config at other
    seq lens too; "kind": of its precision and compile mode, other models included."""

    def apply(self, raw: float) -> float:
        return self.overhead + self.slope * raw

    def text(self) -> str:
        """`calibrated on 3 rows of its config (+2.1 MiB, × 0.982)`."""
        where = {"config": "of its config", "model": "of its config at other seq lens"}.get(
            self.scope, "of its precision and compile mode"
        )
        slope = f", × {self.slope:.3f}" if self.slope != 1.0 else ""
        return (
            f"calibrated on {self.rows} row{'s' * (self.rows != 1)} {where} ({self.overhead / 2**20:+.3g} MiB{slope})"
        )


def fit_overhead(samples: list[CpuSample], scope: str = "kind") -> AffineFit:
    """The slope kept at 1 (the count's bytes, within 3 % of the measured peak at batch 64 in fp32) and the
    overhead the median measured - predicted: robust to the small rows' heap noise (±1.5 MiB between batches of
    the same tokens), which a fitted slope over other models would spread onto the large ones."""
    overhead = statistics.median(s.measured - s.predicted for s in samples)
    return AffineFit(overhead=overhead, slope=1.0, rows=len(samples), scope=scope)


def fit_affine(samples: list[CpuSample], scope: str = "config") -> AffineFit:
    """Rows of one config: overhead and slope by ordinary least squares (the closed form of the 2 x 2 normal
    equations). The peak of one config is affine in its batch (flash attention: no T² term), and so is the count,
    so the slope corrects what the count misses per token of this config (bf16 ops that compute through fp32
    temporaries) and the overhead what the process adds. Unweighted, the large rows lead, whose peaks are tensors;
    the small ones are a few MiB of heap noise (±1.5 MiB between batches of the same tokens): weighted by
    1 / measured² (the relative error), a leave-one-out over 47 rows extrapolated to batch 64 up to 19 % off,
    unweighted 17 % (docs/memory-cap.md). With rows whose predicted peaks spread by less than MIN_SPREAD (the slope
    would rest on noise), or a slope that is not positive: `fit_overhead`."""
    xs, ys = [s.predicted for s in samples], [s.measured for s in samples]
    if len(samples) < 2 or max(xs) < MIN_SPREAD * min(xs):
        return fit_overhead(samples, scope)
    overhead, slope = least_squares(xs, ys)
    if slope <= 0:
        return fit_overhead(samples, scope)
    return AffineFit(overhead=overhead, slope=slope, rows=len(samples), scope=scope)


@dataclass(frozen=True)
class CpuPrediction:
    """A CPU trial's predicted peak: raw (`cpu_predicted_bytes`), and as `fit` corrects it (None: no rows)."""

    raw: float
    fit: AffineFit | None

    @property
    def bytes(self) -> float:
        return self.raw if self.fit is None else self.fit.apply(self.raw)

    def basis(self) -> str:
        return "uncalibrated" if self.fit is None else self.fit.text()


@dataclass(frozen=True)
class CpuCalibration:
    """Fits over a results folder's clean CPU rows, the closest first: per config and seq len where it has rows at
    two batch sizes or more, then per config at any seq len (`fit_affine`: a bf16 rank's peak at batch 64, seq 32
    read 4-8 MiB above batch 16, seq 128, the same tokens, where fp32's agreed within 0.2 MiB), then per
    (precision, compile) (`fit_overhead`)."""

    configs: dict[tuple[Shape, str, str], AffineFit]
    """Keyed by `config_of` with the seq len, and by it at seq len 0 (any)."""
    kinds: dict[tuple[str, str], AffineFit]
    excess: dict[str, AffineFit] = field(default_factory=dict)
    """By what (ONE_TIME), what rows that also paid a one-time cost peaked above their calibrated prediction
    (`one_time_excess`): not in the figure (a plan cannot know which trial opens a rank group or compiles), said
    beside it."""

    def fit(self, shape: Shape, precision: str, compile: str) -> AffineFit | None:
        for seq in (True, False):
            own = self.configs.get(config_of(shape, precision, compile, seq=seq))
            if own is not None and own.rows > 1:
                return own
        return self.kinds.get((precision, compile))

    def predict(self, shape: Shape, precision: str, compile: str) -> CpuPrediction:
        return CpuPrediction(raw=cpu_predicted_bytes(shape, precision), fit=self.fit(shape, precision, compile))

    def max_batch(self, shape: Shape, precision: str, compile: str, available: float, limit: int = 1 << 20) -> int:
        """The largest batch whose predicted peak is within `available` bytes (0: not even one). It refuses
        nothing: a CPU trial past it still runs, and its cap makes a real allocation fail."""
        return largest(
            lambda b: self.predict(replace(shape, batch_size=b), precision, compile).bytes <= available, limit
        )

    @property
    def rows(self) -> dict[tuple[str, str], int]:
        """Rows per (precision, compile)."""
        return {k: f.rows for k, f in self.kinds.items()}


def calibrate_cpu(samples: Iterable[CpuSample]) -> CpuCalibration:
    """`fit_affine` per config (with and without its seq len) and `fit_overhead` per (precision, compile)."""
    configs: dict[tuple[Shape, str, str], list[CpuSample]] = {}
    kinds: dict[tuple[str, str], list[CpuSample]] = {}
    for x in samples:
        if x.predicted > 0 and x.measured > 0:
            configs.setdefault(x.config, []).append(x)
            configs.setdefault(x.any_seq, []).append(x)
            kinds.setdefault(x.kind, []).append(x)
    return CpuCalibration(
        configs={k: fit_affine(v, "config" if k[0].seq_len else "model") for k, v in configs.items()},
        kinds={k: fit_overhead(v) for k, v in kinds.items()},
    )


FRESH = "a fresh process's first trial"
COMPILING = "a trial that compiled"
ONE_TIME = (FRESH, COMPILING)
"""The rows whose peak also counts a one-time cost, which no count of the step has: a fresh process's first trial
(oneDNN's kernels and the like, set up on its first step: measured, one process, 34.8 MiB, then 4.8 MiB the same
trial again), and a compiled trial that compiled inside its measured window (inductor runs in the rank process:
gpt-tiny fp32 regional at batch 4, seq 128, 49.8 MiB compiling, 9.9 eager; batch 16 running the graph batch 4
compiled, dynamic_batch, 28.5 MiB where eager measured 32.0)."""
COMPILING_S = 5.0
"""A row's compile_time_s above which it compiled in its window: 25-39 s compiling on this project's 2-core
machine, 0.45-0.49 s running a kept graph."""


def one_time_excess(calibration: CpuCalibration, rows: dict[str, list[CpuSample]]) -> CpuCalibration:
    """`calibration` with `excess`: per kind of one-time cost (ONE_TIME), the median of measured - calibrated
    prediction over its rows that `calibration` predicts."""
    excess = {}
    for what, samples in rows.items():
        over = [
            x.measured - fit.apply(x.predicted)
            for x in samples
            if (fit := calibration.fit(x.config[0], x.config[1], x.config[2])) is not None
        ]
        if over:
            excess[what] = AffineFit(overhead=statistics.median(over), slope=1.0, rows=len(over), scope=what)
    return replace(calibration, excess=excess)


def cpu_leave_one_out(samples: list[CpuSample]) -> list[float | None]:
    """Each sample's calibrated prediction from the others alone (None: no other sample to learn from)."""
    out: list[float | None] = []
    for i, x in enumerate(samples):
        fit = calibrate_cpu(samples[:i] + samples[i + 1 :]).fit(x.config[0], x.config[1], x.config[2])
        out.append(None if fit is None else fit.apply(x.predicted))
    return out
