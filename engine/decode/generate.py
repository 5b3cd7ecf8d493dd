"""One generation run as a stream of events: `generate()`, the entry point every tool uses.

Plain AR decoding is engine/decode/ar_decoder.py's `Decoder`; speculative rounds (a proposer
drafts, the target verifies) are engine/decode/speculative.py's `SpeculativeDecoder`.
"""

from __future__ import annotations

from typing import Iterator, Optional

import mlx.core as mx

from engine.decode.ar_decoder import Decoder
from engine.decode.cancel import CancelToken
from engine.decode.events import Event
from engine.decode.prefill import check_prompt
from engine.decode.prefix_cache import PrefixCache
from engine.decode.settings import GenerationSettings
from engine.decode.speculative import SpeculativeDecoder
from engine.models.pair import LoadedPair
from engine.runtime.distributed import heartbeat
from engine.runtime.streams import STREAM


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
    cls = Decoder if settings.mode == "ar" else SpeculativeDecoder
    with mx.stream(STREAM):
        decoder = cls(pair, list(prompt_ids), settings=settings, cancel=cancel, prefix=prefix)
        for event in decoder.events():
            heartbeat()  # a rank of a sharded run that stops here is noticed by the others
            yield event
