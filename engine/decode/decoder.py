"""One generation run as a stream of events: plain AR decoding or DFlash rounds.

`Decoder` holds everything a run touches (the pair, the target's and the drafter's
caches, the sampler, the rollback, the taps and the output) and `DFlashDecoder.round()`
reads top to bottom: draft a block, verify it, decide acceptance
(engine/decode/acceptance.py), roll back the rejected part, commit.
`generate()` is the entry point every tool uses.
"""

from __future__ import annotations

import time
from typing import Iterator, Optional

import mlx.core as mx
import numpy as np

from engine.decode.acceptance import accept
from engine.decode.cost_curve import CalibrationCancelled, cost_curve_steps
from engine.decode.events import (
    PLAIN, CalibrationEvent, Event, PrefillEvent, RoundEvent, StartEvent, SummaryEvent, TextEvent,
)
from engine.decode.cancel import CancelToken
from engine.decode.output import OutputTracker
from engine.decode.prefill import PromptPass, check_prompt
from engine.decode.prefix_cache import PrefixCache
from engine.decode.proposal import Proposal, propose, selector_fields, selector_table, selector_table_on_host
from engine.decode.rollback import make_rollback
from engine.decode.sampling import Sampler
from engine.decode.settings import GenerationSettings
from engine.decode.stats import RoundStats
from engine.decode.verify_length import VerifyLengthController
from engine.decode.why import as_lists, explain, explain_on_host
from engine.models.pair import LoadedPair
from engine.models.target import make_target_cache
from engine.runtime.distributed import from_root, heartbeat
from engine.runtime.streams import STREAM

def _ms(t0: float, t1: float) -> float:
    return round((t1 - t0) * 1000.0, 4)


def _float32(a: mx.array) -> np.ndarray:
    return np.array(a if a.dtype == mx.float32 else a.astype(mx.float32))


