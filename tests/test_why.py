"""Why acceptance is what it is: per drafted position, the drafter's and the target's confidence."""

from __future__ import annotations

import pytest

from engine.decode.decoder import generate
from engine.decode.events import RoundEvent, from_dict, to_dict
from engine.decode.prompts import encode_prompt
from engine.decode.settings import GenerationSettings, SamplingSettings
from engine.models.pair import load_pair


def _rounds(pair, prompt: str, **settings) -> list[RoundEvent]:
    ids = encode_prompt(pair.tokenizer, prompt, False)
    return [e for e in generate(pair, ids, GenerationSettings(max_tokens=40, **settings)) if isinstance(e, RoundEvent)]


@pytest.mark.parametrize("which", ["random", "alternating"])
def test_greedy_rounds_say_where_and_why_they_broke(which, qwen3_pair, alternating_dirs):
    pair = qwen3_pair if which == "random" else load_pair(*alternating_dirs)
    rounds = _rounds(pair, "def add(a, b):")
    assert rounds
    for r in rounds:
        n = len(r.drafted)
        assert len(r.draft_p) == len(r.target_p) == len(r.margin) == len(r.target_rank) == n
        assert all(0.0 <= p <= 1.0 for p in r.draft_p + r.target_p) and all(m >= 0 for m in r.margin)
        # greedy: an accepted draft is the drafter's first choice and the target's, so the target's
        # choice ranks first in the drafter's distribution
        assert all(rank == 0 for rank in r.target_rank[: r.accepted])
        if r.accepted < n:  # the draft that broke: the target chose something else
            assert r.target_rank[r.accepted] > 0
    if which == "alternating":  # each round accepts exactly one draft and breaks at the second
        assert all(r.accepted == 1 for r in rounds if len(r.drafted) > 1)


def test_sampled_rounds_carry_the_fields_and_traces_round_trip(qwen3_pair):
    rounds = _rounds(qwen3_pair, "x = 1", sampling=SamplingSettings(temperature=0.8, seed=3))
    r = next(r for r in rounds if r.drafted)
    assert len(r.draft_p) == len(r.drafted)
    again = from_dict(to_dict(r))
    assert again == r
    old = {k: v for k, v in to_dict(r).items() if k not in ("draft_p", "target_p", "margin", "target_rank")}
    assert from_dict(old).draft_p == []  # traces written before these fields still open
