"""Synthetic "textbook" Python for the demo target: small, complete, varied modules.

A 5 M-parameter model trained on the standard library alone writes one phrase over
and over from a bare `def` line (see git history of the demo target's model card).
Short, self-contained functions and classes, with docstrings, comments, tests and a
`__main__` block, teach it the shape of code a demo user types, so its greedy text
reads like Python and ends its functions. Names, parameter names, docstrings, type
hints and bodies vary per draw; the output is deterministic for a seed.
"""

from __future__ import annotations

import numpy as np

from synthetic_tasks import CLASSES, TASKS

MODULE_DOCS = (
    "Small helpers for {topic}.",
    "Utilities for working with {topic}.",
    "{Topic} helpers, with a few tests at the bottom.",
    "Exercises on {topic}.",
    "A handful of functions about {topic}.",
)
TOPICS = ("numbers", "strings", "lists", "text", "collections", "files", "math", "data", "sequences", "records")
IMPORTS = ("import math", "import os", "import re", "import json", "import random", "import string",
           "from collections import Counter", "from collections import defaultdict", "import itertools",
           "from dataclasses import dataclass", "from typing import Iterable", "import sys")


def _pick(rng: np.random.Generator, seq):
    return seq[int(rng.integers(len(seq)))]


def _signature(params: list[str], hints: bool) -> str:
    if hints:
        return ", ".join(params)
    return ", ".join(p.split(":")[0].split("=")[0].strip() + ("=" + p.split("=")[1].strip() if "=" in p else "")
                     for p in params)


def render_function(rng: np.random.Generator, task: dict, hints: bool, doc_style: int) -> tuple[str, str]:
    """One function from a task: (source, chosen name)."""
    name = _pick(rng, task["names"])
    params = list(_pick(rng, task["params"]))
    names = [p.split(":")[0].split("=")[0].strip() for p in params] + ["", "", ""]
    fields = {"a": names[0], "b": names[1], "c": names[2], "f": name}
    sig = _signature(params, hints)
    ret = f" -> {task['ret']}" if hints and task.get("ret") else ""
    lines = [f"def {name}({sig}){ret}:"]
    doc = _pick(rng, task["docs"]).format(**fields)
    if doc_style == 1:
        lines.append(f'    """{doc}"""')
    elif doc_style == 2:
        lines.append(f'    """{doc}')
        lines.append("")
        lines.append(f"    >>> {task['tests'][0][0].format(f=name)}")
        lines.append(f"    {task['tests'][0][1]}")
        lines.append('    """')
    body = _pick(rng, task["bodies"]).strip("\n").format(**fields)
    lines.extend(body.split("\n"))
    return "\n".join(lines) + "\n", name


def render_class(rng: np.random.Generator, cls: dict, hints: bool, doc_style: int) -> str:
    name = _pick(rng, cls["names"])
    src = cls["source"].strip("\n").replace("{C}", name)
    if not hints:
        src = _strip_hints(src)
    lines = src.split("\n")
    if doc_style:
        lines.insert(1, f'    """{_pick(rng, cls["docs"])}"""')
        lines.insert(2, "")
    return "\n".join(lines) + "\n"


def _strip_hints(src: str) -> str:
    """Drop `-> T` and `: T` annotations from def lines of a class template."""
    import re

    out = []
    for line in src.split("\n"):
        if line.lstrip().startswith("def "):
            line = re.sub(r"\)\s*->\s*[^:]+:", "):", line)
            line = re.sub(r"(\w+)\s*:\s*[\w\[\], |.]+?(?=\s*(=|,|\)))", r"\1", line)
        out.append(line)
    return "\n".join(out)


def render_module(rng: np.random.Generator) -> str:
    """One module: optional docstring and imports, then 1-3 definitions, each function followed by its
    own test half the time, sometimes a main block; then the module ends.

    Short modules that end (EOS) after a definition or its test teach a small model to stop, and
    a test right below its function names that function: with the tests gathered at the end, a
    5 M-parameter model wrote the same test again and again.
    """
    hints = bool(rng.random() < 0.5)
    doc_style = int(rng.choice(3, p=(0.15, 0.6, 0.25)))
    parts: list[str] = []
    if rng.random() < 0.4:
        topic = _pick(rng, TOPICS)
        parts.append('"""' + _pick(rng, MODULE_DOCS).format(topic=topic, Topic=topic.capitalize()) + '"""\n')
    if rng.random() < 0.5:
        k = int(rng.integers(1, 3))
        parts.append("\n".join(sorted({_pick(rng, IMPORTS) for _ in range(k)})) + "\n")
    last = None
    for _ in range(int(rng.choice(3, p=(0.45, 0.35, 0.2))) + 1):
        if rng.random() < 0.2:
            parts.append(render_class(rng, _pick(rng, CLASSES), hints, doc_style))
            continue
        task = _pick(rng, TASKS)
        src, name = render_function(rng, task, hints, doc_style)
        parts.append(src)
        last = (task, name)
        if rng.random() < 0.5:
            call, expected = _pick(rng, task["tests"])
            parts.append(f"def test_{name}():\n    assert {call.format(f=name)} == {expected}\n")
    if last is not None and rng.random() < 0.2:
        call, _ = _pick(rng, last[0]["tests"])
        parts.append(f'if __name__ == "__main__":\n    print({call.format(f=last[1])})\n')
    return "\n\n".join(parts)


def synthetic_corpus(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [render_module(rng) for _ in range(count)]


if __name__ == "__main__":
    import sys

    for doc in synthetic_corpus(int(sys.argv[1]) if len(sys.argv) > 1 else 3, seed=0):
        print(doc)
        print("# " + "=" * 70)
