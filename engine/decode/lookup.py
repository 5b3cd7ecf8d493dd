"""Context lookup ("prompt lookup", copy drafting): propose what followed the current suffix last time.

When a user has the model edit code they pasted, re-emit a class with a rename or continue a table,
the next tokens are often a copy of an earlier stretch of the context. `LookupIndex` holds the
committed tokens (prompt, then each round's committed tokens) and, per n-gram length n in
min_n..max_n, a dict from each n-gram to the position of the token that followed its latest
occurrence. Only n-grams that have a following token are indexed, so the n-gram that ends the
sequence right now is never its own match: looking it up finds its latest *earlier* occurrence.

The latest occurrence is not always the copy being made: re-emitting a function whose body holds
the same line twice, the second time round the latest occurrence of that line is the first one
just re-emitted, and its continuation leads back into the function's middle. So the index also
follows the copy it proposed last: when every token committed since agreed with that copy, the
copy's next position is a second candidate, and the deeper of the two matches wins (the latest
n-gram occurrence on a tie).

`extend` costs O(new tokens x n-gram lengths); `propose` one dict lookup per n-gram length, longest
first, plus at most 2 x `depth_cap` token comparisons to measure how deep the matches run.

A proposal is deterministic (no distribution of its own), so verifying it keeps decoding lossless:
at T = 0 a draft is accepted while it equals the target's argmax, at T > 0 by speculative sampling
with q one-hot on the draft. The caller scales how much of the continuation it verifies with
`draft_length`, and `LookupGate` shortens drafts again when long ones keep missing.

Pure Python, no MLX: it runs once per round beside the drafter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

DEPTH_CAP = 64  # match depth is counted up to here: past it the draft length is capped anyway
LONG_FROM = 8  # a match this deep or deeper earns a long draft
SHORT_DRAFT = 4  # what a shallower match earns


@dataclass(frozen=True)
class LookupMatch:
    """A copied continuation: `tokens` followed the earlier occurrence that starts at `source`.

    `match_depth` is how many tokens ending at the current position equal the tokens ending just
    before `source` (at most the index's depth cap): how long the copy has already agreed.
    `ngram` is the longest n-gram length (min_n..max_n) that matches there: min(max_n, match_depth).
    Where the copy would run past the last token, it repeats itself (`continuation`).
    """

    tokens: list[int]
    ngram: int
    match_depth: int
    source: int  # index in the sequence of the first copied token


class LookupIndex:
    def __init__(self, min_n: int = 2, max_n: int = 5, depth_cap: int = DEPTH_CAP):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        if depth_cap < max_n:
            raise ValueError(f"depth_cap ({depth_cap}) must be at least max_n ({max_n})")
        self.min_n, self.max_n, self.depth_cap = min_n, max_n, depth_cap
        self._tokens: list[int] = []
        # _next[n - min_n][ngram] = position of the token after the n-gram's latest occurrence
        self._next: list[dict[tuple[int, ...], int]] = [{} for _ in range(min_n, max_n + 1)]
        self._last: Optional[tuple[int, int]] = None  # (end, source) of the match proposed last

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> tuple[int, ...]:
        """The committed sequence (a copy, O(length): for tests and traces, not for every round)."""
        return tuple(self._tokens)

    def extend(self, tokens: list[int]) -> None:
        """Append committed tokens and index every n-gram that now has a following token.

        Position e (the token that follows) is indexed once, when the token at e arrives: the
        n-grams tokens[e - n:e] then map to e, overwriting older occurrences, so each dict keeps
        the latest one.
        """
        seq = self._tokens
        start = len(seq)
        seq.extend(int(t) for t in tokens)
        for e in range(start, len(seq)):
            for n, after in zip(range(self.min_n, self.max_n + 1), self._next):
                if e < n:
                    break
                after[tuple(seq[e - n:e])] = e

    def propose(self, max_draft: int) -> Optional[LookupMatch]:
        """The continuation of the deepest of two matches for the end of the sequence: the latest
        earlier occurrence of the longest n-gram (max_n down to min_n) that ends it, and the copy
        proposed last, advanced, when the tokens committed since followed it. Up to `max_draft`
        tokens, fewer where the sequence ends. None when no n-gram of those lengths occurred
        before, or `max_draft` < 1.
        """
        seq = self._tokens
        end = len(seq)
        source = self._latest(end) if max_draft >= 1 else None
        if source is None:
            self._last = None
            return None
        depth = self._depth(source, end)
        followed = self._followed(end)
        if followed is not None and followed != source:
            followed_depth = self._depth(followed, end)
            if followed_depth > depth:
                source, depth = followed, followed_depth
        self._last = (end, source)
        # the longest n-gram that matches at `source`: depth >= max_n means max_n does
        return LookupMatch(continuation(seq, source, end, max_draft), min(self.max_n, depth), depth, source)

    def _latest(self, end: int) -> Optional[int]:
        """Where the continuation of the longest n-gram ending at `end` last began, or None."""
        seq = self._tokens
        for n in range(min(self.max_n, end), self.min_n - 1, -1):
            source = self._next[n - self.min_n].get(tuple(seq[end - n:end]))
            if source is not None:
                return source
        return None

    def _followed(self, end: int) -> Optional[int]:
        """The last proposed copy's position now, if every token committed since agreed with it."""
        if self._last is None:
            return None
        last_end, last_source = self._last
        gone = end - last_end
        seq = self._tokens
        if seq[last_source:last_source + gone] != seq[last_end:end]:
            return None
        return last_source + gone

    def _depth(self, source: int, end: int) -> int:
        """How many tokens before `source` equal those before `end`, up to the depth cap."""
        seq = self._tokens
        depth = 0
        limit = min(self.depth_cap, source)  # source < end, so the earlier occurrence runs out first
        while depth < limit and seq[source - 1 - depth] == seq[end - 1 - depth]:
            depth += 1
        return depth


def continuation(seq: list[int], source: int, end: int, max_draft: int) -> list[int]:
    """Up to `max_draft` tokens from `source`. Where they would run past the end of the sequence, the
    copy goes on with itself: text that repeats with period end - source (a table's rows, a line
    written again) repeats further, so a match 2 tokens back still proposes a long draft."""
    tokens = seq[source:source + max_draft]
    period = end - source
    while len(tokens) < max_draft:
        tokens.append(tokens[len(tokens) - period])
    return tokens


def draft_length(match_depth: int, cap: int, *, short: int = SHORT_DRAFT, long_from: int = LONG_FROM) -> int:
    """How many copied tokens to verify for a match `match_depth` deep: min(cap, 2 * match_depth) from
    `long_from` on, min(cap, short) below it.

    Why 2m: copy runs are heavy-tailed (a re-emitted function runs on for a hundred tokens, a
    coincidental `self.` for none), and a scale-free guess is that a run that has agreed for m
    tokens lasts k more with probability about m / (m + k). A draft of 2m then has its last
    position accepted about one time in three and commits about m ln 3 ~ 1.1 m drafts on
    average: long enough to take a real copy in a few rounds, short enough that a copy breaking
    early wastes at most a verify of 2m. The factor is the one DS publishes (m >= 8 earns
    min(32, 2m)). What an extra verify position costs is the cost curve's business: the caller
    sets `cap` from it (copy_cap).
    Why a short draft below `long_from`: in code a few agreeing tokens are mostly boilerplate
    (`    def __init__(self`, `return self.`) that diverges at the next name, so such a match gets
    a few tokens, enough to win when it is a real copy's first round and cheap when it is not.
    """
    if cap < 1:
        return 0
    if match_depth >= long_from:
        return min(cap, 2 * match_depth)
    return min(cap, short)


def copy_cap(verify_ms: list[float], match_depth: int, longest: int) -> int:
    """The copy length (1..longest drafts) that commits the most tokens per millisecond at these verify
    costs (verify_ms[L - 1]: a verify of L tokens at the round's depth), or 0 where none beats a plain
    step (a verify of the anchor alone). A copy of L drafts commits about 1 + sum over k <= L of
    m / (m + k) tokens (draft_length's scale-free guess, m the match depth) and costs a verify of L + 1,
    priced past the longest measured one along the curve's mean slope. Where a verify costs little
    more than a step this keeps draft_length's 2m; where each position costs much, it cuts a copy that
    verified whole would cost more than it commits (docs/performance.md, "Copy length")."""
    slope = (verify_ms[-1] - verify_ms[0]) / (len(verify_ms) - 1) if len(verify_ms) > 1 else 0.0

    def verify(n: int) -> float:
        return verify_ms[n - 1] if n <= len(verify_ms) else verify_ms[-1] + slope * (n - len(verify_ms))

    m = max(match_depth, 1)
    best, best_rate, expected = 0, 1.0 / verify_ms[0], 1.0
    for length in range(1, longest + 1):
        expected += m / (m + length)
        rate = expected / verify(length + 1)
        if rate > best_rate:
            best, best_rate = length, rate
    return best


class LookupGate:
    """Parks long lookup drafts after repeated poor acceptance and probes again later.

    A long draft (more than `short` tokens) that gets fewer than half its tokens accepted is poor;
    `poor_limit` poor long drafts in a row park the gate: for the next `park_rounds` rounds,
    `limit` cuts every lookup draft to `short`. Then the gate lets one long draft through as a
    probe: accepted at least half, the gate stays open; poor again, it parks at once for another
    `park_rounds` (no second chance while its last evidence is a failure). Short drafts and
    rounds with no lookup draft count only toward the parking time.

    The caller calls `record` once per round, with `proposed` = 0 in a round that verified no
    lookup draft, so the parking time runs in rounds whatever the rounds drafted.
    """

    def __init__(self, short: int = SHORT_DRAFT, poor_limit: int = 2, park_rounds: int = 8):
        self.short, self.poor_limit, self.park_rounds = short, poor_limit, park_rounds
        self.poor_in_row = 0
        self.parked_for = 0  # rounds left before the next long draft is allowed

    @property
    def parked(self) -> bool:
        return self.parked_for > 0

    def limit(self, length: int) -> int:
        """The draft length to verify this round, given the length `draft_length` chose."""
        return min(length, self.short) if self.parked else length

    def record(self, proposed: int, accepted: int) -> None:
        """One round's outcome: `proposed` lookup tokens verified, `accepted` of them accepted."""
        if self.parked_for > 0:
            self.parked_for -= 1
            return
        if proposed <= self.short:
            return
        if 2 * accepted >= proposed:
            self.poor_in_row = 0
            return
        self.poor_in_row += 1
        if self.poor_in_row >= self.poor_limit:
            self.parked_for = self.park_rounds
            self.poor_in_row = self.poor_limit - 1  # after the park, one poor probe parks again


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share. For a copy against what a round committed (greedy: the
    target's choices there) it is how many the copy would have had accepted; where the copy agrees
    with all of them, what the target would have said next is unknown, so it is a lower bound."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class CopyJudge:
    """Whether DFlash rounds should verify a copy instead of the drafter's block, from this run's own
    evidence: samples of the tokens each would commit a round, the latest `window` of each.

    Two judges sit in LookupThenDrafter. For shallow copies (a match shallower than LONG_FROM), which
    are mostly boilerplate in code, but in text that re-emits its context (a file edited in place, a
    table continued) are right again a token or two after each change where the drafter, guessing
    fresh text, is not: every round with a shallow match is a sample, the tokens the copy committed
    or, in a round the drafter took, would have committed (`common_prefix` + 1, a lower bound); the
    drafter's rounds are samples of what it commits. Before `min_samples` copies the drafter is
    preferred (`prior` False): a copy round is cheaper, but a shallow match is weak evidence.
    For deep copies the drafter's block parts from (a split): each split is a sample of both (the
    one verified exactly, the other as a lower bound from what was committed), and
    before evidence the copy is preferred (`prior` True), as it always was: where the target really
    copies, the copy runs on past the drafter's block.
    """

    def __init__(self, window: int = 8, min_samples: int = 3, prior: bool = False):
        self.window, self.min_samples, self.prior = window, min_samples, prior
        self.copies: list[int] = []  # tokens committed per round, latest last
        self.drafter: list[int] = []

    @property
    def has_evidence(self) -> bool:
        """Whether prefers_copy() weighs samples (else it answers with the prior)."""
        return len(self.copies) >= self.min_samples

    def prefers_copy(self) -> bool:
        if not self.has_evidence:
            return self.prior
        if not self.drafter:
            return True
        return sum(self.copies) / len(self.copies) >= sum(self.drafter) / len(self.drafter)

    def copy_round(self, committed: int) -> None:
        self.copies = (self.copies + [committed])[-self.window:]

    def drafter_round(self, committed: int) -> None:
        self.drafter = (self.drafter + [committed])[-self.window:]
