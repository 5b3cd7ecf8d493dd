"""How many positions to draft and verify each round (`--block-size auto`).

A round of length k (the anchor and k - 1 drafts, drafted and verified) costs draft(k) plus
verify(k) from the cost curve at the run's current context depth (a verify's attention grows
with it faster than a step's; k = 1, a plain step run pipelined as AR's, is priced a margin
above an AR step: PLAIN_MARGIN), and
commits on average
    E(k) = 1 + sum_{i < k} a_1 * ... * a_i
tokens, where a_j is the chance that draft j is accepted once drafts 1..j-1 were. The
controller keeps recency-weighted counts of a_j from this run's rounds and picks the k with the
most committed tokens per millisecond. Before a position has been offered its rate is the one
before it (a_1 starts at 0.5): a run whose blocks are accepted whole reaches further, one whose
drafts miss early stays short. k = 1 is plain decoding with the drafter skipped; from there it
drafts a short probe block (4) now and then (every 4, 8, ... up to 64 rounds while probes keep
failing) so it can come back when acceptance does: a probe accepted whole raises the rates,
and the rounds after it reach further. The drafter drafts only the k positions it
will verify: drafting a shorter block is cheaper, and a drafter often drafts its first positions
better in a short block. Memory is long (~30 rounds) so that a few unlucky rounds do not
cut a good run short; but a run of first-draft misses that the rate before it makes unlikely
(under 1%, and at least three: three after a_1 = 0.8, seven after 0.5) means the text changed
(prose after code, say). The controller then keeps only that run, weighed as two rounds,
instead of drafting on for the ~30 rounds its memory would take to forget; one probe accepted
brings it back. Which k it picks never changes what is committed: acceptance is decided as for
any block.

Tried and not kept: scaling each price by what this run's own rounds measured, and ageing the
drafting memory with plain tokens (docs/performance.md, "Tried and not kept").
"""

from __future__ import annotations

from engine.decode.cost_curve_data import CostCurve

DECAY = 0.97  # weight of a round's evidence after each newer round: ~30 rounds of memory
PRIOR_WEIGHT = 2.0  # a_j's prior counts as two rounds: a_1's is FIRST_PRIOR, a_j's (j > 1) is a_{j-1}
FIRST_PRIOR = 0.5
PROBE_FIRST, PROBE_MAX = 4, 64
PROBE_LENGTH = 4  # a probe's cost over a plain step is small; a whole block would cost a verify of 16
# A probe's cost, in AR steps, that the probe schedule above was chosen for: up to this the schedule
# is kept as it is; where a probe costs more, probes come that much less often, so probing takes the
# same share of a run (docs/performance.md, "Probes").
PROBE_COST = 1.5
SURPRISE = 0.01  # a run of first-draft misses less likely than this, at the rate before it, resets the counts
MIN_MISSES = 3  # two misses in a row happen even to a drafter right 9 times in 10
KEPT_MISSES = 2.0  # what such a run weighs after the reset, in rounds
# Drafting must fall this far below a plain step's rate before auto stops drafting (and a plain
# step this far above drafting's to keep it plain). Its acceptance rates come from the last ~30
# rounds and undershoot after a run of misses, and once plain it learns only from probes, so a plain
# step priced as an AR step would send it plain where blocks pay. Why 1.15: docs/performance.md,
# "The price of a plain step". Verify lengths never change what is committed, only when.
PLAIN_MARGIN = 1.15


