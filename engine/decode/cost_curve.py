"""The cost curve: what one verify of L tokens and one AR step cost the loaded target, here.

A DFlash round costs a draft plus a verify whose cost grows with the number of positions it
checks (on a CPU a 16-token verify is ~1.5-2 AR steps; on a GPU it is nearly flat). Which
block size pays off follows from this curve and the acceptance a run sees. Measured per
L = 1..block: `repeats` verifies of L tokens from a short fresh context, with taps and (for
hybrid targets) tape recording as in a round, and as many single-token AR steps and drafts;
the median of each. Cached per target files, block, device and BLAS in the user cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import mlx.core as mx

from engine import json_text
from engine.decode.cancel import CancelToken
from engine.decode.proposal import propose
from engine.decode.sampling import Sampler
from engine.decode.settings import SamplingSettings
from engine.decode.prefill import prefill
from engine.decode.rollback import make_rollback
from engine.errors import DFlashError
from engine.models.pair import LoadedPair
from engine.models.target import make_target_cache
from engine.runtime import blas
from engine.runtime.distributed import from_root
from engine.runtime.streams import STREAM
from engine.safe_write import write_atomic

CONTEXT_TOKENS = 32  # the short context every verify starts from
SCHEMA = 2  # 2: draft time per block length


@dataclass
class CostCurve:
    target: str
    device: str
    blas: str
    block: int
    repeats: int
    ar_step_ms: float  # one single-token forward, the unit of "AR steps"
    verify_ms: list[float]  # verify_ms[L - 1]: one verify of L tokens (L = 1 is the anchor alone)
    draft_ms: Optional[float]  # one drafter pass over a whole block (None without a drafter)
    measured_at: float  # time.time() of the measurement
    schema: int = SCHEMA
    # draft_by_length_ms[L - 1]: drafting a block of L (a fixed block size L drafts only L); [0] is 0
    draft_by_length_ms: Optional[list[float]] = None

    def verify_in_ar_steps(self) -> list[float]:
        return [round(v / self.ar_step_ms, 3) for v in self.verify_ms]

    def round_ms(self, length: int, whole_block: bool = True) -> float:
        """A round that verifies `length` positions: its draft (none for length 1) and its verify.
        whole_block: the drafter drafted its whole block (auto); else only `length` (a fixed size)."""
        if length <= 1:
            return self.verify_ms[0]
        if whole_block or not self.draft_by_length_ms:
            return self.verify_ms[length - 1] + (self.draft_ms or 0.0)
        return self.verify_ms[length - 1] + self.draft_by_length_ms[length - 1]


def fitted(curve: CostCurve) -> CostCurve:
    """The curve with its verify and draft times made non-decreasing in length: timing noise on a
    loaded CPU can make a longer verify look cheaper than a shorter one (measured: a verify of 3 at
    16.0 ms, of 1 at 18.4 ms), which tilts auto towards drafting. Work grows with length, so the
    curve is the nearest non-decreasing one."""
    by_length = curve.draft_by_length_ms
    if by_length:
        by_length = [by_length[0]] + non_decreasing(by_length[1:])
    return replace(curve, verify_ms=non_decreasing(curve.verify_ms), draft_by_length_ms=by_length,
                   draft_ms=by_length[-1] if by_length else curve.draft_ms)


def non_decreasing(values: list[float]) -> list[float]:
    """The least-squares non-decreasing fit (pool adjacent violators): runs that fall are averaged."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks[-2], blocks.pop()
            blocks[-1] = [(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2]
    return [round(m, 4) for m, n in blocks for _ in range(int(n))]


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000.0, 4)


def _verify_once(pair: LoadedPair, ids: mx.array, length: int, ar: bool = False) -> float:
    cache = make_target_cache(pair.target)
    prefill(pair, cache, ids.tolist(), record_taps=False)
    block = ids[:length][None]
    rollback = make_rollback(pair.target, cache) if not ar and pair.taps is not None else None
    t0 = time.perf_counter()
    if rollback is None:
        out = pair.target(block, cache=cache)
        mx.eval(out)
    else:
        with pair.taps.capture(length > 1), rollback.recording():
            out = pair.target(block, cache=cache)
        mx.eval(out, pair.taps.concatenated() if length > 1 else out)
    return time.perf_counter() - t0


def _draft_once(pair: LoadedPair, ids: mx.array, block: int) -> float:
    cache = make_target_cache(pair.target)
    _, context = prefill(pair, cache, ids.tolist(), record_taps=True)
    drafter, head = pair.drafter, pair.head
    dcache = drafter.make_cache()
    blocks = mx.array([int(ids[-1])] + [drafter.cfg.mask_token_id] * (block - 1))[None]
    # The first pass caches the prompt's context; a round's draft sees a few new positions only.
    embedded = drafter.embed(head, blocks)
    mx.eval(drafter(embedded, context[:, :-block], dcache, ids.shape[0] - block), [c.state for c in dcache])
    t0 = time.perf_counter()
    hidden = drafter(embedded, context[:, -block:], dcache, ids.shape[0])
    mx.eval(propose(drafter, head, hidden[0, 1:], int(ids[-1]), Sampler(SamplingSettings())).drafts)  # DFlash2: its selector too
    return time.perf_counter() - t0


def _check(block: int, repeats: int) -> None:
    if repeats < 1 or not 1 <= block <= 64:
        raise DFlashError(f"repeats {repeats} must be at least 1 and the block 1..64.")


