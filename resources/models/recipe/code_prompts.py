"""Prompts shaped like the demo's real use: the first lines of a function or class.

`bench` and the app's users start from a `def` or `class` line and a line or two
more, not from a window cut mid-statement. Distilling from such prompts puts the
drafter's training text where inference goes. Methods are dedented so that they
read like top-level definitions, as a user's prompt would.
"""

from __future__ import annotations

import re
import textwrap

import numpy as np

DEFINITION = re.compile(r"^([ \t]*)(?:async\s+)?(?:def|class)\s+\w", re.MULTILINE)
MAX_LINES = 4
MAX_CHARS = 240


def definition_prompts(texts: list[str], count: int, seed: int) -> list[str]:
    """`count` prompts: a definition line plus 0-3 following lines, dedented, ending in a newline."""
    starts = [(i, m.start(), len(m.group(1))) for i, text in enumerate(texts) for m in DEFINITION.finditer(text)]
    if not starts:
        raise ValueError("no def or class lines in the texts")
    rng = np.random.default_rng(seed)
    prompts: list[str] = []
    while len(prompts) < count:
        i, start, indent = starts[int(rng.integers(len(starts)))]
        lines = texts[i][start:].split("\n")[: int(rng.integers(1, MAX_LINES + 1))]
        # stop at a dedent (the definition ended) and keep the prompt short
        kept = [lines[0]]
        for line in lines[1:]:
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                break
            kept.append(line)
        text = textwrap.dedent("\n".join(kept) + "\n")
        if len(text) <= MAX_CHARS and text.strip():
            prompts.append(text)
    return prompts
