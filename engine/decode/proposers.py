"""Who proposes a round's drafts: the DFlash drafter, context lookup, or a draft model. Each is a
Proposer (engine/decode/proposer_base.py: what the round loop asks of it).
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx

from engine.decode.cost_curve_data import CostCurve
from engine.decode.lookup import (LONG_FROM, SHORT_DRAFT, CopyJudge, LookupGate, LookupIndex, LookupMatch,
                                  common_prefix, copy_cap, draft_length)
from engine.decode.events import DRAFT_MODEL, DRAFTER, LOOKUP
from engine.decode.drafts import Proposal, propose
from engine.decode.proposer_base import Proposer, no_drafts
from engine.decode.sampling import Sampler
from engine.decode.settings import LOOKUP_MAX_DRAFT, GenerationSettings
from engine.decode.tree.layout import graft
from engine.decode.tree.plan import TreePlanner
from engine.models.pair import LoadedPair


class DrafterProposer(Proposer):
    """The DFlash drafter: a block drafted in one pass over the target's taps of the context."""

    source = DRAFTER
    needs_taps = True  # the verify records the target's taps: they are the drafter's next context

    def __init__(self, pair: LoadedPair, settings: GenerationSettings, sampler: Sampler):
        self.drafter, self.head, self.sampler = pair.drafter, pair.head, sampler
        self.cache = pair.drafter.make_cache(settings.draft_window or None, settings.draft_sink)
        self.pending: list[mx.array] = []  # target taps the drafter has not seen yet
        # --tree: the planner makes a round's tree from its drafts (or keeps the chain)
        self.trees = TreePlanner(settings.tree, settings.tree_auto) if settings.uses_tree else None
        self.block = settings.block_size or pair.drafter.cfg.block_size

    def observe(self, committed: list[int], taps: Optional[mx.array]) -> None:
        """The target's taps (1, n, k*H) of the positions just committed (or of the prompt)."""
        if taps is not None:
            self.pending.append(taps)

    def propose(self, anchor: int, length: int, position: int, room: int) -> Proposal:
        """The block's drafts d1..d_{length-1} (queued, not awaited), (at T > 0) the log-probs they
        were drawn from, the drafter's logits and (DFlash2) its selector's walk. (`room`: tokens the
        run still wants; the block's length already fits it.)"""
        if length <= 1:
            return no_drafts(self.source)
        planned = self.trees is not None and self.trees.considers(position, length)
        if planned and not self.trees.sizes_by_curve:
            length = min(self.block, room)  # a fixed budget's tree: the whole block deep
        ids = mx.array([anchor] + [self.drafter.cfg.mask_token_id] * (length - 1))[None]
        pending = self.pending
        ctx = mx.concatenate(pending, axis=1) if len(pending) > 1 else (pending[0] if pending else None)
        hidden = self.drafter(self.drafter.embed(self.head, ids), ctx, self.cache, position)
        proposal = propose(self.drafter, self.head, hidden[0, 1:], anchor, self.sampler)
        mx.async_eval(proposal.drafts, proposal.logq, [c.state for c in self.cache])
        self.pending = []
        if planned:
            key = None if self.sampler.s.greedy else self.sampler.next_key()
            proposal.tree = self.trees.plan(anchor, proposal, position, key)  # None: the chain pays more
        return proposal

    def price_copies(self, curve: CostCurve) -> None:
        if self.trees is not None:
            self.trees.price(curve)  # --tree auto: trees sized by the curve

    def record(self, proposal: Proposal, accepted: int) -> None:
        if self.trees is not None and proposal.source == DRAFTER and proposal.drafts.size:
            self.trees.record(proposal.tree, proposal.path or list(range(accepted + 1)), proposal.drafts.size,
                              proposal.ms)

    def context_width(self) -> int:
        """Context positions the drafter attended to in its last draft: its widest layer's cache."""
        return max((c.keys.shape[2] for c in self.cache if c.keys is not None), default=0)


PRICE_EVERY = 64  # context tokens between two pricings of copies against the cost curve