class Decoder:
    """Plain autoregressive decoding, and the run's shared state: caches, sampler, output, stats."""

    mode = "ar"

    def __init__(self, pair: LoadedPair, prompt_ids: list[int], *, settings: GenerationSettings,
                 cancel: Optional[CancelToken] = None, prefix: Optional[PrefixCache] = None):
        self.pair = pair
        self.prompt_ids = list(prompt_ids)
        self.settings = settings
        self.cancel = cancel or CancelToken()
        self.prefix = prefix  # the previous run's caches to reuse, and where this run's are kept
        self.sampler = Sampler(settings.sampling)
        self.out = OutputTracker(pair.tokenizer, settings.max_tokens, settings.stop_strings)
        self.cache = make_target_cache(pair.target)
        self.stats = RoundStats()
        self.t_first = 0.0
        self.reused = 0  # prompt tokens taken from the previous run's caches

    @property
    def block(self) -> int:
        return 1

    def events(self) -> Iterator[Event]:
        """A StartEvent, the first token from prefill, the decode loop's events, a SummaryEvent."""
        s = self.settings
        yield StartEvent(s.mode, s.to_dict(), self.pair.facts(), list(self.prompt_ids))
        mx.reset_peak_memory()
        t_start = time.perf_counter()
        ready = yield from self.calibrate()
        last_logits, context = (yield from self.prefill()) if ready else (None, None)
        if last_logits is None:  # stopped during calibration or prefill: nothing was generated
            self.t_first = time.perf_counter()
            self.out.stop_reason = "cancelled"
            yield self.summary(t_start, self.t_first)
            return
        y = from_root(self.sampler.sample(last_logits), self.pair.ranks)
        first = int(y.item())
        self.t_first = time.perf_counter()
        stop = self.out.add(first)
        yield TextEvent(self.out.take_delta(), [first], None, 0.0)  # sampled from prefill
        if not stop:
            yield from self.decode(y, context)
        t_end = time.perf_counter()
        self.out.finish()
        tail = self.out.take_delta()
        if tail:
            yield TextEvent(tail, [], None, t_end - self.t_first)
        if self.cancel.cancelled and self.out.stop_reason is None:
            self.out.stop_reason = "cancelled"
        yield self.summary(t_start, t_end)

    def calibrate(self):
        """What the run needs measured before it starts (nothing for AR); False when stopped."""
        return True
        yield  # a generator, like the subclass's

    def prefill(self):
        """The prompt into the target's caches, from the previous run's where it shares a prefix with
        it; yields a PrefillEvent per chunk, returns (last logits, the prompt's taps) or (None, None)
        when stopped. The taps are recorded when the drafter needs them, or (with a prefix cache)
        whenever the pair has a drafter, for a later DFlash run to reuse."""
        record = self.block > 1 or (self.prefix is not None and self.pair.taps is not None)
        reuse = self.prefix.take(self.pair, self.prompt_ids, record) if self.prefix is not None else None
        if reuse is not None:
            self.cache = reuse.cache
        run = PromptPass(self.pair, self.cache, self.prompt_ids, record, start=reuse.start if reuse else 0,
                         taps_before=reuse.taps if reuse else None, marks=dict(reuse.marks) if reuse else {})
        self.reused = reuse.start if reuse else 0
        total = len(self.prompt_ids)
        if reuse is not None:
            yield PrefillEvent(self.reused, total, self.reused)
        if reuse is not None and reuse.logits is not None:  # the same prompt: nothing to compute
            run.logits, run.context = reuse.logits, reuse.taps
        else:
            for done in run.chunks(self.cancel):
                yield PrefillEvent(done, total, self.reused)
        if self.prefix is not None:
            self.prefix.keep(self.pair, self.prompt_ids, self.cache, run.marks,
                             run.context if run.done else run.taps_so_far(), run.logits if run.done else None)
        if not run.done:
            return None, None
        return run.logits, run.context if self.block > 1 else None

    def decode(self, y: mx.array, context: Optional[mx.array]) -> Iterator[Event]:
        """Pipelined like mlx-lm's generate_step: step n+1 is queued before token n is read."""
        model, cache, out, ranks = self.pair.target, self.cache, self.out, self.pair.ranks

        def step(token: mx.array) -> mx.array:
            # from_root: ranks of a sharded target commit rank 0's token (a no-op in one process)
            nxt = from_root(self.sampler.sample(model(token.reshape(1, 1), cache=cache)[0, -1]), ranks)
            mx.async_eval(nxt)
            return nxt

        y = step(y)
        while not self.cancel.cancelled:
            nxt = step(y) if out.remaining > 1 else None
            token = int(y.item())
            stop = out.add(token)
            yield TextEvent(out.take_delta(), [token], None, time.perf_counter() - self.t_first)
            if stop:
                return
            y = nxt

    def summary(self, t_start: float, t_end: float) -> SummaryEvent:
        out, stats, block = self.out, self.stats, self.block
        decode_s = t_end - self.t_first
        n = len(out.tokens)
        return SummaryEvent(
            mode=self.mode,
            token_ids=list(out.tokens),
            text=out.text,
            num_generated=n,
            prompt_tokens=len(self.prompt_ids),
            prefill_s=round(self.t_first - t_start, 6),
            decode_s=round(decode_s, 6),
            tok_per_s=round(n / decode_s, 3) if decode_s > 0 else 0.0,
            num_rounds=stats.rounds,
            mean_acceptance_length=stats.tau,
            acceptance_histogram=stats.histogram_of(block) if self.mode == "dflash" else [],
            per_position_acceptance=(stats.per_position_acceptance + [0.0] * block)[: max(block - 1, 0)],
            mean_draft_ms=stats.mean_draft_ms,
            mean_verify_ms=stats.mean_verify_ms,
            mean_rollback_ms=stats.mean_rollback_ms,
            stop_reason=out.stop_reason or "max_tokens",
            peak_memory_mb=round(mx.get_peak_memory() / 1e6, 2),
            reused_tokens=self.reused,
            num_plain_steps=stats.plain_steps,
            mean_round_ms=stats.mean_round_ms,
        )


