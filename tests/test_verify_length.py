"""--block-size auto: the verify-length controller, and that any verify length stays lossless."""

from __future__ import annotations

import itertools

import pytest

from engine.decode.cost_curve_data import CostCurve, fitted
from engine.decode.prompts import encode_prompt
from engine.decode.settings import SamplingSettings
from engine.decode.events import PLAIN
from engine.decode.verify_length import PROBE_COST, PROBE_FIRST, PROBE_LENGTH, VerifyLengthController

from distribution import check_exactness, exact_outcomes, sampled_unfiltered, verified_unfiltered
from helpers import PROMPTS, run

ALPHA = 0.001


def _curve(block=16, ar=10.0, verify_growth=0.05, draft=2.0):
    """A CPU-like curve: a verify of L tokens costs 1 + growth * (L - 1) AR steps."""
    return CostCurve(target="t", device="cpu", blas="x", block=block, repeats=1, ar_step_ms=ar,
                     verify_ms=[ar * (1 + verify_growth * (n - 1)) for n in range(1, block + 1)],
                     draft_ms=draft, measured_at=0.0)


def test_a_drafter_that_never_hits_is_skipped_and_probed_ever_less_often():
    c = VerifyLengthController(_curve(), 16)
    picks = []
    for _ in range(200):
        k = c.choose(1000)
        picks.append(k)
        c.record(k - 1, 0)
    assert picks[-1] in (1, PROBE_LENGTH) and picks[20:].count(1) > 150  # plain decoding, the drafter skipped
    probes = [i for i, k in enumerate(picks) if k == PROBE_LENGTH and i > 10]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps and gaps == sorted(gaps) and gaps[0] >= PROBE_FIRST  # probes grow rarer


def _probes(curve, rounds=400) -> list[int]:
    """The rounds auto drafts in, for a drafter that never hits."""
    c = VerifyLengthController(curve, 16)
    picks = []
    for _ in range(rounds):
        k = c.choose(1000)
        picks.append(k)
        c.record(k - 1, 0)
    return [i for i, k in enumerate(picks) if k > 1]


def test_probes_that_cost_more_come_less_often():
    """A 4-bit target at 151,936 rows on a CPU: a probe costs 4.5 AR steps, not the demo pairs' 1.4. Probed
    on the demo pairs' schedule, a 128-token run spent a sixth of its time probing a drafter that never
    paid; probes come that many times less often, so probing costs about the same share of a run
    whatever a probe costs. The demo pairs' schedule is unchanged."""
    cheap, dear = _curve(), _curve(draft=20.0, verify_growth=0.5)
    cost = {name: c.round_ms(PROBE_LENGTH, whole_block=False) / c.ar_step_ms for name, c in
            (("cheap", cheap), ("dear", dear))}
    assert cost["cheap"] <= PROBE_COST < 2 * PROBE_COST < cost["dear"]
    cheap_probes = [i for i in _probes(cheap) if i >= 11]  # before that, auto drafts on its prior
    cheap_gaps = [b - a for a, b in zip(cheap_probes, cheap_probes[1:])]
    dear_probes = _probes(dear)
    dear_gaps = [b - a for a, b in zip(dear_probes, dear_probes[1:])]
    assert cheap_gaps[:4] == [PROBE_FIRST * 2 ** i for i in range(4)]
    stretch = round(cost["dear"] / PROBE_COST)
    assert stretch == 3 and dear_gaps[:3] == [stretch * g for g in cheap_gaps[1:4]]


def test_timing_noise_cannot_make_a_longer_verify_look_cheaper():
    """Measured on a loaded CPU (the v4 demo target): a verify of 3 timed below a verify of 1. The
    fitted curve never prices a longer round below a shorter one, and auto still goes plain on a
    drafter that rarely hits."""
    ms = [18.3955, 20.2106, 16.0056, 18.5407, 23.5957]
    curve = fitted(CostCurve(target="t", device="cpu", blas="x", block=5, repeats=1, ar_step_ms=17.6,
                             verify_ms=ms, draft_ms=5.2, measured_at=0.0,
                             draft_by_length_ms=[0.0, 4.3163, 4.5798, 4.2, 5.206]))
    assert curve.verify_ms == sorted(curve.verify_ms) and curve.verify_ms[-1] == ms[-1]
    assert sum(curve.verify_ms) == pytest.approx(sum(ms), abs=1e-3)  # the fit keeps the mean cost
    assert curve.draft_by_length_ms[0] == 0.0 and curve.draft_by_length_ms[1:] == sorted(curve.draft_by_length_ms[1:])
    costs = [curve.round_ms(k, whole_block=False) for k in range(2, 6)]
    assert costs == sorted(costs) and curve.round_ms(1) <= costs[0]
    c = VerifyLengthController(curve, 5)
    picks = []
    for _ in range(60):  # a drafter whose first draft lands 1 time in 10
        k = c.choose(1000)
        picks.append(k)
        c.record(k - 1, 1 if len(picks) % 10 == 0 and k > 1 else 0)
    assert picks[30:].count(1) >= 25, picks


