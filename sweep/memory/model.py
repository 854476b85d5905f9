"""Predicted peak memory per rank of a trial, before any GPU time: pure arithmetic (no torch, no Ray).

    peak = max(forward end, backward end)
    forward end  = state_fwd·N/dp + compute copies + L·T·B·act(ac) + loss (6·B·T·V; chunked: 10·C·V + 6·V·E + 2·B·T·E)
    backward end = 16·N/dp + compute copies

* Training state, sharded over the dp ranks (FSDP2): fp32 master weights (4 B/param) and AdamW's two fp32
  moments (8) all the time; the fp32 gradients (4) exist from backward until `zero_grad(set_to_none=True)`,
  so they are live at the end of forward only with grad_accum > 1 (the earlier micro-batches' sums): measured,
  Llama3-8B on 2 H200s at batch 2 peaks 14.96 GiB higher with grad_accum 8 than 1, which is 4 B × 8.03 B / 2.
* Compute copies: under FSDP2 (dp > 1) the bf16 all-gathered parameters of the largest unit (a block, or the
  root's embeddings and head), twice (the next unit is prefetched while one computes); on one rank the model
  is not sharded and trains under autocast, whose bf16 casts of every matmul weight stay cached (and saved for
  backward) through forward: 2 B × N_matmul.
* Activations of one micro-batch, bytes per token per layer, in bf16 (2 B), as Korthikanti et al. 2022,
  "Reducing Activation Recomputation in Large Transformer Models" §4.1, count what backward needs — with
  flash/SDPA attention (no s² score or softmax term: only its output is saved) and no dropout (no masks):
  the two norms' inputs and outputs (4E), q (E), k and v (2·J·D), the attention output (E), and the MLP:
  GPT's GELU input and output (4E each), Llama's SwiGLU gate, up and their product (K each; silu is
  recomputed). GPT comes to 32·E (their 34·s·b·h less the two 1-byte residual dropout masks).
  `ac: full` keeps each block's input (E) and recomputes one block at a time in backward; `selective`
  checkpoints every other block (trainer/parallelize.py), so half the blocks keep everything.
* Logits and loss: B·T·V logits in bf16 and their fp32 upcast for the loss, the largest single temporary at
  the end of forward (6 B per element). `loss: chunked` (trainer/loss.py, Liger Kernel's fused linear
  cross-entropy) never holds them: what it holds at its most, inside the forward's loss, is one chunk's logits
  in bf16, their fp32 upcast and fp32 log-softmax (10·C·V, C = trainer.loss_chunk.chunk_tokens(V) tokens, or B·T
  if fewer; as eager code holds them: compiled, inductor should hold less, which the calibration would absorb), the
  head weight's gradient summed in fp32 with a chunk's bf16 share of it (4 + 2 B × V·E), and the hidden states'
  gradient, in bf16 (2·B·T·E), both kept for backward (`chunk_loss_bytes`). Same matmul weights otherwise: on one
  rank the head's bf16 copy is the loss's own instead of autocast's.
* Layouts (sweep.spec.layout): dp is the ranks that shard the state, dp_shard x tp (an HSDP replica holds a whole
  copy); with tensor parallel the compute copies, activations and logits are each divided by tp (column/row
  parallel inside the blocks, sequence parallel between them, logits sharded on the vocabulary).

The figure is then corrected by what the clean ok rows a cluster has already measured say of it
(sweep.memory.calibration): compile fusion, the allocator and what a recipe keeps that the count does not move it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sweep.spec.trial import Trial
from trainer.loss_chunk import chunk_tokens
from trainer.models.specs import ModelSpec

GiB = 2**30
ACT_BYTES = 2  # bf16 activations
LOGIT_BYTES = 2 + 4  # bf16 logits and their fp32 upcast
CHUNK_LOGIT_BYTES = 2 + 4 + 4  # loss: chunked, a chunk's: bf16 logits, their fp32 upcast and log-softmax (eager)


@dataclass(frozen=True)
class Shape:
    """What the prediction needs of a trial: the model's dims and the step's layout."""

    arch: str
    n_layers: int
    d_embd: int
    n_heads: int
    vocab_size: int
    n_params: int
    n_kv_heads: int | None
    ffn_hidden: int | None
    max_seq_len: int
    batch_size: int
    seq_len: int
    ranks: int  # the ranks the training state is sharded over: dp_shard x tp (HSDP replicas each hold a copy)
    ac: str = "none"
    grad_accum: int = 1
    tp: int = 1  # tensor (and sequence) parallel: activations, logits and a unit's gathered weights split tp ways
    fp8_saved: bool = False  # torchao FP8: the matmul inputs backward needs are kept as FP8 (1 B), not bf16
    loss: str = "full"  # the trial's `loss`: full (the B·T·V logits) or chunked (trainer/loss.py)

    @staticmethod
    def saves_fp8(precision: str) -> bool:
        # torchao's Float8Linear saves the FP8 casts of its input for backward; TE's modules are eager and,
        # as measured on one H200, keep more than bf16, so they are left to the calibration ratio
        return precision.startswith("fp8-torchao")

    @classmethod
    def of(cls, trial: Trial) -> Shape:
        """From a `sweep.spec.grid.Trial` (its ModelSpec and layout)."""
        return cls.of_spec(
            trial.model,
            precision=trial.precision,
            batch_size=trial.batch_size,
            seq_len=trial.seq_len,
            ranks=trial.dp_shard * trial.tp,
            ac=trial.ac,
            grad_accum=trial.grad_accum,
            tp=trial.tp,
            loss=trial.loss,
        )

    @classmethod
    def of_spec(
        cls,
        m: ModelSpec,
        *,
        precision: str,
        batch_size: int,
        seq_len: int,
        ranks: int,
        ac: str = "none",
        grad_accum: int = 1,
        tp: int = 1,
        loss: str = "full",
    ) -> Shape:
        """From a `trainer.models.specs.ModelSpec` and a layout (a trial's, or a recorded row's)."""
        return cls(
            arch=m.arch,
            n_layers=m.n_layers,
            d_embd=m.d_embd,
            n_heads=m.n_heads,
            vocab_size=m.vocab_size,
            n_params=m.n_params(),
            n_kv_heads=m.n_kv_heads,
            ffn_hidden=m.ffn_hidden,
            max_seq_len=m.max_seq_len,
            batch_size=batch_size,
            seq_len=seq_len,
            ranks=ranks,
            ac=ac,
            grad_accum=grad_accum,
            tp=tp,
            fp8_saved=cls.saves_fp8(precision),
            loss=loss,
        )


@dataclass(frozen=True)
class Breakdown:
    """The predicted peak of one rank, in bytes, and its parts."""

    state: float
    compute_copies: float
    activations: float
    logits: float
    backward_end: float

    @property
    def forward_end(self) -> float:
        return self.state + self.compute_copies + self.activations + self.logits

    @property
    def peak(self) -> float:
        return max(self.forward_end, self.backward_end)

    @property
    def batch_part(self) -> float:
        """What grows with the batch at the end of forward: the activations and the loss's tensors."""
        return self.activations + self.logits


