"""Training text written by the target itself: greedy continuations of prompts cut from the data.

A drafter is asked to predict the target's greedy output given the target's own
context. Teacher forcing on the raw corpus shows it the corpus's contexts instead,
which small targets rarely produce themselves (they loop, drift, repeat names).
Continuations generated here put the drafter's training contexts where inference
will put them. Generation is batched and greedy, so it is deterministic for a seed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable, Optional

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from engine.models.checkpoint import target_fingerprint
from engine.errors import DFlashError
from engine.models.pair import LoadedPair
from engine.safe_write import atomic_path, write_atomic

PROMPT_LENS = (8, 64)  # shortest and longest prompt cut from the data, in tokens
DISTILL_BATCH = 128  # rows per batched decode: big enough for BLAS to pay, small enough for any target cache
# (a GPU, launch-bound on a small target, writes text several times faster at 1,024: the recipes' --distill-batch)


def greedy_continuations(
    pair: LoadedPair,
    tokens: np.ndarray,
    sequences: int,
    prompt_lens: tuple[int, int] = PROMPT_LENS,
    new_tokens: int = 224,
    batch: int = 32,
    seed: int = 0,
    progress: Optional[Callable[[float, int], None]] = None,
    kept: Optional[dict[int, np.ndarray]] = None,
    on_batch: Optional[Callable[[dict[int, np.ndarray]], None]] = None,
) -> np.ndarray:
    """One int32 stream of `sequences` rows [prompt, greedy continuation], each cut after
    the first EOS it generates and followed by EOS.

    Prompts are windows of `tokens` at random starts with a random length in prompt_lens
    (one length per batch, so a batch prefills without padding). `kept`: rows (by index) of a run
    that stopped, taken instead of written again (the random draws are made all the same, so the
    rest is what an unstopped run writes); `on_batch` gets each batch's rows as they are done.
    """
    lo, hi = prompt_lens
    if sequences < 1 or new_tokens < 1 or batch < 1 or not 1 <= lo <= hi:
        raise DFlashError("distillation needs sequences, new tokens and batch >= 1 and 1 <= min prompt <= max prompt.")
    if len(tokens) <= hi:
        raise DFlashError(f"the data holds {len(tokens)} tokens; distillation prompts need more than {hi}.")
    rng = np.random.default_rng(seed)
    rows: list[np.ndarray] = []
    while len(rows) < sequences:
        n = min(batch, sequences - len(rows))
        plen = int(rng.integers(lo, hi + 1))
        starts = rng.integers(0, len(tokens) - plen, size=n)
        members = range(len(rows), len(rows) + n)
        if kept is not None and all(i in kept for i in members):
            rows += [kept[i] for i in members]
        else:
            prompts = np.stack([tokens[s : s + plen] for s in starts]).astype(np.int32)
            done = _rows(pair, prompts, new_tokens, _within(progress, len(rows), n, sequences))
            rows += done
            if on_batch is not None:
                on_batch(dict(zip(members, done)))
        if progress is not None:
            progress(len(rows), sequences)
    return np.concatenate(rows)


def prompt_continuations(
    pair: LoadedPair,
    prompts: list[list[int]],
    new_tokens: int = 224,
    batch: int = 32,
    progress: Optional[Callable[[float, int], None]] = None,
    kept: Optional[dict[int, np.ndarray]] = None,
    on_batch: Optional[Callable[[dict[int, np.ndarray]], None]] = None,
) -> np.ndarray:
    """greedy_continuations' rows for given prompts (say, ones shaped like real use), in order
    (`kept` and `on_batch` as there).

    Prompts of equal length are decoded together, so no batch needs padding.
    """
    if not prompts or any(len(p) < 1 for p in prompts) or new_tokens < 1 or batch < 1:
        raise DFlashError("distillation needs at least one non-empty prompt, and new tokens and batch >= 1.")
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    rows: dict[int, np.ndarray] = {}
    for length in sorted(by_len):
        members = by_len[length]
        for k in range(0, len(members), batch):
            chunk = members[k : k + batch]
            if kept is not None and all(i in kept for i in chunk):
                rows.update((i, kept[i]) for i in chunk)
            else:
                batch_rows = _rows(pair, np.array([prompts[i] for i in chunk], dtype=np.int32), new_tokens,
                                   _within(progress, len(rows), len(chunk), len(prompts)))
                rows.update(zip(chunk, batch_rows))
                if on_batch is not None:
                    on_batch(dict(zip(chunk, batch_rows)))
            if progress is not None:
                progress(len(rows), len(prompts))
    return np.concatenate([rows[i] for i in range(len(prompts))])


def cached_continuations(
    pair: LoadedPair,
    tokens: np.ndarray,
    cache_file: Path,
    sequences: int,
    new_tokens: int = 224,
    seed: int = 0,
    progress: Optional[Callable[[float, int], None]] = None,
    batch: Optional[int] = None,
) -> np.ndarray:
    """greedy_continuations, saved to cache_file (.npy, with a .json of its settings) and
    reused while the settings and the source length match, so a resumed run trains on
    the same text without generating it again."""
    meta = {"sequences": sequences, "new_tokens": new_tokens, "seed": seed, "source_tokens": int(len(tokens)),
            "target": target_fingerprint(pair.target_path)}
    return _cached(cache_file, meta, lambda kept, on_batch: greedy_continuations(
        pair, tokens, sequences, new_tokens=new_tokens, batch=batch or DISTILL_BATCH, seed=seed, progress=progress,
        kept=kept, on_batch=on_batch))


def cached_prompt_continuations(
    pair: LoadedPair,
    prompts: list[list[int]],
    cache_file: Path,
    new_tokens: int = 224,
    progress: Optional[Callable[[float, int], None]] = None,
    batch: Optional[int] = None,
) -> np.ndarray:
    """prompt_continuations, cached like cached_continuations (keyed by a hash of the prompts)."""
    digest = hashlib.sha256(json.dumps(prompts).encode()).hexdigest()
    meta = {"prompts": len(prompts), "prompts_sha256": digest, "new_tokens": new_tokens,
            "target": target_fingerprint(pair.target_path)}
    return _cached(cache_file, meta, lambda kept, on_batch: prompt_continuations(
        pair, prompts, new_tokens=new_tokens, batch=batch or DISTILL_BATCH, progress=progress, kept=kept,
        on_batch=on_batch))


class KeptRows:
    """The rows a distillation has written so far, saved beside its cache file after every batch
    (CACHE.partial.npz, with the cache's description): a batch of a real target's text takes minutes,
    and Ctrl-C, a crash or a closed terminal must not throw the finished ones away. A run with the
    same description goes on from them; the file goes once the cache is whole."""

    def __init__(self, cache_file: Path, meta: dict):
        self.path = cache_file.with_name(cache_file.name + ".partial.npz")
        self.meta = json.dumps(meta, sort_keys=True)
        self.rows: dict[int, np.ndarray] = {}
        try:
            with np.load(self.path) as saved:
                if str(saved["meta"]) == self.meta:
                    cuts = np.cumsum(saved["lengths"])[:-1]
                    self.rows = dict(zip(saved["indices"].tolist(), np.split(saved["stream"], cuts)))
        except (OSError, ValueError, KeyError):
            pass  # none, or another run's, or cut short: written again

    def add(self, rows: dict[int, np.ndarray]) -> None:
        self.rows.update(rows)
        indices = sorted(self.rows)
        with atomic_path(self.path, ".npz") as tmp:  # np.savez adds .npz to any other name
            np.savez(tmp, meta=np.array(self.meta), indices=np.array(indices, dtype=np.int64),
                     lengths=np.array([len(self.rows[i]) for i in indices], dtype=np.int64),
                     stream=np.concatenate([self.rows[i] for i in indices]).astype(np.int32))

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def _cached(cache_file: Path, meta: dict, make: Callable[..., np.ndarray]) -> np.ndarray:
    """`make(kept, on_batch)` once, its stream saved to `cache_file` with `meta` beside it; reused while the
    description matches, and resumed from the rows a stopped run kept (KeptRows)."""
    meta_file = cache_file.with_suffix(".json")
    if cache_file.is_file() and meta_file.is_file():
        try:
            if json.loads(meta_file.read_text()) == meta:
                return np.load(cache_file)
        except (ValueError, OSError):
            pass  # unreadable cache: generate again
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    kept = KeptRows(cache_file, meta)
    stream = make(kept.rows, kept.add)
    meta_file.unlink(missing_ok=True)  # a crash before the new description leaves no description: regenerated
    with atomic_path(cache_file, ".npy") as tmp:  # np.save adds .npy to any other name
        np.save(tmp, stream)  # the stream whole before its description says it is there
    write_atomic(meta_file, json.dumps(meta), "the training text's description")
    kept.remove()
    return stream


def _within(progress: Optional[Callable[[float, int], None]], done: int, rows: int,
            total: int) -> Optional[Callable[[float], None]]:
    """A batch's own progress (the fraction of its tokens written) as the run's, in rows: a batch of 128
    rows takes minutes on a real target, and the bar should not sit still through it."""
    if progress is None:
        return None
    return lambda fraction: progress(done + rows * fraction, total)


def _rows(pair: LoadedPair, prompts: np.ndarray, new_tokens: int,
          on_progress: Optional[Callable[[float], None]] = None) -> list[np.ndarray]:
    """[prompt, greedy continuation cut after its first EOS, EOS] for each row of prompts (B, P)."""
    eos = pair.tokenizer.eos_token_id
    rows = []
    for prompt, gen in zip(prompts, _generate_batch(pair.target, prompts, new_tokens, on_progress)):
        stop = np.flatnonzero(gen == eos)
        gen = gen[: stop[0]] if stop.size else gen
        rows.append(np.concatenate([prompt, gen, [eos]]).astype(np.int32))
    return rows


PROGRESS_EVERY = 16  # tokens between progress reports (each waits for a token that many steps back: no pause)


def _generate_batch(model, prompts: np.ndarray, new_tokens: int,
                    on_progress: Optional[Callable[[float], None]] = None) -> np.ndarray:
    """(B, new_tokens) greedy tokens after each prompt row; no step waits for the host, but for a progress
    report every PROGRESS_EVERY tokens."""
    cache = make_prompt_cache(model)
    y = mx.argmax(model(mx.array(prompts), cache=cache)[:, -1], axis=-1)
    out = [y]
    for i in range(1, new_tokens):
        y = mx.argmax(model(y[:, None], cache=cache)[:, -1], axis=-1)
        mx.async_eval(y)
        out.append(y)
        if on_progress is not None and i % PROGRESS_EVERY == 0:
            mx.eval(out[-PROGRESS_EVERY])  # written, not only queued: the steps after it stay in flight
            on_progress((len(out) - PROGRESS_EVERY + 1) / new_tokens)
    return np.array(mx.stack(out, axis=1))
