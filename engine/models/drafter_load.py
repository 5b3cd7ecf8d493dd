"""Build and load a drafter of either generation, as its config names it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx

from engine.models.checkpoint import canonical_name, check_drafter_weights, weight_files
from engine.models.drafter import DFlashDrafter
from engine.models.drafter2 import DFlash2Drafter
from engine.models.drafter_config import DrafterConfig, load_drafter_config


def new_drafter(cfg: DrafterConfig) -> DFlashDrafter:
    """A drafter with fresh weights: DFlash2 when the config has a selector, v1 otherwise."""
    return DFlashDrafter(cfg) if cfg.selector is None else DFlash2Drafter(cfg)


def load_drafter(folder: Path, dtype: Any) -> DFlashDrafter:
    """Load a checked DFlash (v1 or DFlash2) checkpoint, cast to the target's dtype; its weights
    are every *.safetensors in the folder."""
    cfg = load_drafter_config(folder)
    check_drafter_weights(folder, cfg)
    model = new_drafter(cfg)
    weights = {}
    for path in weight_files(folder):
        weights.update((canonical_name(k), v) for k, v in mx.load(str(path)).items())
    model.load_weights([(k, v.astype(dtype)) for k, v in weights.items()], strict=True)
    mx.eval(model.parameters())
    model.eval()
    return model
