"""The verdict of one max-batch search (sweep.search.max_batch.MaxBatchSearch): the largest batch that fits, the
fastest, what the search probed; completed from the search's rows with what they measured. Pure."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal


@dataclass(frozen=True, kw_only=True, slots=True)
class MaxBatchMeasures:
    """What a max-batch search's rows say beyond its probes' outcomes (`sweep.service.complete_verdict`)."""

    alloc_retries_at_max: int | None
    """The caching allocator's retries at the largest fitting batch (None: not reported, e.g. on CPU)."""
    alloc_retries_at_fastest: int | None
    """The same at the fastest batch."""
    allocator: str
    """`batch B fits, but the allocator thrashes (N retries)` for either batch, or '' when neither retried."""
    tflops_at_fastest: float | None
    """TFLOP/s per GPU at the fastest batch."""
    search_wall_s: float
    """Driver wall seconds of every probe of the search."""
    cost_vs_one_trial: float | None
    """`search_wall_s` over measuring the answer once on fresh rank processes (None: no answer to measure)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MaxBatchVerdict:
    """One max-batch search's verdict (the `Verdict` protocol of sweep.search.plan), one per config."""

    kind: Literal["max_batch"] = "max_batch"
    """The kind of search (the saved object's first key)."""
    search_id: str | None
    """The id every probe row of the search carries (sweep.search.max_batch.max_batch_search_id)."""
    model: str
    """The model's label."""
    precision: str
    """The precision recipe."""
    compile: str
    """The compile mode."""
    ac: str
    """The activation checkpointing mode."""
    seq_len: int
    """Tokens per sequence."""
    gpus: int
    """Ranks per trial."""
    options: str
    """The training options away from their defaults, as `Trial.options_text` writes them ('' for none)."""
    max_batch: int | None
    """The largest batch that fitted (None: not even the smallest probed)."""
    first_failing_batch: int | None
    """The smallest batch that ran out of memory (None: none did)."""
    fastest_batch: int | None
    """The fitting batch of most tokens per second per GPU."""
    probes: int
    """How many probes the search ran."""
    probe_batches: tuple[int, ...]
    """The batches probed, in order."""
    aborted: str | None
    """The status that stopped the search short of a limit (error, timeout, unsupported), else None."""
    measured: MaxBatchMeasures | None = None
    """What the rows measured, once completed from them (saved after the keys above, in its own order)."""

    def to_json(self) -> dict[str, Any]:
        """The saved object (`_search/<run_id>.json`): the keys and their order of every earlier release."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "measured"}
        out["probe_batches"] = list(self.probe_batches)
        return out | (asdict(self.measured) if self.measured is not None else {})
