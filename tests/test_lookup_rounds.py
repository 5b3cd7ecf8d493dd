"""Context lookup in the round loop: --mode lookup (copies alone, no drafter) and DFlash rounds that
verify a copy instead of the drafter's block (--lookup). Lossless at T = 0, exact at T > 0."""

from __future__ import annotations

from collections import Counter

import pytest

from engine.decode.events import PLAIN
from engine.decode.prompts import encode_prompt
from engine.decode.settings import LOOKUP_MAX_DRAFT, GenerationSettings, SamplingSettings
from engine.errors import SettingsError
from engine.models.pair import load_pair
from engine.tools.parity import run_parity

from distribution import RUNS, check_exactness, exact_outcomes, verified_unfiltered
from helpers import PROMPTS, run


def test_lookup_mode_needs_no_drafter_and_copies_a_repeating_output(alternating_dirs, oracle_ids):
    """The alternating oracle writes second, third, second, ...: once the pattern is in the context
    every copy is right, and a deep match earns drafts past a DFlash block."""
    pair = load_pair(alternating_dirs[0], None)  # the target alone
    ids = [7, 8, oracle_ids[0]]
    ar, _ = run(pair, ids, mode="ar", max_tokens=80)
    lookup, rounds = run(pair, ids, mode="lookup", max_tokens=80)
    assert lookup.token_ids == ar.token_ids and lookup.mode == "lookup"
    copies = [r for r in rounds if r.source == "lookup"]
    assert copies and max(len(r.drafted) for r in copies) > 16 and max(r.verified for r in copies) <= LOOKUP_MAX_DRAFT + 1
    assert all(r.accepted == len(r.drafted) for r in copies)
    assert all(r.bonus_kind == PLAIN and r.source is None for r in rounds if not r.drafted)  # no copy yet: a step
    assert lookup.num_rounds == len(copies) and lookup.num_plain_steps == len(rounds) - len(copies)
    assert all(r.draft_context is None for r in rounds)


def test_dflash_rounds_take_a_copy_where_it_runs_deep_and_stay_lossless(alternating_pair, oracle_ids, qwen3_pair):
    pair = alternating_pair
    ids = [7, 8, oracle_ids[0]]
    ar, _ = run(pair, ids, mode="ar", max_tokens=80)
    mixed, rounds = run(pair, ids, max_tokens=80, lookup=True)
    assert mixed.token_ids == ar.token_ids
    sources = Counter(r.source for r in rounds)
    assert sources["drafter"] and sources["lookup"]  # the drafter until the copy runs deep, then copies
    first_copy = next(i for i, r in enumerate(rounds) if r.source == "lookup")
    assert all(r.source == "lookup" for r in rounds[first_copy:-1])
    # copies run past the drafter's block: the summary's histogram and per-position rates keep them
    longest = max(len(r.drafted) for r in rounds)
    block = pair.drafter.cfg.block_size
    assert longest > block - 1 and len(mixed.per_position_acceptance) == longest
    assert sum(mixed.acceptance_histogram) == mixed.num_rounds == len([r for r in rounds if r.drafted])
    assert mixed.acceptance_histogram[longest] == sum(r.accepted == longest for r in rounds)
    for prompt in PROMPTS:  # a random target: copies only where its own output repeats
        prompt_ids = encode_prompt(qwen3_pair.tokenizer, prompt + prompt, chat=False)
        assert run_parity(qwen3_pair, prompt_ids, GenerationSettings(max_tokens=48, lookup=True)).identical


def test_lookup_mode_refuses_what_it_cannot_take(qwen3_pair):
    assert GenerationSettings(mode="lookup", block_size=4, auto=True).resolved(qwen3_pair).block_size is None
    with pytest.raises(SettingsError, match="mode 'copy'"):
        GenerationSettings(mode="copy").resolved(qwen3_pair)


@pytest.mark.parametrize("mutation", [None, verified_unfiltered], ids=["exact", "mutated"])
@pytest.mark.parametrize("mode, extra, splits_to", [("lookup", {}, None),
                                                    ("dflash", {"lookup": True, "block_size": 4}, "copy"),
                                                    ("dflash", {"lookup": True, "block_size": 4}, "drafter")])
