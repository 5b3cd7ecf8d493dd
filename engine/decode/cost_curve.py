"""The cost curve: what one verify of L tokens and one AR step cost the loaded target, here,
at a context depth.

A DFlash round costs a draft plus a verify whose cost grows with the number of positions it
checks (on a CPU a 16-token verify is ~1.5-2 AR steps; on a GPU it is nearly flat), and both
grow with the context they attend to: a verify's attention over the KV cache is L rows where
an AR step's is one. Which block size pays off follows from this curve at the run's depth and
the acceptance a run sees. Measured at a few depths (DEPTHS, up to the target's context): a
prompt of that many tokens is prefilled once, then per L = 1..block `repeats` verifies of L
tokens, with taps and (for hybrid targets) tape recording as in a round, each followed by
putting the caches back (engine/models/cache_state.py) and by a single-token AR step (every
figure is used as a ratio to the AR step's median, so one busy moment must not move it); as many
drafts (the drafter's context kept as the run's draft window and sink keep it); the median
of each. Past the `repeats` sweeps asked for, a depth takes more (up to EXTRA_SWEEPS times as
many) while they fit in SWEEP_BUDGET_S, since auto's choices hang on these figures (what the
extra sweeps steady: docs/performance.md, "Measuring the cost curve"). A model whose sweep takes
seconds gets its `repeats`. The curve itself, its interpolation between
depths and its fit are engine/decode/cost_curve_data.py's. Cached per target and drafter files, block,
window, device and BLAS in the user cache, and per kind of sampling (`sampling_kind`): an AR step
includes drawing its token, a verify the acceptance of its drafts and a draft drawing them, as in
a run with those settings: at T > 0 over a large vocabulary on the CPU these draws cost as much as
the forwards (a v1 drafter's block is 15 full-vocabulary draws).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable, Iterator, Optional

import mlx.core as mx

from engine import json_text
from engine.decode.cancel import CancelToken
from engine.decode.cost_curve_data import CONTEXT_TOKENS, SCHEMA, CostCurve, DepthPoint, fitted, shorter, with_points
from engine.decode.acceptance import accept
from engine.decode.drafts import propose
from engine.decode.sampling import Sampler, log_probs
from engine.decode.settings import SamplingSettings
from engine.decode.prefill import context_length, prefill
from engine.decode.rollback import make_rollback
from engine.errors import DFlashError
from engine.models.kernel_dispatch import kernels_key
from engine.models.cache_state import mark, restore
from engine.models.pair import LoadedPair
from engine.models.target import make_target_cache
from engine.runtime import blas
from engine.runtime.distributed import from_root, rank_0_decides
from engine.runtime.streams import STREAM
from engine.safe_write import write_atomic
from engine.json_text import is_number


class CalibrationCancelled(DFlashError):
    """Stop was pressed while the cost curve was being measured."""


DEPTHS = (CONTEXT_TOKENS, 512, 1536, 4096)  # depths measured, where the target's context allows
SWEEP_BUDGET_S = 6.0  # a depth's sweeps go on past `repeats` while the next one fits in this (seconds)...
EXTRA_SWEEPS = 3  # ...up to this many times `repeats`


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000.0, 4)


def _ids(pair: LoadedPair, n: int) -> list[int]:
    vocab = pair.head.vocab_size
    return [(97 + 31 * i) % vocab for i in range(n)]


def sampling_kind(s: Optional[SamplingSettings]) -> str:
    """What a curve's timings depend on in the sampling settings: greedy, or draws over the whole
    vocabulary (top-p sorting it), or among the top k (top-p adding a pass over the vocabulary)."""
    if s is None or s.greedy:
        return "greedy"
    if s.top_k > 0:
        return "top-k+top-p" if s.top_p < 1.0 else "top-k"
    return "top-p" if s.top_p < 1.0 else "sampled"


def _timed_verify(pair: LoadedPair, cache: list, block: mx.array, rollback, ar: bool, sampler: Sampler,
                  logq: Optional[mx.array]) -> float:
    """One forward of `block` on top of `cache` and its token drawn (an AR step), or its drafts
    accepted (a round's verify, against the drafter's log-probs `logq` at T > 0), then the caches back."""
    where = mark(cache)
    length = block.shape[1]
    t0 = time.perf_counter()
    taps = []
    if ar or rollback is None:  # an AR step, or no drafter (lookup): no taps, nothing for a rollback
        out = pair.target(block, cache=cache)[0]
    else:
        with pair.taps.capture(length > 1), rollback.recording():
            out = pair.target(block, cache=cache)[0]
        taps = [pair.taps.concatenated()] if length > 1 else []
    drawn = sampler.sample(out[-1]) if ar else accept(sampler, out, block[0, 1:],
                                                      logq[: length - 1] if logq is not None else None)
    mx.eval(drawn, *taps)
    elapsed = time.perf_counter() - t0
    restore(cache, where)
    return elapsed


def _timed_draft(pair: LoadedPair, context: mx.array, depth: int, length: int, window: int, sink: int,
                 sampler: Sampler) -> float:
    """A draft of `length` at `depth`: the drafter's context cache filled as a run's would be (the
    run's window and sink), then timed over a pass that adds a round's new rows."""
    drafter, head = pair.drafter, pair.head
    ids = _ids(pair, depth + 1)
    dcache = drafter.make_cache(window or None, sink)
    fresh = min(length, depth)  # a round adds accepted + 1 rows; a block's worth is the most
    blocks = mx.array([ids[depth]] + [drafter.cfg.mask_token_id] * (length - 1))[None]
    embedded = drafter.embed(head, blocks)
    mx.eval(drafter(embedded, context[:, : depth - fresh], dcache, depth - fresh), [c.state for c in dcache])
    t0 = time.perf_counter()
    hidden = drafter(embedded, context[:, depth - fresh : depth], dcache, depth)
    # drawn as the run draws them; DFlash2: its selector too
    proposal = propose(drafter, head, hidden[0, 1:], ids[depth], sampler)
    mx.eval(proposal.drafts, proposal.logq)
    return time.perf_counter() - t0


def more_sweeps(done: int, repeats: int, elapsed_s: float, budget_s: float) -> bool:
    """Whether a depth takes another sweep: always up to `repeats`, then while the next (taking as
    long as the mean so far) fits in `budget_s`, up to EXTRA_SWEEPS x repeats."""
    if done < repeats:
        return True
    return done < EXTRA_SWEEPS * repeats and elapsed_s * (done + 1) / done <= budget_s


def _measure_depth(pair: LoadedPair, depth: int, block: int, repeats: int, window: int, sink: int,
                   cancel: CancelToken, budget_s: float, sampling: SamplingSettings) -> Iterator[None]:
    """Yields after each sweep; returns the depth's DepthPoint."""
    sampler = Sampler(sampling)
    logq = None  # at T > 0 the drafter's log-probs of a block (any: acceptance costs the same)
    if not sampling.greedy:
        logq = log_probs(mx.random.normal((block, pair.head.vocab_size), key=mx.random.key(depth)), sampling)
        mx.eval(logq)
    cache = make_target_cache(pair.target)
    ids = _ids(pair, depth + block)
    _, context = prefill(pair, cache, ids[:depth], record_taps=pair.taps is not None)
    rollback = make_rollback(pair.target, cache) if pair.taps is not None else None
    verify_ids = mx.array(ids[depth:])[None]
    _timed_verify(pair, cache, verify_ids, rollback, False, sampler, logq)  # warm-up: kernels compiled, buffers grown
    verify: list[list[float]] = [[] for _ in range(block)]
    ar: list[float] = []
    draft: list[list[float]] = [[] for _ in range(block)]
    sweeps, start = 0, time.perf_counter()
    # rank 0's clock decides for every rank of a sharded target: on their own, one rank once took a
    # sweep more than the other and ran its verifies' collectives alone (a hang in 2 of 15 runs here)
    while rank_0_decides(more_sweeps(sweeps, repeats, time.perf_counter() - start, budget_s), pair.ranks):
        for length in range(1, block + 1):
            if cancel.cancelled:
                raise CalibrationCancelled("calibration was cancelled.")
            verify[length - 1].append(_timed_verify(pair, cache, verify_ids[:, :length], rollback, False, sampler,
                                                    logq))
            # an AR step beside every verify: every ratio is to this median, so it gets the most samples
            ar.append(_timed_verify(pair, cache, verify_ids[:, :1], rollback, True, sampler, logq))
        if pair.drafter is not None:
            for length in range(2, block + 1):
                draft[length - 1].append(_timed_draft(pair, context, depth, length, window, sink, sampler))
        sweeps += 1
        yield
    return DepthPoint(depth, _median_ms(ar), [_median_ms(v) for v in verify],
                      [0.0] + [_median_ms(d) for d in draft[1:]] if draft[-1] else None, sweeps)


def depths_for(pair: LoadedPair, block: int) -> list[int]:
    """DEPTHS that fit the target's context with a block after them (the base always)."""
    limit = context_length(pair)
    return [d for d in DEPTHS if d == CONTEXT_TOKENS or limit is None or d + block < limit]


def _check(block: int, repeats: int) -> None:
    if repeats < 1:
        raise DFlashError(f"repeats {repeats} must be at least 1.")
    if not 1 <= block <= 64:
        raise DFlashError(f"block size {block} is outside 1..64, the longest verify the cost curve measures.")


def measure_steps(pair: LoadedPair, *, block: Optional[int] = None, repeats: int = 3, window: int = 0,
                  sink: int = 0, cancel: Optional[CancelToken] = None, budget_s: Optional[float] = None,
                  sampling: Optional[SamplingSettings] = None,
                  kept: Optional[list[DepthPoint]] = None) -> Iterator[tuple[int, int]]:
    """measure() as a generator: yields (steps done, steps in all) after each sweep at each depth
    (a depth counts as its most sweeps, EXTRA_SWEEPS x repeats: one that ends sooner jumps to its
    end), returns the curve. Raises CalibrationCancelled when `cancel` stops it. `kept`: the depths
    a stopped measurement finished, appended to as each depth ends; they are not measured again."""
    block = block or (pair.drafter.cfg.block_size if pair.drafter is not None else 16)
    _check(block, repeats)
    cancel = cancel or CancelToken()
    budget_s = SWEEP_BUDGET_S if budget_s is None else budget_s
    depths = depths_for(pair, block)
    most = EXTRA_SWEEPS * repeats
    points = kept if kept is not None else []
    with mx.stream(STREAM):
        for depth in depths[len(points):]:
            steps = _measure_depth(pair, depth, block, repeats, window, sink, cancel, budget_s,
                                   sampling or SamplingSettings())
            points.append((yield from _counted(steps, len(points) * most, len(depths) * most)))
            if points[-1].sweeps < most:
                yield len(points) * most, len(depths) * most
        device = str(mx.default_device())
    base, *deeper = points
    return fitted(CostCurve(
        target=str(pair.target_path), device=device, blas=blas.status.split(" (")[0], block=block,
        repeats=repeats, ar_step_ms=base.ar_step_ms, verify_ms=base.verify_ms,
        draft_ms=base.draft_by_length_ms[-1] if base.draft_by_length_ms else None, measured_at=time.time(),
        draft_by_length_ms=base.draft_by_length_ms, context=base.depth, deeper=deeper,
        draft_window=window, draft_sink=sink, sweeps=base.sweeps, sampling=sampling_kind(sampling),
    ))


def _counted(steps: Iterator[None], before: int, total: int):
    """Yield (done, total) for each step of `steps`, counting from `before`; return its result."""
    done = before
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value
        done += 1
        yield done, total


def measure(pair: LoadedPair, *, block: Optional[int] = None, repeats: int = 3, window: int = 0, sink: int = 0,
            progress: Callable[[str], None] = lambda msg: None,
            cancel: Optional[CancelToken] = None, budget_s: Optional[float] = None,
            sampling: Optional[SamplingSettings] = None) -> CostCurve:
    """Time verifies of 1..block tokens, AR steps and drafts at each depth on this machine (seconds,
    not minutes)."""
    return _drain(measure_steps(pair, block=block, repeats=repeats, window=window, sink=sink, cancel=cancel,
                                budget_s=budget_s, sampling=sampling), progress)


def _drain(steps, progress: Callable[[str], None]):
    """Run a (done, total) generator to its end, saying each step; its result."""
    while True:
        try:
            done, total = next(steps)
        except StopIteration as stop:
            return stop.value
        progress(f"measured {done}/{total}")


def _sound(curve: CostCurve, block: int) -> bool:
    """A cached curve the controller can use: positive times for every verify length at every
    depth, depths ascending."""
    def positive(v) -> bool:
        return is_number(v) and v > 0

    def sound(p: DepthPoint) -> bool:
        by_length = p.draft_by_length_ms
        return (isinstance(p.verify_ms, list) and len(p.verify_ms) == block and all(positive(v) for v in p.verify_ms)
                and positive(p.ar_step_ms) and isinstance(p.depth, int)
                and (by_length is None or (isinstance(by_length, list) and len(by_length) == block
                                           and all(positive(v) for v in by_length[1:]))))

    points = curve.points()
    return (curve.block == block and (curve.draft_ms is None or positive(curve.draft_ms))
            and all(sound(p) for p in points) and all(a.depth < b.depth for a, b in zip(points, points[1:])))


def _cached(path: Path, block: int) -> Optional[CostCurve]:
    """The sound curve of `block` in a cache file, fitted (entries cached before the fit get it here);
    None where there is none or it is damaged (measured again)."""
    try:
        data = json_text.loads(path.read_bytes()) if path.is_file() else None
        if isinstance(data, dict) and data.get("schema") == SCHEMA and _sound(curve := _from_json(data), block):
            return fitted(curve)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _from_longer(files: list[str], block: int) -> Optional[CostCurve]:
    """A cached curve of a longer block cut to `block` (cost_curve_data.shorter), else None: block 9 after 16
    measured. `files`: _key_parts."""
    for longer in range(block + 1, 65):  # up to 64, the longest verify _check allows
        curve = _cached(cache_dir() / "cost-curves" / f"{_hashed(files, longer)}.json", longer)
        if curve is not None:
            return fitted(shorter(curve, block))
    return None


def cache_dir() -> Path:
    override = os.environ.get("DFLASH_CACHE_DIR")
    if override:
        return Path(override)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("dflash-playground"))


