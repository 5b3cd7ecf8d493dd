"""Undoing the rejected part of a verify block in the target's caches.

Attention KV caches are trimmed. Recurrent layers cannot be trimmed; a rollback
strategy for them registers itself in ROLLBACK_STRATEGIES (see engine/hybrid.py
when present). The round loop only calls before_verify / after_verify.
"""

from __future__ import annotations

from typing import Callable, Optional

import mlx.nn as nn
from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

from engine.errors import DFlashError


class KVTrimRollback:
    """All layers are attention with trimmable caches: drop the rejected entries."""

    kind = "kv-trim"

    def __init__(self, model: nn.Module, cache: list):
        self.cache = cache

    def before_verify(self) -> None:
        pass

    def after_verify(self, accepted: int, length: int) -> None:
        trim = length - accepted - 1
        if trim:
            trim_prompt_cache(self.cache, trim)


# Strategies tried in order; each is (applies(model, cache) -> bool, factory).
ROLLBACK_STRATEGIES: list[tuple[Callable[[nn.Module, list], bool], Callable]] = []


def make_rollback(model: nn.Module, cache: list, prefer: Optional[str] = None):
    for applies, factory in ROLLBACK_STRATEGIES:
        if applies(model, cache):
            return factory(model, cache, prefer)
    if not can_trim_prompt_cache(cache):
        raise DFlashError(
            f"target model type '{getattr(model, 'model_type', type(model).__name__)}' keeps caches that "
            "cannot be rolled back after a partial accept; DFlash cannot run it losslessly."
        )
    return KVTrimRollback(model, cache)


def rollback_kind(model: nn.Module) -> str:
    from engine.target import make_target_cache

    return make_rollback(model, make_target_cache(model)).kind


import engine.hybrid  # noqa: E402,F401  (registers the GatedDeltaNet strategies: tape replay, rerun)
