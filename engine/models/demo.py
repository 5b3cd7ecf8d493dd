"""Where the bundled demo pair lives (source tree, or a frozen app bundle)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

DEMO_TARGET = "demo-target"
DEMO_DRAFTER = "demo-dflash2-drafter"  # the faster of the demo target's drafters (their model cards)
DEMO_V1_DRAFTER = "demo-drafter"
DEMO_DRAFT_MODEL = "demo-draft-model"  # a small AR model of the demo target's tokenizer (--mode draft-model)
# Every bundled pair, the default first (v1 is the default where the DFlash2 drafter is not
# installed); the hybrid pair shows tape replay (GatedDeltaNet target).
DEMO_PAIRS = [(DEMO_TARGET, DEMO_DRAFTER), (DEMO_TARGET, DEMO_V1_DRAFTER),
              ("demo-hybrid-target", "demo-hybrid-drafter")]
# Ends in a newline, as the bench prompts do: the demo tokenizer splits as Qwen's does, keeping a
# newline apart from the indentation after it, so the target goes on with an indented body.
SAMPLE_PROMPT = "def fibonacci(n):\n"
# The hybrid demo pair starts on a prompt its drafter drafts well: from `import math` and a newline it
# drafts longer blocks than from `def fibonacci(n):` (its target is the weaker model, trained for fewer
# steps; the figures: the model cards and docs/performance.md).
SAMPLE_PROMPTS = {"demo-hybrid-target": "import math\n"}


def models_dir() -> Path:
    override = os.environ.get("DFLASH_MODELS_DIR")
    if override:
        return Path(override)
    frozen = getattr(sys, "_MEIPASS", None)
    if frozen:
        return Path(frozen) / "resources" / "models"
    return Path(__file__).resolve().parents[2] / "resources" / "models"


def _installed(name: str) -> Optional[Path]:
    folder = models_dir() / name
    return folder if (folder / "config.json").is_file() else None


def demo_pair() -> Optional[tuple[Path, Path]]:
    """The default (target, drafter): the demo target with its DFlash2 drafter, else with its v1
    drafter; None when neither pair is installed."""
    target = _installed(DEMO_TARGET)
    drafter = _installed(DEMO_DRAFTER) or _installed(DEMO_V1_DRAFTER)
    return (target, drafter) if target and drafter else None


def demo_pairs() -> list[tuple[Path, Path]]:
    """Every bundled pair whose target and drafter are both installed, the default first."""
    found = [(_installed(t), _installed(d)) for t, d in DEMO_PAIRS]
    return [(t, d) for t, d in found if t and d]


def bundled_model(name: str) -> Optional[Path]:
    """The folder of a bundled demo model called `name` (e.g. 'demo-hybrid-target'), if installed."""
    if name not in {n for pair in DEMO_PAIRS for n in pair} | {DEMO_DRAFT_MODEL}:
        return None
    return _installed(name)


def sample_prompt(target: Optional[str | Path]) -> str:
    """The prompt to start with on `target`: its own for a bundled demo target that needs one."""
    if not target:
        return SAMPLE_PROMPT
    given = Path(target).expanduser()
    folder = bundled_model(given.name)
    if folder is None:
        return SAMPLE_PROMPT
    by_name = str(target) == given.name and not given.exists()  # as --target takes it (a local folder wins)
    if by_name or (given.exists() and given.resolve() == folder.resolve()):
        return SAMPLE_PROMPTS.get(folder.name, SAMPLE_PROMPT)
    return SAMPLE_PROMPT


def prompt_after_load(prompt: str, target: Optional[str | Path]) -> str:
    """The prompt once `target` has loaded: a sample prompt left as it was becomes that target's
    own (sample_prompt); anything the user wrote stays."""
    return sample_prompt(target) if prompt in (SAMPLE_PROMPT, *SAMPLE_PROMPTS.values()) else prompt