def measure(pair: LoadedPair, *, block: Optional[int] = None, repeats: int = 3,
            progress: Callable[[str], None] = lambda msg: None,
            cancel: Optional[CancelToken] = None) -> CostCurve:
    """Time verifies of 1..block tokens, AR steps and drafts on this machine (seconds, not minutes)."""
    block = block or (pair.drafter.cfg.block_size if pair.drafter is not None else 16)
    _check(block, repeats)
    cancel = cancel or CancelToken()
    with mx.stream(STREAM):
        vocab = pair.head.vocab_size
        ids = mx.array([(97 + 31 * i) % vocab for i in range(CONTEXT_TOKENS + block)])
        _verify_once(pair, ids, block)  # warm-up: kernels compiled, caches allocated
        verify: list[list[float]] = [[] for _ in range(block)]
        ar: list[float] = []
        draft: list[list[float]] = [[] for _ in range(block)]
        for r in range(repeats):
            for length in range(1, block + 1):
                if cancel.cancelled:
                    raise DFlashError("calibration was cancelled.")
                verify[length - 1].append(_verify_once(pair, ids, length))
            ar.append(_verify_once(pair, ids, 1, ar=True))
            if pair.drafter is not None:
                for length in range(2, block + 1):
                    draft[length - 1].append(_draft_once(pair, ids, length))
            progress(f"repeat {r + 1}/{repeats}")
        device = str(mx.default_device())
    return fitted(CostCurve(
        target=str(pair.target_path), device=device, blas=blas.status.split(" (")[0], block=block,
        repeats=repeats, ar_step_ms=_median_ms(ar), verify_ms=[_median_ms(v) for v in verify],
        draft_ms=_median_ms(draft[-1]) if draft[-1] else None, measured_at=time.time(),
        draft_by_length_ms=[0.0] + [_median_ms(d) for d in draft[1:]] if draft[-1] else None,
    ))


def _sound(curve: CostCurve, block: int) -> bool:
    """A cached curve the controller can use: positive times for every verify length."""
    def positive(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0

    by_length = curve.draft_by_length_ms
    return (isinstance(curve.verify_ms, list) and len(curve.verify_ms) == block and curve.block == block
            and all(positive(v) for v in curve.verify_ms) and positive(curve.ar_step_ms)
            and (curve.draft_ms is None or positive(curve.draft_ms))
            and (by_length is None or (isinstance(by_length, list) and len(by_length) == block
                                       and all(positive(v) for v in by_length[1:]))))


def cache_dir() -> Path:
    override = os.environ.get("DFLASH_CACHE_DIR")
    if override:
        return Path(override)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("dflash-playground"))


def cache_key(pair: LoadedPair, block: int, repeats: int) -> str:
    """Changes with the target's and the drafter's files, the block, repeats, device, BLAS and MLX."""
    parts = [str(pair.target_path.resolve()), str(block), str(repeats), mx.__version__, blas.status,
             str(pair.drafter_path.resolve()) if pair.drafter_path else "-"]
    with mx.stream(STREAM):
        parts.append(str(mx.default_device()))
    folders = [pair.target_path] + ([pair.drafter_path] if pair.drafter_path else [])
    for f in [f for d in folders for f in sorted(d.glob("*.json")) + sorted(d.glob("*.safetensors"))]:
        st = f.stat()
        parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def cost_curve(pair: LoadedPair, *, block: Optional[int] = None, repeats: int = 3, fresh: bool = False,
               progress: Callable[[str], None] = lambda msg: None,
               cancel: Optional[CancelToken] = None) -> tuple[CostCurve, bool]:
    """(curve, from_cache): the cached curve for this target and machine, else a new measurement."""
    block = block or (pair.drafter.cfg.block_size if pair.drafter is not None else 16)
    _check(block, repeats)  # before the cache: a bad setting is refused whether or not a curve is cached
    if pair.ranks.sharded:
        # Each host keeps its own cache, and a rank that measured while another read its
        # cache would run collectives alone: every rank measures, and all use rank 0's numbers.
        return _agreed(measure(pair, block=block, repeats=repeats, progress=progress, cancel=cancel), pair), False
    path = cache_dir() / "cost-curves" / f"{cache_key(pair, block, repeats)}.json"
    if not fresh and path.is_file():
        try:
            data = json_text.loads(path.read_bytes())
            if isinstance(data, dict) and data.get("schema") == SCHEMA:
                curve = CostCurve(**{k: data[k] for k in CostCurve.__dataclass_fields__})
                if _sound(curve, block):
                    return fitted(curve), True  # entries cached before the fit get it here
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged cache entry is measured again
    curve = measure(pair, block=block, repeats=repeats, progress=progress, cancel=cancel)
    try:
        write_atomic(path, json.dumps(asdict(curve), indent=2), "the cost curve cache")
    except DFlashError:
        pass  # an unwritable cache costs a re-measurement next time, nothing more
    return curve, False


def _agreed(curve: CostCurve, pair: LoadedPair) -> CostCurve:
    """The curve with rank 0's timings on every rank, so every rank's controller picks the same lengths."""
    block = len(curve.verify_ms)
    by_length = curve.draft_by_length_ms or [0.0] * block
    numbers = mx.array([curve.ar_step_ms, curve.draft_ms or 0.0, *curve.verify_ms, *by_length], dtype=mx.float32)
    ar, draft, *rest = from_root(numbers, pair.ranks).tolist()
    return replace(curve, ar_step_ms=ar, draft_ms=draft if curve.draft_ms is not None else None,
                   verify_ms=rest[:block],
                   draft_by_length_ms=rest[block:] if curve.draft_by_length_ms is not None else None)