def _picks_after(c: VerifyLengthController, accepted_of, rounds: int = 60) -> list[int]:
    picks = []
    for i in range(rounds):
        k = c.choose(1000)
        picks.append(k)
        c.record(k - 1, min(k - 1, accepted_of(i)))
    return picks


def test_a_run_of_misses_after_good_rounds_goes_plain_within_a_few_rounds():
    """The French-prose prompt's trace under auto: early rounds accept 2-4 drafts, then nothing is
    accepted. With ~30 rounds of memory the controller drafted on for 31 rounds of misses (60 with
    plain steps priced PLAIN_MARGIN above an AR step); a run of misses that unlikely now resets what
    it knows: within a few rounds it verifies short blocks (a step and a draft or two), plain soon
    after, and a probe accepted brings drafting back."""
    curve = _curve(ar=20.0, verify_growth=0.04, draft=4.0)
    c = VerifyLengthController(curve, 16)
    early = [2, 3, 1, 4, 2, 3, 2, 4, 3, 2]
    picks = _picks_after(c, lambda i: early[i] if i < len(early) else 0)
    assert picks[len(early)] > 1  # it was drafting when the text changed
    assert max(picks[len(early) + 4:]) <= PROBE_LENGTH, picks
    first_plain = picks.index(1, len(early))
    assert first_plain - len(early) <= 16, picks
    assert picks[first_plain:].count(1) >= 0.8 * len(picks[first_plain:]), picks
    back = _picks_after(c, lambda i: 15, rounds=100)  # the drafter gets everything again
    assert back[-10:] == [16] * 10, back


def test_a_few_unlucky_rounds_do_not_stop_a_good_run():
    """First-draft acceptance 0.8: two misses in a row are common (1 in 25) and must not reset it."""
    c = VerifyLengthController(_curve(ar=20.0, verify_growth=0.04, draft=4.0), 16)
    pattern = [4, 3, 5, 0, 0, 4, 6, 3, 0, 5]
    picks = _picks_after(c, lambda i: pattern[i % len(pattern)])
    assert 1 not in picks[5:], picks


def test_a_middling_drafter_keeps_drafting_through_runs_of_four_misses():
    """First-draft acceptance 0.6 with its misses bunched in fours: such a run has a 2.6% chance
    at that rate, not surprising enough to forget the rounds before it (a reset after any three
    misses would, and would go plain)."""
    c = VerifyLengthController(_curve(ar=20.0, verify_growth=0.04, draft=4.0), 16)
    pattern = [3, 2, 0, 0, 0, 0, 2, 1, 3, 2]
    picks = _picks_after(c, lambda i: pattern[i % len(pattern)])
    assert 1 not in picks, picks


def test_it_comes_back_when_acceptance_recovers():
    c = VerifyLengthController(_curve(), 16)
    for _ in range(100):
        c.record(c.choose(1000) - 1, 0)
    picks = []
    for _ in range(200):  # now the drafter gets everything it is asked
        k = c.choose(1000)
        picks.append(k)
        c.record(k - 1, k - 1)
    assert picks[-1] == 16 and picks[-20:] == [16] * 20


def test_a_good_drafter_on_a_flat_curve_verifies_everything_and_a_costly_verify_fewer():
    flat, steep = VerifyLengthController(_curve(verify_growth=0.0), 16), VerifyLengthController(
        _curve(verify_growth=0.5), 16)
    for c in (flat, steep):
        for _ in range(50):  # drafts accepted up to position 4, then rejected
            k = c.choose(1000)
            c.record(k - 1, min(4, k - 1))
    assert flat.choose(1000) >= 5 and 1 < steep.choose(1000) <= flat.choose(1000)
    assert flat.choose(3) <= 3  # never more than the tokens still wanted