class LookupProposer(Proposer):
    """Context lookup: the continuation of the latest earlier occurrence of the text just written,
    as long as the match runs deep (engine/decode/lookup.py). A copy has no distribution of its
    own: at T > 0 it is verified by speculative sampling with q one-hot on each copied token,
    which keeps the output distributed as AR's."""

    source = LOOKUP
    def __init__(self, prompt_ids: list[int], vocab_size: int, sampler: Sampler):
        self.index = LookupIndex()
        self.index.extend(list(prompt_ids))
        self.gate = LookupGate()
        self.vocab_size, self.sampler = vocab_size, sampler
        self.curve: Optional[CostCurve] = None  # --block-size auto's cost curve: copies priced by it
        self.caps: dict[int, int] = {}  # copy_cap by match depth, at the depth priced last
        self.priced_at, self.verify_ms = -1, [1.0]  # that depth, and the curve's verify costs there

    def price_copies(self, curve: CostCurve) -> None:
        """From now on a copy is as long as this machine's verify costs make pay (lookup.copy_cap)."""
        self.curve, self.priced_at = curve, -1

    def cap(self, match_depth: int) -> int:
        """The longest copy worth verifying for a match this deep, at the context's depth (priced again
        every PRICE_EVERY tokens: the curve moves slowly with depth, and a match is looked up several
        times a round and at every plain step)."""
        if self.curve is None:
            return LOOKUP_MAX_DRAFT
        depth = len(self.index) // PRICE_EVERY * PRICE_EVERY
        if depth != self.priced_at:
            self.priced_at, self.caps, self.verify_ms = depth, {}, self.curve.at(depth).verify_ms
        if match_depth not in self.caps:
            self.caps[match_depth] = copy_cap(self.verify_ms, match_depth, LOOKUP_MAX_DRAFT)
        return self.caps[match_depth]

    def observe(self, committed: list[int], taps: Optional[mx.array]) -> None:
        self.index.extend(list(committed))

    def record(self, proposal: Proposal, accepted: int) -> None:
        self.gate.record(proposal.drafts.size if proposal.source == LOOKUP else 0, accepted)

    def match(self, limit: int) -> Optional[tuple[LookupMatch, int]]:
        """The copy a round could verify now and how many of its tokens (at most `limit`: the match
        depth scales it, the gate may shorten it), or None."""
        found = self.index.propose(LOOKUP_MAX_DRAFT)
        if found is None:
            return None
        cap = self.cap(found.match_depth)
        n = min(self.gate.limit(draft_length(found.match_depth, cap)), limit, len(found.tokens))
        return (found, n) if n > 0 else None

    def propose(self, anchor: int, length: int, position: int, room: int) -> Proposal:
        """The copied span: as long as the match earns (lookup.draft_length), at most `room` - 1."""
        return self.proposal(self.match(room - 1))

    def proposal(self, found: Optional[tuple[LookupMatch, int]]) -> Proposal:
        """The Proposal of a match() (no drafts for None)."""
        if found is None:
            return no_drafts(self.source)
        match, n = found
        drafts = mx.array(match.tokens[:n], dtype=mx.int32)
        logq = None
        if not self.sampler.s.greedy:  # q is one-hot on each copied token
            logq = mx.where(mx.arange(self.vocab_size)[None, :] == drafts[:, None], 0.0, -mx.inf)
        return Proposal(drafts, logq, None, source=self.source)


