"""Plain autoregressive decoding, and what every run shares.

`Decoder` holds what every run touches (the pair, the target's caches, the sampler, the output,
the statistics), runs the prompt (reusing the previous run's caches where it can, with progress
events) and decodes one token a step, pipelined as mlx-lm's generate_step is. Speculative runs
(engine/decode/speculative.py) build on it.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Callable, Iterator, Optional

import mlx.core as mx

from engine.decode.events import Event, PrefillEvent, StartEvent, SummaryEvent, TextEvent
from engine.decode.cancel import CancelToken
from engine.decode.output import OutputTracker
from engine.decode.prefill import PromptPass
from engine.decode.prefix_cache import PrefixCache
from engine.decode.sampling import Sampler
from engine.decode.settings import GenerationSettings
from engine.decode.stats import RoundStats
from engine.models.pair import LoadedPair
from engine.models.target import make_target_cache
from engine.runtime.distributed import from_root


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

    @property
    def keeps_taps(self) -> bool:
        """Whether the run needs the target's taps (a drafter's context): not for AR."""
        return False

    def events(self) -> Iterator[Event]:
        """A StartEvent, the first token from prefill, the decode loop's events, a SummaryEvent."""
        s = self.settings
        yield StartEvent(s.mode, s.to_dict(), self.pair.facts(), list(self.prompt_ids))
        ready = yield from self.calibrate()  # a first auto run's measurement is neither prefill nor peak
        mx.reset_peak_memory()
        t_start = time.perf_counter()
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
        record = self.keeps_taps or (self.prefix is not None and self.pair.taps is not None)
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
        return run.logits, run.context if self.keeps_taps else None

    def decode(self, y: mx.array, context: Optional[mx.array]) -> Iterator[Event]:
        out = self.out
        for token, _ in self.plain_tokens(y, lambda i: out.remaining > 1):
            stop = out.add(token)
            yield TextEvent(out.take_delta(), [token], None, time.perf_counter() - self.t_first)
            if stop:
                return

    def plain_tokens(self, token: mx.array, more: Callable[[int], bool],
                     taps: bool = False) -> Iterator[tuple[int, Optional[mx.array]]]:
        """Plain AR steps from `token`, pipelined as mlx-lm's generate_step: step i + 1 is queued
        before token i is read, where `more(i)` wants one. Yields (token i, with `taps` the target's
        taps of its step) until `more` says no or the run is cancelled. AR and auto's plain
        stretches (engine/decode/speculative.py) both decode through it."""
        model, cache, ranks, recorder = self.pair.target, self.cache, self.pair.ranks, self.pair.taps

        def step(y: mx.array) -> tuple[mx.array, Optional[mx.array]]:
            with recorder.capture() if taps else nullcontext():
                logits = model(y.reshape(1, 1), cache=cache)[0, -1]
            # from_root: ranks of a sharded target commit rank 0's token (a no-op in one process)
            nxt = from_root(self.sampler.sample(logits), ranks)
            kept = recorder.concatenated() if taps else None
            mx.async_eval(nxt, *([kept] if taps else []))
            return nxt, kept

        queued, i = step(token), 0
        while not self.cancel.cancelled:
            y, kept = queued
            going = more(i)
            if going:
                queued = step(y)
            yield int(y.item()), kept
            if not going:
                return
            i += 1

    def summary(self, t_start: float, t_end: float) -> SummaryEvent:
        out, stats = self.out, self.stats
        block = max(self.block, len(stats.histogram))  # a copy (--lookup) may verify past the drafter's block
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
            acceptance_histogram=stats.histogram_of(block) if self.mode != "ar" else [],
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
