"""Why acceptance is what it is: per drafted position, the drafter's and the target's confidence."""

from __future__ import annotations

import mlx.core as mx
import pytest

from engine.decode.generate import generate
from engine.decode.events import RoundEvent, from_dict, to_dict
from engine.decode.prompts import encode_prompt
from engine.decode.settings import GenerationSettings, SamplingSettings
from engine.models.pair import load_pair
from engine.runtime.streams import STREAM

from fixtures.tiny_dflash2 import write_dflash2_drafter


@pytest.fixture(scope="module")
def dflash2_pair(qwen3_untied_dirs, tmp_path_factory):
    target = qwen3_untied_dirs[0]
    return load_pair(target, write_dflash2_drafter(tmp_path_factory.mktemp("dflash2") / "drafter", target, seed=5))


def _rounds(pair, prompt: str, **settings) -> list[RoundEvent]:
    ids = encode_prompt(pair.tokenizer, prompt, False)
    return [e for e in generate(pair, ids, GenerationSettings(max_tokens=40, **settings)) if isinstance(e, RoundEvent)]


@pytest.mark.parametrize("which", ["random", "alternating"])
def test_greedy_rounds_say_where_and_why_they_broke(which, qwen3_pair, alternating_pair):
    pair = qwen3_pair if which == "random" else alternating_pair
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


