"""The temporary block's size stops at the end of its topmost buffer, not at its padding.

XLA's heap simulator places each temporary at an offset aligned to the block's alignment (64
bytes on XLA:CPU) and sizes the block as the largest `offset + size` over its buffers
(`HeapSimulator`: the result's `heap_size`, what `memory_analysis()` reports as
`temp_size_in_bytes`). The buffer at the top of the block at its peak therefore counts its own
bytes, not its size rounded up to the alignment: the model's block, a sum of aligned sizes, was
one padding too big. XLA keeps the smallest of the layouts its heap algorithms find, so the
top is the live buffer whose rounding wastes most: a loop's counter (4 bytes), a scalar.

Measured on fuzz seed 17 #1112 (`lax.scan` accumulating a [1, 8] gradient, 2x2x2): the block
holds the loop's tuple table (24 bytes at offset 0), the counter's copy (4 at 64) and the
accumulator (4 at 128): 132 bytes, where the aligned sum is 192 (the prediction 1.41x XLA's
148 bytes; exactly 60 bytes over on a dozen such small accumulation loops).
"""

from __future__ import annotations

import numpy as np

#: The smallest buffer a row of small fixed-size temporaries holds (`cpu_buffers`: a loop's
#: counter, a threefry state word): a 32-bit scalar.
SMALL_BUFFER_BYTES = 4


def padding(nbytes, align_bytes: int) -> np.ndarray:
    """Bytes by which rounding each size up to `align_bytes` grows it (0 for no alignment)."""
    nbytes = np.asarray(nbytes, dtype=np.float64)
    if not align_bytes:
        return np.zeros_like(nbytes)
    return np.ceil(nbytes / align_bytes) * align_bytes - nbytes


def unpadded_block(block, pad, start, end) -> np.ndarray:
    """The block's live bytes after each op (`block`, the sum of the aligned sizes of the
    buffers [start, end)) less the largest padding `pad` of a buffer live there: that buffer
    goes on top (module essay). A buffer's padding is below the alignment, so there are few
    distinct values: one pass over the ops per value."""
    block = np.asarray(block, dtype=np.float64)
    n = len(block)
    top = np.zeros(n)
    pad = np.asarray(pad, dtype=np.float64)
    start, end = np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64)
    for p in np.unique(pad[pad > 0])[::-1]:
        k = pad >= p
        delta = np.zeros(n + 1)
        np.add.at(delta, start[k], 1.0)
        np.add.at(delta, end[k], -1.0)
        live = np.cumsum(delta)[:n] > 0
        top = np.where(live & (top == 0), p, top)
    return block - top
