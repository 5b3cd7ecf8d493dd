"""AR vs DFlash on one prompt: identical or not, and where and by how much if not.

The verdict says what a difference means. At temperature 0 DFlash must equal AR token for token,
except where AR's top two logits are within rounding of each other (a near-tie: the two runs
round differently, verify's matmuls over a block against AR's single steps). At temperature > 0
AR and DFlash draw their random numbers differently, so their outputs are two samples: a token
difference says nothing, and the lossless claim is about the distribution (many seeds; the
statistical tests in tests/test_sampling.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Optional

import mlx.core as mx

from engine.decode.events import Event, SummaryEvent
from engine.decode.cancel import CancelToken
from engine.decode.generate import generate
from engine.decode.prefill import prefill
from engine.decode.prefix_cache import PrefixCache
from engine.decode.settings import GenerationSettings
from engine.models.pair import LoadedPair
from engine.models.target import make_target_cache
from engine.runtime.streams import STREAM


# A flip below this AR logit margin is floating point, for float32 logits (and the floor for any dtype).
FLOAT32_NEAR_TIE = 1e-3
# Logits of released models stay below this in magnitude (Gemma 2 caps them at 30).
LOGIT_CEILING = 32.0
# Explicit mantissa bits of each float dtype the logits can come in.
MANTISSA_BITS = {"bfloat16": 7, "float16": 10, "float32": 23, "float64": 52}

# Verdict kinds (ParityResult.to_dict()["verdict"], the window's headline).
IDENTICAL = "identical"  # T = 0, same tokens
NEAR_TIE = "near_tie"  # T = 0, a flip within the logits' rounding
DIVERGENCE = "divergence"  # T = 0, a flip at a clear margin: a bug
LENGTH = "length"  # one output is a prefix of the other
SAMPLES = "samples"  # T > 0: two samples, compared only in distribution


def dtype_name(dtype: object) -> str:
    return str(dtype).replace("mlx.core.", "")


def near_tie_threshold(dtype: str) -> float:
    """The AR logit margin below which a flip at T = 0 is floating point, for logits in `dtype`.

    Logits are rounded to their dtype's spacing, which grows with their magnitude: in bfloat16 those
    between 16 and 32 are 0.125 apart, so two runs that round differently can swap top-1 and top-2
    at margins of a step or two. The threshold is one step at LOGIT_CEILING (bfloat16 0.25, float16
    0.03125), never below 1e-3 (float32's, where accumulation order, not the last rounding, decides).
    """
    bits = MANTISSA_BITS.get(dtype_name(dtype))
    if bits is None:
        return FLOAT32_NEAR_TIE
    return max(FLOAT32_NEAR_TIE, 2.0 ** (math.floor(math.log2(LOGIT_CEILING)) - bits))


@dataclass(frozen=True)
class Verdict:
    kind: str  # one of the verdict kinds above
    near_tie: Optional[float]  # the threshold used (T = 0), None at T > 0
    text: str  # one clause, lower case: the CLI prints it, the window capitalises it


def parity_verdict(identical: bool, first: Optional[int], margin: Optional[float], temperature: float,
                   dtype: str, method: str = "DFlash") -> Verdict:
    """What the comparison of AR's and `method`'s outputs says, at this temperature and logits dtype."""
    if temperature > 0:
        seen = "identical outputs" if identical else f"outputs differ from token {first}"
        if margin is not None:
            seen += f" (AR logit margin there {margin:.3g})"
        return Verdict(SAMPLES, None, (
            f"{seen}; at temperature {temperature:g} AR and {method} draw their random numbers differently, so "
            f"these are two samples and a token difference says nothing about correctness: {method} is lossless "
            "in distribution, which a check over many seeds tests (the statistical tests in tests/test_sampling.py)"))
    threshold = near_tie_threshold(dtype)
    if identical:
        return Verdict(IDENTICAL, threshold, f"identical: {method} reproduced AR token for token")
    if margin is None:
        return Verdict(LENGTH, threshold, f"outputs differ from token {first} (one output is longer)")
    rule = f"the near-tie threshold for {dtype_name(dtype)} logits"
    if margin < threshold:
        return Verdict(NEAR_TIE, threshold, f"outputs differ from token {first}; AR logit margin there {margin:.3g}, "
                                            f"below {threshold:g} ({rule}): a near-tie flip (floating point)")
    return Verdict(DIVERGENCE, threshold, f"outputs differ from token {first}; AR logit margin there {margin:.3g}, "
                                          f"not below {threshold:g} ({rule}): a real divergence")


def round_in_ar_steps(dflash_decode_s: float, rounds: int, ar_tok_s: float) -> Optional[float]:
    """A DFlash round's whole cost (draft, verify, rollback, bookkeeping) in AR steps: the mean
    acceptance length at which DFlash breaks even with AR (2x needs twice it)."""
    if not rounds or not ar_tok_s:
        return None
    return round(dflash_decode_s / rounds * ar_tok_s, 3)


@dataclass
class ParityResult:
    identical: bool  # over the tokens compared: the whole outputs, or (stopped) those both runs wrote
    first_divergence: Optional[int]  # index into the generated tokens
    margin_at_divergence: Optional[float]  # AR's top-1 minus top-2 logit there
    ar: SummaryEvent
    dflash: Optional[SummaryEvent]  # None: Stop ended the AR run, and DFlash did not start
    temperature: float = 0.0
    logits_dtype: str = "float32"  # the dtype the target computes its logits in
    cancelled: bool = False  # Stop ended a run: only the tokens both runs wrote were compared

    @property
    def compared(self) -> int:
        """How many generated tokens the comparison covers."""
        if self.dflash is None:
            return 0
        a, b = len(self.ar.token_ids), len(self.dflash.token_ids)
        return min(a, b) if self.cancelled else max(a, b)

    @property
    def verdict(self) -> Verdict:
        return parity_verdict(self.identical, self.first_divergence, self.margin_at_divergence, self.temperature,
                              self.logits_dtype)

    @property
    def near_tie(self) -> Optional[float]:
        return self.verdict.near_tie

    @property
    def speedup(self) -> float:
        if self.dflash is None:
            return 0.0
        return self.dflash.tok_per_s / self.ar.tok_per_s if self.ar.tok_per_s else 0.0

    @property
    def ended_at_once(self) -> bool:
        """Both runs' first token was EOS: nothing decoded, so their rates (one token over no time) mean nothing."""
        return self.ar.ended_at_once and self.dflash is not None and self.dflash.ended_at_once

    @property
    def timed(self) -> bool:
        """Both runs decoded past their first token, so their rates and the speedup mean something."""
        return self.ar.timed and self.dflash is not None and self.dflash.timed

    @property
    def round_in_ar_steps(self) -> Optional[float]:
        d = self.dflash  # the real rounds' own time: auto's plain steps are no rounds
        if d is None:
            return None
        return round_in_ar_steps((d.mean_round_ms or 0.0) * d.num_rounds / 1000, d.num_rounds, self.ar.tok_per_s)

    def to_dict(self) -> dict:
        verdict, d = self.verdict, self.dflash
        return {
            "identical": self.identical,
            "first_divergence": self.first_divergence,
            "margin_at_divergence": self.margin_at_divergence,
            "verdict": verdict.kind,
            "near_tie": verdict.near_tie,
            "logits_dtype": self.logits_dtype,
            "temperature": self.temperature,
            "cancelled": self.cancelled,
            "compared": self.compared,
            "ended_at_once": self.ended_at_once,  # then the rates are one token over no decoding time: no speed
            "ar_tok_s": self.ar.tok_per_s,
            "dflash_tok_s": d.tok_per_s if d is not None else None,
            "timed": self.timed,  # False: one run wrote only its first token, and the rates are no speed
            "speedup": round(self.speedup, 4) if self.timed else None,
            "mean_acceptance_length": d.mean_acceptance_length if d is not None else None,
            "round_in_ar_steps": self.round_in_ar_steps,
            "mean_round_ms": d.mean_round_ms if d is not None else None,  # what round_in_ar_steps is made from
            "ar_tokens": self.ar.num_generated,
            "dflash_tokens": d.num_generated if d is not None else 0,
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


def divergence(pair: LoadedPair, prompt_ids: list[int], ar: list[int], other: list[int],
               priced: bool = True) -> tuple[Optional[int], Optional[float]]:
    """Where two outputs of one prompt part (None: identical) and, when `priced`, AR's logit margin
    there (None where one output is a prefix of the other: no token was chosen differently)."""
    where = first_divergence(ar, other)
    if not priced or where is None or where >= min(len(ar), len(other)):
        return where, None
    return where, logit_margin(pair, prompt_ids, ar[:where])


def output_verdict(pair: LoadedPair, prompt_ids: list[int], ar: SummaryEvent, other: SummaryEvent,
                   temperature: float, method: str = "DFlash") -> Verdict:
    """The parity verdict for two finished runs of one prompt (AR's first): at T = 0 a difference is
    priced by AR's logit margin where it starts, so a floating-point near-tie is named as one."""
    where, margin = divergence(pair, prompt_ids, ar.token_ids, other.token_ids, priced=temperature == 0)
    return parity_verdict(where is None, where, margin, temperature, dtype_name(pair.head.dtype), method)


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
        if cancel is not None and cancel.cancelled:
            break  # Stop during the AR run: DFlash does not start
    return compare_runs(pair, prompt_ids, summaries["ar"], summaries.get("dflash"), settings.sampling.temperature)


def compare_runs(pair: LoadedPair, prompt_ids: list[int], ar: SummaryEvent, dflash: Optional[SummaryEvent],
                 temperature: float) -> ParityResult:
    """The parity of two runs of one prompt. A run that Stop ended is compared over the tokens both
    wrote: its missing tail is no difference (a stopped run once read as a divergence at a clear margin)."""
    cancelled = dflash is None or "cancelled" in (ar.stop_reason, dflash.stop_reason)
    a, b = ar.token_ids, (dflash.token_ids if dflash is not None else [])
    if cancelled:
        n = min(len(a), len(b))
        a, b = a[:n], b[:n]
    where, margin = divergence(pair, prompt_ids, a, b)
    return ParityResult(where is None, where, margin, ar, dflash, temperature=temperature,
                        logits_dtype=dtype_name(pair.head.dtype), cancelled=cancelled)
