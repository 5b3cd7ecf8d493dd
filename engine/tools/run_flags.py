"""What the run commands (generate, parity, bench, calibrate) read from their command lines, typed.

The commands take different sets of flags (bench has no --stop, calibrate no --lookup): `RunFlags.of`
reads the ones a command has and leaves the rest at their defaults, which are the run's own
(engine/decode/settings.py), so no reader asks the namespace whether a flag exists.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields
from typing import Optional, Union

from engine.decode.settings import DEFAULTS, LOOKUP_BY_DEFAULT, TREE_BY_DEFAULT, GenerationSettings, SamplingSettings

SAMPLING = DEFAULTS.sampling


@dataclass(frozen=True)
class RunFlags:
    max_tokens: int = DEFAULTS.max_tokens
    block_size: Union[int, str, None] = None  # N, "auto", or None (the drafter's own)
    temperature: float = SAMPLING.temperature
    top_p: float = SAMPLING.top_p
    top_k: int = SAMPLING.top_k
    min_p: float = SAMPLING.min_p
    seed: int = SAMPLING.seed
    stop: list[str] = field(default_factory=list)
    trace: Optional[str] = None
    rollback: str = DEFAULTS.rollback
    draft_window: int = DEFAULTS.draft_window
    draft_sink: Optional[int] = None  # None: not given
    lookup: Optional[bool] = None  # None: not given
    draft_model: Optional[str] = None
    num_draft: Optional[int] = None  # None: not given
    drafter: Optional[str] = None
    mode: Optional[str] = None  # generate's --mode; parity and bench have none
    tree: Union[int, str, None] = None  # N, "auto", or None (not given: the default, for DFlash runs)

    @classmethod
    def of(cls, args: argparse.Namespace) -> "RunFlags":
        given = vars(args)
        return cls(**{f.name: given[f.name] for f in fields(cls) if f.name in given})

    def sampling(self) -> SamplingSettings:
        return SamplingSettings(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
                                seed=self.seed)

    def sink(self) -> int:
        """The sink the user gave, else the default one with a window and none without (a sink beside the
        whole context means nothing, so `--draft-window 0` alone must not trip over the default sink)."""
        if self.draft_sink is not None:
            return self.draft_sink
        return DEFAULTS.draft_sink if self.draft_window else 0

    def settings(self, mode: str) -> GenerationSettings:
        return GenerationSettings(
            mode=mode,
            max_tokens=self.max_tokens,
            block_size=None if self.block_size == "auto" else self.block_size,
            auto=self.block_size == "auto",
            sampling=self.sampling(),
            stop_strings=tuple(self.stop),
            diagnostics=bool(self.trace),  # the per-round tables: only a trace reads them here
            rollback=self.rollback,
            draft_window=self.draft_window,
            draft_sink=self.sink(),
            lookup=LOOKUP_BY_DEFAULT if self.lookup is None else self.lookup,
            draft_model=self.draft_model,
            num_draft=DEFAULTS.num_draft if self.num_draft is None else self.num_draft,
            **tree_settings(self.tree, mode),
        )


def tree_settings(given: Union[int, str, None], mode: str) -> dict:
    """--tree as the settings' fields (None: not given: the default, for DFlash runs)."""
    tree = (TREE_BY_DEFAULT if mode == "dflash" else 0) if given is None else given
    return {"tree": 0, "tree_auto": True} if tree == "auto" else {"tree": tree, "tree_auto": False}