def test_whole_blocks_accepted_reach_further_than_any_position_was_offered():
    """Positions never offered take the rate before them: a run accepting every block grows k."""
    c = VerifyLengthController(_curve(verify_growth=0.1), 16)
    picks = []
    for _ in range(12):
        k = c.choose(1000)
        picks.append(k)
        c.record(k - 1, k - 1)
    assert picks[0] < 16 and picks[-1] == 16 and picks == sorted(picks), picks


def test_plain_steps_are_priced_a_margin_above_the_ar_step_they_run_as():
    """The hybrid demo target's curve at depth 512: an AR step 25.7 ms, a recorded verify of one
    28.4 and of two 30.9, a draft of two 4.6. Plain steps run pipelined as AR's (25 ms a token in a
    trace), priced PLAIN_MARGIN above that step: a drafter right 1 time in 10 (35.5 ms for 1.1
    tokens at k = 2) goes plain; one right 3 times in 10 (35.5 ms for 1.3) is within the margin and
    keeps drafting short blocks."""
    verify = [28.4, 30.9, 32.8, 32.8] + [37.0] * 12
    curve = CostCurve(target="t", device="cpu", blas="x", block=16, repeats=1, ar_step_ms=25.7, verify_ms=verify,
                      draft_ms=5.9, measured_at=0.0, draft_by_length_ms=[0.0, 4.6, 5.6, 5.6] + [5.9] * 12)
    rarely = _picks_after(VerifyLengthController(curve, 16), lambda i: 1 if i % 10 == 5 else 0, rounds=80)
    assert rarely[30:].count(1) >= 40, rarely
    sometimes = _picks_after(VerifyLengthController(curve, 16), lambda i: 1 if i % 10 in (2, 5, 8) else 0, rounds=80)
    assert 1 not in sometimes[30:] and max(sometimes[30:]) <= PROBE_LENGTH, sometimes


def test_a_text_whose_first_drafts_miss_is_drafted_on_when_later_ones_land():
    """The DFlash2 demo pair's curve at depth 32 (AR step 20.2 ms, a round of two 26.4, of four
    27.7). A prompt in another kind of text (SQL after Python, say) opens with a few misses and the
    drafter then follows it, in bursts. Priced as an AR step (or a verify of one, the lower), two
    opening misses sent auto plain (a_1 0.25 against its prior of 0.5) and its probes, landing on
    misses, kept it there for most of the run; within the margin it drafts on, and at these prices
    commits at least 1.3 times as much per millisecond as plain steps would."""
    verify = [19.2, 22.1, 23.3, 23.4, 23.4, 23.4, 25.2, 25.2, 26.8, 28.4] + [32.3] * 6
    draft = [0.0, 4.3, 4.3, 4.3, 4.3, 4.8, 5.1, 5.1, 5.2, 5.4, 5.6, 5.6, 5.6, 6.1, 6.1, 6.1]
    curve = CostCurve(target="t", device="cpu", blas="x", block=16, repeats=1, ar_step_ms=20.19, verify_ms=verify,
                      draft_ms=6.1, measured_at=0.0, draft_by_length_ms=draft)
    pattern = [0, 0, 0, 0, 2, 3, 2, 1]
    c = VerifyLengthController(curve, 16)
    picks = _picks_after(c, lambda i: pattern[i % len(pattern)], rounds=100)
    assert 1 not in picks, picks
    tokens = sum(min(k - 1, pattern[i % len(pattern)]) + 1 for i, k in enumerate(picks))
    assert tokens / sum(curve.round_ms(k, whole_block=False) for k in picks) > 1.3 / curve.ar_step_ms


@pytest.fixture
def cycling_verify_length(monkeypatch):
    """Every verify length in turn, 1..cap, whatever the controller would pick."""
    counter = itertools.count()
    monkeypatch.setattr(VerifyLengthController, "choose", lambda self, remaining, depth=0: 1 + next(counter) % remaining)


def test_greedy_auto_equals_ar(qwen3_pair, alternating_pair):
    for pair in (qwen3_pair, alternating_pair):
        for prompt in PROMPTS[:2]:
            ar, _ = run(pair, prompt, mode="ar", max_tokens=40)
            df, rounds = run(pair, prompt, max_tokens=40, auto=True)
            assert df.token_ids == ar.token_ids
            assert all(r.verified == len(r.drafted) + 1 for r in rounds)


