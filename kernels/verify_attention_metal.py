"""Multi-row verify attention as a Metal kernel (mx.fast.metal_kernel), for Macs.

MLX's GPU attention has a fused kernel for a few query rows (its vector kernel runs while
rows x GQA stays small) and falls back to an unfused graph past that, which reads the whole
KV cache once per query head: at depth a 16-token verify of a GQA model pays for it (see
../shared/LONG_CONTEXT_NOTES.md section 2). Here one threadgroup takes up to ROWS query rows
that share a KV head (a GQA group's heads times the block's positions) and walks the KV
cache in tiles of 32 keys held in threadgroup memory, so each tile is read once for all of
its rows; in a tile each lane scores one key against its row, the row's softmax runs online
(running max and sum, float32), and each lane accumulates D / 32 of the output.

Inputs half or bfloat16 (what a Mac runs), head dim a multiple of 32 up to 128; a causal mask, no
mask, or a boolean (rows, keys) mask: a draft tree's ancestor-only mask (engine/decode/tree) or a
sliding window's, read per key as the tile is scored (MASKED). Nothing here has run on a Mac in this
project's CI (Linux, CPU): the dispatcher
(`choose`) tries the kernel once per shape against the pure-MLX reference
(kernels/verify_attention.py) and MLX's own attention, and uses it only when it agrees with the
reference and is faster; otherwise, or when it fails to build, MLX's attention runs.
"""

from __future__ import annotations

import logging
import time
from functools import cache
from typing import Callable, Optional

import mlx.core as mx

from kernels.verify_attention import Mask, reference

ROWS = 4  # query rows (one SIMD group each) per threadgroup
TILE = 32  # keys per tile: one per lane
CHECK_TOLERANCE = 2e-2  # half-precision outputs against the float32 reference
MIN_GAIN = 0.95  # the kernel must take at most this share of MLX's time

log = logging.getLogger(__name__)

_SOURCE = """
    uint S = meta[0];  // keys: a runtime value, so each depth does not compile a kernel of its own
    uint lane = thread_index_in_simdgroup;
    uint sg = simdgroup_index_in_threadgroup;
    uint tid = thread_index_in_threadgroup;
    uint bh = threadgroup_position_in_grid.x;        // batch * Hkv + kv head
    uint row = threadgroup_position_in_grid.y * ROWS + sg;  // g * L + l
    bool active = row < G * L;
    uint g = row / L;
    uint l = row % L;
    uint b = bh / Hkv;
    uint hkv = bh % Hkv;
    uint hq = hkv * G + g;
    constexpr uint PER_LANE = D / 32;

    threadgroup float qs[ROWS * D];
    threadgroup T ks[TILE * D];
    threadgroup T vs[TILE * D];

    uint q_off = ((b * (Hkv * G) + hq) * L + l) * D;
    uint kv_off = (b * Hkv + hkv) * S * D;
    for (uint d = lane; d < D; d += 32) {
        qs[sg * D + d] = active ? static_cast<float>(q[q_off + d]) * scale[0] : 0.0f;
    }
    uint limit = CAUSAL ? (S - L + l) : (S - 1);  // the last key this row sees (MASKED: allow's row says)

    float m = -INFINITY;
    float total = 0.0f;
    float acc[PER_LANE];
    for (uint i = 0; i < PER_LANE; ++i) {
        acc[i] = 0.0f;
    }
    for (uint base = 0; base < S; base += TILE) {
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint idx = tid; idx < TILE * D; idx += 32 * ROWS) {
            uint key = base + idx / D;
            ks[idx] = key < S ? k[kv_off + key * D + idx % D] : static_cast<T>(0);
            vs[idx] = key < S ? v[kv_off + key * D + idx % D] : static_cast<T>(0);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (!active) {
            continue;
        }
        uint key = base + lane;
        float s = -INFINITY;
        bool seen = MASKED ? (key < S && allow[l * S + key] != 0) : (key < S && key <= limit);
        if (seen) {
            s = 0.0f;
            for (uint d = 0; d < D; ++d) {
                s = metal::fma(qs[sg * D + d], static_cast<float>(ks[lane * D + d]), s);
            }
        }
        float tile_max = simd_max(s);
        if (tile_max == -INFINITY) {
            continue;  // every key of this tile is past the row's own position
        }
        float new_m = metal::max(m, tile_max);
        float p = (s == -INFINITY) ? 0.0f : metal::exp(s - new_m);
        float correction = (m == -INFINITY) ? 0.0f : metal::exp(m - new_m);
        total = total * correction + simd_sum(p);
        for (uint i = 0; i < PER_LANE; ++i) {
            acc[i] *= correction;
        }
        for (uint j = 0; j < TILE; ++j) {
            float pj = simd_shuffle(p, j);
            for (uint i = 0; i < PER_LANE; ++i) {
                acc[i] = metal::fma(pj, static_cast<float>(vs[j * D + lane + 32 * i]), acc[i]);
            }
        }
        m = new_m;
    }
    if (active) {
        for (uint i = 0; i < PER_LANE; ++i) {
            out[q_off + lane + 32 * i] = static_cast<T>(acc[i] / total);
        }
    }
"""


@cache
def _kernel():
    return mx.fast.metal_kernel(name="dflash_verify_attention", input_names=["q", "k", "v", "scale", "meta", "allow"],
                                output_names=["out"], source=_SOURCE)