def test_sampling_with_copies_is_exact(qwen3_pair, monkeypatch, mode, extra, splits_to, mutation):
    """A copy has no distribution of its own: verified with q one-hot on it, the first two tokens are
    distributed as AR's. A random target rarely copies, so every round here is offered a deep
    'copy' of the greedy continuation (likely tokens, often accepted, sometimes not). In DFlash
    rounds the copy is checked against the random drafter's block, which parts from it: the split
    goes to the copy (as before any evidence) or, with the judge made to prefer the drafter, to the
    block, whose drafts were sampled beside a copy they were compared to only by their argmax."""
    from engine.decode.lookup import CopyJudge, LookupMatch
    from engine.decode.proposers import LookupProposer

    ids = encode_prompt(qwen3_pair.tokenizer, PROMPTS[1], chat=False)
    greedy, _ = run(qwen3_pair, ids, mode="ar", max_tokens=12)

    def match(self, limit):
        done = len(self.index) - len(ids)  # tokens generated so far
        tokens = greedy.token_ids[done:done + 3]
        return (LookupMatch(tokens, 5, 20, 0), min(limit, len(tokens))) if tokens and limit > 0 else None

    monkeypatch.setattr(LookupProposer, "match", match)
    if splits_to == "drafter":
        monkeypatch.setattr(CopyJudge, "prefers_copy", lambda self: False)
    exact = exact_outcomes(qwen3_pair, ids, SamplingSettings(temperature=1.0, top_k=3), tokens=2)
    seen = Counter()

    def outcome(seed):
        sampling = SamplingSettings(temperature=1.0, top_k=3, seed=seed)
        summary, rounds = run(qwen3_pair, ids, mode=mode, sampling=sampling, max_tokens=3, **extra)
        copies = [r for r in rounds if r.source == "lookup"]
        seen["copied"] += bool(copies)
        seen["accepted"] += any(r.accepted for r in copies)
        seen["blocks"] += any(r.source == "drafter" and r.choice.startswith("copy and block part") for r in rounds)
        return tuple(summary.token_ids[:2])

    check_exactness(monkeypatch, mutation, exact, outcome)
    if mutation is not None:
        return
    if splits_to == "drafter":
        assert seen["blocks"] == RUNS  # every run verified a block the copy was checked against
    else:  # every run verified a copy; some kept, some not
        assert seen["copied"] == RUNS and 0.05 * RUNS < seen["accepted"] < 0.95 * RUNS, seen


def test_a_copy_verified_by_speculative_sampling_leaves_the_target_distribution():
    """The acceptance rule with the lookup proposer's one-hot q: the first committed token is
    distributed as p whether the copy is accepted (probability p(copy)) or the residual drawn."""
    import mlx.core as mx
    from scipy.stats import chisquare

    from engine.decode.acceptance import accept
    from engine.decode.proposers import LookupProposer
    from engine.decode.sampling import Sampler

    sampler = Sampler(SamplingSettings(temperature=1.0, seed=11))
    proposer = LookupProposer([3, 1, 2, 3, 1], vocab_size=4, sampler=sampler)  # (3, 1) seen: copy 2, 3, 1, ...
    proposal = proposer.propose(anchor=1, length=4, position=5, room=4)
    assert proposal.drafts.tolist() == [2, 3, 1] and proposal.source == "lookup"
    p = [0.1, 0.2, 0.3, 0.4]
    logits = mx.log(mx.array([p] * 4))
    n, counts, accepted_any = 4000, Counter(), 0
    for _ in range(n):
        accepted, nxt = accept(sampler, logits, proposal.drafts, proposal.logq).tolist()
        counts[2 if accepted else nxt] += 1
        accepted_any += accepted > 0
    assert chisquare([counts[i] for i in range(4)], [x * n for x in p]).pvalue > 1e-3, counts
    assert 0.2 * n < accepted_any < 0.4 * n  # the copy kept with probability p(2) = 0.3


