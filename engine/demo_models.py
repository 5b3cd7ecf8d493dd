"""Where the bundled demo pair lives (source tree, or a frozen app bundle)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

DEMO_TARGET = "demo-target"
DEMO_DRAFTER = "demo-drafter"
SAMPLE_PROMPT = "def fibonacci(n):\n"


def models_dir() -> Path:
    override = os.environ.get("DFLASH_MODELS_DIR")
    if override:
        return Path(override)
    frozen = getattr(sys, "_MEIPASS", None)
    if frozen:
        return Path(frozen) / "resources" / "models"
    return Path(__file__).resolve().parent.parent / "resources" / "models"


def demo_pair() -> Optional[tuple[Path, Path]]:
    """(target, drafter) when both are installed, else None."""
    base = models_dir()
    target, drafter = base / DEMO_TARGET, base / DEMO_DRAFTER
    if (target / "config.json").is_file() and (drafter / "config.json").is_file():
        return target, drafter
    return None