def _key_parts(pair: LoadedPair, repeats: int, window: int, sink: int, sampling: Optional[SamplingSettings]
               ) -> list[str]:
    """What a cached curve's file name hashes, but the block: the target's and the drafter's files,
    repeats, the draft window and sink, the kind of sampling, device, BLAS, MLX and which of our
    kernels run (a curve timed through other kernels prices rows wrongly). Read once for every
    block a lookup tries (a glob and a stat of both model folders)."""
    parts = [str(pair.target_path.resolve()), str(repeats), mx.__version__, blas.status,
             str(pair.drafter_path.resolve()) if pair.drafter_path else "-", f"window {window} sink {sink}",
             f"sampling {sampling_kind(sampling)}"]
    with mx.stream(STREAM):
        parts.append(str(mx.default_device()))
    parts.append(kernels_key(pair.cpu_kernels))
    folders = [pair.target_path] + ([pair.drafter_path] if pair.drafter_path else [])
    for f in [f for d in folders for f in sorted(d.glob("*.json")) + sorted(d.glob("*.safetensors"))]:
        st = f.stat()
        parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    return parts


def _hashed(parts: list[str], block: int) -> str:
    return hashlib.sha256("|".join([parts[0], str(block), *parts[1:]]).encode()).hexdigest()[:32]