class LookupThenDrafter(Proposer):
    """DFlash rounds that verify a copied span instead of the drafter's block where the copy is worth
    it. A copy is considered where it runs deep (at least lookup.LONG_FROM tokens already agree) or,
    shallower, while this run's shallow copies have committed at least as much as the drafter's
    blocks (`shallow_judge`). A considered copy is checked against the drafter's block, drafted
    beside it: where one is a prefix of the other the longer is verified; where they part, the
    judge of its kind decides from this run's evidence on such splits (`split_judge` for deep
    copies: the copy until the evidence says otherwise). A target that renames a class or edits a
    line as it re-emits a file parts from its context there, and a drafter that reads the target's
    state mostly parts with it: a copy taken unchecked lost those rounds, and a judge that stopped
    drafting once it preferred copies never saw the drafter improve.

    The check costs a draft, awaited before the verify is built (no overlap with it), in rounds
    that consider a copy, except while a copy flows: after a long copy accepted in full, the next
    deep copy is verified unchecked (the text is being re-emitted; a check would only agree).
    The shallow judge's drafter samples come from rounds without a deep copy in reach, as before
    the check: a block verified where a deep copy agreed with it is no sample of plain drafting.
    Its copy samples come from rounds and, during auto's plain steps, from probes: a shallow match
    seen between steps is scored against the tokens the next steps commit, so a stretch of plain
    steps through text that repeats itself ends once shallow copies have shown they pay (without
    probes the judge heard nothing there, and lookup alone beat DFlash + lookup).
    Both proposers keep their state every round."""

    source = DRAFTER
    needs_taps = True

    def __init__(self, drafter: DrafterProposer, lookup: LookupProposer):
        self.drafter, self.lookup = drafter, lookup
        self.shallow_judge = CopyJudge()
        self.split_judge = CopyJudge(prior=True)
        # this round's proposals the verify does not see, scored against what it commits
        self.unverified_copy: Optional[list[int]] = None  # a shallow copy the drafter's block won over
        self.unverified_block: Optional[list[int]] = None  # the block a shallow copy won over
        self.split: Optional[tuple[list[int], list[int]]] = None  # a deep copy and a block that parted
        self.took_shallow = False  # this round verifies a shallow copy
        self.deep = False  # this round had a deep copy in reach
        self.flowing = False  # the last round verified a long copy and accepted all of it
        self.grafted: Optional[list[int]] = None  # this round's copy, grafted into its tree
        self.probe: Optional[tuple[list[int], list[int]]] = None  # plain steps: a shallow copy, what followed

    def observe(self, committed: list[int], taps: Optional[mx.array]) -> None:
        """What each proposal would have committed is its common prefix with what was, plus one (a
        lower bound for the one not verified; for a block at T > 0, its argmax stands for it)."""
        self.drafter.observe(committed, taps)
        self.lookup.observe(committed, taps)
        if self.unverified_copy is not None:
            self.shallow_judge.copy_round(common_prefix(self.unverified_copy, committed) + 1)
        if self.unverified_block is not None:
            self.shallow_judge.drafter_round(common_prefix(self.unverified_block, committed) + 1)
        if self.split is not None:
            copy, block = self.split
            self.split_judge.copy_round(common_prefix(copy, committed) + 1)
            self.split_judge.drafter_round(common_prefix(block, committed) + 1)
        self.unverified_copy = self.unverified_block = self.split = None
        self.flowing = False  # a round sets it again in record(); a plain step leaves it off

    def stepped(self, committed: list[int]) -> None:
        """Auto's plain step committed `committed` (after observe()): score the probe once the steps
        part from its copy or cover it (exactly what a round verifying it would have committed),
        then probe the next shallow match."""
        if self.probe is not None:
            copy, seen = self.probe
            seen += committed
            agreed = common_prefix(copy, seen)
            if agreed < len(seen) or agreed == len(copy):
                self.shallow_judge.copy_round(agreed + 1)
                self.probe = None
        if self.probe is None:
            found = self.lookup.match(LOOKUP_MAX_DRAFT)
            if found is not None and found[0].match_depth < LONG_FROM:
                self.probe = (found[0].tokens[: found[1]], [])

    def record(self, proposal: Proposal, accepted: int) -> None:
        """After observe(), in a round (plain steps are observed only)."""
        self.lookup.record(proposal, accepted)
        self.drafter.record(proposal, accepted)
        copy = self.grafted if proposal.source == DRAFTER else proposal.drafts.tolist()
        self.flowing = copy is not None and accepted == len(copy) > SHORT_DRAFT and (
            proposal.source == LOOKUP or proposal.tree.tokens[proposal.path[1:]].tolist() == copy)
        if proposal.source == DRAFTER and proposal.drafts.size and not self.deep:
            self.shallow_judge.drafter_round(accepted + 1)
        elif self.took_shallow:
            self.shallow_judge.copy_round(accepted + 1)

    def considers_copy(self, found: Optional[tuple[LookupMatch, int]]) -> bool:
        """Whether a match is checked against the drafter's block: deep, or shallow while the shallow
        judge prefers copies."""
        return found is not None and (found[0].match_depth >= LONG_FROM or self.shallow_judge.prefers_copy())

    def price_copies(self, curve: CostCurve) -> None:
        self.lookup.price_copies(curve)
        self.drafter.price_copies(curve)

    def copy_ready(self) -> bool:
        """Whether a copy would be considered now (auto's plain steps end there)."""
        return self.considers_copy(self.lookup.match(LOOKUP_MAX_DRAFT))

    def propose(self, anchor: int, length: int, position: int, room: int) -> Proposal:
        found = self.lookup.match(room - 1)
        shallow = found is not None and found[0].match_depth < LONG_FROM
        considered = self.considers_copy(found)
        self.took_shallow, self.deep = False, found is not None and not shallow
        self.grafted = None
        self.probe = None  # a round scores its own copies
        if self.deep and self.flowing:
            return self.copy(found, "a copy flowing (the last one was accepted in full): not checked against a block")
        block = self.drafter.propose(anchor, length, position, room)
        if block.tree is not None:  # a copy is one more branch of the tree, not a rival to it
            if considered:
                self.grafted = found[0].tokens[: found[1]]
                block.tree = graft(block.tree, self.grafted)
                block.choice = "the copy grafted into the tree as a branch"
            if shallow:  # the shallow judge scores the copy against what the tree commits
                self.unverified_copy = found[0].tokens[: found[1]]
            return block
        if not considered:
            if shallow:
                self.unverified_copy = found[0].tokens[: found[1]]
                if block.drafts.size:
                    judge = self.shallow_judge
                    block.choice = ("a shallow copy was in reach; " + ("this run's drafter commits more"
                                    if judge.has_evidence else "too few shallow copies seen yet to take one"))
            return block
        return self.checked_copy(found, block, shallow)

    def copy(self, found: tuple[LookupMatch, int], why: str) -> Proposal:
        proposal = self.lookup.proposal(found)
        proposal.choice = why
        return proposal

    def checked_copy(self, found: tuple[LookupMatch, int], block: Proposal, shallow: bool) -> Proposal:
        """A considered copy against the drafter's block: the longer where one is a prefix of the
        other, else the judge's choice. The block's tokens are compared at T = 0, its logits' argmax
        at T > 0 (DFlash2: the head's, before the selector's rescoring): the choice must not depend
        on what the drafter sampled, or a block verified would be drawn from q cut where it meets
        the copy and acceptance's p / q would no longer hold."""
        n = block.drafts.size
        if n == 0:  # auto chose a plain step here: the copy is the round's only draft
            self.took_shallow = shallow
            return self.copy(found, "auto would have stepped plainly here")
        guide = (block.drafts if self.drafter.sampler.s.greedy else mx.argmax(block.logits, axis=-1)).tolist()
        match, length = found
        copy = match.tokens[:length]
        agree = common_prefix(copy, guide)
        if agree >= min(n, length):  # one is a prefix of the other
            if n >= length:
                self.unverified_copy = copy if shallow else None
                block.choice = "the block holds the copy" + (" and drafts further" if n > length else "")
                return block
            self.unverified_block = guide if shallow else None
            self.took_shallow = shallow
            return self.copy(found, "the drafter's block agrees with the copy, which runs further")
        parted = f"copy and block part at draft {agree + 1}"
        if shallow:  # considered: the shallow judge prefers copies
            self.unverified_block, self.took_shallow = guide, True
            return self.copy(found, f"{parted}; this run's shallow copies commit at least as much")
        self.split = (copy, guide)
        judge = self.split_judge
        if judge.prefers_copy():
            why = "this run's splits favour the copy" if judge.has_evidence else "too few splits seen yet: the copy"
            return self.copy(found, f"{parted}; {why}")
        block.choice = f"{parted}; this run's splits favour the drafter"
        return block

    def context_width(self) -> int:
        return self.drafter.context_width()


