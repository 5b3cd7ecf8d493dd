"""DFlash rounds with --lookup check a copy against the drafter's own block before verifying it
(engine/decode/proposers.py LookupThenDrafter): the longer where one is a prefix of the other, the
run's evidence where they part. The drafter here is the hand-built oracle's, loaded from disk: it
drafts `second` at every block position, and what the target commits is given round by round."""

from __future__ import annotations

from typing import Optional

import pytest

from engine.decode.lookup import LONG_FROM, CopyJudge, LookupMatch
from engine.decode.proposers import DRAFTER, LOOKUP, DrafterProposer, LookupProposer, LookupThenDrafter
from engine.decode.sampling import Sampler
from engine.decode.settings import GenerationSettings, SamplingSettings

OTHER = 7  # an ordinary token neither the oracle target nor its drafter writes after `second`
BLOCK = 5  # the round's verify length: the block drafts 4


@pytest.fixture
def rounds(oracle_pair, oracle_ids):
    """make(temperature): a LookupThenDrafter over the oracle drafter."""
    pair = oracle_pair

    def make(temperature: float = 0.0, prompt: Optional[list[int]] = None) -> LookupThenDrafter:
        settings = GenerationSettings(sampling=SamplingSettings(temperature=temperature, seed=3))
        sampler = Sampler(settings.sampling)
        prompt = prompt or [5, 6, oracle_ids[0]]
        return LookupThenDrafter(DrafterProposer(pair, settings, sampler),
                                 LookupProposer(prompt, pair.head.vocab_size, sampler))
    return make


def copy_of(tokens: list[int], depth: int) -> tuple[LookupMatch, int]:
    return LookupMatch(tokens, 5, depth, 0), len(tokens)


def block_of(proposer: LookupThenDrafter, anchor: int):
    return proposer.drafter.propose(anchor, BLOCK, position=3, room=100)


def test_the_longer_of_a_copy_and_a_block_that_agree_is_verified(rounds, oracle_ids):
    second = oracle_ids[1]
    proposer = rounds()
    block = block_of(proposer, second)
    assert block.drafts.tolist() == [second] * (BLOCK - 1)
    long_copy = proposer.checked_copy(copy_of([second] * 20, LONG_FROM + 2), block, shallow=False)
    assert long_copy.source == LOOKUP and long_copy.drafts.tolist() == [second] * 20
    assert long_copy.choice == "the drafter's block agrees with the copy, which runs further"
    short_copy = proposer.checked_copy(copy_of([second] * 2, 3), block, shallow=True)
    assert short_copy is block  # the block holds the copy and drafts further


def test_deep_copies_the_target_leaves_are_passed_over_once_the_drafter_proves_right(rounds, oracle_ids):
    """Before evidence a deep copy wins a split (the target usually copies); each split scores both
    against what was committed, and after a few where the target followed the drafter, the block."""
    second = oracle_ids[1]
    proposer = rounds()
    wrong = copy_of([second, OTHER, OTHER, OTHER, OTHER, OTHER], LONG_FROM + 4)
    chosen = []
    for _ in range(4):
        proposal = proposer.checked_copy(wrong, block_of(proposer, second), shallow=False)
        chosen.append(proposal.source)
        proposer.observe([second] * BLOCK, None)  # the target wrote what the drafter drafted
    assert chosen == [LOOKUP, LOOKUP, LOOKUP, DRAFTER]
    fresh = rounds()
    first = fresh.checked_copy(wrong, block_of(fresh, second), shallow=False)
    assert first.choice == "copy and block part at draft 2; too few splits seen yet: the copy"
    assert proposal.choice == "copy and block part at draft 2; this run's splits favour the drafter"
    assert proposer.split_judge.copies == [2, 2, 2, 2] and proposer.split_judge.drafter == [5, 5, 5, 5]


def test_deep_copies_the_target_follows_keep_winning_splits(rounds, oracle_ids):
    second = oracle_ids[1]
    proposer = rounds()
    right = copy_of([second, OTHER, OTHER, OTHER, OTHER, OTHER], LONG_FROM + 4)
    for _ in range(6):
        proposal = proposer.checked_copy(right, block_of(proposer, second), shallow=False)
        assert proposal.source == LOOKUP
        proposer.observe([second, OTHER, OTHER, OTHER, OTHER, OTHER, second], None)


def test_at_t_above_zero_the_check_reads_the_drafters_argmax_not_its_samples(rounds, oracle_ids):
    """The oracle drafter's argmax is `second`, but at T = 1 over a 4,096-token vocabulary its samples
    almost never are. A copy of `second`s agrees with the argmax and is verified; were the choice
    made on the samples, the block drawn from q cut where it meets the copy would be verified with
    q's ratios, and the output would leave the target's distribution."""
    second = oracle_ids[1]
    proposer = rounds(temperature=1.0)
    proposer.split_judge = CopyJudge(prior=False)  # a split goes to the block
    block = block_of(proposer, second)
    assert block.drafts.tolist() != [second] * (BLOCK - 1)  # what it sampled
    assert proposer.checked_copy(copy_of([second] * 12, LONG_FROM + 2), block, shallow=False).source == LOOKUP
    assert proposer.checked_copy(copy_of([OTHER] * 12, LONG_FROM + 2), block, shallow=False) is block