def test_a_copy_ends_autos_plain_stretch(alternating_pair, oracle_ids, monkeypatch):
    """Where auto finds drafting does not pay it runs plain steps in stretches; with --lookup a copy
    that runs deep ends the stretch, and the copies are verified as in fixed-length rounds."""
    from engine.decode.verify_length import VerifyLengthController

    monkeypatch.setattr(VerifyLengthController, "best", lambda self, depth=0: 1)  # drafting never pays
    pair = alternating_pair
    ids = [7, 8, oracle_ids[0]]
    ar, _ = run(pair, ids, mode="ar", max_tokens=80)
    plain, plain_rounds = run(pair, ids, max_tokens=80, auto=True)
    assert plain.token_ids == ar.token_ids and not any(r.source == "lookup" for r in plain_rounds)
    mixed, rounds = run(pair, ids, max_tokens=80, auto=True, lookup=True)
    assert mixed.token_ids == ar.token_ids
    copies = [i for i, r in enumerate(rounds) if r.source == "lookup"]
    assert copies and sum(len(rounds[i].drafted) for i in copies) > 40  # most of the output came as copies
    assert all(r.source == "lookup" for r in rounds[copies[0]:])  # once the copy runs deep, only copies
    assert len(rounds) < len(plain_rounds) / 4


def test_plain_steps_watching_for_a_copy_stay_pipelined(alternating_pair, oracle_ids, monkeypatch):
    """With --lookup each plain step asks whether a copy is ready; it must ask after the next forward
    was queued (the target's cache already holds the token just read), as AR's loop overlaps a step
    with the next one's graph building, or every plain step pays for that building alone."""
    from engine.decode.speculative import SpeculativeDecoder
    from engine.decode.verify_length import VerifyLengthController

    monkeypatch.setattr(VerifyLengthController, "best", lambda self, depth=0: 1)  # plain stretches throughout
    ahead = []  # per check: tokens in the target's cache minus tokens committed (prompt included)
    real = SpeculativeDecoder.copy_ready

    def copy_ready(self):
        ahead.append(self.cache[0].offset - (len(self.prompt_ids) + len(self.out.tokens)))
        return real(self)

    monkeypatch.setattr(SpeculativeDecoder, "copy_ready", copy_ready)
    pair = alternating_pair
    ids = [7, 8, oracle_ids[0]]
    ar, _ = run(pair, ids, mode="ar", max_tokens=80)
    mixed, rounds = run(pair, ids, max_tokens=80, auto=True, lookup=True)
    assert mixed.token_ids == ar.token_ids and any(r.source == "lookup" for r in rounds)
    # between rounds the anchor is not fed yet (-1); inside a stretch the next step is already queued (0)
    assert set(ahead) == {-1, 0} and ahead.count(0) > 5


def test_a_copy_is_as_long_as_the_cost_curve_makes_pay(alternating_pair, oracle_ids, monkeypatch):
    """With auto the cost curve prices a copy's length: where each verified position costs over half a step
    (a bfloat16 or 4-bit target on a CPU comes near it), copies stay short instead of verifying up to 32
    tokens (an 18-token copy there cost 10 AR steps and committed 2). Outputs stay AR's."""
    import engine.decode.speculative as speculative
    from engine.decode.cost_curve_data import CostCurve
    from engine.decode.lookup import DEPTH_CAP, copy_cap
    from engine.decode.verify_length import VerifyLengthController

    steep = CostCurve(target="t", device="cpu", blas="x", block=16, repeats=1, ar_step_ms=10.0,
                      verify_ms=[10.0 + 6.0 * n for n in range(16)], draft_ms=5.0, measured_at=0.0)

    def cached(pair, **kwargs):  # this machine's curve, as a cached one comes: no measuring
        return steep, True
        yield

    monkeypatch.setattr(speculative, "cost_curve_steps", cached)
    monkeypatch.setattr(VerifyLengthController, "best", lambda self, depth=0: 1)  # the drafter never pays here
    pair = alternating_pair
    ids = [7, 8, oracle_ids[0]]
    ar, _ = run(pair, ids, mode="ar", max_tokens=80)
    priced, rounds = run(pair, ids, max_tokens=80, auto=True, lookup=True)
    assert priced.token_ids == ar.token_ids
    copies = [len(r.drafted) for r in rounds if r.source == "lookup"]
    longest = max(copy_cap(steep.verify_ms, m, LOOKUP_MAX_DRAFT) for m in range(1, DEPTH_CAP + 1))
    assert copies and max(copies) <= longest <= 8  # with a flat curve they ran past 16 (the test above)
