"""`bench --block-sizes 2,4,8,16,auto`: every block size measured on the same prompts, next to
what the advisor predicted for it from one of them.

Per prompt and repeat: one AR run, then one DFlash run per block size. The advisor learns from
the runs at the largest fixed size (all prompts pooled) and the cost curve, and predicts every
size; the table puts the prediction beside the measurement. Every size runs the drafter alone
(lookup off, whatever the run's settings say): a sweep of block sizes is about the drafter, and
copies verified instead of its blocks would blur both the measurements and the advisor's input.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Callable, Optional, Union

from engine.decode.advisor import advise
from engine.decode.cancel import CancelToken
from engine.decode.cost_curve import cost_curve
from engine.decode.settings import MAX_BLOCK, GenerationSettings
from engine.decode.stats import RoundStats
from engine.errors import DFlashError
from engine.models.pair import LoadedPair
from engine.tools.bench import check_prompts, run_once, tok_per_s, warm_up

Size = Union[int, str]


def parse_sizes(text: str) -> list[Size]:
    """'2,4,8,16,auto' -> [2, 4, 8, 16, 'auto'], each size once, in the order given."""
    sizes: list[Size] = []
    for part in text.split(","):
        part = part.strip()
        size: Size
        if part == "auto":
            size = part
        else:
            try:
                size = int(part)
            except ValueError:
                raise DFlashError(f"block sizes: '{part}' is not a whole number or 'auto'.") from None
            if not 1 <= size <= MAX_BLOCK:
                raise DFlashError(f"block sizes: {size} is outside 1..{MAX_BLOCK}.")
        if size not in sizes:
            sizes.append(size)
    if not any(isinstance(s, int) for s in sizes):
        raise DFlashError("block sizes: give at least one fixed size; the advisor learns from it.")
    return sizes


def _settings_for(settings: GenerationSettings, size: Size) -> GenerationSettings:
    if size == "auto":
        return replace(settings, mode="dflash", block_size=None, auto=True, lookup=False)
    return replace(settings, mode="dflash", block_size=int(size), auto=False, lookup=False)


def run_block_sizes(
    pair: LoadedPair,
    prompts: list[tuple[str, list[int]]],
    settings: GenerationSettings,
    sizes: list[Size],
    repeats: int = 1,
    progress: Callable[[str], None] = lambda msg: None,
    cancel: Optional[CancelToken] = None,
) -> dict:
    if repeats < 1:
        raise DFlashError(f"repeats {repeats} must be at least 1.")
    for size in sizes:  # every size checked against the drafter before anything is measured
        _settings_for(settings, size).resolved(pair)
    check_prompts(pair, prompts, settings.max_tokens)
    curve, _ = cost_curve(pair, window=settings.draft_window, sink=settings.draft_sink, progress=progress,
                          cancel=cancel, sampling=settings.sampling)
    ar_settings = replace(settings, mode="ar")
    progress("warm-up")
    all_ids = [ids for _, ids in prompts]
    for size in sizes:  # each size verifies blocks of its own shapes, compiled on first use
        warm_up(pair, all_ids, ar_settings, _settings_for(settings, size), cancel)

    ar_all: list = []
    runs: dict[Size, list] = {s: [] for s in sizes}  # (summary, rounds) per prompt and repeat
    per_prompt = []
    for n, (text, ids) in enumerate(prompts, 1):
        ar_runs, mine = [], {s: [] for s in sizes}
        for r in range(repeats):
            progress(f"prompt {n}/{len(prompts)}, repeat {r + 1}/{repeats}")
            ar_runs.append(run_once(pair, ids, ar_settings, cancel)[0])
            for size in sizes:
                mine[size].append(run_once(pair, ids, _settings_for(settings, size), cancel)[:2])
        ar_tok_s = tok_per_s(ar_runs)
        rounds = {s: sum(len(m[1]) for m in mine[s]) for s in sizes}
        per_prompt.append({
            "prompt": text,
            "ar_tok_s": round(ar_tok_s, 3),
            "ar_tokens": sum(s.num_generated for s in ar_runs),
            "rounds": min(rounds.values()),
            # no rounds at a size: the output ended at its first token, and a ratio would be noise
            "speedup": {str(s): round(tok_per_s([m[0] for m in mine[s]]) / ar_tok_s, 4) if rounds[s] else None
                        for s in sizes},
            "tau": {str(s): RoundStats.of(r for m in mine[s] for r in m[1]).tau for s in sizes},
        })
        ar_all += ar_runs
        for size in sizes:
            runs[size] += mine[size]

    ar_tok_s = tok_per_s(ar_all)
    source = max(s for s in sizes if isinstance(s, int))
    advice = advise([r for _, rounds in runs[source] for r in rounds], sum(s.decode_s for s, _ in runs[source]),
                    curve, ar_tok_s, block=source)
    overall = {}
    for size in sizes:
        measured = tok_per_s([s for s, _ in runs[size]]) / ar_tok_s
        predicted = None
        if advice is not None:
            predicted = advice.auto_speedup if size == "auto" else (
                advice.speedup_at(int(size)) if int(size) <= source else None)
        drafted = any(size_rounds for _, size_rounds in runs[size])
        overall[str(size)] = {
            "speedup": round(measured, 4) if drafted else None,
            "predicted_speedup": predicted,
            "error": round(predicted / measured - 1, 4) if predicted else None,
            "tau": RoundStats.of(r for _, rounds in runs[size] for r in rounds).tau,
            # runs[size] is in the same prompt and repeat order as ar_all
            "identical": all(a.token_ids == s.token_ids for a, (s, _) in zip(ar_all, runs[size])),
        }
    return {
        "sizes": [str(s) for s in sizes],
        "advisor_source": source,
        "ar_tok_s": round(ar_tok_s, 3),
        "overall": overall,
        "advice": advice.to_dict() if advice else None,
        "per_prompt": per_prompt,
        "prompts": len(prompts),
        "repeats": repeats,
        "max_tokens": settings.max_tokens,
        "temperature": settings.sampling.temperature,
        "sampling": asdict(settings.sampling),
    }
