"""What a run is asked to do, with every default and limit in one place.

The command line (engine/tools/cli.py) and the window (app/prompt_panel.py,
app/settings.py) take their defaults and ranges from here; `resolved()` is the one
check of a run's settings against the loaded pair.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from engine.errors import SettingsError
from engine.json_text import is_number

# lookup: copies from the context verified, no drafter needed; draft-model: a small AR model drafts
MODES = ("dflash", "ar", "lookup", "draft-model")
NUM_DRAFT = 3  # tokens a draft model drafts a round, as mlx-lm's command line
MAX_NUM_DRAFT = 32
LOOKUP_MAX_DRAFT = 32  # the longest copied span a round verifies (past the DFlash block: a copy runs deep)
ROLLBACK_MODES = ("replay", "rerun")  # hybrid targets: tape replay, or re-run the recurrence
MAX_BLOCK = 16
MAX_TOKENS_LIMIT = 1_000_000
MAX_TEMPERATURE = 100.0
# The drafter's context, for full-attention drafter layers without a trained window: the last
# DRAFT_WINDOW positions plus the first DRAFT_SINK (0: the whole context). Sliding layers keep
# their trained window whatever these say. The sink keeps a chat's system prompt and a model's
# attention-sink positions in view. Why these values: docs/performance.md, "Draft window 256 and sink 64".
DRAFT_WINDOW = 256
DRAFT_SINK = 64
MAX_DRAFT_CONTEXT = 1 << 20
# What the command line and the window run when no block size is given: auto, each round verifying
# as many drafts as pay off at the run's depth (engine/decode/verify_length.py; why it is the default:
# docs/performance.md). A target's first auto run measures its cost curve (then cached).
# GenerationSettings itself keeps a fixed block (auto=False): code that builds settings says what it wants.
AUTO_BY_DEFAULT = True
# DFlash runs also verify a copied span of the context instead of the drafter's block where the text
# being written repeats earlier text (--lookup, on unless --no-lookup): a few dict look-ups a round.
# Why it is on by default: docs/performance.md, "Copy lookup (the default)".
LOOKUP_BY_DEFAULT = True
# Draft trees (--tree N: a budget of N draft nodes, several continuations verified in one forward;
# engine/decode/tree/). 0 is the chain, what a run verifies when --tree is not given: on a quiet CPU
# --tree auto lost to it with the v1 demo drafter and gained little with DFlash2 (docs/performance.md,
# "Draft trees"), so trees are asked for (--tree N or auto). GenerationSettings keeps tree=0 too.
TREE_BY_DEFAULT = 0
MAX_TREE = 64  # draft nodes a round verifies at most (the verify's rows less the anchor)


def tree_refusal(pair, block: int) -> Optional[str]:
    """Why no draft tree can run with this pair and block (None: one can). Every sampling setting can."""
    if block < 2:
        return "needs a block of at least 2 (a block of 1 drafts nothing to branch)"
    from engine.decode.tree.verify import tree_cache_refusal
    from engine.models.target import make_target_cache

    return tree_cache_refusal(pair.target, make_target_cache(pair.target))


def draft_context_text(window: int, sink: int) -> str:
    """The draft window and sink in words (doctor, the window's tooltip)."""
    if not window:
        return "the whole context (--draft-window 0)"
    return f"the last {window} positions" + (f" and the first {sink}" if sink else "") + \
        f" (--draft-window {window} --draft-sink {sink})"


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self, vocab_size: int) -> None:
        if not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise SettingsError(f"temperature {self.temperature} is outside 0..{MAX_TEMPERATURE:g} (0 means greedy).")
        if not 0.0 < self.top_p <= 1.0:
            raise SettingsError(f"top-p {self.top_p} is outside (0, 1] (1 turns it off).")
        if not 0 <= self.top_k < vocab_size:
            raise SettingsError(f"top-k {self.top_k} is outside 0..{vocab_size - 1} (0 turns it off).")
        if not 0.0 <= self.min_p < 1.0:
            raise SettingsError(f"min-p {self.min_p} is outside [0, 1) (0 turns it off).")
        if not 0 <= self.seed < 2**63:
            raise SettingsError(f"seed {self.seed} is outside 0..{2**63 - 1}.")

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(data: Any) -> "SamplingSettings":
        """The sampling a run's settings record (a trace's header), greedy where it says nothing usable."""
        if not isinstance(data, dict):
            return SamplingSettings()
        return SamplingSettings(**{k: v for k, v in data.items() if k in SamplingSettings.__dataclass_fields__
                                   and is_number(v)})