def test_the_host_tables_equal_the_mlx_ones():
    """On a CPU the decoder computes the why and selector tables in numpy; they must be the tables
    the MLX graphs (used on a GPU) give, field by field."""
    import mlx.core as mx
    import numpy as np

    from engine.decode.drafts import selector_table, selector_table_on_host
    from engine.decode.why import explain, explain_on_host
    from engine.models.drafter2 import Selection

    rng = np.random.default_rng(0)
    n, vocab, k = 7, 300, 5
    draft_logits = rng.normal(0, 3, (n, vocab)).astype(np.float32)
    target_logits = rng.normal(0, 3, (n + 1, vocab)).astype(np.float32)
    drafts = rng.integers(0, vocab, n).astype(np.int32)
    drafts[:3] = target_logits[:3].argmax(-1)  # some drafts the target agrees with
    target_logits[4, [10, 20]] = target_logits[4].max() + 1.0  # a tie at the top: margin 0
    before = target_logits.copy()
    on_mlx = np.array(explain(mx.array(draft_logits), mx.array(target_logits), mx.array(drafts)))
    for a in (draft_logits, target_logits):
        a.flags.writeable = False  # on the CPU they are read-only views of MLX's memory
    on_host = explain_on_host(draft_logits, target_logits, drafts)
    np.testing.assert_allclose(on_host, on_mlx, rtol=1e-5, atol=1e-6)
    assert on_host[2, 4] == 0.0 and (target_logits == before).all()  # its inputs as they were
    copy_on_mlx = np.array(explain(None, mx.array(target_logits), mx.array(drafts)))  # a copy: no draft logits
    copy_on_host = explain_on_host(None, target_logits, drafts)
    np.testing.assert_allclose(copy_on_host, copy_on_mlx, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(copy_on_host[1:3], on_host[1:3])  # the target's side is the same table's
    assert (copy_on_host[0] == 1.0).all() and copy_on_host[3].tolist() == [0, 0, 0] + [1] * (n - 3)

    candidates = np.stack([rng.permutation(vocab)[:k] for _ in range(n)]).astype(np.int32)
    candidates[:2, 1] = target_logits[:2].argmax(-1)  # the target's choice among them, not first
    selection = Selection(mx.array(drafts), mx.array(candidates), mx.array(rng.normal(size=(n, k)).astype(np.float32)),
                          mx.array(draft_logits.argmax(-1).astype(np.int32)), None)
    mlx_table = [np.array(a) for a in selector_table(selection, mx.array(target_logits), n)]
    host_table = selector_table_on_host(candidates=candidates, plain_top=np.array(selection.plain_top),
                                        scores=np.array(selection.scores), target_logits=target_logits, n=n)
    for mine, theirs in zip(host_table, mlx_table):
        np.testing.assert_allclose(mine, theirs, rtol=1e-6)
    assert (host_table[2][:2] >= 0).all()


def test_the_command_line_computes_the_tables_only_for_a_trace(tmp_path):
    import argparse

    from engine.tools.cli import _settings

    args = argparse.Namespace(temperature=0.0, seed=0, max_tokens=8, block_size=None)
    assert _settings(args, "dflash").diagnostics is False
    assert _settings(argparse.Namespace(**vars(args), trace=str(tmp_path / "t.jsonl")), "dflash").diagnostics


def _without_times(event):
    from dataclasses import replace

    if isinstance(event, RoundEvent):
        return replace(event, draft_ms=0.0, verify_ms=0.0, rollback_ms=0.0, t=0.0)
    return replace(event, t=0.0) if hasattr(event, "t") else event


@pytest.mark.parametrize("which", ["dflash", "dflash2"])
def test_rounds_held_for_their_host_tables_come_out_as_in_line_ones(which, request, monkeypatch):
    """On the CPU a round's tables are computed on a thread of their own while the next round runs,
    and the round is given out with them a round late: the run's events must be those of tables
    computed in line by the MLX graphs (a GPU's way), in the same order, each round's text after it."""
    import engine.decode.speculative as speculative
    from engine.decode.events import SummaryEvent
    from engine.decode.round_record import RoundRecorder

    pair = request.getfixturevalue("qwen3_pair" if which == "dflash" else "dflash2_pair")
    ids = encode_prompt(pair.tokenizer, "def add(a, b):", False)

    def events(host: bool) -> list:
        monkeypatch.setattr(speculative, "RoundRecorder", lambda on_host: RoundRecorder(on_host=host))
        settings = GenerationSettings(max_tokens=48, block_size=8, sampling=SamplingSettings(temperature=0.0))
        return [e for e in generate(pair, ids, settings) if not isinstance(e, SummaryEvent)]

    held, in_line = events(True), events(False)
    rounds = [e for e in held if isinstance(e, RoundEvent)]
    assert len(rounds) > 3 and all(len(r.draft_p) == len(r.drafted) for r in rounds)
    assert [type(e) for e in held] == [type(e) for e in in_line]
    for mine, theirs in zip(held, in_line):
        mine, theirs = _without_times(mine), _without_times(theirs)
        if isinstance(mine, RoundEvent):
            for name in ("draft_p", "target_p", "margin"):
                assert getattr(mine, name) == pytest.approx(getattr(theirs, name), abs=2e-3), name
                setattr(mine, name, getattr(theirs, name))
        assert mine == theirs
    for a, b in zip(held, held[1:]):  # each round is followed by its own text
        if isinstance(a, RoundEvent):
            assert b.round == a.index and b.token_ids == a.committed


def test_a_stopped_run_gives_out_every_round_it_committed_with_its_tables(qwen3_pair):
    """Stop while a round is held for its tables: that round still comes out, with them, before the
    summary, so the rounds account for every token the summary holds."""
    from engine.decode.cancel import CancelToken
    from engine.decode.events import SummaryEvent, TextEvent

    ids = encode_prompt(qwen3_pair.tokenizer, "def add(a, b):", False)
    cancel, events = CancelToken(), []
    for event in generate(qwen3_pair, ids, GenerationSettings(max_tokens=200, block_size=8), cancel):
        events.append(event)
        if isinstance(event, RoundEvent):
            cancel.cancel()
    summary = events[-1]
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    assert isinstance(summary, SummaryEvent) and summary.stop_reason == "cancelled"
    held = int(STREAM.device == mx.cpu)  # host tables (the CPU) hold a round; a GPU's are computed in line
    assert len(rounds) == 1 + held  # the one seen when Stop was pressed, and the one held then
    assert all(len(r.draft_p) == len(r.drafted) > 0 for r in rounds)
    first = next(e for e in events if isinstance(e, TextEvent)).token_ids
    assert first + [t for r in rounds for t in r.committed] == summary.token_ids


def test_copies_and_a_draft_models_drafts_say_how_sure_each_side_was(qwen3_pair, qwen3_tied_dirs, monkeypatch):
    """Every drafted round carries the tables, whoever proposed. A copy (lookup) is certain of each token:
    draft_p 1, and the target's choice ranks 0 where it is the copied token, 1 where the copy broke. A draft
    model that is the target itself is exactly as sure of each draft as the target is."""
    from engine.decode.lookup import LookupMatch
    from engine.decode.proposers import LookupProposer

    ids = encode_prompt(qwen3_pair.tokenizer, "def add(a, b):", False)
    greedy = [e for e in generate(qwen3_pair, ids, GenerationSettings(mode="ar", max_tokens=40))][-1].token_ids
    vocab = qwen3_pair.head.vocab_size

    def match(self, limit):  # the greedy continuation, its third token spoiled: each copy breaks there
        tokens = list(greedy[len(self.index) - len(ids):][:4])
        if len(tokens) == 4:
            tokens[2] = (tokens[2] + 1) % vocab
        return (LookupMatch(tokens, 5, 20, 0), min(limit, len(tokens))) if tokens and limit > 0 else None

    monkeypatch.setattr(LookupProposer, "match", match)
    copies = [r for r in _rounds(qwen3_pair, "def add(a, b):", mode="lookup") if r.drafted]
    assert copies and all(r.source == "lookup" for r in copies)
    assert any(r.accepted == 2 < len(r.drafted) for r in copies)
    for r in copies:
        n = len(r.drafted)
        assert r.draft_p == [1.0] * n and len(r.target_p) == len(r.margin) == n
        assert r.target_rank == [0] * r.accepted + [1] * (r.accepted < n) + r.target_rank[r.accepted + 1:]
        assert all(0.0 <= p <= 1.0 for p in r.target_p) and all(m >= 0 for m in r.margin)

    own = [r for r in _rounds(qwen3_pair, "def add(a, b):", mode="draft-model", draft_model=str(qwen3_tied_dirs[0]),
                              num_draft=4) if r.drafted]
    assert own and all(r.source == "draft-model" for r in own)
    for r in own:
        assert r.accepted == len(r.drafted) and r.target_rank == [0] * len(r.drafted)
        assert r.draft_p == pytest.approx(r.target_p, abs=2e-3)