def fits(q: mx.array, k: mx.array, mask: Mask, sinks: Optional[mx.array]) -> bool:
    """Calls the kernel can take: half or bfloat16, head dim 32..128 in steps of 32, GQA, several
    query rows, a causal mask, none, or a boolean one of (rows, keys), no sinks, on a Metal GPU."""
    if sinks is not None or q.ndim != 4 or q.dtype not in (mx.float16, mx.bfloat16) or k.dtype != q.dtype:
        return False
    D = q.shape[-1]
    if D % 32 or not 32 <= D <= 128 or q.shape[1] % k.shape[1] or q.shape[2] < 2:
        return False
    if isinstance(mask, (str, type(None))):
        return mask is None or mask == "causal"
    return mask.dtype == mx.bool_ and mask.shape == (q.shape[2], k.shape[2])


def metal_attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Mask) -> mx.array:
    B, Hq, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    groups = Hq // Hkv
    rows = groups * L
    return _kernel()(
        inputs=[mx.contiguous(q), mx.contiguous(k), mx.contiguous(v), mx.array([scale], dtype=mx.float32),
                mx.array([S], dtype=mx.uint32), _allow(mask)],
        template=[("T", q.dtype), ("D", D), ("G", groups), ("L", L), ("Hkv", Hkv),
                  ("ROWS", ROWS), ("TILE", TILE), ("CAUSAL", int(_kind(mask) == "causal")),
                  ("MASKED", int(_kind(mask) == "mask"))],
        grid=(B * Hkv * 32 * ROWS, -(-rows // ROWS), 1),
        threadgroup=(32 * ROWS, 1, 1),
        output_shapes=[q.shape],
        output_dtypes=[q.dtype],
    )[0]


def _kind(mask: Mask) -> Optional[str]:
    """None, "causal", or "mask" (a boolean array): what the kernel is built for."""
    return mask if isinstance(mask, (str, type(None))) else "mask"


def _allow(mask: Mask) -> mx.array:
    """A boolean mask as the kernel reads it (uint8, row-major (rows, keys)); one unread byte otherwise."""
    if _kind(mask) != "mask":
        return mx.zeros((1,), dtype=mx.uint8)
    return mx.contiguous(mask.astype(mx.uint8))


def shape_key(q: mx.array, k: mx.array, mask: Mask) -> tuple:
    """What decides whether the kernel pays: dtype, dims, rows, the context in powers of two, and the
    kind of mask (every tree of a shape shares one verdict: the kernel reads any mask the same way)."""
    return (str(q.dtype), q.shape[1], k.shape[1], q.shape[2], q.shape[3], k.shape[2].bit_length(), _kind(mask))


def _timed(f: Callable[[], mx.array], runs: int = 5) -> float:
    mx.eval(f())
    t0 = time.perf_counter()
    for _ in range(runs):
        mx.eval(f())
    return (time.perf_counter() - t0) / runs


def check_shape(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Mask,
                kernel: Callable = metal_attention, stock: Callable = mx.fast.scaled_dot_product_attention) -> Optional[str]:
    """None when `kernel` agrees with the reference on random inputs of this call's shape and beats
    MLX's attention on them; else why it is not used."""
    try:
        shape = [mx.random.normal(a.shape).astype(a.dtype) for a in (q, k, v)]
        got = kernel(*shape, scale, mask)
        want = reference(*shape, scale, mask)
        error = mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item()
        if not error <= CHECK_TOLERANCE:
            return f"differs from the reference by {error:.3g}"
        mine = _timed(lambda: kernel(*shape, scale, mask))
        theirs = _timed(lambda: stock(*shape, scale=scale, mask=mask))
        if mine > MIN_GAIN * theirs:
            return f"not faster than MLX's attention ({1000 * mine:.2f} ms against {1000 * theirs:.2f} ms)"
        return None
    except Exception as exc:  # a kernel that does not build or launch
        return f"{type(exc).__name__}: {exc}"


class ShapeChecks:
    """One check per shape and process; what was decided, for doctor and traces."""

    def __init__(self, check: Callable = check_shape):
        self.check = check
        self.verdicts: dict[tuple, Optional[str]] = {}

    def use_kernel(self, q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Mask) -> bool:
        key = shape_key(q, k, mask)
        if key not in self.verdicts:
            self.verdicts[key] = self.check(q, k, v, scale, mask)
            if self.verdicts[key] is not None:
                log.info("verify attention kernel not used for %s: %s", key, self.verdicts[key])
        return self.verdicts[key] is None


def sdpa_with_metal(stock: Callable, checks: Optional[ShapeChecks] = None) -> Callable:
    """mlx-lm's scaled_dot_product_attention signature: the Metal kernel for verify blocks whose shape
    passed its check, `stock` (mlx-lm's) for everything else."""
    checks = checks or ShapeChecks()

    def sdpa_dispatch(queries, keys, values, cache, scale, mask, sinks=None):
        if (not hasattr(cache, "bits") and cache is not None and fits(queries, keys, mask, sinks)
                and queries.shape[2] <= 64 and checks.use_kernel(queries, keys, values, scale, mask)):
            return metal_attention(queries, keys, values, scale, mask)
        return stock(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)

    sdpa_dispatch.stock = stock
    sdpa_dispatch.checks = checks
    return sdpa_dispatch
