"""At T > 0 DFlash must be exact in distribution: speculative sampling against the drafter's q."""

from collections import Counter

import mlx.core as mx
import pytest
from scipy.stats import chisquare

from engine.errors import SettingsError
from engine.decode.prompts import encode_prompt
from engine.decode.acceptance import accept
from engine.decode.sampling import Sampler, log_probs
from engine.decode.settings import SamplingSettings

from distribution import check_exactness, exact_outcomes, verified_unfiltered
from helpers import PROMPTS, run

ALPHA = 1e-3  # false-alarm rate of each statistical test


def test_speculative_verify_gives_target_distribution():
    """Drafts from q, verified against p: the first committed token is distributed as p."""
    p_logits = mx.log(mx.array([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]]))
    q_logits = mx.log(mx.array([[0.1, 0.6, 0.1, 0.2]]))
    sampler = Sampler(SamplingSettings(temperature=1.0, seed=7))
    n = 4000
    counts = Counter()
    accepted_any = 0
    for _ in range(n):
        drafts, logq = sampler.draft(q_logits)
        accepted, nxt = accept(sampler, p_logits, drafts, logq).tolist()
        first = drafts.tolist()[0] if accepted else nxt
        counts[first] += 1
        accepted_any += accepted
    observed = [counts[i] for i in range(4)]
    expected = [0.5 * n, 0.3 * n, 0.15 * n, 0.05 * n]
    assert chisquare(observed, expected).pvalue > ALPHA, observed
    assert 0 < accepted_any < n  # both the accept and the resample paths ran


def test_every_row_of_a_block_gives_the_target_distribution():
    """Two drafts from q, verified against three rows of p: the first committed token is distributed
    as p's row 0, the second (when the first draft was kept) as row 1, the third (both kept: the
    bonus) as row 2. Rejections at row 0 and at row 1 and the bonus each draw from their own row."""
    p = [[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.25, 0.05, 0.6, 0.1]]
    q = [[0.2, 0.5, 0.1, 0.2], [0.4, 0.1, 0.1, 0.4]]
    p_logits, q_logits = mx.log(mx.array(p)), mx.log(mx.array(q))
    sampler = Sampler(SamplingSettings(temperature=1.0, seed=11))
    counts = [Counter(), Counter(), Counter()]
    accepted_counts = Counter()
    for _ in range(6000):
        drafts, logq = sampler.draft(q_logits)
        accepted, nxt = accept(sampler, p_logits, drafts, logq).tolist()
        committed = drafts.tolist()[:accepted] + [nxt]
        accepted_counts[accepted] += 1
        for row, token in enumerate(committed):
            counts[row][token] += 1
    assert min(accepted_counts[a] for a in range(3)) > 300  # each way a round can end was taken often
    for row in range(3):
        n = sum(counts[row].values())
        observed = [counts[row][i] for i in range(4)]
        assert chisquare(observed, [pi * n for pi in p[row]]).pvalue > ALPHA, (row, observed)


def test_greedy_verify_accepts_matching_prefix():
    sampler = Sampler(SamplingSettings())
    logits = mx.array([[0.0, 5.0, 0.0], [0.0, 0.0, 5.0], [5.0, 0.0, 0.0]])
    assert accept(sampler, logits, mx.array([1, 2]), None).tolist() == [2, 0]
    assert accept(sampler, logits, mx.array([1, 0]), None).tolist() == [1, 2]
    assert accept(sampler, logits, mx.array([0, 2]), None).tolist() == [0, 1]


def test_filters_shape_the_distribution():
    logits = mx.array([[3.0, 2.0, 1.0, 0.0]])
    top2 = mx.exp(log_probs(logits, SamplingSettings(temperature=1.0, top_k=2))).tolist()[0]
    assert top2[2] == 0.0 and top2[3] == 0.0 and abs(sum(top2) - 1) < 1e-6
    cold = mx.exp(log_probs(logits, SamplingSettings(temperature=0.1))).tolist()[0]
    assert cold[0] > 0.99


@pytest.mark.parametrize("vocab", [1000, 40000])
@pytest.mark.parametrize("filters", [{}, {"min_p": 0.05}, {"top_k": 50}, {"top_p": 0.9}, {"min_p": 0.1, "top_k": 9},
                                     {"top_k": 20, "top_p": 0.9}, {"top_k": 20, "top_p": 0.3, "min_p": 0.05}])
def test_the_filters_give_mlx_lms_distribution(vocab, filters):
    """log_probs as mlx-lm's sampler filters: normalised before the filters and again after the
    temperature. It normalises once where no top-p is asked for, and with top-k on it ranks only the
    k best of a row (the chunked path at 40,000 tokens); the same distribution either way, for
    logits far from 0 too."""
    from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

    logits = mx.random.normal((3, vocab), key=mx.random.key(3)) * 4 + mx.array([[0.0], [90.0], [-200.0]])
    s = SamplingSettings(temperature=0.7, **filters)
    x = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    x = apply_top_p(x, s.top_p) if s.top_p < 1 else x
    x = apply_min_p(x, s.min_p) if s.min_p > 0 else x
    x = (apply_top_k(x, s.top_k) if s.top_k else x) / s.temperature
    want = mx.softmax(x, axis=-1)
    got = mx.exp(log_probs(logits, s))
    assert mx.allclose(got, want, rtol=1e-4, atol=1e-7).item()  # float32 rounding of logits near 300
    assert ((got > 0) == (want > 0)).all().item()  # the same tokens filtered out


@pytest.mark.parametrize("mutation", [None, verified_unfiltered], ids=["exact", "mutated"])
def test_dflash_samples_ars_distribution(qwen3_pair, monkeypatch, mutation):
    """The first two generated tokens of DFlash (block 4) over many seeds are distributed as AR's;
    a rejection resampled from p instead of the residual is caught."""
    ids = encode_prompt(qwen3_pair.tokenizer, PROMPTS[2], chat=False)
    exact = exact_outcomes(qwen3_pair, ids, SamplingSettings(temperature=1.0, top_k=3), tokens=2)

    def outcome(seed):
        sampling = SamplingSettings(temperature=1.0, top_k=3, seed=seed)
        return tuple(run(qwen3_pair, ids, mode="dflash", sampling=sampling, max_tokens=2, block_size=4)[0].token_ids)

    check_exactness(monkeypatch, mutation, exact, outcome)


@pytest.mark.parametrize(
    "settings, field",
    [
        (SamplingSettings(temperature=-1), "temperature"),
        (SamplingSettings(top_p=0.0), "top-p"),
        (SamplingSettings(top_k=10**9), "top-k"),
        (SamplingSettings(min_p=1.5), "min-p"),
        (SamplingSettings(seed=-3), "seed"),
    ],
)
def test_absurd_sampling_settings_are_refused(settings, field):
    with pytest.raises(SettingsError, match=field):
        settings.validate(512)


def test_sampling_read_back_from_a_runs_settings():
    """A trace's recorded sampling (the window's advisor times the run's draws with it): what it says,
    greedy where it says nothing usable."""
    s = SamplingSettings(temperature=0.6, top_p=0.95, top_k=20, min_p=0.0, seed=4)
    assert SamplingSettings.from_dict(s.to_dict()) == s
    assert SamplingSettings.from_dict({"temperature": 0.5, "extra": 1}) == SamplingSettings(temperature=0.5)
    for junk in (None, "hot", [], {"temperature": "hot"}, {"temperature": True}):
        assert SamplingSettings.from_dict(junk) == SamplingSettings()
