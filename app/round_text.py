"""A round in words: the rounds table's tooltip (what was drafted, accepted and why), a tree round's
tree in a line, and a DFlash2 round's selector."""

from __future__ import annotations

from engine.decode.confidence import broke_at
from engine.decode.events import DRAFT_MODEL, LOOKUP, PLAIN, RoundEvent
from engine.decode.selector_stats import has_selector, miss, positions
from engine.decode.tree_stats import chain_depth, is_tree_round
from app import theme
from app.tokens import chip_text


def round_tooltip(r: RoundEvent, table) -> str:
    if r.bonus_kind == PLAIN:
        return (f"round {r.index} at position {r.position}: a plain step (auto skipped the drafter: drafting did "
                f"not pay here)\n{chip_text(table, r.bonus)} (id {r.bonus}) from the target alone, "
                f"{r.verify_ms:.2f} ms")
    drafts = " ".join(chip_text(table, t) for t in r.drafted) or "(none)"
    source = f" (by the {theme.SOURCE_LABEL.get(r.source, r.source)})" if r.source and r.drafted else ""
    return (f"round {r.index} at position {r.position}\n"
            f"anchor {chip_text(table, r.anchor)} (id {r.anchor})\n"
            f"drafted{source}: {drafts}\n"
            + (f"why these drafts: {r.choice}\n" if r.choice else "")
            + f"accepted {r.accepted} of {len(r.drafted)}, then {r.bonus_kind} {chip_text(table, r.bonus)} "
            f"(id {r.bonus})\n"
            f"committed {len(r.committed)} tokens; draft {r.draft_ms:.2f} ms, verify {r.verify_ms:.2f} ms, "
            f"rollback {r.rollback_ms:.2f} ms"
            + (f"\nverified {r.verified} positions (the anchor and {r.verified - 1} drafts)" if r.verified else "")
            + (f"; drafted but not verified: {' '.join(chip_text(table, t) for t in r.unverified)}"
               if r.unverified else "")
            + why_lines(r, table) + selector_lines(r, table) + tree_lines(r))


def tree_lines(r: RoundEvent) -> str:
    """A tree round: its size, the second choices it took and what the chain would have accepted."""
    if not is_tree_round(r):
        return ""
    chain, exact = chain_depth(r)
    taken = sum(r.tree_ranks[i] > 0 for i in r.tree_path[1:])
    return (f"\na draft tree of {len(r.tree_parents) - 1} draft nodes (the drafted line above is its accepted path, "
            f"then first choices): {taken} second choice{'s' * (taken != 1)} taken; the chain "
            f"(the drafter's first choices) would have accepted {'' if exact else 'at least '}{chain}"
            "\ndouble-click the round for its tree (Tree tab)")


def why_lines(r: RoundEvent, table) -> str:
    """The proposer's confidence per draft and, where the block broke, how far apart the models were. A
    copy (lookup) is certain of every token: only the target's side is told."""
    if not r.draft_p:
        return ""
    broke = broke_at(r)
    if r.source == LOOKUP:
        if broke is None:
            return ""
        return (f"\nbroke at copied token {broke['position']}: the copy had {chip_text(table, broke['draft'])} "
                f"(the target p {broke['target_p']:.2f}); the target chose "
                f"{chip_text(table, broke['target_choice'])} by a logit margin of {broke['margin']:.2f}"
                + (", the copied token itself (a sampling miss)" if broke["target_rank"] == 0 else ""))
    who = "draft model" if r.source == DRAFT_MODEL else "drafter"
    text = f"\n{who} confidence per draft: " + " ".join(f"{p:.2f}" for p in r.draft_p)
    if broke is not None:
        rank = broke["target_rank"]
        text += (f"\nbroke at draft {broke['position']}: the {who} gave {chip_text(table, broke['draft'])} "
                 f"p {broke['draft_p']:.2f} (the target p {broke['target_p']:.2f}); the target chose "
                 f"{chip_text(table, broke['target_choice'])} by a logit margin of {broke['margin']:.2f}, "
                 + (f"the {who}'s first choice too (a sampling miss)" if rank == 0 else
                    f"ranked {rank + 1} in the {who}'s list"))
    return text


def selector_lines(r: RoundEvent, table) -> str:
    """A DFlash2 round: how often its selector rescored the plain argmax, and whose miss the break was."""
    if not has_selector(r):
        return ""
    rows = positions(r)
    text = (f"\nselector: {sum(row['rescored'] for row in rows)} of {len(rows)} drafts differ from the "
            "drafter's plain argmax")
    broke = miss(r)
    if broke is not None:
        rank = broke["target_rank"]
        text += f"; at draft {broke['position']} the target's choice " + (
            "was not a candidate (the drafter's miss)" if broke["kind"] == "drafter" else
            f"was candidate #{rank + 1} (the selector's miss)" if broke["kind"] == "selector" else
            "was the draft (a sampling miss)")
    return text + ("" if is_tree_round(r) else "\ndouble-click the round for its candidates (Selector tab)")
