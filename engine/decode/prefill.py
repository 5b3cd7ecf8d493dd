"""The prompt: checked against the target's context, then run through it in chunks.

Chunks start at multiples of the chunk size in absolute positions, whatever part of the prompt
is already in the cache (engine/decode/prefix_cache.py), so a run that reuses a prefix computes
every chunk after it exactly as a cold run does. Each chunk is evaluated before the next is
queued: progress is reported and Stop is honoured between chunks. Chunks are small on the CPU
(256 tokens, which also prefill faster there than 2,048: docs/performance.md) and 1,024 on a GPU,
so a Stop waits for well under a second's work either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Optional

import mlx.core as mx

from engine.decode.cancel import CancelToken
from engine.errors import SettingsError
from engine.models.cache_state import CacheMark, mark
from engine.models.drafter_config import flat_config
from engine.models.pair import LoadedPair
from engine.runtime.distributed import heartbeat
from engine.json_text import is_int

PREFILL_STEP = 1024  # tokens per chunk on a GPU
CPU_PREFILL_STEP = 256


def check_prompt(pair: LoadedPair, prompt_ids: list[int], max_tokens: int) -> None:
    """A prompt the target can take: not empty, and with the output inside its context."""
    if not prompt_ids:
        raise SettingsError("the prompt is empty; give at least one token.")
    context = context_length(pair)
    if context and len(prompt_ids) >= context:
        raise SettingsError(f"the prompt has {len(prompt_ids)} tokens, but the target's context is {context} "
                            "(max_position_embeddings); shorten the prompt.")
    if context and len(prompt_ids) + max_tokens > context:
        raise SettingsError(f"the prompt ({len(prompt_ids)} tokens) plus max tokens ({max_tokens}) passes the "
                            f"target's context of {context} (max_position_embeddings); use max tokens "
                            f"{context - len(prompt_ids)} or fewer.")


def context_length(pair: LoadedPair) -> Optional[int]:
    value = flat_config(pair.target_config).get("max_position_embeddings")
    return value if is_int(value) and value > 0 else None


def chunk_size() -> int:
    return CPU_PREFILL_STEP if mx.default_device() == mx.cpu else PREFILL_STEP


@dataclass
class PromptPass:
    """The prompt run through the target from `start` (tokens before it are in `cache` already).

    `chunks()` runs it, yielding the prompt tokens in the cache after each chunk; then `logits`
    holds the last position's logits and `context` the taps of every prompt position (those of
    `taps_before` first), or None when taps are not recorded. `marks` holds where the caches
    stood at each chunk boundary (and at the prompt's end): a later run can go back there.
    """

    pair: LoadedPair
    cache: list
    prompt_ids: list[int]
    record_taps: bool
    start: int = 0
    taps_before: Optional[mx.array] = None
    logits: Optional[mx.array] = None
    context: Optional[mx.array] = None
    marks: dict[int, CacheMark] = field(default_factory=dict)

    def __post_init__(self):
        self._taps = [self.taps_before[:, : self.start]] if self.record_taps and self.taps_before is not None else []

    def chunks(self, cancel: Optional[CancelToken] = None) -> Iterator[int]:
        step = chunk_size()
        ids = mx.array(self.prompt_ids)
        taps = self._taps
        n, at = len(self.prompt_ids), self.start
        while at < n:
            if cancel is not None and cancel.cancelled:
                return
            heartbeat("running the prompt")
            end = min((at // step + 1) * step, n)  # the next multiple of the chunk size
            chunk = ids[None, at:end]
            if self.record_taps:
                with self.pair.taps.capture():
                    logits = self.pair.target(chunk, cache=self.cache)
                taps.append(self.pair.taps.concatenated())
            else:
                logits = self.pair.target(chunk, cache=self.cache)
            # only the prompt's last position's logits are read: a chunk before it leaves its head
            # unevaluated (at a 152k vocabulary that head was a third of a CPU chunk's time)
            last = [logits[0, -1]] if end == n else []
            mx.eval([c.state for c in self.cache] + taps[-1:] + last)
            if last:
                self.logits = last[0]
            at = end
            self.marks[at] = mark(self.cache)
            yield at
        if self.record_taps:
            self.context = self.taps_so_far()

    def taps_so_far(self) -> Optional[mx.array]:
        """The taps of the prompt tokens in the cache now (None when not recorded)."""
        if not self._taps:
            return None
        return mx.concatenate(self._taps, axis=1) if len(self._taps) > 1 else self._taps[0]

    @property
    def done(self) -> bool:
        return self.logits is not None and max(self.marks, default=self.start) >= len(self.prompt_ids)


def prefill(pair: LoadedPair, cache: list, prompt_ids: list[int], record_taps: bool,
            cancel: Optional[CancelToken] = None):
    """Run the prompt through the target; (last-position logits, taps (1, n, k*H) or None).
    Cancel is checked between chunks: (None, None) when it stopped the prefill."""
    run = PromptPass(pair, cache, prompt_ids, record_taps)
    for _ in run.chunks(cancel):
        pass
    return (run.logits, run.context) if run.done else (None, None)