class DFlashDecoder(Decoder):
    """Block-diffusion speculative decoding: the drafter drafts a block, the target verifies it."""

    mode = "dflash"

    def __init__(self, pair: LoadedPair, prompt_ids: list[int], *, settings: GenerationSettings,
                 cancel: Optional[CancelToken] = None, prefix: Optional[PrefixCache] = None):
        super().__init__(pair, prompt_ids, settings=settings, cancel=cancel, prefix=prefix)
        self.drafter, self.head, self.taps = pair.drafter, pair.head, pair.taps
        self.drafter_cache = pair.drafter.make_cache(settings.draft_window or None, settings.draft_sink)
        self.rollback = None  # made after prefill (a hybrid target's layers start recording tapes then)
        self.pending: list[mx.array] = []  # target taps the drafter has not seen yet
        self.position = len(self.prompt_ids)  # absolute position of the next anchor
        self.verify_length = None  # --block-size auto: picks how many positions each round verifies
        self.tables_on_host = STREAM.device == mx.cpu  # the why and selector tables: see engine/decode/why.py

    @property
    def block(self) -> int:
        return self.settings.block_size

    def calibrate(self):
        """--block-size auto: this machine's cost curve (measured once, then cached), with progress
        events while it is measured; False when Stop ended it (a notice, not an error)."""
        s = self.settings
        if not s.auto:
            return True
        steps = cost_curve_steps(self.pair, block=self.block, window=s.draft_window, sink=s.draft_sink,
                                 cancel=self.cancel)
        try:
            while True:
                try:
                    done, total = next(steps)
                except StopIteration as stop:
                    curve, _ = stop.value
                    break
                yield CalibrationEvent(done, total)
        except CalibrationCancelled:
            return False
        self.verify_length = VerifyLengthController(curve, self.block)
        return True

    def decode(self, y: mx.array, context: Optional[mx.array]) -> Iterator[Event]:
        self.rollback = make_rollback(self.pair.target, self.cache, prefer=self.settings.rollback)
        if context is not None:
            self.pending.append(context)
        anchor, index = int(y.item()), 0
        while not self.cancel.cancelled:
            plain = self.verify_length.plain_stretch(self.position) if self.verify_length is not None else 0
            rounds = self.plain_steps(index, anchor, plain) if plain > 1 else [self.round(index, anchor)]
            for event in rounds:
                self.stats.add(event)
                yield event
                yield TextEvent(self.out.take_delta(), event.committed, index, event.t)
                if self.out.stop_reason is not None:
                    return
                anchor = event.bonus
                self.position += event.accepted + 1
                index += 1

    def round(self, index: int, anchor: int) -> RoundEvent:
        """One round: draft, verify, accept, roll back, commit."""
        length = min(self.block, self.out.remaining)  # a block commits at most `length` tokens
        verify = length if self.verify_length is None else self.verify_length.choose(length, self.position)
        t0 = time.perf_counter()
        proposal = self.draft(anchor, verify)  # auto drafts only what it verifies, as a fixed size would
        drafts = proposal.drafts
        t_queued = time.perf_counter()

        # The verify's graph is built while the drafter runs (a DFlash2 greedy walk has already
        # waited for the drafter's outputs, so there only its cache update overlaps): building it is
        # Python work, about a sixth of a round on a small target. It counts as verify time, and
        # the wait for the drafts that follows as draft time.
        verify_ids = mx.concatenate([mx.array([anchor], dtype=drafts.dtype), drafts])
        with self.taps.capture(self.block > 1), self.rollback.recording():
            logits = self.pair.target(verify_ids[None], cache=self.cache)[0]
        result = from_root(accept(self.sampler, logits, drafts, proposal.logq), self.pair.ranks)
        tables = drafts.size > 0 and not self.tables_on_host  # on the CPU they are made after the verify
        why = explain(proposal.logits, logits, drafts) if tables else None
        selection = proposal.selection if tables else None
        selector = selector_table(selection, logits, drafts.size) if selection is not None else None
        t_built = time.perf_counter()
        mx.eval(drafts)
        t1 = time.perf_counter()
        # after the wait: a pipeline-sharded target evaluates its layers to gather the taps
        new_taps = self.taps.concatenated() if self.block > 1 else None
        mx.eval(result, new_taps, why, selector)
        accepted, bonus = result.tolist()
        if drafts.size and self.tables_on_host:  # part of the verify's time, as their MLX graphs are
            why, selector = self.host_tables(proposal, logits, drafts)
        t2 = time.perf_counter()

        self.rollback.after_verify(accepted, verify)
        if new_taps is not None:
            self.pending.append(new_taps[:, : accepted + 1])
        t3 = time.perf_counter()

        drafted = drafts.tolist()
        if self.verify_length is not None:
            self.verify_length.record(len(drafted), accepted)
        committed, _ = self.out.add_many(drafted[:accepted] + [bonus])
        return RoundEvent(
            index=index,
            position=self.position,
            anchor=anchor,
            drafted=drafted,
            accepted=accepted,
            bonus=bonus,
            bonus_kind=PLAIN if self.verify_length is not None and verify == 1 else (
                "bonus" if accepted == len(drafted) else "correction"),
            committed=committed,
            draft_ms=_ms(t0, t_queued) + _ms(t_built, t1),
            verify_ms=_ms(t_queued, t_built) + _ms(t1, t2),
            rollback_ms=_ms(t2, t3),
            t=t3 - self.t_first,
            generated=len(self.out.tokens),
            verified=verify,
            draft_context=self.draft_context() if drafted else None,
            **(as_lists(why.tolist()) if why is not None else {}),
            **(selector_fields([a.tolist() for a in selector]) if selector is not None else {}),
        )

    @staticmethod
    def host_tables(proposal: Proposal, logits: mx.array, drafts: mx.array) -> tuple[np.ndarray, Optional[list]]:
        """The round's why and selector tables in numpy, from its evaluated logits."""
        target = _float32(logits)
        why = explain_on_host(_float32(proposal.logits), target, np.array(drafts))
        selection = proposal.selection
        return why, selector_table_on_host(selection, target, drafts.size) if selection is not None else None

    def plain_steps(self, index: int, anchor: int, n: int) -> Iterator[RoundEvent]:
        """Up to n rounds of one token each (auto backed off to plain decoding), pipelined as AR is:
        the next forward is queued before this token is read. Taps are kept for the drafter; there
        is nothing to roll back. The last token is never fed: it is the next round's anchor."""
        model, cache, ranks = self.pair.target, self.cache, self.pair.ranks
        n = min(n, self.out.remaining)

        def step(token: mx.array) -> tuple[mx.array, mx.array]:
            with self.taps.capture():
                logits = model(token.reshape(1, 1), cache=cache)[0, -1]
            nxt, taps = from_root(self.sampler.sample(logits), ranks), self.taps.concatenated()
            mx.async_eval(nxt, taps)
            return nxt, taps

        queued = step(mx.array(anchor))
        t0 = time.perf_counter()
        for i in range(n):
            token_array, taps = queued
            queued = step(token_array) if i + 1 < n else None
            token = int(token_array.item())
            self.pending.append(taps)
            committed, _ = self.out.add_many([token])
            self.verify_length.skipped()
            t1 = time.perf_counter()
            yield RoundEvent(index=index + i, position=self.position + i, anchor=anchor, drafted=[], accepted=0,
                             bonus=token, bonus_kind=PLAIN, committed=committed, draft_ms=0.0,
                             verify_ms=_ms(t0, t1), rollback_ms=0.0, t=t1 - self.t_first,
                             generated=len(self.out.tokens), verified=1)
            anchor, t0 = token, t1
            if self.out.stop_reason is not None or self.cancel.cancelled:
                return

    def draft_context(self) -> int:
        """Context positions the drafter attended to in the last draft: its widest layer's cache."""
        return max((c.keys.shape[2] for c in self.drafter_cache if c.keys is not None), default=0)

    def draft(self, anchor: int, length: int) -> Proposal:
        """The block's drafts d1..d_{length-1} (queued, not awaited), (at T > 0) the log-probs they
        were drawn from, the drafter's logits and (DFlash2) its selector's walk."""
        if length <= 1:
            return Proposal(mx.array([], dtype=mx.int32), None, None)
        ids = mx.array([anchor] + [self.drafter.cfg.mask_token_id] * (length - 1))[None]
        pending = self.pending
        ctx = mx.concatenate(pending, axis=1) if len(pending) > 1 else (pending[0] if pending else None)
        hidden = self.drafter(self.drafter.embed(self.head, ids), ctx, self.drafter_cache, self.position)
        proposal = propose(self.drafter, self.head, hidden[0, 1:], anchor, self.sampler)
        mx.async_eval(proposal.drafts, proposal.logq, [c.state for c in self.drafter_cache])
        self.pending = []
        return proposal


def generate(
    pair: LoadedPair,
    prompt_ids: list[int],
    settings: GenerationSettings,
    cancel: Optional[CancelToken] = None,
    prefix: Optional[PrefixCache] = None,
) -> Iterator[Event]:
    """Yield a StartEvent, PrefillEvents, then RoundEvents (DFlash) and TextEvents, then a SummaryEvent.
    With `prefix`, the prompt starts from the previous run's caches where it shares a prefix with
    it, and this run's are kept there for the next."""
    settings = settings.resolved(pair)
    check_prompt(pair, list(prompt_ids), settings.max_tokens)
    cls = DFlashDecoder if settings.mode == "dflash" else Decoder
    with mx.stream(STREAM):
        decoder = cls(pair, list(prompt_ids), settings=settings, cancel=cancel, prefix=prefix)
        for event in decoder.events():
            heartbeat()  # a rank of a sharded run that stops here is noticed by the others
            yield event