class VerifyLengthController:
    def __init__(self, curve: CostCurve, block: int):
        self.curve = curve
        self.block = min(block, len(curve.verify_ms))
        self.accepted = [0.0] * (self.block - 1)  # decayed counts per draft position j = 1..block-1
        self.offered = [0.0] * (self.block - 1)
        self.plain_rounds = 0  # consecutive rounds at k = 1
        self.probe_every = PROBE_FIRST
        self.misses = 0  # consecutive drafting rounds whose first draft was rejected
        self.rate_before_misses = FIRST_PRIOR  # a_1 when that run began

    def rates(self) -> list[float]:
        """a_j for j = 1..block-1: accepted given every earlier draft was."""
        out, prior = [], FIRST_PRIOR
        for a, o in zip(self.accepted, self.offered):
            prior = (a + PRIOR_WEIGHT * prior) / (o + PRIOR_WEIGHT)
            out.append(prior)
        return out

    def expected_tokens(self) -> list[float]:
        """E(k) for k = 1..block, from one pass over the rates."""
        totals, total, reach = [1.0], 1.0, 1.0
        for a in self.rates():
            reach *= a
            total += reach
            totals.append(total)
        return totals

    def best(self, depth: int = 0) -> int:
        """The k with the most expected committed tokens per millisecond at context depth `depth`."""
        curve = self.curve.at(depth)
        # k = 1 runs as a pipelined plain step, AR's loop with taps kept: an AR step, not a verify of
        # one recording tapes; priced PLAIN_MARGIN above it (see there)
        plain = curve.ar_step_ms * PLAIN_MARGIN
        per_ms = [e / (curve.round_ms(k, whole_block=False) if k > 1 else plain)
                  for k, e in enumerate(self.expected_tokens(), 1)]
        return per_ms.index(max(per_ms)) + 1

    def choose(self, remaining: int, depth: int = 0) -> int:
        """The verify length for the next round (at most `remaining`, the tokens still wanted), at
        context depth `depth` (the anchor's position)."""
        k = self.best(depth)
        if k == 1:
            self.plain_rounds += 1
            if self.plain_rounds >= self.probe_after(depth):  # look again at what the drafter offers
                self.plain_rounds = 0
                self.probe_every = min(self.probe_every * 2, PROBE_MAX)
                k = min(PROBE_LENGTH, self.block)
        else:
            self.plain_rounds = 0
            self.probe_every = PROBE_FIRST
        return max(1, min(k, remaining))

    def plain_stretch(self, depth: int = 0) -> int:
        """How many plain (k = 1) rounds to run back to back now, before the next probe; 0 when
        drafting pays. The decoder runs them pipelined, as AR decoding is."""
        if self.best(depth) != 1:
            return 0
        return max(self.probe_after(depth) - self.plain_rounds - 1, 0)

    def probe_after(self, depth: int = 0) -> int:
        """Plain rounds before the next probe: probe_every, stretched where a probe costs more than
        PROBE_COST AR steps, so probing takes the same share of a run whatever a probe costs."""
        curve = self.curve.at(depth)
        cost = curve.round_ms(min(PROBE_LENGTH, self.block), whole_block=False) / curve.ar_step_ms
        return round(self.probe_every * max(1.0, cost / PROBE_COST))

    def skipped(self) -> None:
        """One plain round ran outside choose() (a stretch)."""
        self.plain_rounds += 1

    def record(self, verified_drafts: int, accepted: int) -> None:
        """A round that verified `verified_drafts` drafts and accepted the first `accepted` of them.
        A round that verified none (k = 1) says nothing about the drafter, and forgets nothing."""
        if verified_drafts == 0:
            return
        if accepted:
            self.misses = 0
        else:
            if self.misses == 0:
                self.rate_before_misses = self.rates()[0]
            self.misses += 1
        self.accepted = [a * DECAY for a in self.accepted]
        self.offered = [o * DECAY for o in self.offered]
        for j in range(min(verified_drafts, accepted + 1)):  # position j offered once 1..j-1 passed
            self.offered[j] += 1.0
            self.accepted[j] += 1.0 if j < accepted else 0.0
        if self.misses >= MIN_MISSES and (1.0 - self.rate_before_misses) ** self.misses < SURPRISE:
            self._keep_only_the_misses()
            self.misses = 0

    def _keep_only_the_misses(self) -> None:
        """The text changed under the drafter: forget what came before this run of misses (unless
        that would make a_1 look better than it does now: a drafter that never hits stays skipped)."""
        kept = min(self.misses, KEPT_MISSES)
        if PRIOR_WEIGHT * FIRST_PRIOR / (kept + PRIOR_WEIGHT) >= self.rates()[0]:  # a_1 after the reset
            return
        self.accepted = [0.0] * len(self.accepted)
        self.offered = [kept] + [0.0] * (len(self.offered) - 1)
