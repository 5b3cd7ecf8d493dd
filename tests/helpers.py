"""Small helpers shared by tests."""

from __future__ import annotations

from collections import Counter

from engine.decode.events import RoundEvent, SummaryEvent
from engine.decode.generate import generate
from engine.decode.settings import GenerationSettings
from engine.decode.prompts import encode_prompt


def run(pair, prompt, **settings):
    """(summary, rounds) of one generation of a raw prompt."""
    ids = encode_prompt(pair.tokenizer, prompt, chat=False) if isinstance(prompt, str) else prompt
    rounds, summary = [], None
    for event in generate(pair, ids, GenerationSettings(**settings)):
        if isinstance(event, RoundEvent):
            rounds.append(event)
        elif isinstance(event, SummaryEvent):
            summary = event
    return summary, rounds


def in_thread(fn):
    """Run fn() on a new thread; return its result or re-raise its exception here."""
    import threading

    box = {}

    def work():
        try:
            box["result"] = fn()
        except BaseException as exc:  # surfaced in the calling thread
            box["error"] = exc

    t = threading.Thread(target=work)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def assert_same_distribution(samples: dict[str, Counter], alpha: float = 1e-3) -> None:
    """Two samplers' outcome counts ({name: Counter}) come from one distribution (chi-square test of
    the contingency table; outcomes seen fewer than 10 times pooled) and cover at least 3 outcomes
    seen often, so the test sees a real distribution, not one outcome."""
    from scipy.stats import chi2_contingency

    a, b = samples.values()
    keys = sorted(set(a) | set(b))
    common = [k for k in keys if a[k] + b[k] >= 10]
    rare = [k for k in keys if k not in common]
    table = [[c[k] for k in common] + ([sum(c[k] for k in rare)] if rare else []) for c in (a, b)]
    assert len(common) >= 3, samples
    assert chi2_contingency(table).pvalue > alpha, samples
