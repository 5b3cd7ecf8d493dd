"""The k largest entries of each row of a vocabulary-wide array, without a partition of the row.

At Qwen's 151,936 tokens a partition (or the sort a top-p filter does) of every row of a block
costs more than a small model's forward on the CPU; the DFlash2 selector's candidates and the
top-k sampling filter need only the few best entries of each row.
"""

from __future__ import annotations

import mlx.core as mx

CHUNK = 128  # top_k_indices: the most entries per chunk of a row


def top_k_indices(x: mx.array, k: int) -> mx.array:
    """Indices of the k largest entries along the last axis of x, unordered: the set an argpartition
    finds (ties aside), without partitioning a whole 150k-token row. Each chunk of a row gives its
    largest; the k chunks with the largest hold the row's top k (any entry outside them is at most
    its own chunk's largest, below theirs), and one small partition over those chunks picks them.
    Chunks are the largest of CHUNK, CHUNK/2, CHUNK/4 that divides the row (real vocabularies are
    multiples of 64 or 128; a row none divides is partitioned whole), so no chunk is padded and no
    index is picked twice. (What it saves at a real vocabulary: docs/performance.md.)"""
    *lead, V = x.shape
    size = next((c for c in (CHUNK, CHUNK // 2, CHUNK // 4) if V % c == 0), None)
    if size is None or V // size <= 4 * k:  # a small or odd vocabulary: one partition of the row
        return mx.argpartition(-x, kth=k - 1, axis=-1)[..., :k]
    chunks = V // size
    best = x.reshape(*lead, chunks, size).max(axis=-1)
    top_chunks = mx.argpartition(-best, kth=k - 1, axis=-1)[..., :k]
    idx = (top_chunks[..., None] * size + mx.arange(size, dtype=mx.uint32)).reshape(*lead, k * size)
    local = mx.argpartition(-mx.take_along_axis(x, idx, axis=-1), kth=k - 1, axis=-1)[..., :k]
    return mx.take_along_axis(idx, local, axis=-1)


def over_vocabulary(shape: tuple[int, ...], idx: mx.array, log_p: mx.array) -> mx.array:
    """Log-probabilities over the whole vocabulary (float32, `shape`) from those of the few ids `idx`
    along the last axis: -inf elsewhere. Acceptance reads such rows at the drafts and draws from one."""
    return mx.put_along_axis(mx.full(shape, -mx.inf, mx.float32), idx, log_p, axis=-1)