class DraftModelProposer(Proposer):
    """Classic draft-model speculation: a small AR model of the target's tokenizer drafts a few tokens
    one by one (sampled from its own distribution at T > 0, whose log-probs acceptance uses). Its own
    KV cache follows the committed text: after a round it is trimmed back to the accepted drafts, and
    a last draft accepted but never fed to it is fed before the next."""

    source = DRAFT_MODEL
    def __init__(self, draft, prompt_ids: list[int], num_draft: int, vocab_size: int, sampler: Sampler):
        from mlx_lm.models.cache import make_prompt_cache

        self.model, self.sampler = draft.model, sampler
        self.cache = make_prompt_cache(draft.model)
        self.num_draft, self.vocab_size = num_draft, vocab_size
        self.prompt_ids = list(prompt_ids)
        self.unfed: list[int] = []  # committed tokens not in its cache yet (the anchor aside)
        self.fed_drafts = 0  # drafts of the last proposal that went through the model

    def prefill(self, chunk: int = 512) -> None:
        """The prompt through the draft model (during the run's prefill, as the target's)."""
        ids = mx.array(self.prompt_ids)
        for start in range(0, len(self.prompt_ids), chunk):
            self.model(ids[None, start : start + chunk], cache=self.cache)
            mx.eval([c.state for c in self.cache])

    def observe(self, committed: list[int], taps: Optional[mx.array]) -> None:
        """A round committed `committed`: the accepted drafts and a bonus (or, first, the prefill's
        token). Drafts fed but not accepted come out of the cache; the bonus is the next anchor."""
        from mlx_lm.models.cache import trim_prompt_cache

        accepted = len(committed) - 1
        if self.fed_drafts > accepted:
            trim_prompt_cache(self.cache, self.fed_drafts - accepted)
        elif self.fed_drafts < accepted:  # the last draft was accepted but never fed
            self.unfed.append(committed[accepted - 1])
        self.fed_drafts = 0

    def propose(self, anchor: int, length: int, position: int, room: int) -> Proposal:
        n = min(self.num_draft, length - 1)
        if n < 1:
            return no_drafts(self.source)
        feed = mx.array(self.unfed + [anchor])[None]
        self.unfed = []
        drafts, logq, rows = [], [], []
        for i in range(n):
            logits = self.model(feed, cache=self.cache)[0, -1]
            token, lq = self.sampler.draft(logits[None, : self.vocab_size])
            mx.async_eval(token)  # computes while the next step's graph is built, as mlx-lm's loop does
            drafts.append(token[0])
            rows.append(logits[: self.vocab_size])
            if lq is not None:
                logq.append(lq[0])
            if i + 1 < n:
                feed = token[None]
        self.fed_drafts = n - 1  # the anchor and drafts 1..n-1 went through the model; draft n did not
        tokens = mx.stack(drafts).astype(mx.int32)
        q = _to_vocab(mx.stack(logq), self.vocab_size) if logq else None  # the target's extra ids get no mass
        mx.async_eval(tokens, *([q] if q is not None else []))
        # its logits, for the round's tables (lazy: computed only when a run asks for them)
        return Proposal(tokens, q, _to_vocab(mx.stack(rows), self.vocab_size), source=self.source)


def _to_vocab(rows: mx.array, vocab_size: int) -> mx.array:
    """A draft model's rows widened to the target's vocabulary (a smaller one: -inf for the rest)."""
    short = vocab_size - rows.shape[-1]
    return rows if short <= 0 else mx.concatenate([rows, mx.full((rows.shape[0], short), -mx.inf)], axis=-1)


def make_proposer(pair: LoadedPair, settings: GenerationSettings, sampler: Sampler,
                  prompt_ids: list[int]) -> Proposer:
    """The proposer a run's settings ask for."""
    if settings.mode == "draft-model":
        from engine.models.draft_model import draft_model_for

        draft = draft_model_for(pair, settings.draft_model)
        return DraftModelProposer(draft, prompt_ids, settings.num_draft, pair.head.vocab_size, sampler)
    lookup = LookupProposer(prompt_ids, pair.head.vocab_size, sampler) if settings.lookup else None
    if settings.mode == "lookup":
        return lookup
    drafter = DrafterProposer(pair, settings, sampler)
    return LookupThenDrafter(drafter, lookup) if lookup is not None else drafter
