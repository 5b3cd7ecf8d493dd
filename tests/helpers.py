"""Small helpers shared by tests (plain functions and constants; fixtures live in conftest.py)."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np

from engine.decode.events import RoundEvent, SummaryEvent
from engine.decode.generate import generate
from engine.decode.settings import GenerationSettings
from engine.decode.prompts import encode_prompt
from engine.training.trainer import TrainSettings

PROMPTS = [
    "def main():\n    parser = argparse.ArgumentParser(",
    "import json\n\nclass Decoder:\n",
    "The quick brown fox",
    "    return textwrap.dedent(text)",
]

# A training run small enough for a unit test: one layer, six steps.
SMALL_TRAINING = TrainSettings(layers=1, block_size=8, steps=6, batch=2, seq_len=48, anchors=4, lr=3e-3, warmup=2,
                      eval_every=3, eval_fraction=0.1)


def run(pair, prompt, **settings):
    """(summary, rounds) of one generation of a raw prompt."""
    ids = encode_prompt(pair.tokenizer, prompt, chat=False) if isinstance(prompt, str) else prompt
    rounds, summary = [], None
    for event in generate(pair, ids, GenerationSettings(**settings)):
        if isinstance(event, RoundEvent):
            rounds.append(event)
        elif isinstance(event, SummaryEvent):
            summary = event
    return summary, rounds


def in_thread(fn):
    """Run fn() on a new thread; return its result or re-raise its exception here."""
    import threading

    box = {}

    def work():
        try:
            box["result"] = fn()
        except BaseException as exc:  # surfaced in the calling thread
            box["error"] = exc

    t = threading.Thread(target=work)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["result"]



def assert_lossless(pair, prompts, **settings):
    """Greedy DFlash equals greedy AR on each prompt (48 tokens), or flips only at a reported near-tie."""
    from engine.tools.parity import run_parity

    for prompt in prompts:
        ids = encode_prompt(pair.tokenizer, prompt, chat=False)
        result = run_parity(pair, ids, GenerationSettings(max_tokens=48, **settings))
        if not result.identical:
            # Only a floating-point near-tie may flip, and the tools must say where and by how much.
            assert result.margin_at_divergence is not None, (prompt, result.to_dict())
            assert result.margin_at_divergence < result.near_tie, (prompt, result.to_dict())
        assert result.dflash.num_rounds > 0


def edit_config(folder, change):
    """Apply change(config) to folder/config.json."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))


def make_trainer(target_dir, corpus_dir, out, settings):
    """A DrafterTrainer for the target in target_dir on the .py files of corpus_dir."""
    from engine.models.pair import load_pair
    from engine.training.data import read_texts, token_stream
    from engine.training.trainer import DrafterTrainer

    pair = load_pair(target_dir, None)
    tokens = token_stream(pair.tokenizer, read_texts([str(corpus_dir)]), pair.tokenizer.eos_token_id)
    return DrafterTrainer(pair, tokens, out, settings)


def prefilled(model, prompt):
    """A fresh cache of `model` with `prompt` run through it (a target's state before a verify)."""
    import mlx.core as mx

    from engine.models.target import make_target_cache

    cache = make_target_cache(model)
    mx.eval(model(mx.array(prompt)[None], cache=cache))
    return cache


def attention_rows(rng, heads: int, rows: int, width: int, dtype) -> mx.array:
    """(1, heads, rows, width) random rows as an attention layer hands its queries and keys to its
    rope: a transposed view."""
    x = mx.array(rng.normal(size=(1, rows, heads, width)).astype(np.float32) * 3).astype(dtype)
    return x.transpose(0, 2, 1, 3)


# (rope dims, head width, base, dtype) the rope tests hold to the rope's own bits: full ropes of each
# float dtype, and a partial one (8 of 32 features, as the hybrid demo target's)
ROPE_CASES = [(32, 32, 10000.0, mx.float32), (64, 64, 1e6, mx.float32), (128, 128, 5e5, mx.bfloat16),
              (16, 16, 10000.0, mx.float16), (8, 32, 10000.0, mx.float32)]
