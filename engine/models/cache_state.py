"""Put a target's caches back to where they stood: trim what can be trimmed, restore the rest.

Attention KV caches write each new token after `offset` into a buffer they keep, so going back
is a trim (the buffer, and what is before the offset, stay). Recurrent caches (GatedDeltaNet's
conv and state arrays) cannot be trimmed; MLX arrays are never changed in place, so holding on
to the arrays a cache held is a snapshot of it. Calibration measures a verify at a depth and
goes back; prefix reuse (engine/decode/prefix_cache.py) keeps a prompt's caches for the next run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class CacheMark:
    offsets: list[Any]  # per cache entry: its offset (trimmable) or a copy of its state (not)


def _trimmable(entry: Any) -> bool:
    is_trimmable = getattr(entry, "is_trimmable", None)
    return bool(is_trimmable and is_trimmable())


def mark(cache: list) -> CacheMark:
    """Where every entry of `cache` stands now."""
    return CacheMark([entry.offset if _trimmable(entry) else _copy(entry.state) for entry in cache])


def restore(cache: list, where: CacheMark) -> None:
    """Back to `where` (mark() of this cache, which has only grown since)."""
    for entry, saved in zip(cache, where.offsets):
        if _trimmable(entry):
            entry.trim(entry.offset - saved)
        else:
            entry.state = _copy(saved)


def _copy(state: Any) -> Any:
    """A state's containers copied (the arrays are shared: MLX never changes one in place)."""
    if isinstance(state, (list, tuple)):
        return type(state)(_copy(s) for s in state)
    return state
