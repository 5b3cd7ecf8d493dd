"""The command line's options. Defaults and ranges come from the settings dataclasses
(engine/decode/settings.py), so the CLI and the window cannot disagree."""

from __future__ import annotations

import argparse
from typing import Any, Callable, Optional

import engine
from engine.decode.settings import (AUTO_BY_DEFAULT, DEFAULTS, LOOKUP_BY_DEFAULT, MAX_BLOCK, MAX_TREE, MODES,
                                    ROLLBACK_MODES, TREE_BY_DEFAULT)

SAMPLING = DEFAULTS.sampling


def add_model_args(p: argparse.ArgumentParser, drafter: bool = True) -> None:
    p.add_argument("--target", help="target model: folder or Hugging Face id (default: the demo pair's)")
    if drafter:
        p.add_argument("--drafter", help="DFlash drafter: folder or Hugging Face id (default: the demo pair's, "
                                         "when --target is left out too)")


def _add_run_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="file holding the prompt text (or a chat history: a JSON list of messages)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--raw", action="store_true", help="encode the prompt as plain text, as mlx-lm does")
    fmt.add_argument("--chat", action="store_true", help="apply the chat template (default when there is one)")
    p.add_argument("--thinking", choices=["on", "off"],
                   help="thinking mode, for chat templates that have one (default, as mlx-lm's: on where the "
                        "tokenizer has thinking tokens such as <think>, else off)")
    _add_max_tokens(p)
    _add_sampling_args(p)
    _add_block_and_rollback(p)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _add_max_tokens(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=DEFAULTS.max_tokens,
                   help=f"tokens to generate (default {DEFAULTS.max_tokens})")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=SAMPLING.temperature, help="0 (the default) is greedy")
    p.add_argument("--top-p", type=float, default=SAMPLING.top_p)
    p.add_argument("--top-k", type=int, default=SAMPLING.top_k)
    p.add_argument("--min-p", type=float, default=SAMPLING.min_p)
    p.add_argument("--seed", type=int, default=SAMPLING.seed,
                   help=f"random seed at temperature > 0 (default {SAMPLING.seed}: the same sample every run; "
                        "another seed draws another)")


