"""Undoing the rejected part of a verify block in the target's caches.

Attention KV caches are trimmed. Recurrent (GatedDeltaNet) layers cannot be trimmed:
hybrid targets get engine/decode/hybrid_rollback.py (tape replay or re-run). The
round loop opens `recording()` around the verify forward and calls `after_verify`.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Optional

import mlx.nn as nn
from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

from engine.decode.hybrid_rollback import HybridRollback
from engine.errors import DFlashError
from engine.models.gdn_tape import is_hybrid


class KVTrimRollback:
    """All layers are attention with trimmable caches: drop the rejected entries."""

    kind = "kv-trim"

    def __init__(self, model: nn.Module, cache: list):
        self.cache = cache

    def recording(self):
        return nullcontext()  # attention caches need no record: trimming is enough

    def after_verify(self, accepted: int, length: int) -> None:
        trim = length - accepted - 1
        if trim:
            trim_prompt_cache(self.cache, trim)


def make_rollback(model: nn.Module, cache: list, prefer: Optional[str] = None):
    """The rollback this target's caches need: hybrid (GatedDeltaNet) or plain KV trim."""
    if is_hybrid(model, cache):
        return HybridRollback(model, cache, prefer or "replay")
    if not can_trim_prompt_cache(cache):
        raise DFlashError(
            f"target model type '{getattr(model, 'model_type', type(model).__name__)}' keeps caches that "
            "cannot be rolled back after a partial accept; DFlash cannot run it losslessly."
        )
    return KVTrimRollback(model, cache)
