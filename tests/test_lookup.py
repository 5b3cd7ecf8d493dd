"""Context lookup (engine/decode/lookup.py): the index against a brute-force reference, the rules
it promises one by one, a copied function re-emitted with a rename, the cost per token and per
proposal in dict operations, draft_length and the gate."""

from __future__ import annotations

import random
import re
import time

import pytest

from engine.decode.lookup import LookupGate, LookupIndex, CopyJudge, common_prefix, copy_cap, draft_length


def _reference(seq: list[int], min_n: int, max_n: int, max_draft: int, cap: int):
    """The proposal by definition, by scanning: (tokens, ngram, depth, source) or None."""
    end = len(seq)
    for n in range(min(max_n, end), min_n - 1, -1):
        for source in range(end - 1, n - 1, -1):
            if seq[source - n:source] == seq[end - n:end]:
                depth = 0
                while depth < min(cap, source) and seq[source - 1 - depth] == seq[end - 1 - depth]:
                    depth += 1
                tokens = seq[source:source + max_draft]
                while len(tokens) < max_draft:  # past the end the copy repeats itself
                    tokens.append(tokens[len(tokens) - (end - source)])
                return tokens, n, depth, source
    return None


def _as_tuple(match):
    return None if match is None else (match.tokens, match.ngram, match.match_depth, match.source)


def _built(seq: list[int], **kw) -> LookupIndex:
    index = LookupIndex(**kw)
    index.extend(seq)
    return index


def _brute_depth(seq: list[int], source: int, cap: int) -> int:
    depth = 0
    while depth < min(cap, source) and seq[source - 1 - depth] == seq[len(seq) - 1 - depth]:
        depth += 1
    return depth


@pytest.mark.parametrize("seed", range(6))
def test_matches_reference_and_incremental_equals_from_scratch(seed):
    """A fresh index proposes the latest earlier occurrence of the longest n-gram, as a scan does;
    one extended round by round indexes the same and proposes a valid match at least as deep
    (it may follow the copy it proposed last instead, only where that runs deeper)."""
    rng = random.Random(seed)
    min_n, max_n, cap = rng.choice([(2, 5, 64), (1, 3, 8), (3, 4, 16)])
    alphabet = rng.choice([2, 3, 6])  # small alphabets: many matches, periodic stretches, deep runs
    seq = [rng.randrange(alphabet) for _ in range(300)]
    index = LookupIndex(min_n, max_n, cap)
    i = 0
    while i < len(seq):
        step = rng.randint(1, 9)  # a round commits 1..block tokens
        index.extend(seq[i:i + step])
        i = min(len(seq), i + step)
        max_draft = rng.randint(1, 12)
        fresh = _built(seq[:i], min_n=min_n, max_n=max_n, depth_cap=cap).propose(max_draft)
        assert _as_tuple(fresh) == _reference(seq[:i], min_n, max_n, max_draft, cap), i
        got = index.propose(max_draft)
        if fresh is None:
            assert got is None
            continue
        period = i - got.source
        assert got.tokens == [seq[got.source + k % period] for k in range(max_draft)] and got.source < i
        assert got.match_depth == _brute_depth(seq[:i], got.source, cap) >= min_n
        assert got.ngram == min(max_n, got.match_depth)
        assert got.source == fresh.source or got.match_depth > fresh.match_depth
    assert index._next == _built(seq, min_n=min_n, max_n=max_n, depth_cap=cap)._next
    assert index.tokens == tuple(seq) and len(index) == len(seq)


def test_a_copy_is_followed_past_a_line_it_already_re_emitted():
    """Re-emitting a block whose line X comes twice: at the end of the second X the latest earlier
    X is the one just re-emitted (followed by Y), but the copy being made continues with Z."""
    x, y, z = [7, 1, 2, 3, 4, 5, 6], [7, 10, 11], [7, 20, 21]
    prompt = x + y + x + z + [99]
    index = _built(prompt + x + y + x[:3])
    match = index.propose(4)
    assert match.tokens == x[3:] and match.source == len(x + y) + 3  # in the prompt's second X
    index.extend(x[3:])  # the copy was right
    match = index.propose(4)
    assert match.tokens == z + [99] and match.match_depth == len(x + y + x)
    fresh = _built(prompt + x + y + x).propose(4)
    assert fresh.tokens == y + x[:1] and fresh.match_depth == len(x)  # the latest occurrence: shallower
    index.extend([7, 10])  # the text leaves the copy (Z wanted 20): back to the latest occurrence
    assert index.propose(2).tokens == [11, 7]


def test_longest_ngram_wins():
    # (2, 3) last came before 8; the 3-gram (1, 2, 3) only before 9, and the longer match wins
    seq = [1, 2, 3, 9, 7, 2, 3, 8, 1, 2, 3]
    match = _built(seq).propose(1)
    assert (match.ngram, match.tokens, match.source) == (3, [9], 3)


def test_the_current_suffix_is_never_its_own_match():
    assert _built([5, 6, 7, 8]).propose(4) is None  # every n-gram ending here occurs once: here
    match = _built([1, 2, 1, 2]).propose(4)  # (1, 2) ends the sequence and also ended at 2
    assert (match.tokens, match.source, match.ngram) == ([1, 2, 1, 2], 2, 2)


