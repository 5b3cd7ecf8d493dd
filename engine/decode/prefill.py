"""The prompt: checked against the target's context, then run through it in chunks."""

from __future__ import annotations

from typing import Optional

import mlx.core as mx

from engine.decode.cancel import CancelToken
from engine.errors import SettingsError
from engine.models.drafter_config import flat_config
from engine.models.pair import LoadedPair
from engine.runtime.distributed import heartbeat

PREFILL_STEP = 2048


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
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def prefill(pair: LoadedPair, cache: list, prompt_ids: list[int], record_taps: bool,
            cancel: Optional[CancelToken] = None):
    """Run the prompt through the target in chunks; (last-position logits, taps (1, n, k*H) or None).
    Cancel is checked between chunks: (None, None) when it stopped the prefill."""
    chunks = []
    logits = None
    ids = mx.array(prompt_ids)
    for start in range(0, len(prompt_ids), PREFILL_STEP):
        if cancel is not None and cancel.cancelled:
            return None, None
        heartbeat("running the prompt")
        if record_taps:
            with pair.taps.capture():
                logits = pair.target(ids[None, start : start + PREFILL_STEP], cache=cache)
            chunks.append(pair.taps.concatenated())
        else:
            logits = pair.target(ids[None, start : start + PREFILL_STEP], cache=cache)
        mx.eval([c.state for c in cache] + chunks[-1:])
    context = mx.concatenate(chunks, axis=1) if len(chunks) > 1 else (chunks[0] if chunks else None)
    return logits[0, -1], context
