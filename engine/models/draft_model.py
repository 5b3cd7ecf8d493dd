"""A classic draft model: a small autoregressive model of the target's tokenizer, for
draft-model speculation (`--mode draft-model --draft-model M`), as mlx-lm's
`speculative_generate_step` and LM Studio's "draft model" use one.

Loaded through mlx-lm like a target, checked against the target (its tokenizer must encode text
as the target's does: the drafts are target token ids), and kept on the loaded pair, so a run
after the first does not load it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.nn as nn

from engine.errors import IncompatiblePairError
from engine.models.pair import LoadedPair
from engine.models.paths import resolve_model_path
from engine.models.target import load_target

PROBE = "def f(x):\n    return x * 2  # über 10 items\n"  # code, indentation, a non-ASCII word


@dataclass
class DraftModel:
    path: Path
    model: nn.Module
    vocab_size: int


def draft_model_for(pair: LoadedPair, name: str) -> DraftModel:
    """The draft model `name` (folder or Hugging Face id) for this pair's target, loaded once."""
    path = resolve_model_path(name)
    kept = pair.draft_models.get(str(path))
    if kept is not None:
        return kept
    check_draft_model_files(path)
    model, tokenizer, config = load_target(path)
    mine, theirs = tokenizer.encode(PROBE), pair.tokenizer.encode(PROBE)
    if mine != theirs:
        raise IncompatiblePairError(f"{path}: this draft model's tokenizer encodes text differently from the "
                                    "target's, so its drafts would be other tokens; a draft model must share the "
                                    "target's tokenizer.")
    vocab = _vocab_size(config)
    if vocab > pair.head.vocab_size:
        raise IncompatiblePairError(f"{path}: the draft model's vocabulary ({vocab}) is larger than the target's "
                                    f"({pair.head.vocab_size}).")
    from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

    if not can_trim_prompt_cache(make_prompt_cache(model)):
        raise IncompatiblePairError(f"{path}: this draft model keeps caches that cannot be trimmed (recurrent "
                                    "layers), so a rejected draft could not be undone in it.")
    kept = pair.draft_models[str(path)] = DraftModel(path, model, vocab)
    return kept


def check_draft_model_files(path: Path) -> None:
    """A draft model's files as the doctor checks a target's (missing, truncated or corrupt weights, a
    config that does not fit them), and not a DFlash drafter: mlx-lm's own error said neither."""
    from engine.models.doctor import check_target_files
    from engine.models.drafter_config import read_config_json

    if "dflash_config" in read_config_json(path):
        raise IncompatiblePairError(f"{path}: this is a DFlash drafter, not a draft model; give it as the drafter "
                                    "(--drafter, or the window's Drafter picker). A draft model is a small "
                                    "autoregressive model with the target's tokenizer.")
    check_target_files(path, "draft model")


def _vocab_size(config: dict[str, Any]) -> int:
    from engine.models.drafter_config import flat_config

    return int(flat_config(config).get("vocab_size", 0))
