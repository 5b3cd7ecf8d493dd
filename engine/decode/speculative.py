"""Speculative decoding: a proposer drafts, the target verifies, one round at a time.

`SpeculativeDecoder.round()` reads top to bottom as mlx-lm's generate_step does: propose, verify,
accept, roll back, commit. Who proposes is a Proposer (engine/decode/proposer_base.py:
the drafter, lookup or a draft model); timing and the diagnostic tables are the RoundRecorder's (engine/decode/round_record.py);
acceptance is engine/decode/acceptance.py's; rollback engine/decode/rollback.py's. With
--block-size auto a controller picks each round's length (engine/decode/verify_length.py) and,
where drafting does not pay, runs plain steps in pipelined stretches. With --tree a round verifies
a draft tree instead of a chain (`tree_round`; engine/decode/tree/).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import replace
from typing import Iterator, Optional

import mlx.core as mx

from engine.decode.acceptance import accept
from engine.decode.cancel import CancelToken
from engine.decode.cost_curve import CalibrationCancelled, cost_curve_steps
from engine.decode.ar_decoder import Decoder
from engine.decode.events import DRAFTER, PLAIN, CalibrationEvent, Event, RoundEvent, TextEvent
from engine.decode.prefix_cache import PrefixCache
from engine.decode.drafts import Proposal
from engine.decode.proposers import make_proposer
from engine.decode.rollback import make_rollback
from engine.decode.round_record import RoundRecorder
from engine.decode.settings import LOOKUP_MAX_DRAFT, GenerationSettings
from engine.decode.tree.plan import chain_taken
from engine.decode.tree.verify import TreeVerifier
from engine.decode.tree.walk import greedy_walk, leftmost_leaf, sampled_walk
from engine.decode.verify_length import VerifyLengthController
from engine.models.pair import LoadedPair
from engine.runtime.distributed import from_root
from engine.runtime.streams import STREAM


def verify_block(settings: GenerationSettings) -> int:
    """The most positions a round verifies (resolved settings): the block, or in lookup mode (no
    drafter) the longest copy it verifies. The cost curve of --block-size auto is measured up to it."""
    return settings.block_size or LOOKUP_MAX_DRAFT + 1


class SpeculativeDecoder(Decoder):
    """Rounds of drafts from a proposer, verified by the target."""

    @property
    def mode(self) -> str:
        return self.settings.mode  # "dflash", or "lookup" (no drafter)

    def __init__(self, pair: LoadedPair, prompt_ids: list[int], *, settings: GenerationSettings,
                 cancel: Optional[CancelToken] = None, prefix: Optional[PrefixCache] = None):
        super().__init__(pair, prompt_ids, settings=settings, cancel=cancel, prefix=prefix)
        self.proposer = make_proposer(pair, settings, self.sampler, self.prompt_ids)
        self.taps = pair.taps  # None without a drafter (lookup mode)
        self.rollback = None  # made after prefill (a hybrid target's layers start recording tapes then)
        self.position = len(self.prompt_ids)  # absolute position of the next anchor
        self.verify_length = None  # --block-size auto: picks how many positions each round verifies
        self.recorder = RoundRecorder(on_host=STREAM.device == mx.cpu)
        self.tree_verifier: Optional[TreeVerifier] = None  # --tree: made at the first tree round (after prefill)

    @property
    def block(self) -> int:
        return verify_block(self.settings)

    def calibrate(self):
        """--block-size auto: this machine's cost curve (measured once, then cached), with progress
        events while it is measured; False when Stop ended it (a notice, not an error)."""
        s = self.settings
        if not s.auto:
            return True
        steps = cost_curve_steps(self.pair, block=self.block, window=s.draft_window, sink=s.draft_sink,
                                 cancel=self.cancel, sampling=s.sampling)
        try:
            while True:
                try:
                    done, total = next(steps)
                except StopIteration as stop:
                    curve, _ = stop.value
                    break
                yield CalibrationEvent(done, total)
        except CalibrationCancelled:
            return False
        self.verify_length = VerifyLengthController(curve, self.block)
        self.proposer.price_copies(curve)  # --lookup: copies as long as they pay here
        return True

    def prefill(self):
        """The prompt into the target's caches, and into the proposer's own model when it has one."""
        self.proposer.prefill()
        return (yield from super().prefill())

    def decode(self, y: mx.array, context: Optional[mx.array]) -> Iterator[Event]:
        self.rollback = make_rollback(self.pair.target, self.cache, prefer=self.settings.rollback)
        yield from self.decode_rounds(int(y.item()), context)
        yield from self.recorder.release()  # the last round, if its tables were still computing

    def decode_rounds(self, anchor: int, context: Optional[mx.array]) -> Iterator[Event]:
        """Rounds (and auto's plain steps) until the output stops or the run is cancelled, each round's
        event and its text given out by the recorder (a round held for its host tables comes out after
        the next)."""
        index = 0
        self.proposer.observe([anchor], context)  # the first token, sampled from the prompt's prefill
        while not self.cancel.cancelled:
            plain = self.verify_length.plain_stretch(self.position) if self.verify_length is not None else 0
            if plain > 1 and self.copy_ready():
                plain = 0  # a round: it verifies the copy
            rounds = self.plain_steps(index, anchor, plain) if plain > 1 else [self.round(index, anchor)]
            for event in rounds:
                self.stats.add(event)
                yield from self.recorder.emit(event, TextEvent(self.out.take_delta(), event.committed, index, event.t))
                if self.out.stop_reason is not None:
                    return
                anchor = event.bonus
                self.position += event.accepted + 1
                index += 1

    def copy_ready(self) -> bool:
        """Whether the proposer has a copy worth verifying now (--lookup; never without it)."""
        return self.proposer.copy_ready()

    @property
    def keeps_taps(self) -> bool:
        """Whether rounds record the target's taps: the proposer reads them, and a block of one
        never drafts."""
        return self.proposer.needs_taps and self.block > 1

    def verify(self, anchor: int, drafts: mx.array) -> mx.array:
        """The target's logits over [anchor, drafts] (graph only), recording the taps the proposer
        needs and the tapes a hybrid target's rollback needs."""
        ids = mx.concatenate([mx.array([anchor], dtype=drafts.dtype), drafts])
        taps = self.taps.capture(self.keeps_taps) if self.taps is not None else nullcontext()
        with taps, self.rollback.recording():
            return self.pair.target(ids[None], cache=self.cache)[0]

    def round(self, index: int, anchor: int) -> RoundEvent:
        """One round: propose, verify, accept, roll back, commit."""
        length = min(self.block, self.out.remaining)  # a block commits at most `length` tokens
        verify = length if self.verify_length is None else self.verify_length.choose(length, self.position)
        rec = self.recorder
        rec.mark("start")
        # queued: the verify is built while the drafts compute
        proposal = self.proposer.propose(anchor, verify, self.position, room=self.out.remaining)
        rec.mark("queued")
        if proposal.tree is not None:
            return self.tree_round(index, anchor, proposal)
        logits = self.verify(anchor, proposal.drafts)
        result = from_root(accept(self.sampler, logits, proposal.drafts, proposal.logq), self.pair.ranks)
        diagnostics = self.settings.diagnostics
        tables = rec.queue_tables(proposal, logits) if diagnostics else []
        rec.mark("built")
        mx.eval(proposal.drafts)  # the wait for the drafts is draft time
        rec.mark("drafted")
        # after that wait: a pipeline-sharded target evaluates its layers to gather the taps
        taps = self.taps.concatenated() if self.keeps_taps else None
        mx.eval(result, taps, tables)
        accepted, bonus = result.tolist()
        table_fields = rec.table_fields(proposal, logits, tables) if diagnostics else {}
        rec.mark("verified")

        drafted = proposal.drafts.tolist()
        self.rollback.after_verify(accepted, len(drafted) + 1)
        rec.mark("rolled")

        committed, _ = self.out.add_many(drafted[:accepted] + [bonus])
        self.proposer.observe(committed, taps[:, : accepted + 1] if taps is not None else None)
        proposal.ms = rec.ms("start", "rolled")
        self.proposer.record(proposal, accepted)

        if self.verify_length is not None and proposal.source == DRAFTER:
            self.verify_length.record(len(drafted), accepted)
        # nothing drafted where the round could have: a plain step (auto skipped the drafter, lookup
        # found no copy); a block of one (fixed, or the run's last token) is a round like any other
        plain = not drafted and length > 1
        return rec.event(
            t_first=self.t_first, tables=table_fields, index=index, position=self.position, anchor=anchor,
            drafted=drafted, accepted=accepted, bonus=bonus,
            bonus_kind=PLAIN if plain else ("bonus" if accepted == len(drafted) else "correction"),
            committed=committed, generated=len(self.out.tokens), verified=len(drafted) + 1,
            draft_context=self.proposer.context_width() if drafted and proposal.source == DRAFTER else None,
            source=proposal.source if drafted else None, choice=proposal.choice)

    def tree_round(self, index: int, anchor: int, proposal: Proposal) -> RoundEvent:
        """A round that verifies a draft tree (--tree): one forward over its nodes, the longest path
        the target agrees with committed, the cache compacted to it, the drafter given its taps."""
        rec, tree = self.recorder, proposal.tree
        if self.tree_verifier is None:
            self.tree_verifier = TreeVerifier(self.pair.target, self.cache)
        taps = self.taps.capture(self.keeps_taps)
        with taps:
            logits = self.tree_verifier.forward(tree)
        greedy = self.sampler.s.greedy
        choice = from_root(mx.argmax(logits, axis=-1) if greedy else logits, self.pair.ranks)
        rec.mark("built")
        rec.mark("drafted")  # the tree was built from the evaluated drafts: their wait is draft time
        taps = self.taps.concatenated() if self.keeps_taps else None
        mx.eval(choice, taps)
        path, bonus = greedy_walk(tree, choice.tolist()) if greedy else sampled_walk(self.sampler, tree, choice,
                                                                                     proposal.logq)
        line = tree.path_to(leftmost_leaf(tree, path[-1]))
        drafted, accepted = tree.tokens[line[1:]].tolist(), len(path) - 1
        table_fields = {}
        if self.settings.diagnostics:  # the tables of the line through the path, as for a chain
            # a line deeper than the drafter's block runs down a grafted copy: its tables are a copy's
            deep = proposal.logits is None or len(drafted) > proposal.logits.shape[0]
            view = replace(proposal, drafts=mx.array(drafted, dtype=mx.int32), tree=None,
                           logits=None if deep else proposal.logits[: len(drafted)], selection=None if deep
                           else proposal.selection)
            rows = logits[mx.array(line, dtype=mx.int32)]
            queued = rec.queue_tables(view, rows)
            mx.eval(queued)
            table_fields = rec.table_fields(view, rows, queued)
        rec.mark("verified")
        self.tree_verifier.compact(self.position, path)
        rec.mark("rolled")
        committed, _ = self.out.add_many(drafted[:accepted] + [bonus])
        self.proposer.observe(committed, taps[:, mx.array(path)] if taps is not None else None)
        proposal.path, proposal.ms = path, rec.ms("start", "rolled")
        self.proposer.record(proposal, accepted)
        if self.verify_length is not None:  # --tree auto drafts the chain's length: it learns the chain's
            n, taken = chain_taken(tree, path) if self.settings.tree_auto else (len(drafted), accepted)
            n = min(n, self.verify_length.block - 1)  # a line down a grafted copy can run past the block
            self.verify_length.record(n, min(taken, n))
        return rec.event(
            t_first=self.t_first, tables=table_fields, index=index, position=self.position, anchor=anchor,
            drafted=drafted, accepted=accepted, bonus=bonus,
            bonus_kind="bonus" if accepted == len(drafted) else "correction", committed=committed,
            generated=len(self.out.tokens), verified=len(tree), draft_context=self.proposer.context_width(),
            source=proposal.source, choice=proposal.choice, tree_parents=tree.parents.tolist(),
            tree_tokens=tree.tokens.tolist(), tree_scores=[round(float(v), 4) for v in tree.scores],
            tree_ranks=tree.ranks.tolist(), tree_path=path)

    def plain_steps(self, index: int, anchor: int, n: int) -> Iterator[RoundEvent]:
        """Up to n rounds of one token each (auto backed off to plain decoding), pipelined as AR is
        (Decoder.plain_tokens): the next forward is queued before this token is read. Taps are kept
        for the drafter; there is nothing to roll back. The last token is never fed: it is the next round's anchor.
        With lookup on, a copy worth verifying (the proposer's copy_ready) ends the stretch: a copy
        is where auto's plain steps lose most against a round. The step already queued when the
        copy shows is still taken (one more plain token, then the round) rather than waited for:
        reading each token before queuing the next forward cost every plain step its overlap with
        the next one's graph building."""
        n = min(n, self.out.remaining)
        start = self.position  # decode() moves self.position on as each step's event is taken
        ending = False  # a copy showed: the step queued then is the stretch's last

        def more(i: int) -> bool:  # whether step i + 1 is queued before token i is read
            return i + 1 < n and not ending

        t0 = time.perf_counter()
        for i, (token, taps) in enumerate(self.plain_tokens(mx.array(anchor), more, taps=True)):
            committed, _ = self.out.add_many([token])
            self.proposer.observe(committed, taps)
            self.proposer.stepped(committed)
            if more(i) and self.copy_ready():
                ending = True
            self.verify_length.skipped()
            t1 = time.perf_counter()
            yield RoundEvent(index=index + i, position=start + i, anchor=anchor, drafted=[], accepted=0,
                             bonus=token, bonus_kind=PLAIN, committed=committed, draft_ms=0.0,
                             verify_ms=round((t1 - t0) * 1000.0, 4), rollback_ms=0.0, t=t1 - self.t_first,
                             generated=len(self.out.tokens), verified=1)
            anchor, t0 = token, t1
            if self.out.stop_reason is not None:
                return
