"""How many tokens one chunk of `loss: chunked` (trainer.loss) takes. Pure (no torch): the memory model
(sweep.memory.model) counts what a chunk holds from it too.

Logits per chunk: 2^28 (1 GiB in fp32). Eagerly a chunk holds its logits in the matmul dtype, their fp32 upcast and
their fp32 log-softmax together (10 B each in bf16: 2.5 GiB; compiled, inductor should fuse the upcast away) where the
full path holds 6 B for each of B·T·V (50 GB at batch 16, T 4096, V 128,256). At V 128,256 a chunk is 2,092 tokens,
whose (2,092 x 4,096) @ (4,096 x 128,256) matmul is still thousands of 128 x 256 output tiles for an H200's 132 SMs:
smaller chunks would save little memory and add launches; larger ones would add memory for no better matmul.
"""

from __future__ import annotations

CHUNK_LOGITS = 2**28


def chunk_tokens(vocab_size: int) -> int:
    """Tokens per chunk: CHUNK_LOGITS logits (at least one token)."""
    return max(1, CHUNK_LOGITS // vocab_size)
