"""Training rows that reward copying from the context: a span of the corpus, then the same span
again, often with one identifier renamed throughout.

The demo targets, trained on the standard library until they knew much of it by heart, never
learned to look back: given a function and the start of its copy under a new name, they wrote
something else (copy share 0.00-0.05 on copy_prompts.jsonl, make_copy_prompts.py). Users re-emit
what they pasted all the time (edit a function, rename a class, continue a table), and lookup
drafting (engine/decode/lookup.py) only pays where the target copies. A share of rows built this
way teaches it: in the second half every token is predictable from the first, once the model
finds where it is in it (and applies the rename).

A span the model knows by heart teaches little, though: it predicts the second half from memory,
not from the first. So most names in the span are disguised first (`disguised`): replaced, in both
halves alike, by made-up names the model has never seen, which only the first half can tell it.

Neither form taught the demo target to copy in the steps a 2-core CPU affords (2026-11-27, from
the shipped target): 100 steps of plain copy rows (35% of rows, 2 x 1,024 tokens) and 160 of
disguised ones (40%, 4 x 512 and 2 x 1,024) left copy_tune_prompts.jsonl's copy share at
0.00-0.10, and the loss on the second copy of a disguised held-out span as high as on the span
itself (3.70 against 3.78; a model that copies would score near 0 there). The run that teaches it
belongs on a GPU, where a step takes about a hundredth of this CPU's.

On a lent H200 (stop 49: 1,715 steps of 32 x 512 / 16 x 1,024 tokens, 40% copy rows, lr 6e-4,
synthetic share 0.5, copy spans from the standard library only) the target learnt to copy:
`copy_probe` 3.30 / 3.17 at step 500, 3.21 / 1.62 at 1,000, 3.08 / 0.89 at the end, and as low
when the copy starts a third of the way in or after 200 tokens of other text. Yet the tune set's
copy share stayed 0.00-0.04: its prompts cue a copy with a few ambiguous tokens (a CSV row's
digits, a renamed header), and the greedy outputs drifted towards the standard library's style and
repeated themselves. Not shipped. So copy spans now come from the row's own source (the synthetic
modules too, whose style the eval prompts share).

Rows now also look more like what users do: whole lines; a cue line before the copy, often naming
the rename (`cue`); in 40% of rows other text between the span and its copy ("the first function
again"); only code names disguised, so docstrings and comments stay English; and after the copy, what
followed the span, under the same names (the old rows went on with the source's real names after a
disguised copy, a contradiction to learn). On a lent H100 (stop 50, synthetic share 0.75, lr 4e-4),
they teach more slowly: 1,400 steps at 30% copy rows left the probe at 3.96 / 3.65, 1,410 more at 50%
at 3.78 / 2.14, 411 more at 3.77 / 1.78, and the tune set's copy share at 0.00-0.20. Not shipped; the
next run continues that checkpoint (runs/s50/gpu/NEXT.md, outside git).
"""

from __future__ import annotations

import builtins
import keyword
import re

import numpy as np

IDENTIFIER = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]{2,}\b")
# a name used as code somewhere (defined, imported, called, assigned, an argument), not a word of a
# docstring or comment (those stay English, as in the text users paste) nor only an attribute (a
# method of a type it knows: `.append` stays)
CODE_NAME = re.compile(r"(?:(?<=\bdef )|(?<=\bclass )|(?<=\bimport )|(?<=\bas ))([A-Za-z_]\w{2,})\b"
                       r"|(?<![.\w])([A-Za-z_]\w{2,})(?=\s*[(\[=,:)\]]|\.\w)")
CUES = ("", "", "# The same, again:", "# Renamed:", "# again:", "# copy")  # the line before a copy
NAMED_CUES = ("# {old} again, as {new}:", "# {new}, a copy of {old}:", "# as above, with {old} renamed {new}",
              "# {new} (the same as {old})", "# {new}:")  # before a copy that renames {old} to {new}
GAP_SHARE = 0.4  # rows with other text between the span and its copy (a file, then "that function again")
RENAME_SHARE = 0.7  # rows whose copy renames an identifier (the rest copy verbatim)
DISGUISE_SHARE = 0.7  # of a span's names, the share replaced by made-up ones
SYLLABLES = ("ka", "lo", "mi", "ter", "vax", "qu", "ron", "bel", "dis", "fen", "gor", "hul", "jin", "pra",
             "sul", "tor", "wex", "zim", "an", "ob", "ri", "cus", "del", "nip")
KEPT = {"self", "cls"} | set(dir(builtins))


def made_up_name(rng: np.random.Generator) -> str:
    parts = [SYLLABLES[int(i)] for i in rng.integers(len(SYLLABLES), size=int(rng.integers(2, 4)))]
    return ("_" if rng.random() < 0.5 else "").join(parts)


def disguised(text: str, rng: np.random.Generator) -> str:
    """`text` with most of its code names (CODE_NAME; not keywords, builtins, self or cls) replaced
    everywhere by made-up ones, each name by its own."""
    taken = set(IDENTIFIER.findall(text))
    code = {a or b for a, b in CODE_NAME.findall(text)}
    new: dict[str, str] = {}
    for name in sorted(n for n in code if not keyword.iskeyword(n) and n not in KEPT):
        if rng.random() < DISGUISE_SHARE:
            made = made_up_name(rng)
            while made in taken:  # two names made one, or a name the text already has
                made = made_up_name(rng)
            taken.add(made)
            new[name] = made
    if not new:
        return text
    return IDENTIFIER.sub(lambda m: new.get(m.group(0), m.group(0)), text)