def _kv_width(s: Shape) -> int:
    """J·D: the width of k (and of v)."""
    return s.d_embd if s.arch == "gpt" else (s.n_kv_heads or s.n_heads) * (s.d_embd // s.n_heads)


def layer_bytes_per_token(s: Shape) -> float:
    """What one block saves for backward per token, without checkpointing (see the module's docstring)."""
    E, K = s.d_embd, s.ffn_hidden or 4 * s.d_embd
    attention = 4 * E + E + 2 * _kv_width(s) + E  # norm inputs and outputs, q, k and v, attention output
    mlp = 8 * E if s.arch == "gpt" else 3 * K
    # the inputs of the matmuls: both norms' outputs, the attention output, and the MLP's down-projection input
    matmul_inputs = 3 * E + (4 * E if s.arch == "gpt" else K)
    saved = ACT_BYTES * (attention + mlp)
    return saved - matmul_inputs * (ACT_BYTES - 1) if s.fp8_saved else saved


def activation_bytes(s: Shape, per_token: float | None = None, width: int = ACT_BYTES) -> float:
    """Activations of one micro-batch at their most, by `ac` mode: what forward keeps, or, checkpointing, what
    the blocks before a checkpointed one keep while backward recomputes it whole. `per_token`: what a block saves
    per token (`layer_bytes_per_token`, or a CPU rank's: sweep.memory.cpu), `width`: bytes of its input."""
    tokens = s.batch_size * s.seq_len
    full_layer = (layer_bytes_per_token(s) if per_token is None else per_token) * tokens
    if s.ac == "none":
        return s.n_layers * full_layer
    kept_input = width * s.d_embd * tokens
    checkpointed = [s.ac == "full" or i % 2 == 0 for i in range(s.n_layers)]  # selective: blocks 0, 2, 4, ...
    kept = [kept_input if c else full_layer for c in checkpointed]
    recompute = max(sum(kept[:i]) + full_layer for i, c in enumerate(checkpointed) if c)
    return max(sum(kept), recompute)


def _unit_params(s: Shape) -> tuple[int, int]:
    """Parameters of one block and of the root (embeddings, final norm, head): FSDP2's units."""
    E = s.d_embd
    if s.arch == "gpt":
        block = 12 * E * E + 13 * E
        return block, s.n_params - s.n_layers * block
    D = E // s.n_heads
    block = 2 * E + E * (E + 2 * (s.n_kv_heads or s.n_heads) * D) + E * E + 3 * E * (s.ffn_hidden or 4 * E)
    return block, s.n_params - s.n_layers * block


def _matmul_params(s: Shape) -> int:
    """Weights that multiply activations (every Linear and the head): autocast's cached bf16 copies."""
    E = s.d_embd
    if s.arch == "gpt":
        return s.n_layers * 12 * E * E + s.vocab_size * E
    block, _ = _unit_params(s)
    return s.n_layers * (block - 2 * E) + s.vocab_size * E


def loss_bytes(s: Shape) -> float:
    """The logits and the loss at the end of forward: the full B·T·V logits (LOGIT_BYTES each; 1 / tp of them with
    TP, sharded on the vocabulary), or what the chunked loss holds (`chunk_loss_bytes`; never with tp > 1)."""
    if s.loss == "chunked":
        return chunk_loss_bytes(s)
    return LOGIT_BYTES * s.batch_size * s.seq_len * s.vocab_size / s.tp


def chunk_loss_bytes(s: Shape) -> float:
    """`loss: chunked` at its most (trainer/loss.py, the module's docstring): one chunk's logits (CHUNK_LOGIT_BYTES),
    the head weight's gradient in fp32 plus a chunk's bf16 share of it, the hidden states' gradient in bf16."""
    tokens = s.batch_size * s.seq_len
    chunk = min(tokens, chunk_tokens(s.vocab_size))
    weight_grads = (4 + 2) * s.vocab_size * s.d_embd
    return CHUNK_LOGIT_BYTES * chunk * s.vocab_size + weight_grads + ACT_BYTES * tokens * s.d_embd


def breakdown(s: Shape) -> Breakdown:
    """The uncalibrated peak of one rank for `s`, part by part."""
    fwd_state = (16 if s.grad_accum > 1 else 12) * s.n_params / s.ranks
    if s.ranks > 1:
        copies = 2 * 2 * max(_unit_params(s)) / s.tp  # bf16, the unit computing and the one prefetched
    else:
        copies = 2 * _matmul_params(s)
    # with TP the logits stay sharded on the vocabulary, and sequence parallel splits what lives between the
    # matmuls (norms, residuals) as column/row parallel splits what lives inside them: each about 1 / tp
    return Breakdown(
        state=fwd_state,
        compute_copies=copies,
        activations=activation_bytes(s) / s.tp,
        logits=loss_bytes(s),
        backward_end=16 * s.n_params / s.ranks + copies,
    )


def predicted_bytes(s: Shape) -> float:
    return breakdown(s).peak


def largest(fits: Callable[[int], bool], limit: int = 1 << 20) -> int:
    """The largest batch in 1..limit that `fits` (0: not even one), for a peak that grows with the batch:
    double, then bisect."""
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of the line y = intercept + slope·x by ordinary least squares (about the means, the closed
    form of the 2 x 2 normal equations); slope 0, the mean of ys, where the xs do not spread."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    return my - slope * mx, slope
