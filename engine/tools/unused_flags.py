"""Flags a command would take and then ignore (and a --tree auto that cannot run) are named before it
runs: a flag accepted in silence reads as a setting that took effect (a QA pass found --num-draft
beside --mode dflash, --draft-model in a bench without the draft-model method, --mode lookup
--no-lookup, all run without a word).

A flag another mode would use is a note on stderr, not an error, so one command line can be rerun
with another --mode; a flag that contradicts the run is an error."""

from __future__ import annotations

import sys

from engine.decode.settings import DEFAULTS
from engine.errors import DFlashError, SettingsError
from engine.tools.run_flags import RunFlags

# the runs (modes and race methods) a DFlash drafter drafts
DRAFTERS = {"dflash", "dflash-auto", "dflash+lookup", "dflash-tree"}


def notes(args, runs: set[str], race: bool = False) -> list[str]:
    """What of `args` none of `runs` uses; raises SettingsError where a flag contradicts them."""
    flags = RunFlags.of(args)
    lookup = flags.lookup  # None: not given
    if runs == {"lookup"} and lookup is False:
        raise SettingsError("--mode lookup drafts by lookup alone: --no-lookup contradicts it (use --mode dflash "
                            "--no-lookup for the drafter alone).")
    said = []
    if "draft-model" not in runs:
        where = ("only the draft-model method in --methods takes it." if race else
                 "only --mode draft-model takes it." if flags.mode is not None else  # generate
                 "this command runs DFlash against AR; generate --mode draft-model runs a draft model, and "
                 "bench --methods ar,draft-model races it against AR.")  # parity and the plain bench: no --mode
        for flag, given in (("--draft-model", flags.draft_model is not None), ("--num-draft", flags.num_draft is not None)):
            if given:
                said.append(f"{flag} is not used: {where}")
    if lookup is not None and (race or not runs & {"dflash"}):
        said.append("--lookup/--no-lookup is not used: " + (
            "each method says whether it looks up (dflash, dflash+lookup)." if race else
            "only --mode dflash takes it (--mode lookup always looks up)."))
    tree = getattr(args, "tree", None)
    if tree not in (None, 0) and ("dflash-tree" not in runs if race else "dflash" not in runs):
        said.append("--tree is not used: " + ("only the dflash-tree method in --methods verifies a tree." if race
                                              else "only --mode dflash verifies a tree."))
    if not runs & DRAFTERS:
        if flags.drafter is not None:
            said.append("--drafter is not used: no run here drafts with a DFlash drafter.")
        if flags.draft_window != DEFAULTS.draft_window or flags.draft_sink is not None:
            said.append("--draft-window/--draft-sink is not used: only a DFlash drafter's context has a window.")
        if flags.block_size not in (None, "auto"):
            said.append("--block-size is not used: " + ("a draft model drafts --num-draft tokens a round."
                                                         if "draft-model" in runs else "no run here drafts a block."))
    return said


def say_unused(args, runs: set[str], race: bool = False) -> None:
    """notes(), each on stderr."""
    for note in notes(args, runs, race):
        print(f"note: {note}", file=sys.stderr)


def check_bench_kind(args) -> None:
    """bench is one of three benches (plain, --methods, --block-sizes): another's flags are refused; and
    every one times decoding, which a run of one token (the prefill's) does not do."""
    from engine.decode.events import nothing_to_time

    problem = nothing_to_time(args.max_tokens, "bench", "--max-tokens")
    if problem:
        raise DFlashError(problem)
    if args.methods and args.block_sizes:
        raise DFlashError("--methods and --block-sizes are two different benches; give one of them.")
    if args.compare_drafter and (args.methods or args.block_sizes):
        raise DFlashError("--compare-drafter belongs to the plain bench (AR against each drafter); leave it out "
                          f"of --{'methods' if args.methods else 'block-sizes'}.")


def resolved_saying(settings, pair, asked: bool = True):
    """settings.resolved(pair), with a note on stderr where a --tree auto that was `asked` for (not the
    default) verifies the chain instead."""
    from engine.decode.settings import tree_refusal

    resolved = settings.resolved(pair)
    if asked and settings.tree_auto and settings.mode == "dflash" and not resolved.tree_auto:
        print(f"note: --tree auto verifies the chain here: a draft tree {tree_refusal(pair, resolved.block_size)}.",
              file=sys.stderr)
    return resolved
