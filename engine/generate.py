"""Generation as a stream of events: plain AR decoding and DFlash rounds, same prefill and sampler."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Iterator, Optional

import mlx.core as mx

from engine.errors import SettingsError
from engine.events import Event, RoundEvent, StartEvent, SummaryEvent, TextEvent
from engine.output import OutputTracker
from engine.rollback import make_rollback
from engine.sampling import Sampler, SamplingSettings
from engine.session import LoadedPair
from engine.target import make_target_cache
from engine.streams import STREAM

PREFILL_STEP = 2048
MAX_BLOCK = 16


@dataclass(frozen=True)
class GenerationSettings:
    mode: str = "dflash"  # "dflash" or "ar"
    max_tokens: int = 256
    block_size: Optional[int] = None  # None: the drafter's own
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    stop_strings: tuple[str, ...] = ()
    rollback: str = "replay"  # hybrid targets: "replay" (tape replay) or "rerun"

    def resolved(self, pair: LoadedPair) -> "GenerationSettings":
        """Checked settings with the block size filled in."""
        if self.mode not in ("dflash", "ar"):
            raise SettingsError(f"mode '{self.mode}' is not one of: dflash, ar.")
        if not 1 <= self.max_tokens <= 1_000_000:
            raise SettingsError(f"max tokens {self.max_tokens} is outside 1..1000000.")
        if self.rollback not in ("replay", "rerun"):
            raise SettingsError(f"rollback '{self.rollback}' is not one of: replay, rerun.")
        self.sampling.validate(pair.head.vocab_size)
        if self.mode == "ar":
            return replace(self, block_size=None)
        if pair.drafter is None:
            raise SettingsError("DFlash mode needs a drafter; give one or use AR mode.")
        block = self.block_size or pair.drafter.cfg.block_size
        if not 1 <= block <= MAX_BLOCK:
            raise SettingsError(f"block size {block} is outside 1..{MAX_BLOCK}.")
        return replace(self, block_size=block)

    def to_dict(self) -> dict:
        return asdict(self)


class CancelToken:
    """Set from any thread; generation checks it once per round and then summarises."""

    def __init__(self):
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


def _ms(t0: float, t1: float) -> float:
    return round((t1 - t0) * 1000.0, 4)


def prefill(pair: LoadedPair, cache: list, prompt_ids: list[int], record_taps: bool):
    """Run the prompt through the target; (last-position logits, taps (1, n, k*H) or None)."""
    taps = pair.taps
    chunks = []
    logits = None
    ids = mx.array(prompt_ids)
    for start in range(0, len(prompt_ids), PREFILL_STEP):
        if taps is not None:
            taps.recording = record_taps
        logits = pair.target(ids[None, start : start + PREFILL_STEP], cache=cache)
        if record_taps:
            chunks.append(taps.concatenated())
        if taps is not None:
            taps.recording = False
        mx.eval([c.state for c in cache] + chunks[-1:])
    context = mx.concatenate(chunks, axis=1) if len(chunks) > 1 else (chunks[0] if chunks else None)
    return logits[0, -1], context


def generate(
    pair: LoadedPair,
    prompt_ids: list[int],
    settings: GenerationSettings,
    cancel: Optional[CancelToken] = None,
) -> Iterator[Event]:
    """Yield a StartEvent, then RoundEvents (DFlash) and TextEvents, then a SummaryEvent."""
    settings = settings.resolved(pair)
    if not prompt_ids:
        raise SettingsError("the prompt is empty; give at least one token.")
    with mx.stream(STREAM):
        yield from _generate(pair, list(prompt_ids), settings, cancel or CancelToken())


def _generate(pair, prompt_ids, settings, cancel) -> Iterator[Event]:
    dflash = settings.mode == "dflash"
    block = settings.block_size or 1
    record = dflash and block > 1
    yield StartEvent(settings.mode, settings.to_dict(), pair.facts(), list(prompt_ids))

    mx.reset_peak_memory()
    sampler = Sampler(settings.sampling)
    out = OutputTracker(pair.tokenizer, settings.max_tokens, settings.stop_strings)
    cache = make_target_cache(pair.target)

    t_start = time.perf_counter()
    last_logits, context = prefill(pair, cache, prompt_ids, record)
    y = sampler.sample(last_logits)
    first = int(y.item())
    t_first = time.perf_counter()
    stop = out.add(first)
    yield TextEvent(out.take_delta(), [first], None, 0.0)  # sampled from prefill

    rounds: list[RoundEvent] = []
    if dflash:
        loop = _dflash_rounds(pair, cache, sampler, out, first, len(prompt_ids), context, block, t_first, cancel,
                              settings.rollback)
    else:
        loop = _ar_steps(pair, cache, sampler, out, y, t_first, cancel)
    if not stop:
        for event in loop:
            if isinstance(event, RoundEvent):
                rounds.append(event)
            yield event
    t_end = time.perf_counter()
    out.finish()
    tail = out.take_delta()
    if tail:
        yield TextEvent(tail, [], None, t_end - t_first)
    if cancel.cancelled and out.stop_reason is None:
        out.stop_reason = "cancelled"
    yield _summary(settings, prompt_ids, out, rounds, block, t_start, t_first, t_end)


def _ar_steps(pair, cache, sampler, out, y, t_first, cancel) -> Iterator[Event]:
    """Plain decoding, pipelined like mlx-lm: step n+1 is queued before token n is read."""
    model = pair.target

    def step(token: mx.array) -> mx.array:
        nxt = sampler.sample(model(token.reshape(1, 1), cache=cache)[0, -1])
        mx.async_eval(nxt)
        return nxt

    y = step(y)
    while not cancel.cancelled:
        nxt = step(y) if out.remaining > 1 else None
        token = int(y.item())
        stop = out.add(token)
        yield TextEvent(out.take_delta(), [token], None, time.perf_counter() - t_first)
        if stop:
            return
        y = nxt


def _dflash_rounds(pair, cache, sampler, out, anchor, position, context, block, t_first, cancel,
                   rollback_mode="replay") -> Iterator[Event]:
    drafter, head, taps = pair.drafter, pair.head, pair.taps
    mask_id = drafter.cfg.mask_token_id
    dcache = drafter.make_cache()
    rollback = make_rollback(pair.target, cache, prefer=rollback_mode)
    pending = [context] if context is not None else []
    index = 0
    while not cancel.cancelled:
        length = min(block, out.remaining)  # a block commits at most `length` tokens
        t0 = time.perf_counter()
        drafts, logq = mx.array([], dtype=mx.int32), None
        if length > 1:
            ids = mx.array([anchor] + [mask_id] * (length - 1))[None]
            ctx = mx.concatenate(pending, axis=1) if len(pending) > 1 else (pending[0] if pending else None)
            hidden = drafter(head.embed(ids), ctx, dcache, position)
            drafts, logq = sampler.draft(head.logits(hidden[0, 1:]))
            mx.eval(drafts, logq, [c.state for c in dcache])
            pending = []
        t1 = time.perf_counter()

        verify_ids = mx.concatenate([mx.array([anchor], dtype=drafts.dtype), drafts])
        rollback.before_verify()
        taps.recording = block > 1
        logits = pair.target(verify_ids[None], cache=cache)[0]
        taps.recording = False
        result = sampler.verify(logits, drafts, logq)
        new_taps = taps.concatenated() if block > 1 else None
        mx.eval(result, new_taps)
        accepted, bonus = result.tolist()
        t2 = time.perf_counter()

        rollback.after_verify(accepted, length)
        if new_taps is not None:
            pending.append(new_taps[:, : accepted + 1])
        t3 = time.perf_counter()

        drafted = drafts.tolist()
        committed, stop = out.add_many(drafted[:accepted] + [bonus])
        event = RoundEvent(
            index=index,
            position=position,
            anchor=anchor,
            drafted=drafted,
            accepted=accepted,
            bonus=bonus,
            bonus_kind="bonus" if accepted == len(drafted) else "correction",
            committed=committed,
            draft_ms=_ms(t0, t1),
            verify_ms=_ms(t1, t2),
            rollback_ms=_ms(t2, t3),
            t=t3 - t_first,
            generated=len(out.tokens),
        )
        yield event
        yield TextEvent(out.take_delta(), committed, index, event.t)
        if stop:
            return
        anchor = bonus
        position += accepted + 1
        index += 1


def _summary(settings, prompt_ids, out, rounds, block, t_start, t_first, t_end) -> SummaryEvent:
    drafting = [r for r in rounds if r.drafted]
    hist = [0] * block
    reached = [0] * max(block - 1, 0)
    offered = [0] * max(block - 1, 0)
    for r in drafting:
        hist[r.accepted] += 1
        for k in range(len(r.drafted)):
            offered[k] += 1
            reached[k] += r.accepted > k
    decode_s = t_end - t_first
    n = len(out.tokens)

    def mean(values):
        return round(sum(values) / len(values), 4) if values else None

    return SummaryEvent(
        mode=settings.mode,
        token_ids=list(out.tokens),
        text=out.text,
        num_generated=n,
        prompt_tokens=len(prompt_ids),
        prefill_s=round(t_first - t_start, 6),
        decode_s=round(decode_s, 6),
        tok_per_s=round(n / decode_s, 3) if decode_s > 0 else 0.0,
        num_rounds=len(rounds),
        mean_acceptance_length=mean([r.accepted + 1 for r in drafting]),
        acceptance_histogram=hist if settings.mode == "dflash" else [],
        per_position_acceptance=[round(a / o, 4) if o else 0.0 for a, o in zip(reached, offered)],
        mean_draft_ms=mean([r.draft_ms for r in rounds]),
        mean_verify_ms=mean([r.verify_ms for r in rounds]),
        mean_rollback_ms=mean([r.rollback_ms for r in rounds]),
        stop_reason=out.stop_reason or "max_tokens",
        peak_memory_mb=round(mx.get_peak_memory() / 1e6, 2),
    )