def test_the_latest_earlier_occurrence_is_preferred():
    match = _built([1, 2, 5, 0, 1, 2, 6, 0, 1, 2]).propose(3)
    assert (match.tokens, match.source) == ([6, 0, 1], 6)


def test_continuation_stops_at_max_draft_and_repeats_past_the_end():
    index = _built([1, 2, 3, 4, 1, 2])
    assert index.propose(10).tokens == [3, 4, 1, 2, 3, 4, 1, 2, 3, 4]  # the period-4 text goes on repeating
    assert index.propose(2).tokens == [3, 4]
    assert index.propose(0) is None


def test_no_match_is_none():
    assert LookupIndex().propose(8) is None
    assert _built([7]).propose(8) is None
    assert _built([1, 2, 3, 1]).propose(8) is None  # min_n = 2: a repeated single token is no match
    assert _built([1, 2, 3, 1], min_n=1).propose(8).tokens == [2, 3, 1, 2, 3, 1, 2, 3]


def test_match_depth():
    # 1..6 repeated: the 5-gram matches, and the agreement runs back over 6 tokens (9 != 7 stops it)
    match = _built([9, 1, 2, 3, 4, 5, 6, 0, 7, 1, 2, 3, 4, 5, 6]).propose(4)
    assert (match.ngram, match.match_depth, match.tokens) == (5, 6, [0, 7, 1, 2])
    # the earlier occurrence starts the sequence: depth stops there
    assert _built([1, 2, 3, 0, 1, 2, 3]).propose(4).match_depth == 3
    # a long repeated block: depth counts up to the cap only
    block = list(range(100, 200))
    assert _built(block + [0] + block).propose(4).match_depth == 64
    assert _built(block + [0] + block, depth_cap=10).propose(4).match_depth == 10


def _lex(text: str, vocab: dict[str, int]) -> list[int]:
    return [vocab.setdefault(piece, len(vocab)) for piece in re.findall(r"\w+|\s+|\S", text)]


FUNCTION = '''def moving_average(values, width):
    """Return the averages of every window of `width` consecutive values."""
    if width <= 0:
        raise ValueError("width must be positive")
    out = []
    total = sum(values[:width])
    out.append(total / width)
    for i in range(width, len(values)):
        total += values[i] - values[i - width]
        out.append(total / width)
    return out
'''


def test_a_renamed_function_is_copied_in_long_drafts_after_the_rename():
    """The prompt holds a function and asks for it again renamed; the 'model' re-emits it. A round
    loop at T = 0: verify the lookup draft, accept its agreeing prefix, commit it and one more token."""
    vocab: dict[str, int] = {}
    prompt = _lex(FUNCTION + "\n\n# The same function, renamed to rolling_mean:\n", vocab)
    renamed = FUNCTION.replace("moving_average", "rolling_mean")
    output = _lex(renamed, vocab)
    rename_at = len(_lex("def rolling_mean", {}))
    cap = 32
    index, gate = LookupIndex(), LookupGate()
    index.extend(prompt)
    done, rounds, long_rounds = 0, 0, []
    while done < len(output):
        match = index.propose(cap)
        drafts = [] if match is None else match.tokens[:gate.limit(draft_length(match.match_depth, cap))]
        accepted = 0
        while accepted < len(drafts) and done + accepted < len(output) and drafts[accepted] == output[done + accepted]:
            accepted += 1
        gate.record(len(drafts), accepted)
        if done >= rename_at + 8 and len(output) - done > cap:
            long_rounds.append((len(drafts), accepted))
        commit = output[done:done + accepted + 1]
        index.extend(commit)
        done += len(commit)
        rounds += 1
    # once the match has grown 8 tokens past the rename, every round drafts 2 x its depth (16 at
    # first, then the cap) and every draft is accepted whole, the repeated `out.append` line included
    assert len(long_rounds) >= 3 and long_rounds[-1][0] == cap, long_rounds
    assert all(d >= 16 and a == d for d, a in long_rounds), long_rounds
    assert rounds <= len(output) // 8, (rounds, len(output))
    assert not gate.parked


class _CountingDict(dict):
    ops = 0

    def get(self, key, default=None):
        _CountingDict.ops += 1
        return super().get(key, default)

    def __setitem__(self, key, value):
        _CountingDict.ops += 1
        super().__setitem__(key, value)


def test_cost_is_per_new_token_and_per_ngram_length():
    rng = random.Random(0)
    block = [rng.randrange(4096) for _ in range(400)]  # code-like: fresh text with repeated blocks
    seq = []
    while len(seq) < 50_000:
        seq += block if rng.random() < 0.3 else [rng.randrange(4096) for _ in range(200)]
    seq = seq[:50_000]
    index = LookupIndex(2, 5)
    index._next = [_CountingDict() for _ in index._next]
    lengths = index.max_n - index.min_n + 1
    extend_ops = propose_ops = hits = 0
    start = time.perf_counter()
    for i in range(0, len(seq), 50):  # 1,000 rounds of 50 committed tokens, a proposal after each
        _CountingDict.ops = 0
        index.extend(seq[i:i + 50])
        extend_ops += _CountingDict.ops
        _CountingDict.ops = 0
        hits += index.propose(32) is not None
        propose_ops += _CountingDict.ops
    elapsed = time.perf_counter() - start
    assert extend_ops <= lengths * len(seq)  # one store per n-gram length per token
    assert propose_ops <= lengths * 1000  # at most one lookup per n-gram length
    assert hits > 200  # the repeated blocks are found
    assert elapsed < 5.0  # generous: well under a second on a quiet machine


