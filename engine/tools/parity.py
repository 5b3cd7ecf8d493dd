"""AR vs DFlash on one prompt: identical or not, and where and by how much if not."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional

import mlx.core as mx

from engine.decode.events import Event, SummaryEvent
from engine.decode.cancel import CancelToken
from engine.decode.decoder import generate
from engine.decode.prefill import prefill
from engine.decode.prefix_cache import PrefixCache
from engine.decode.settings import GenerationSettings
from engine.models.pair import LoadedPair
from engine.models.target import make_target_cache
from engine.runtime.streams import STREAM


def round_in_ar_steps(dflash_decode_s: float, rounds: int, ar_tok_s: float) -> Optional[float]:
    """A DFlash round's whole cost (draft, verify, rollback, bookkeeping) in AR steps: the mean
    acceptance length at which DFlash breaks even with AR (2x needs twice it)."""
    if not rounds or not ar_tok_s:
        return None
    return round(dflash_decode_s / rounds * ar_tok_s, 3)


@dataclass
class ParityResult:
    identical: bool
    first_divergence: Optional[int]  # index into the generated tokens
    margin_at_divergence: Optional[float]  # AR's top-1 minus top-2 logit there
    ar: SummaryEvent
    dflash: SummaryEvent

    @property
    def speedup(self) -> float:
        return self.dflash.tok_per_s / self.ar.tok_per_s if self.ar.tok_per_s else 0.0

    @property
    def round_in_ar_steps(self) -> Optional[float]:
        return round_in_ar_steps(self.dflash.decode_s, self.dflash.num_rounds, self.ar.tok_per_s)

    def to_dict(self) -> dict:
        return {
            "identical": self.identical,
            "first_divergence": self.first_divergence,
            "margin_at_divergence": self.margin_at_divergence,
            "ar_tok_s": self.ar.tok_per_s,
            "dflash_tok_s": self.dflash.tok_per_s,
            "speedup": round(self.speedup, 4),
            "mean_acceptance_length": self.dflash.mean_acceptance_length,
            "round_in_ar_steps": self.round_in_ar_steps,
            "ar_tokens": self.ar.num_generated,
            "dflash_tokens": self.dflash.num_generated,
        }


def first_divergence(a: list[int], b: list[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def logit_margin(pair: LoadedPair, prompt_ids: list[int], generated: list[int]) -> float:
    """Top-1 minus top-2 logit of the target for the token after prompt + generated."""
    with mx.stream(STREAM):
        logits, _ = prefill(pair, make_target_cache(pair.target), prompt_ids + generated, record_taps=False)
        top2 = mx.sort(logits.astype(mx.float32))[-2:]
        return float((top2[1] - top2[0]).item())


def run_parity(
    pair: LoadedPair,
    prompt_ids: list[int],
    settings: GenerationSettings,
    on_event: Callable[[Event], None] = lambda e: None,
    cancel: Optional[CancelToken] = None,
    prefix: Optional[PrefixCache] = None,
) -> ParityResult:
    """AR then DFlash with the same settings; every event also goes to `on_event`. The DFlash run
    reuses the AR run's prefill (`prefix`, or one of its own): the same chunks a cold run computes."""
    summaries = {}
    prefix = prefix if prefix is not None else PrefixCache()
    for mode in ("ar", "dflash"):
        for event in generate(pair, prompt_ids, replace(settings, mode=mode), cancel, prefix=prefix):
            on_event(event)
            if isinstance(event, SummaryEvent):
                summaries[mode] = event
    ar, df = summaries["ar"], summaries["dflash"]
    where = first_divergence(ar.token_ids, df.token_ids)
    margin = None
    if where is not None and where < len(ar.token_ids) and where < len(df.token_ids):
        margin = logit_margin(pair, prompt_ids, ar.token_ids[:where])
    return ParityResult(where is None, where, margin, ar, df)