@dataclass(frozen=True)
class GenerationSettings:
    mode: str = "dflash"  # one of MODES
    max_tokens: int = 128
    block_size: Optional[int] = None  # None: the drafter's own
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    stop_strings: tuple[str, ...] = ()
    rollback: str = "replay"  # one of ROLLBACK_MODES
    auto: bool = False  # --block-size auto: each round verifies as many drafts as pay off (block_size caps it)
    draft_window: int = DRAFT_WINDOW  # drafter context positions kept (0: all); see DRAFT_WINDOW
    draft_sink: int = DRAFT_SINK  # ...plus this many first positions
    lookup: bool = False  # DFlash rounds verify a copied span of the context instead where one matches deeply
    draft_model: Optional[str] = None  # draft-model mode: the small AR model (folder or Hugging Face id)
    num_draft: int = NUM_DRAFT
    # Each round's diagnostic tables (how sure the drafter and the target were of each draft, the target's
    # rank of it, the selector's candidates): the window's Why, Selector and rounds views and traces read
    # them. They cost a softmax over the vocabulary per position, on the host (docs/performance.md,
    # "Diagnostic tables"), so the command line computes them only for a trace (generate and parity with
    # --trace); bench times the engine without them.
    diagnostics: bool = True
    # --tree N: each round verifies a draft tree of N nodes (0: the chain); tree_auto (--tree auto):
    # each round's tree sized by the cost curve, the chain where a tree does not pay
    tree: int = 0
    tree_auto: bool = False

    @property
    def uses_tree(self) -> bool:
        return bool(self.tree or self.tree_auto)

    def tree_checked(self, pair, block: int) -> "GenerationSettings":
        """The tree settings checked against the run: --tree N where no tree can run is a SettingsError
        saying why; --tree auto there verifies the chain (`tree_refusal` says why: the CLI notes it)."""
        from dataclasses import replace

        if not 0 <= self.tree <= MAX_TREE:
            raise SettingsError(f"tree {self.tree} is outside 0..{MAX_TREE} draft nodes (0 verifies the chain).")
        refusal = tree_refusal(pair, block) if self.uses_tree else None
        if refusal is None:
            return self
        if self.tree:
            raise SettingsError(f"--tree {refusal}; leave --tree out.")
        return replace(self, tree_auto=False)

    def resolved(self, pair) -> "GenerationSettings":
        """Checked against the loaded pair, with the block size filled in (None in AR mode)."""
        from dataclasses import replace

        if self.mode not in MODES:
            raise SettingsError(f"mode '{self.mode}' is not one of: {', '.join(MODES)}.")
        if not 1 <= self.max_tokens <= MAX_TOKENS_LIMIT:
            raise SettingsError(f"max tokens {self.max_tokens} is outside 1..{MAX_TOKENS_LIMIT}.")
        if self.rollback not in ROLLBACK_MODES:
            raise SettingsError(f"rollback '{self.rollback}' is not one of: {', '.join(ROLLBACK_MODES)}.")
        self.sampling.validate(pair.head.vocab_size)
        if any(not stop for stop in self.stop_strings):  # it was ignored without a word
            raise SettingsError("an empty stop string matches nothing; give the text to stop at.")
        if not 0 <= self.draft_window <= MAX_DRAFT_CONTEXT:
            raise SettingsError(f"draft window {self.draft_window} is outside 0..{MAX_DRAFT_CONTEXT} "
                                "(0 keeps the drafter's whole context).")
        if not 0 <= self.draft_sink <= MAX_DRAFT_CONTEXT:
            raise SettingsError(f"draft sink {self.draft_sink} is outside 0..{MAX_DRAFT_CONTEXT}.")
        if self.draft_sink and not self.draft_window:
            raise SettingsError("a draft sink needs a draft window: with the whole context kept there is "
                                "nothing to keep apart.")
        if self.mode != "dflash":  # only a DFlash drafter's rounds branch (the CLI notes a --tree left unused)
            self = replace(self, tree=0, tree_auto=False)
        if self.mode == "ar":
            return replace(self, block_size=None, auto=False, lookup=False)
        if self.mode == "lookup":  # the copied span's length is the match's: there is no block size
            return replace(self, block_size=None, auto=False, lookup=True)
        if self.mode == "draft-model":  # the draft model proposes every round: no copies
            if not self.draft_model:
                raise SettingsError("draft-model mode needs a draft model: give --draft-model (a small model "
                                    "with the target's tokenizer).")
            if not 1 <= self.num_draft <= MAX_NUM_DRAFT:
                raise SettingsError(f"num draft {self.num_draft} is outside 1..{MAX_NUM_DRAFT}.")
            return replace(self, block_size=self.num_draft + 1, auto=False, lookup=False)
        if pair.drafter is None:
            raise SettingsError("DFlash needs a drafter: give --drafter (a folder or a Hugging Face id), or run AR "
                                "alone (generate --mode ar, or AR in the window).")
        own = pair.drafter.cfg.block_size
        if self.block_size is None:  # the drafter's own, whatever it is: MAX_BLOCK bounds what a user asks for
            return replace(self, block_size=own).tree_checked(pair, own)
        block, high = self.block_size, min(own, MAX_BLOCK)
        if block == 0:  # the window's "drafter's" is 0 in its spin box, but it passes None
            raise SettingsError(f"block size 0 is not a block size: give 1..{high} (the drafter's own is {own}).")
        if not 1 <= block <= high:
            why = ""
            if own < MAX_BLOCK and block <= MAX_BLOCK:
                why = f" (this drafter drafts blocks of {own})"
            elif own > MAX_BLOCK:
                why = f" (leave it unset to run this drafter's own block of {own})"
            raise SettingsError(f"block size {block} is outside 1..{high}{why}.")
        return replace(self, block_size=block).tree_checked(pair, block)

    def to_dict(self) -> dict:
        return asdict(self)



# What a run gets when nothing is said (the command line's and the window's defaults): auto and lookup on,
# the tree as TREE_BY_DEFAULT says. GenerationSettings() keeps them off: code that builds settings says.
DEFAULTS = GenerationSettings(auto=AUTO_BY_DEFAULT, lookup=LOOKUP_BY_DEFAULT, tree_auto=TREE_BY_DEFAULT == "auto",
                              tree=TREE_BY_DEFAULT if isinstance(TREE_BY_DEFAULT, int) else 0)
