"""Small helpers shared by tests."""

from __future__ import annotations

from engine.decode.events import RoundEvent, SummaryEvent
from engine.decode.decoder import generate
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
