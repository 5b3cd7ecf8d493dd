"""Exactness at T > 0, tested against the target's own distribution.

`exact_outcomes` computes the probability of every run's first tokens as AR draws them (the
target's filtered, tempered log-probs at each prefix, multiplied along the tree of tokens they
allow), so a sampler's outcomes are tested against the truth (a chi-square goodness of fit)
instead of against a second sample of AR runs: one sample of n runs has the power that two
samples of 2n runs each had, at a quarter of the runs.

Each statistical test also runs its sampler with a mutation (a bug of the kind the test is there
to catch, put in with monkeypatch) and asserts that the same test rejects it.

Sizes (docs/test-suite.md has the figures): RUNS_MUTATED runs reject each test's mutation with a
power of at least 0.99 (`runs_for_power`, from the mutation's effect measured on 300 runs). RUNS
runs against the exact distribution have twice the power that the 300 + 300 runs of the two-sample
tests they replace had against any difference (a chi-square's noncentrality is n * effect for one
sample, N/2 * effect for two of N each).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import mlx.core as mx

ALPHA = 1e-3  # false-alarm rate of every distribution test
RUNS = 300  # runs of each statistical test against the exact distribution (module docstring)
RUNS_MUTATED = 60  # runs of its mutation check (module docstring)
MIN_EXPECTED = 5.0  # outcomes expected fewer times are pooled into one cell


def exact_outcomes(pair, ids: list[int], sampling, tokens: int) -> dict[tuple[int, ...], float]:
    """{first generated tokens: probability} of AR at `sampling` after prompt `ids`: sequences of
    `tokens` tokens, or shorter where an EOS token ends the run."""
    from engine.decode.prefill import prefill
    from engine.decode.sampling import log_probs
    from engine.models.target import make_target_cache
    from engine.runtime.streams import STREAM

    eos = set(pair.tokenizer.eos_token_ids)
    out: dict[tuple[int, ...], float] = {}

    def walk(prefix: list[int], prob: float) -> None:
        if len(prefix) == tokens or (prefix and prefix[-1] in eos):
            out[tuple(prefix)] = prob
            return
        with mx.stream(STREAM):
            logits, _ = prefill(pair, make_target_cache(pair.target), ids + prefix, record_taps=False)
            p = mx.exp(log_probs(logits[None].astype(mx.float32), sampling))[0].tolist()
        for token, pt in enumerate(p):
            if pt > 0:
                walk(prefix + [token], prob * pt)

    walk([], 1.0)
    return out


def goodness_of_fit(counts: Counter, exact: dict[tuple[int, ...], float]) -> tuple[float, int]:
    """(p-value, outcomes tested apart) of a chi-square test that `counts` are draws from `exact`;
    outcomes expected fewer than MIN_EXPECTED times are pooled, and an outcome `exact` gives
    probability 0 counts against the fit in full."""
    from scipy.stats import chisquare

    n = sum(counts.values())
    impossible = sum(c for k, c in counts.items() if k not in exact)
    if impossible:
        return 0.0, 0
    common = [k for k, p in exact.items() if p * n >= MIN_EXPECTED]
    rare = [k for k in exact if k not in common]
    observed = [counts[k] for k in common] + ([sum(counts[k] for k in rare)] if rare else [])
    expected = [exact[k] * n for k in common] + ([sum(exact[k] for k in rare) * n] if rare else [])
    scale = n / sum(expected)  # float rounding of the products
    return float(chisquare(observed, [e * scale for e in expected]).pvalue), len(common)


def assert_draws_from(counts: Counter, exact: dict[tuple[int, ...], float]) -> None:
    """The runs' outcomes fit AR's exact distribution, over at least 3 outcomes seen often (a real
    distribution, not one outcome)."""
    pvalue, outcomes = goodness_of_fit(counts, exact)
    assert outcomes >= 3, (counts, exact)
    assert pvalue > ALPHA, (pvalue, counts, exact)


def assert_rejected(counts: Counter, exact: dict[tuple[int, ...], float]) -> None:
    """A mutated sampler's outcomes are told apart from AR's exact distribution."""
    pvalue, _ = goodness_of_fit(counts, exact)
    assert pvalue <= ALPHA, (pvalue, counts, exact)


def verified_unfiltered(monkeypatch) -> None:
    """Mutation: the target's distribution at verification taken without the run's filters (top-k,
    top-p, min-p): accepts, residuals and the bonus drawn from the raw softmax at the temperature."""
    from dataclasses import replace

    from engine.decode import acceptance

    right = acceptance.speculative_acceptance

    def mutant(sampler, target_logits, drafts, draft_logq):
        filtered = sampler.s
        sampler.s = replace(filtered, top_k=0, top_p=1.0, min_p=0.0)
        try:
            return right(sampler, target_logits, drafts, draft_logq)  # its graph is built here
        finally:
            sampler.s = filtered

    monkeypatch.setattr(acceptance, "speculative_acceptance", mutant)


def sampled_unfiltered(monkeypatch) -> None:
    """Mutation: a token drawn outside verification (AR's and auto's plain steps) from the raw softmax
    at the temperature, without the run's filters."""
    from engine.decode.sampling import Sampler

    monkeypatch.setattr(Sampler, "sample", lambda self, logits: mx.random.categorical(
        logits.astype(mx.float32) / self.s.temperature, key=self.next_key()))


def check_exactness(monkeypatch, mutation, exact: dict, outcome: Callable[[int], tuple[int, ...]]) -> None:
    """outcome(seed) over RUNS seeds fits AR's `exact` distribution; with `mutation` put in first (a
    mutation above), the same test over RUNS_MUTATED seeds rejects it."""
    if mutation is not None:
        mutation(monkeypatch)
    runs = RUNS if mutation is None else RUNS_MUTATED
    counts = Counter(outcome(seed) for seed in range(runs))
    (assert_draws_from if mutation is None else assert_rejected)(counts, exact)


def runs_for_power(exact: dict, mutated: dict, power: float = 0.99, alpha: float = ALPHA) -> int:
    """The fewest runs whose goodness-of-fit test rejects `mutated` (outcome probabilities) as draws
    from `exact` with probability `power` (noncentral chi-square, cells as goodness_of_fit pools
    them at that n)."""
    from scipy.stats import chi2, ncx2

    for n in range(20, 100_000, 10):
        common = [k for k, p in exact.items() if p * n >= MIN_EXPECTED]
        rare = [k for k in exact if k not in common]
        cells = [([k], exact[k], mutated.get(k, 0.0)) for k in common]
        if rare:
            cells.append((rare, sum(exact[k] for k in rare),
                          sum(mutated.get(k, 0.0) for k in rare) + sum(v for k, v in mutated.items() if k not in exact)))
        df = len(cells) - 1
        if df < 1:
            continue
        effect = sum((m - p) ** 2 / p for _, p, m in cells)
        if 1 - ncx2.cdf(chi2.ppf(1 - alpha, df), df, n * effect) >= power:
            return n
    raise ValueError("no sample size up to 100,000 runs has that power")
