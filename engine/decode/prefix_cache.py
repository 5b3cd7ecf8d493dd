"""The last prompts' caches, kept for the next run of the same pair.

A user iterates: the same prompt with other settings, the prompt edited at its end, Both mode's
DFlash run after its AR run. Each would prefill again what the last run already had in the
target's caches. `PrefixCache` keeps the last run's caches with the marks its prefill left at
every chunk boundary (engine/decode/prefill.py) and the prompt's taps; the next run of the same
pair takes them back to the deepest boundary inside the prefix the two prompts share (a KV trim,
and for recurrent layers the state held at that boundary) and prefills only the rest, in the
same chunks a cold run computes there, so its tokens are a cold run's. A run of the same prompt
reuses the whole prefill, the last position's logits included.

Recurrent states are whole arrays, so for a hybrid target only the last few boundaries are kept;
attention-only targets keep every boundary (a mark is an offset there).

The window keeps one entry (its last run). A server keeps a few (`capacity`), the most recent
first: several clients' conversations interleave, and each turn grows its own conversation by
one message, so the next turn finds its prefix among them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx

from engine.decode.lookup import common_prefix
from engine.models.cache_state import CacheMark, restore
from engine.models.pair import LoadedPair

KEPT_RECURRENT_MARKS = 4  # boundaries kept for a target with recurrent layers, the deepest ones


@dataclass
class Reuse:
    cache: list  # the target's caches, at `start` tokens of the new prompt
    start: int  # prompt tokens already in `cache`
    taps: Optional[mx.array]  # the taps of those tokens (1, start, k*H) when they were recorded
    logits: Optional[mx.array]  # the last position's logits when the whole prompt is reused
    marks: dict[int, CacheMark]  # the kept marks up to `start`, for the run to keep in turn


@dataclass
class _Entry:
    pair: LoadedPair
    prompt_ids: list[int]
    cache: list
    marks: dict[int, CacheMark]
    taps: Optional[mx.array]
    logits: mx.array


class PrefixCache:
    """The caches of the last `capacity` prompts prefilled (or of the part of each done before a
    Stop), the most recent first. One run uses one thread's cache at a time: not thread-safe."""

    def __init__(self, capacity: int = 1):
        if capacity < 1:
            raise ValueError(f"a prefix cache keeps at least one prompt, not {capacity}")
        self.capacity = capacity
        self._entries: list[_Entry] = []  # most recent first

    def clear(self) -> None:
        self._entries = []

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, pair: LoadedPair, prompt_ids: list[int], need_taps: bool) -> Optional[Reuse]:
        """The kept caches at the deepest boundary `prompt_ids` shares with a kept prompt, or None
        (another pair, nothing shared, or taps needed that were not recorded). The entry used is
        given up (its caches now belong to the new run); with none to use and no room for the new
        run's, the oldest is (with one entry, as the window keeps: given up either way)."""
        best, start, whole = None, 0, False
        for entry in self._entries:
            found, found_whole = _reusable(entry, pair, prompt_ids, need_taps)
            if found > start:
                best, start, whole = entry, found, found_whole
        if best is None:
            if self._entries and len(self._entries) >= self.capacity:
                self._entries.pop()
            return None
        self._entries.remove(best)
        entry = best
        restore(entry.cache, entry.marks[start])
        marks = {b: m for b, m in entry.marks.items() if b <= start}
        taps = entry.taps[:, :start] if need_taps else None
        return Reuse(entry.cache, start, taps, entry.logits if whole else None, marks)

    def keep(self, pair: LoadedPair, prompt_ids: list[int], cache: list, marks: dict[int, CacheMark],
             taps: Optional[mx.array], logits: Optional[mx.array]) -> None:
        """Keep a run's caches for the next run: `marks` are where its prefill left them (the last one
        is where the caches go back to before reuse), `logits` those of the prompt's last position
        when the prefill finished."""
        if not marks:
            return
        if any(not isinstance(o, int) for m in marks.values() for o in m.offsets):  # recurrent states held
            deepest = sorted(marks)[-KEPT_RECURRENT_MARKS:]
            marks = {b: marks[b] for b in deepest}
        done = max(marks)
        self._entries.insert(0, _Entry(pair, list(prompt_ids[:done]), cache, marks, taps,
                                       logits if done == len(prompt_ids) else None))
        del self._entries[self.capacity:]


def _reusable(entry: _Entry, pair: LoadedPair, prompt_ids: list[int], need_taps: bool) -> tuple[int, bool]:
    """(prompt tokens `entry` can give a run of `prompt_ids`, whether that is the whole prompt with its
    logits): its deepest boundary inside the prefix they share (0 for another pair, or taps needed
    that it did not record)."""
    if entry.pair is not pair or (need_taps and entry.taps is None):
        return 0, False
    shared = common_prefix(entry.prompt_ids, prompt_ids)
    whole = shared == len(prompt_ids) == len(entry.prompt_ids) and entry.logits is not None
    # a partial reuse leaves at least one token to compute: its logits start the output
    limit = shared if whole else min(shared, len(prompt_ids) - 1)
    return max((b for b in entry.marks if b <= limit), default=0), whole