def _from_json(data: dict) -> CostCurve:
    values = {k: data[k] for k in CostCurve.__dataclass_fields__}
    values["deeper"] = [DepthPoint(**{k: p[k] for k in DepthPoint.__dataclass_fields__}) for p in values["deeper"]]
    return CostCurve(**values)


def cost_curve_steps(pair: LoadedPair, *, block: Optional[int] = None, repeats: int = 3, fresh: bool = False,
                     window: int = 0, sink: int = 0, cancel: Optional[CancelToken] = None,
                     sampling: Optional[SamplingSettings] = None,
                     on_note: Callable[[str], None] = lambda note: None) -> Iterator[tuple[int, int]]:
    """cost_curve() as a generator: yields (done, total) while it measures (nothing when the curve is
    cached), returns (curve, from_cache); `on_note` hears when the cache could not be written."""
    block = block or (pair.drafter.cfg.block_size if pair.drafter is not None else 16)
    _check(block, repeats)  # before the cache: a bad setting is refused whether or not a curve is cached
    def measured(kept: Optional[list[DepthPoint]] = None):
        return measure_steps(pair, block=block, repeats=repeats, window=window, sink=sink, cancel=cancel,
                             sampling=sampling, kept=kept)

    files = _key_parts(pair, repeats, window, sink, sampling)
    key, store = _hashed(files, block), pair.curves
    if pair.ranks.sharded:
        # Each host keeps its own cache, and a rank that measured while another read its
        # cache would run collectives alone: every rank measures, and all use rank 0's numbers.
        if not fresh and key in store.sharded:
            return store.sharded[key], True
        curve = store.sharded[key] = _agreed((yield from measured()), pair)
        return curve, False
    path = cache_dir() / "cost-curves" / f"{key}.json"
    if not fresh and str(path) in store.unwritten:
        return store.unwritten[str(path)], True
    if not fresh and (curve := _cached(path, block) or _from_longer(files, block)) is not None:
        return curve, True
    # Stop during the measurement keeps the depths it finished: the next run goes on from them (it
    # started again from the first, and a long prompt's first run spends most of its time here)
    kept = store.stopped.setdefault(key, []) if not fresh else []
    curve = yield from measured(kept)
    store.stopped.pop(key, None)
    try:
        write_atomic(path, json.dumps(asdict(curve), indent=2), "the cost curve cache")
    except DFlashError as exc:
        store.unwritten[str(path)] = curve  # kept for this pair's next runs
        on_note(f"the curve is not cached ({exc}); it is kept for this process only, so the next command "
                "measures it again")
    return curve, False