def test_while_shallow_copies_are_preferred_the_drafter_is_still_heard(rounds, oracle_ids):
    """A run whose drafter was weak early (its first blocks miss) prefers shallow copies; the block is
    still drafted beside each one and scored, so the run returns to the drafter once it is better."""
    second = oracle_ids[1]
    proposer = rounds()
    for _ in range(3):
        proposer.shallow_judge.drafter_round(1)
        proposer.shallow_judge.copy_round(3)
    shallow = copy_of([second, second, OTHER, OTHER], 4)
    taken = []
    for _ in range(8):
        if not proposer.shallow_judge.prefers_copy():
            break
        proposal = proposer.checked_copy(shallow, block_of(proposer, second), shallow=True)
        taken.append(proposal.source)
        proposer.observe([second] * 3, None)  # the copy's two, then the target's `second`
        proposer.record(proposal, accepted=2)
    assert taken and set(taken) == {LOOKUP}
    judge = proposer.shallow_judge
    assert judge.copies[-len(taken):] == [3] * len(taken)  # each copy taken is scored once, as verified
    assert len(judge.copies) == min(judge.window, 3 + len(taken))
    assert judge.drafter[-len(taken):] == [4] * len(taken)  # and the block beside it, as it would have done
    assert not judge.prefers_copy()


def test_a_flowing_copy_is_verified_without_drafting_a_block_beside_it(alternating_pair, oracle_ids, monkeypatch):
    """The alternating oracle's output repeats itself, so once the copy runs deep every copy is right:
    after the first long copy accepted in full, the drafter is not run again for the check."""
    from helpers import run

    calls = []
    propose = DrafterProposer.propose

    def counted(self, *args, **kwargs):
        calls.append(1)
        return propose(self, *args, **kwargs)

    monkeypatch.setattr(DrafterProposer, "propose", counted)
    pair = alternating_pair
    _, rounds = run(pair, [7, 8, oracle_ids[0]], max_tokens=120, lookup=True)
    copies = [r for r in rounds if r.source == LOOKUP]
    drafted = [r for r in rounds if r.source == DRAFTER]
    assert len(copies) >= 4 and all(r.accepted == len(r.drafted) for r in copies)
    assert len(drafted) <= len(calls) <= len(drafted) + 1  # one check before the first long copy
    assert all(r.choice.startswith("a copy flowing") for r in copies[1:])  # the window's tooltip says why


def test_a_plain_step_ends_a_flowing_copy(rounds, oracle_ids):
    """Only a round's own long copy accepted in full lets the next deep copy through unchecked: after
    a plain step (observed, never recorded) the next deep copy is checked again."""
    second = oracle_ids[1]
    proposer = rounds()
    copy = proposer.checked_copy(copy_of([second] * 12, LONG_FROM + 2), block_of(proposer, second), shallow=False)
    proposer.observe([second] * 13, None)
    proposer.record(copy, accepted=12)
    assert proposer.flowing
    proposer.observe([second], None)  # a plain step
    assert not proposer.flowing


def test_why_a_round_took_its_drafts_travels_in_traces(alternating_pair, oracle_ids):
    from engine.decode.events import from_dict, to_dict
    from helpers import run

    _, rounds = run(alternating_pair, [7, 8, oracle_ids[0]], max_tokens=60, lookup=True)
    r = next(r for r in rounds if r.choice)
    assert from_dict(to_dict(r)) == r
    from app.rounds_view import round_tooltip

    assert f"\nwhy these drafts: {r.choice}\naccepted {r.accepted} of" in round_tooltip(r, None)  # the window says it
    with pytest.raises(ValueError, match="'choice' = 3"):
        from_dict(to_dict(r) | {"choice": 3})


def test_plain_steps_score_shallow_copies_and_end_once_they_pay(rounds):
    """Auto's plain steps propose nothing, so a shallow match seen between them is a probe: scored
    against the tokens the next steps commit, as a round verifying it would have committed. Once
    probes have paid, a shallow match is a copy worth a round (copy_ready ends the stretch)."""
    proposer = rounds(prompt=[5, 6, 7, 9, 11, 5, 6])
    step(proposer, 7)  # (5, 6, 7) was seen: the probe copies 9, 11, 5, 6
    assert proposer.probe == ([9, 11, 5, 6], [])
    for token in (9, 3):  # the steps part from it at its second token
        step(proposer, token)
    assert proposer.shallow_judge.copies == [2] and proposer.probe is None
    proposer = rounds(prompt=[5, 6, 7, 9, 11, 5, 6])
    for token in (7, 9, 11, 5, 6):  # the steps follow it all the way
        step(proposer, token)
    assert proposer.shallow_judge.copies[0] == 5

    # three snippets, each re-emitted up to a changed last token: each probe commits 3 + 1
    proposer = rounds(prompt=[1, 2, 3, 4, 5, 50, 11, 12, 13, 14, 15, 51, 21, 22, 23, 24, 25, 52])
    for snippet in ((1, 2, 3, 4, 5, 60), (11, 12, 13, 14, 15, 61), (21, 22)):
        for token in snippet:
            step(proposer, token)
    assert proposer.shallow_judge.copies == [4, 4]
    assert not proposer.copy_ready()  # a shallow match, but two probes are no evidence yet
    for token in (23, 24, 25, 62, 1, 2):
        step(proposer, token)
    assert proposer.shallow_judge.copies == [4, 4, 4]
    assert proposer.copy_ready()  # now a shallow match ends the stretch: a round verifies it


def step(proposer: LookupThenDrafter, token: int) -> None:
    """What auto's plain step tells the proposer (engine/decode/speculative.py plain_steps)."""
    proposer.observe([token], None)
    proposer.stepped([token])
