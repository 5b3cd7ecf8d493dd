"""The harness of the statistical tests: the exact distribution AR draws from, and the sample sizes."""

import pytest

from engine.decode.prompts import encode_prompt
from engine.decode.settings import SamplingSettings

from distribution import ALPHA, check_exactness, exact_outcomes, runs_for_power, sampled_unfiltered
from helpers import PROMPTS, run


@pytest.mark.parametrize("mutation", [None, sampled_unfiltered], ids=["exact", "mutated"])
def test_ar_draws_from_the_exact_outcomes(qwen3_pair, monkeypatch, mutation):
    """The exact outcomes are a distribution (every allowed pair of tokens, summing to 1) that AR's
    own runs fit, and AR drawing without its filters does not."""
    ids = encode_prompt(qwen3_pair.tokenizer, PROMPTS[2], chat=False)
    exact = exact_outcomes(qwen3_pair, ids, SamplingSettings(temperature=1.0, top_k=3), tokens=2)
    assert len(exact) == 9 and sum(exact.values()) == pytest.approx(1.0)

    def outcome(seed):
        sampling = SamplingSettings(temperature=1.0, top_k=3, seed=seed)
        return tuple(run(qwen3_pair, ids, mode="ar", sampling=sampling, max_tokens=2)[0].token_ids)

    check_exactness(monkeypatch, mutation, exact, outcome)


def test_runs_for_power_is_the_fewest_runs_with_that_power():
    from scipy.stats import chi2, ncx2

    exact = {(0,): 0.4, (1,): 0.3, (2,): 0.2, (3,): 0.1}
    mutated = {(0,): 0.3, (1,): 0.3, (2,): 0.25, (3,): 0.15}
    effect = sum((mutated[k] - p) ** 2 / p for k, p in exact.items())
    n = runs_for_power(exact, mutated)

    def power(runs):
        return 1 - ncx2.cdf(chi2.ppf(1 - ALPHA, 3), 3, runs * effect)

    assert power(n) >= 0.99 > power(n - 10)
    assert runs_for_power(exact, {k: (p + exact[k]) / 2 for k, p in mutated.items()}) > 3 * n  # half the shift