def cost_curve(pair: LoadedPair, *, block: Optional[int] = None, repeats: int = 3, fresh: bool = False,
               window: int = 0, sink: int = 0,
               progress: Callable[[str], None] = lambda msg: None,
               cancel: Optional[CancelToken] = None,
               sampling: Optional[SamplingSettings] = None) -> tuple[CostCurve, bool]:
    """(curve, from_cache): the cached curve for this target and machine, else a new measurement.
    window, sink, sampling: as the runs that use the curve keep the drafter's context and draw."""
    return _drain(cost_curve_steps(pair, block=block, repeats=repeats, fresh=fresh, window=window, sink=sink,
                                   cancel=cancel, sampling=sampling, on_note=progress), progress)


def _agreed(curve: CostCurve, pair: LoadedPair) -> CostCurve:
    """The curve with rank 0's timings on every rank, so every rank's controller picks the same lengths."""
    block = len(curve.verify_ms)

    def numbers(p: DepthPoint) -> list[float]:
        return [p.ar_step_ms, *p.verify_ms, *(p.draft_by_length_ms or [0.0] * block)]

    points = curve.points()
    agreed = from_root(mx.array([numbers(p) for p in points], dtype=mx.float32), pair.ranks).tolist()
    return with_points(curve, [
        replace(p, ar_step_ms=row[0], verify_ms=row[1 : block + 1],
                draft_by_length_ms=row[block + 1 :] if p.draft_by_length_ms is not None else None)
        for p, row in zip(points, agreed)])