def renamed(text: str, rng: np.random.Generator) -> str:
    """`text` with one identifier that occurs at least twice renamed everywhere (or unchanged when
    none does); keywords, builtins, self and cls stay, as in `disguised`."""
    return renaming(text, rng)[0]


def renaming(text: str, rng: np.random.Generator) -> tuple[str, str, str]:
    """(`renamed`'s text, the old name, the new one); the names are "" when nothing was renamed."""
    counts: dict[str, int] = {}
    for name in IDENTIFIER.findall(text):
        if not keyword.iskeyword(name) and name not in KEPT:
            counts[name] = counts.get(name, 0) + 1
    names = sorted(n for n, c in counts.items() if c >= 2)
    if not names:
        return text, "", ""
    old = names[int(rng.integers(len(names)))]
    new = ("new_", "other_", "my_", "")[int(rng.integers(4))] + old + ("", "2", "_v2", "_copy")[int(rng.integers(4))]
    if new == old:
        new = old + "2"
    return swapped(text, old, new), old, new


def swapped(text: str, old: str, new: str) -> str:
    """`text` with the name `old` (a whole word) written `new` everywhere."""
    return re.sub(rf"\b{re.escape(old)}\b", new, text)


def cue(rng: np.random.Generator, old: str, new: str) -> str:
    """What stands between a span (and any text after it) and its copy: blank lines, often a comment
    that says a copy follows, naming the rename when there is one."""
    if old and rng.random() < 0.7:
        line = NAMED_CUES[int(rng.integers(len(NAMED_CUES)))].format(old=old, new=new)
    else:
        line = CUES[int(rng.integers(len(CUES)))]
    return "\n\n" + (line + "\n" + "\n" * int(rng.integers(2)) if line else "\n" * int(rng.integers(2)))


def copy_row(rng: np.random.Generator, tokenizer, ids: np.ndarray, seq_len: int) -> np.ndarray:
    """seq_len + 1 tokens: whole lines of `ids` (a quarter to half of the row) with their names
    disguised, sometimes the lines that follow them (GAP_SHARE: then the span is a sixth to a third,
    the text between up to a quarter), a cue (`cue`), then the span again (renamed or verbatim) and
    what followed it, with the same names, to the row's end."""
    gap = rng.random() < GAP_SHARE
    length = int(rng.integers(seq_len // 6, seq_len // 3 + 1) if gap else rng.integers(seq_len // 4, seq_len // 2 + 1))
    between = int(rng.integers(seq_len // 16, seq_len // 4 + 1)) if gap else 0
    start = int(rng.integers(0, len(ids) - length - between - 2 * seq_len - 2))
    cuts = (start, start + length, start + length + between, start + length + between + seq_len)
    pieces = [tokenizer.decode(ids[a:b].tolist()) for a, b in zip(cuts, cuts[1:])]
    whole, ends = "".join(pieces), np.cumsum([len(p) for p in pieces])
    first = whole.find("\n") + 1  # whole lines, as one copies a function or a table
    while whole.startswith("\n", first) and first < ends[0]:
        first += 1
    span_end, after_end = (whole.rfind("\n", 0, int(e)) + 1 for e in ends[:2])
    if not first < span_end <= after_end:  # no line ends in the span: its tokens as they are
        first, span_end, after_end = 0, int(ends[0]), int(ends[1])
    masked = disguised("\0".join((whole[first:span_end], whole[span_end:after_end], whole[after_end:])), rng)
    text, after, tail = masked.split("\0")  # one disguise: names agree throughout
    again, old, new = renaming(text, rng) if rng.random() < RENAME_SHARE else (text, "", "")
    rest = swapped(after + tail, old, new) if old else after + tail
    row = tokenizer.encode(text + after + cue(rng, old, new) + again + rest).ids[: seq_len + 1]
    if len(row) < seq_len + 1:  # a tokenizer that merges more across the joins than the cut ids did
        row += ids[cuts[3] : cuts[3] + seq_len + 1 - len(row)].tolist()
    return np.asarray(row, dtype=ids.dtype)


def copy_probe(model, tokenizer, ids: np.ndarray, spans: int = 24, seed: int = 5) -> tuple[float, float]:
    """(mean loss on held-out disguised spans, on their copies right after them, a blank line
    between): a model that copies scores near 0 on the copy, one that does not about what it
    scores on the span. Shipped demo target (2026-11-27): 5.75 / 5.56."""
    import mlx.core as mx
    import mlx.nn as nn

    rng = np.random.default_rng(seed)
    blank = tokenizer.encode("\n\n").ids
    first, second = [], []
    for _ in range(spans):
        length = int(rng.integers(64, 129))
        start = int(rng.integers(0, len(ids) - length - 10))
        span = tokenizer.encode(disguised(tokenizer.decode(ids[start : start + length].tolist()), rng)).ids
        row = span + blank + span
        loss = nn.losses.cross_entropy(model(mx.array(row[:-1])[None])[0], mx.array(row[1:]))
        n = len(span)
        first.append(loss[: n - 1].mean().item())
        second.append(loss[n + len(blank) :].mean().item())  # its first token is anyone's guess
    return float(np.mean(first)), float(np.mean(second))