def block_size_arg(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number or 'auto'") from None


def _add_block_and_rollback(p: argparse.ArgumentParser) -> None:
    p.add_argument("--block-size", type=block_size_arg, metavar="N|auto", default="auto" if AUTO_BY_DEFAULT else None,
                   help=f"auto{' (the default)' if AUTO_BY_DEFAULT else ''}: each round verifies as many drafts "
                        "as pay off, from this machine's cost curve (measured once, cached) and the acceptance "
                        f"so far, up to the drafter's block; or N, 1..{MAX_BLOCK}: every round drafts N - 1")
    p.add_argument("--rollback", choices=ROLLBACK_MODES, default=DEFAULTS.rollback,
                   help=f"hybrid (GatedDeltaNet) targets: tape replay or re-run the recurrence "
                        f"(default: {DEFAULTS.rollback})")
    _add_draft_context(p)
    p.add_argument("--draft-model", metavar="M",
                   help="generate --mode draft-model, bench --methods draft-model: a small autoregressive model "
                        "with the target's tokenizer (folder or Hugging Face id) that drafts --num-draft tokens a round")
    p.add_argument("--num-draft", type=int, default=None,  # None: not given (engine/tools/unused_flags.py)
                   help=f"tokens the draft model drafts a round (default {DEFAULTS.num_draft})")
    p.add_argument("--lookup", action=argparse.BooleanOptionalAction, default=None,  # None: not given
                   help="DFlash rounds verify a copied span of the context instead of the drafter's block where "
                        "the text being written repeats earlier text"
                        f"{' (the default; --no-lookup: the drafter alone)' if LOOKUP_BY_DEFAULT else ''}; "
                        "generate --mode lookup, bench --methods lookup: copies alone, no drafter")
    add_tree_arg(p, "; bench --methods dflash-tree: the tree beside the chain")


def add_tree_arg(p: argparse.ArgumentParser, more: str = "") -> None:
    """--tree, for the run commands and serve (None when not given: the default, for DFlash runs)."""
    p.add_argument("--tree", type=block_size_arg, metavar="N|auto", default=None,
                   help=f"DFlash rounds verify a draft tree of N draft nodes (1..{MAX_TREE}) in one forward: the "
                        "drafter's second choices beside its chain, the longest path the target agrees with "
                        "committed; auto: each round's tree sized by the cost curve, the chain where a tree does "
                        f"not pay; 0: the chain (default {'auto' if TREE_BY_DEFAULT == 'auto' else TREE_BY_DEFAULT})"
                        + more)


def _add_draft_context(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft-window", type=int, default=DEFAULTS.draft_window, metavar="N",
                   help="the drafter sees the last N context positions (full-attention drafter layers; "
                        f"sliding ones keep their trained window); 0 keeps all (default {DEFAULTS.draft_window})")
    p.add_argument("--draft-sink", type=int, default=None, metavar="N",
                   help=f"...and the first N positions, with a window (default {DEFAULTS.draft_sink}; "
                        "none with --draft-window 0)")


class OneLineParser(argparse.ArgumentParser):
    """A flag argparse cannot read is one line and exit 2, as every other bad input is (argparse printed
    the whole usage, nine lines for generate, above the line that says what was wrong)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (`{self.prog} --help` lists the options)\n")


def build_parser(add_more: Optional[Callable[[Any], None]] = None) -> argparse.ArgumentParser:
    """The engine's subcommands; `add_more(subparsers)` adds others (app/cli.py: train-drafter, gui)."""
    parser = OneLineParser(
        prog="dflash-playground",
        description="DFlash block-diffusion speculative decoding on MLX. With no command, opens the window.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {engine.__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command")

    g = sub.add_parser("generate", help="generate text, AR or DFlash")
    _add_run_args(g)
    g.add_argument("--mode", choices=MODES, default=DEFAULTS.mode)
    g.add_argument("--trace", help="write a dflash-trace/1 JSONL trace here")

    p = sub.add_parser("parity", help="AR then DFlash on the same prompt; are they identical?")
    _add_run_args(p)
    p.add_argument("--trace", help="write both runs and the verdict here (dflash-trace/2 JSONL; the window opens it)")

    b = sub.add_parser("bench", help="AR vs DFlash speed over a prompts file")
    add_model_args(b)
    b.add_argument("--prompts", required=True,
                   help='JSONL file, one {"prompt": "..."} per line, or {"messages": [...]} for a chat history')
    _add_max_tokens(b)
    b.add_argument("--repeats", type=int, default=1)
    _add_sampling_args(b)
    _add_block_and_rollback(b)
    fmt = b.add_mutually_exclusive_group()
    fmt.add_argument("--raw", action="store_true")
    fmt.add_argument("--chat", action="store_true")
    b.add_argument("--json", action="store_true")
    b.add_argument("--with-mlx-lm", action="store_true", help="also time mlx-lm's own generate (AR reference)")
    b.add_argument("--compare-drafter", metavar="D2", action="append", default=[],
                   help="also run this drafter (folder or id) on the same target after every AR run, "
                        "e.g. a DFlash2 drafter beside a v1 one; may be given more than once")
    b.add_argument("--block-sizes", metavar="LIST", help="e.g. 2,4,8,16,auto: measure each block size on every "
                   "prompt, beside the advisor's prediction for it")
    b.add_argument("--methods", metavar="LIST",
                   help="race the ways to speed up this target on every prompt: ar,dflash,dflash-auto,lookup,"
                        "dflash+lookup,dflash-tree,draft-model (draft-model needs --draft-model; --with-mlx-lm then "
                        "also times "
                        "mlx-lm's speculative generation with it)")

    d = sub.add_parser("doctor", help="can this drafter run with this target?")
    add_model_args(d)

    c = sub.add_parser("calibrate", help="the cost curve: one verify of 1..block tokens and one AR step, here")
    add_model_args(c)
    c.add_argument("--block-size", type=block_size_arg, metavar="N|auto",
                   help="measure verifies up to this length (default, or auto: the drafter's block, the curve "
                        "--block-size auto runs use)")
    c.add_argument("--repeats", type=int, default=3,
                   help="sweeps at each depth at least (more while they fit in 6 s, up to 3x); medians are kept")
    c.add_argument("--fresh", action="store_true", help="measure again even when a cached curve exists")
    _add_draft_context(c)
    _add_sampling_args(c)  # runs at T > 0 use a curve with their draws timed
    c.add_argument("--json", action="store_true")

    e = sub.add_parser("export", help="convert a trace")
    e.add_argument("trace", help="a trace: one run (dflash-trace/1) or a parity check (dflash-trace/2)")
    e.add_argument("--chrome", required=True, help="write Chrome trace JSON (Perfetto) here")

    m = sub.add_parser("demo", help="parity on the demo pair (a tiny pair is built if none is installed)")
    _add_max_tokens(m)

    if add_more is not None:
        add_more(sub)
    return parser
