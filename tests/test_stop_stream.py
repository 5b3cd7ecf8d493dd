"""The stream never shows text the summary cuts: a stop string's first characters are held back
until the tokens after them complete the stop or rule it out."""

import pytest

from engine.decode.events import SummaryEvent, TextEvent
from engine.decode.generate import generate
from engine.decode.output import OutputTracker
from engine.decode.prompts import encode_prompt
from engine.decode.settings import GenerationSettings

from helpers import PROMPTS, run


def stream(pair, ids, **settings):
    """(streamed text pieces, summary) of one run."""
    pieces, summary = [], None
    for event in generate(pair, ids, GenerationSettings(**settings)):
        if isinstance(event, TextEvent):
            pieces.append(event.text)
        elif isinstance(event, SummaryEvent):
            summary = event
    return pieces, summary


def straddling_stop(pair, ids) -> tuple[str, int]:
    """A stop string whose first character ends one token and whose second begins the next, first
    seen there; and where it starts in the output."""
    ar, _ = run(pair, ids, mode="ar", max_tokens=40)
    text = ar.text
    ends = [len(pair.tokenizer.decode(ar.token_ids[: i + 1])) for i in range(len(ar.token_ids))]
    for end in ends:
        stop = text[end - 1 : end + 1]
        if end >= 1 and len(stop) == 2 and text.find(stop) == end - 1 and not stop.isspace():
            return stop, end - 1
    pytest.fail(f"no stop string straddles two tokens in {text!r}")


@pytest.mark.parametrize("mode", ["ar", "dflash"])
def test_stream_equals_summary_with_a_straddling_stop(qwen3_pair, mode):
    ids = encode_prompt(qwen3_pair.tokenizer, PROMPTS[0], chat=False)
    stop, cut = straddling_stop(qwen3_pair, ids)
    pieces, summary = stream(qwen3_pair, ids, mode=mode, max_tokens=40, stop_strings=(stop,))
    assert summary.stop_reason == "stop_string" and len(summary.text) == cut
    shown = ""
    for piece in pieces:
        shown += piece
        assert summary.text.startswith(shown), (stop, shown, summary.text)  # never more than the summary keeps
    assert shown == summary.text


def test_held_back_text_is_released_when_the_stop_does_not_follow(qwen3_pair):
    """A possible stop that the next token rules out, or that the output ends on, still reaches the stream."""
    ids = encode_prompt(qwen3_pair.tokenizer, PROMPTS[0], chat=False)
    ar, _ = run(qwen3_pair, ids, mode="ar", max_tokens=40)
    out = OutputTracker(qwen3_pair.tokenizer, 40, stop_strings=(ar.text[-1] + "\x00never",))
    shown = ""
    for token in ar.token_ids:
        out.add(token)
        shown += out.take_delta()
        assert ar.text.startswith(shown)
    assert out.stop_reason == "max_tokens" and shown == ar.text
    pieces, summary = stream(qwen3_pair, ids, mode="dflash", max_tokens=40, stop_strings=(ar.text[-1] + "\x00",))
    assert "".join(pieces) == summary.text == ar.text