def test_draft_length():
    assert [draft_length(m, 32) for m in (1, 2, 5, 7)] == [4, 4, 4, 4]  # shallow: a few tokens
    assert [draft_length(m, 32) for m in (8, 12, 16, 64)] == [16, 24, 32, 32]  # deep: 2m up to the cap
    assert draft_length(3, 2) == 2 and draft_length(40, 0) == 0
    assert draft_length(5, 32, short=2, long_from=4) == 10


def test_a_copy_is_as_long_as_this_machines_verify_costs_make_pay():
    """copy_cap: where a verify costs little more than a step (the demo target on a CPU, measured: 23 ms for
    1 token, 31 ms for 16) a deep match keeps draft_length's 2m; where each position costs a fifth of a
    step (a bfloat16 target on a CPU, measured: 64 ms for 1, 278 ms for 16) copies are cut short, and a
    shallow one no verify pays for gets none. Past the curve's longest verify, its mean slope prices them."""
    flat = [23.05, 26.0, 26.15, 26.15, 26.15, 26.15, 27.4, 28.01, 28.34, 28.55, 29.68, 29.68, 30.96, 30.96, 30.96,
            30.96]
    steep = [63.92, 78.75, 94.04, 106.76, 124.38, 137.99, 155.25, 166.21, 182.09, 202.79, 217.05, 225.84, 241.9,
             253.63, 266.39, 277.87]
    assert [draft_length(m, copy_cap(flat, m, 32)) for m in (8, 12, 16)] == [16, 24, 32]  # as without a curve
    assert all(copy_cap(steep, m, 32) < copy_cap(flat, m, 32) for m in (1, 8, 16, 64))
    assert 1 <= copy_cap(steep, 8, 32) <= 8  # an 18-token copy had cost 10 AR steps for 2 tokens
    assert copy_cap([10.0, 30.0, 50.0], 1, 32) == 0  # each position dearer than the step it could save
    assert copy_cap([10.0], 16, 32) == 32  # one verify length measured: the rest priced as flat


def test_gate_parks_long_drafts_after_repeated_poor_acceptance_and_probes_later():
    gate = LookupGate(short=4, poor_limit=2, park_rounds=3)
    assert gate.limit(32) == 32
    gate.record(32, 3)  # poor once
    gate.record(32, 30)  # good: the run of poor drafts is broken
    gate.record(32, 15)  # poor (below half)
    assert not gate.parked and gate.limit(32) == 32
    gate.record(4, 0)  # short drafts never count as poor
    gate.record(0, 0)
    gate.record(32, 1)  # second poor long draft in a row: parked
    assert gate.parked and gate.limit(32) == 4 and gate.limit(3) == 3
    for _ in range(3):  # any round counts toward the parking time, lookup or not
        assert gate.parked
        gate.record(0, 0)
    assert not gate.parked and gate.limit(32) == 32  # the probe
    gate.record(32, 2)  # a poor probe parks again at once
    assert gate.parked
    for _ in range(3):
        gate.record(4, 4)
    gate.record(32, 16)  # a probe accepted half: open, and one poor draft no longer parks
    gate.record(32, 0)
    assert not gate.parked
    gate.record(32, 0)
    assert gate.parked


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        LookupIndex(min_n=0)
    with pytest.raises(ValueError):
        LookupIndex(min_n=4, max_n=3)
    with pytest.raises(ValueError):
        LookupIndex(max_n=5, depth_cap=4)


def test_a_copy_agrees_with_a_round_for_their_common_prefix():
    assert common_prefix([5, 6, 7, 8], [5, 6, 9]) == 2
    assert common_prefix([5, 6], [5, 6, 7]) == 2  # agreed with all it had
    assert common_prefix([4, 6], [5, 6]) == 0


def test_shallow_copies_are_judged_on_this_runs_evidence():
    judge = CopyJudge(window=4, min_samples=3)
    judge.drafter_round(3)
    judge.copy_round(4)
    judge.copy_round(4)
    assert not judge.prefers_copy()  # two samples are not evidence yet
    judge.copy_round(4)
    assert judge.prefers_copy()  # copies commit 4 a round, the drafter 3
    for _ in range(3):
        judge.drafter_round(6)
    assert not judge.prefers_copy()  # the drafter's recent 5.25 beats the copies' 4
    for _ in range(4):
        judge.copy_round(1)
    assert not judge.prefers_copy()
    for _ in range(4):  # only the last `window` copies count: the run moved into text it re-emits
        judge.copy_round(7)
    assert judge.prefers_copy()