def test_greedy_every_verify_length_equals_ar(qwen3_pair, alternating_pair, cycling_verify_length):
    pair = alternating_pair
    ar, _ = run(pair, PROMPTS[0], mode="ar", max_tokens=60)
    df, rounds = run(pair, PROMPTS[0], max_tokens=60, auto=True)
    assert df.token_ids == ar.token_ids
    verified = {r.verified for r in rounds}
    assert 1 in verified and max(verified) >= 8  # skipped drafts, short and long verifies all ran
    assert all(len(r.drafted) == r.verified - 1 and not r.unverified for r in rounds)  # drafts only what it verifies


def _assert_exact(pair, monkeypatch, mutation) -> None:
    """The first three tokens of DFlash (auto, block 4) over many seeds are distributed as AR's."""
    ids = encode_prompt(pair.tokenizer, PROMPTS[2], chat=False)
    exact = exact_outcomes(pair, ids, SamplingSettings(temperature=1.0, top_k=2), tokens=3)

    def outcome(seed):
        summary, _ = run(pair, ids, mode="dflash", max_tokens=3, auto=True, block_size=4,
                         sampling=SamplingSettings(temperature=1.0, top_k=2, seed=seed))
        return tuple(summary.token_ids)

    check_exactness(monkeypatch, mutation, exact, outcome)


@pytest.mark.parametrize("mutation", [None, verified_unfiltered], ids=["exact", "mutated"])
def test_sampling_at_every_verify_length_is_exact(qwen3_pair, cycling_verify_length, monkeypatch, mutation):
    """DFlash verifying 1, 2, 3, 1, ... positions samples as AR does."""
    _assert_exact(qwen3_pair, monkeypatch, mutation)


@pytest.fixture
def backed_off(monkeypatch):
    """A controller that always finds plain decoding best: rounds run in pipelined plain stretches
    between probes."""
    monkeypatch.setattr(VerifyLengthController, "best", lambda self, depth=0: 1)


def test_plain_stretches_equal_ar_and_keep_the_drafter_fed(qwen3_pair, backed_off, monkeypatch):
    ar, _ = run(qwen3_pair, PROMPTS[0], mode="ar", max_tokens=60)
    df, rounds = run(qwen3_pair, PROMPTS[0], max_tokens=60, auto=True)
    assert df.token_ids == ar.token_ids
    stretch = [r for r in rounds if r.verified == 1 and r.draft_ms == 0.0]
    probes = [r for r in rounds if r.drafted]
    assert len(stretch) > 20 and probes  # mostly plain, probing now and then
    # Plain steps are their own kind: not rounds in the summary, not in its round times
    plain = [r for r in rounds if r.bonus_kind == PLAIN]
    assert plain == [r for r in rounds if r.verified == 1] and set(map(id, stretch)) <= set(map(id, plain))
    assert df.num_plain_steps == len(plain) and df.num_rounds == len(rounds) - len(plain) == len(probes)
    assert df.mean_verify_ms == pytest.approx(sum(r.verify_ms for r in probes) / len(probes), abs=1e-3)
    assert [r.index for r in rounds] == list(range(len(rounds)))
    # Each round and plain step starts where the one before it ended (traces and the by-depth
    # tables read these positions as context depths)
    assert all(b.position == a.position + a.accepted + 1 for a, b in zip(rounds, rounds[1:]))
    # The same decisions one round at a time: the probes draft the same tokens, so the drafter
    # saw the same target taps for every plain token of a stretch.
    monkeypatch.setattr(VerifyLengthController, "plain_stretch", lambda self, depth=0: 0)
    _, single = run(qwen3_pair, PROMPTS[0], max_tokens=60, auto=True)
    assert [(r.position, r.drafted) for r in single if r.drafted] == [(r.position, r.drafted) for r in probes]


@pytest.mark.parametrize("mutation", [None, sampled_unfiltered], ids=["exact", "mutated"])
def test_sampling_in_plain_stretches_is_exact(qwen3_pair, backed_off, monkeypatch, mutation):
    """DFlash backed off to pipelined plain stretches samples as AR does."""
    _assert_exact(qwen3_pair, monkeypatch, mutation)
