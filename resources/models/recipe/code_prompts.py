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


PROSE = re.compile(r"^[ \t]*(?:#+|\"\"\"|''')?[ \t]*([A-Z][a-z]+(?: [\w,'()-]+){3,}[^\n]*)$", re.MULTILINE)


def line_prompts(texts: list[str], count: int, seed: int) -> list[str]:
    """`count` prompts of the shapes a definition start misses, for the drafter's fine-tune.

    Three in four are 1-4 consecutive lines from anywhere in a file, indentation kept (a
    line in the middle of a function, an import block, a comment, a module's head), half of
    them cut before a space of their last line. One in four is English prose: the words of a comment or
    docstring line, without its markers, cut after a random word (text that is not code).
    """
    rng = np.random.default_rng(seed)
    starts = [(i, m.start()) for i, text in enumerate(texts) for m in re.finditer(r"^[ \t]*\S", text, re.MULTILINE)]
    prose = [m.group(1) for text in texts for m in PROSE.finditer(text)]
    if not starts or not prose:
        raise ValueError("the texts have no lines, or no comment or docstring prose")
    prompts: list[str] = []
    while len(prompts) < count:
        if rng.random() < 0.25:
            words = prose[int(rng.integers(len(prose)))].split(" ")
            text = " ".join(words[: int(rng.integers(3, len(words) + 1))])
        else:
            i, start = starts[int(rng.integers(len(starts)))]
            lines = texts[i][start:].split("\n")[: int(rng.integers(1, MAX_LINES + 1))]
            text = "\n".join(lines) + "\n"
            last = lines[-1]
            spaces = [k for k in range(len(last) - len(last.lstrip()) + 1, len(last)) if last[k] == " "]
            if spaces and rng.random() < 0.5:  # cut inside the last line, before a space
                text = text[: len(text) - 1 - len(last) + spaces[int(rng.integers(len(spaces)))]]
        if len(text) <= MAX_CHARS and text.strip():
            prompts.append(text)
    return prompts
