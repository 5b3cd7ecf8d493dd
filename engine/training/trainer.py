"""Train a DFlash drafter on a frozen target, writing the published checkpoint format.

Each step: the target runs over B sequences of S tokens (taps + its own greedy next
tokens); A anchor positions per sequence become blocks [anchor, mask...]; the drafter
predicts the target's greedy tokens at block positions 1..L-1 with loss weights
exp(-(k-1)/gamma). Batches and anchors come from a generator seeded by (seed, step),
so a resumed run sees exactly what an uninterrupted one would.

DFlash2 (`arch="dflash2"`) adds, with the same weights per position, a K-way cross-entropy of
the candidate selector: at each position the head's top-K candidates are rescored with the
true previous token as predecessor (what the selector sees whenever the earlier drafts were
accepted) and the target's token is the class; positions whose token is not a candidate add
nothing. Its convs start as the identity, so `--init` from a v1 drafter starts from v1's drafts.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import threading
import zlib
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from engine import json_text
from engine.errors import DFlashError
from engine.models.checkpoint import MADE_BY_FILE, canonical_name, model_name, published_name, target_fingerprint
from engine.models.drafter_load import new_drafter
from engine.models.drafter_config import DrafterConfig, parse_drafter_config
from engine.decode.top_k import top_k_indices
from engine.models.pair import LoadedPair
from engine.training.starting_point import (
    TrainSettings, drafter_config_for, find_mask_token, initial_drafter,
)
from engine.models.taps import install_taps
from engine.safe_write import atomic_path, write_atomic
from kernels.verify_attention import whole_sequences

def _sync(folder: Path) -> None:
    """fsync every file in `folder`, then the folder itself."""
    for f in folder.iterdir():
        with open(f, "rb") as handle:
            os.fsync(handle.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


CHECKPOINT_DIR = "checkpoint"
CHECKPOINT_NAMES = (CHECKPOINT_DIR, CHECKPOINT_DIR + ".old", CHECKPOINT_DIR + ".tmp")  # a swap's three stages
CHECKPOINT_FILES = {"state.json", "model.safetensors", "optimizer.safetensors", "config.json", MADE_BY_FILE}


def _crc32(*arrays: np.ndarray) -> int:
    """A checksum of the training text (tokens as int32), to tell a resume on other text."""
    crc = 0
    for a in arrays:
        crc = zlib.crc32(np.ascontiguousarray(a, dtype=np.int32).tobytes(), crc)
    return crc


class DrafterTrainer:
    def __init__(
        self,
        pair: LoadedPair,
        tokens: np.ndarray,
        out: Path,
        s: TrainSettings,
        checkpoint_dir: Optional[Path] = None,
        eval_tokens: Optional[np.ndarray] = None,
    ):
        """`eval_tokens` (held-out text) replaces the default split of the last eval_fraction of `tokens`."""
        if pair.drafter is not None:
            raise DFlashError("train a drafter on a target loaded alone, not with another drafter.")
        self.mask_id = find_mask_token(pair.tokenizer)
        initial = None
        if s.init:
            s, initial_config, initial = initial_drafter(pair, s, self.mask_id)
        self.pair, self.out, self.s = pair, Path(out), s
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else self.out / CHECKPOINT_DIR
        need = s.seq_len + 1
        n_eval = max(int(len(tokens) * s.eval_fraction), need) if s.eval_fraction > 0 and eval_tokens is None else 0
        if len(tokens) - n_eval < need:
            raise DFlashError(
                f"the training data has {len(tokens)} tokens; --seq-len {s.seq_len} needs at least {need + n_eval}."
            )
        if not 2 <= s.block_size <= 16:
            raise DFlashError(f"--block-size {s.block_size} is outside 2..16.")
        if s.seq_len <= s.block_size or s.anchors < 1 or s.batch < 1 or s.steps < 1 or s.layers < 1:
            raise DFlashError("--seq-len must exceed --block-size, and --anchors, --batch, --steps, --layers must be >= 1.")
        self.train_tokens = tokens[: len(tokens) - n_eval]
        if s.batch * s.seq_len > len(self.train_tokens):  # --batch 100000 was killed for memory, unsaid
            raise DFlashError(f"--batch {s.batch} x --seq-len {s.seq_len} is {s.batch * s.seq_len:,} tokens a step, more "
                              f"than the {len(self.train_tokens):,} tokens of training text; lower --batch (a step "
                              "sees windows of the text; memory grows with the batch).")
        self.eval_tokens = eval_tokens if eval_tokens is not None else tokens[len(tokens) - n_eval :]
        # what a checkpoint was trained on: a resume on other text (or for another target) is refused
        self.data = {"train_tokens": int(len(self.train_tokens)), "held_out_tokens": int(len(self.eval_tokens)),
                     "crc32": _crc32(self.train_tokens, self.eval_tokens),
                     "target_fingerprint": target_fingerprint(pair.target_path)}
        mx.random.seed(s.seed)
        if initial is not None:
            self.raw_config, self.drafter = initial_config, initial
        else:
            self.raw_config = drafter_config_for(pair, s, self.mask_id)
            self.drafter = new_drafter(parse_drafter_config(self.raw_config, self.out / "config.json"))
        self.cfg: DrafterConfig = self.drafter.cfg
        self.drafter.set_dtype(pair.head.dtype)
        self.drafter.train()
        self.taps = install_taps(pair.target, self.cfg.target_layer_ids)
        pair.target.freeze()
        L = s.block_size
        self.weights = mx.array([math.exp(-(k - 1) / s.gamma) for k in range(1, L)], dtype=mx.float32)
        warm = min(s.warmup, max(s.steps - 1, 1))
        schedule = optim.join_schedules(
            [optim.linear_schedule(s.lr * 0.01, s.lr, warm), optim.cosine_decay(s.lr, max(s.steps - warm, 1), s.lr * 0.05)],
            [warm],
        )
        self.optimizer = optim.AdamW(learning_rate=schedule, weight_decay=s.weight_decay)
        self.step = 0
        self.history: list[dict] = []
        self._loss_and_grad = nn.value_and_grad(self.drafter, self._loss)

    # ---- data -------------------------------------------------------------------------
    def _windows(self, tokens: np.ndarray, rng: np.random.Generator, batch: int) -> np.ndarray:
        starts = rng.integers(0, len(tokens) - self.s.seq_len, size=batch)
        return np.stack([tokens[i : i + self.s.seq_len] for i in starts])

    def _anchors(self, rng: np.random.Generator, batch: int) -> np.ndarray:
        # An anchor needs context before it and L - 1 target labels after it inside the window.
        high = self.s.seq_len - self.s.block_size + 1
        return np.sort(rng.integers(1, high, size=(batch, self.s.anchors)), axis=1)

    def _target_pass(self, seqs: mx.array) -> tuple[mx.array, mx.array]:
        """(taps (B, S, k*H), the target's greedy next token at every position (B, S))."""
        self.taps.recording = True
        with whole_sequences():  # on the CPU the target's attention over the window runs on the host
            logits = self.pair.target(seqs)
        self.taps.recording = False
        taps = mx.stop_gradient(self.taps.concatenated())
        greedy = mx.argmax(logits, axis=-1)
        self.taps.outputs = {}
        return taps, greedy

    def _blocks(self, seqs: mx.array, greedy: mx.array, anchors: mx.array):
        B, A = anchors.shape
        L = self.s.block_size
        anchor_ids = mx.take_along_axis(seqs, anchors, axis=1)  # (B, A)
        ids = mx.concatenate(
            [anchor_ids[..., None], mx.full((B, A, L - 1), self.mask_id, dtype=anchor_ids.dtype)], axis=-1
        )
        emb = self.drafter.embed(self.pair.head, ids.reshape(B, A * L)).reshape(B, A, L, -1)
        # Label at block position k (1..L-1): the target's greedy token after position anchor + k - 1.
        label_pos = anchors[..., None] + mx.arange(L - 1)[None, None, :]
        labels = mx.take_along_axis(greedy, label_pos.reshape(B, -1), axis=1).reshape(B, A, L - 1)
        # The token each label follows (the selector's predecessor): the sequence's own token at
        # anchor + k - 1, which the target's label was predicted from (the anchor for k = 1).
        prev = mx.take_along_axis(seqs, label_pos.reshape(B, -1), axis=1).reshape(B, A, L - 1)
        return emb, labels, prev

    def _draft(self, emb, taps, anchors) -> tuple[mx.array, mx.array]:
        """(hidden, logits in fp32) at block positions 1..L-1: (B, A, L-1, H) and (B, A, L-1, V)."""
        hidden = self.drafter.forward_blocks(emb, taps, anchors)[:, :, 1:]
        return hidden, self.drafter.logits(self.pair.head, hidden).astype(mx.float32)

    def _weighted_ce(self, logits, labels, counts: Optional[mx.array] = None) -> mx.array:
        """Cross-entropy weighted by block position; `counts` (0/1 per position) leaves some out."""
        ce = nn.losses.cross_entropy(logits, labels, reduction="none")  # (B, A, L-1)
        w = self.weights if counts is None else self.weights * counts
        total = w.sum() if counts is not None else self.weights.sum() * ce.shape[0] * ce.shape[1]
        return (ce * w).sum() / mx.maximum(total, 1e-6)

    def _selector_scores(self, hidden, logits, prev) -> tuple[mx.array, mx.array]:
        """(candidates (B, A, L-1, K), their selector scores) with the true predecessors."""
        sel = self.drafter.candidate_selector
        k = self.cfg.selector.selector_top_k
        candidates = mx.stop_gradient(top_k_indices(logits, k))  # the candidates decoding sees
        unary = mx.take_along_axis(logits, candidates, axis=-1)
        pair = (sel.pair_terms(hidden, candidates) * sel.predecessor(prev)[..., None, :]).sum(axis=-1)
        return candidates, unary + pair

    def _selector_ce(self, hidden, logits, prev, labels) -> mx.array:
        candidates, scores = self._selector_scores(hidden, logits, prev)
        hit = candidates == labels[..., None]
        inside = hit.any(axis=-1).astype(mx.float32)
        return self._weighted_ce(scores, mx.argmax(hit.astype(mx.int32), axis=-1), inside)

    def _loss(self, emb, taps, anchors, labels, prev):
        hidden, logits = self._draft(emb, taps, anchors)
        loss = self._weighted_ce(logits, labels)
        if self.cfg.selector is not None:
            loss = loss + self._selector_ce(hidden, logits, prev, labels)
        return loss

    def batch(self, tokens: np.ndarray, rng: np.random.Generator, batch: int):
        seqs = mx.array(self._windows(tokens, rng, batch))
        anchors = mx.array(self._anchors(rng, batch))
        taps, greedy = self._target_pass(seqs)
        emb, labels, prev = self._blocks(seqs, greedy, anchors)
        return emb, taps, anchors, labels, prev

    # ---- steps ------------------------------------------------------------------------
    def train_step(self) -> float:
        rng = np.random.default_rng([self.s.seed, self.step])
        emb, taps, anchors, labels, prev = self.batch(self.train_tokens, rng, self.s.batch)
        mx.eval(emb, taps, labels, prev)
        loss, grads = self._loss_and_grad(emb, taps, anchors, labels, prev)
        value = float(loss.item())
        if not math.isfinite(value):  # checked before the update: the weights stay finite
            raise DFlashError(f"training diverged at step {self.step + 1} (loss {value}); the last checkpoint "
                              "is kept; lower --lr and --resume, or start again.")
        self.optimizer.update(self.drafter, grads)
        mx.eval(self.drafter.parameters(), self.optimizer.state)
        self.step += 1
        return value

    def evaluate(self, batches: int = 4) -> dict:
        """Held-out loss and a teacher-forced tau estimate (1 + leading correct drafts; DFlash2: the
        selector's picks with the true predecessors, which are its real ones while drafts are right)."""
        rng = np.random.default_rng([self.s.seed, 10**9])
        tokens = self.eval_tokens if len(self.eval_tokens) > self.s.seq_len else self.train_tokens
        losses, taus = [], []
        for _ in range(batches):
            emb, taps, anchors, labels, prev = self.batch(tokens, rng, self.s.batch)
            losses.append(float(self._loss(emb, taps, anchors, labels, prev).item()))
            hidden, logits = self._draft(emb, taps, anchors)
            picks = mx.argmax(logits, axis=-1)
            if self.cfg.selector is not None:
                candidates, scores = self._selector_scores(hidden, logits, prev)
                picks = mx.take_along_axis(candidates, mx.argmax(scores, axis=-1)[..., None], axis=-1)[..., 0]
            right = (picks == labels).astype(mx.int32)
            taus.append(float((1 + mx.cumprod(right, axis=-1).sum(axis=-1)).mean().item()))
        return {"eval_loss": round(float(np.mean(losses)), 4), "tau_estimate": round(float(np.mean(taus)), 3)}

    # ---- files ------------------------------------------------------------------------
    def save_drafter(self, folder: Path) -> None:
        """config.json and model.safetensors, each written beside itself and renamed into place."""
        folder.mkdir(parents=True, exist_ok=True)
        weights = {published_name(k): v for k, v in tree_flatten(self.drafter.parameters())}
        with atomic_path(folder / "model.safetensors", ".safetensors") as tmp:  # mlx wants the suffix
            mx.save_safetensors(str(tmp), weights)
        write_atomic(folder / "config.json", json.dumps(self.raw_config, indent=2), "the drafter config")
        if folder == self.out:
            # a model --force replaced may have been sharded: its shards and index would be read beside ours
            for stale in [*folder.glob("model-*-of-*.safetensors"), *folder.glob("*.safetensors.index.json")]:
                stale.unlink()
            made_for = {"name": model_name(self.pair.target_path), "fingerprint": target_fingerprint(self.pair.target_path)}
            write_atomic(folder / MADE_BY_FILE, json.dumps({
                "made_by": "dflash-playground train-drafter",
                "target": made_for,  # the doctor names a mismatch
                "settings": asdict(self.s),
                "data": {k: v for k, v in self.data.items() if k != "target_fingerprint"},
                "final": self.history[-1] if self.history else None,  # the doctor says when it is barely trained
            }, indent=2), "the training record")

    def save_checkpoint(self) -> Path:
        ckpt = self.checkpoint_dir
        tmp = ckpt.with_name(ckpt.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)  # a write a crash cut short
        tmp.mkdir(parents=True, exist_ok=True)
        self.save_drafter(tmp)
        mx.save_safetensors(str(tmp / "optimizer.safetensors"), dict(tree_flatten(self.optimizer.state)))
        state = {"step": self.step, "settings": asdict(self.s), "history": self.history, "data": self.data}
        (tmp / "state.json").write_text(json.dumps(state, indent=2))
        _sync(tmp)  # on disk before the swap: a power loss cannot leave an empty checkpoint
        old = ckpt.with_name(ckpt.name + ".old")
        if ckpt.exists():
            if old.exists():
                shutil.rmtree(old)
            ckpt.rename(old)
        tmp.rename(ckpt)
        if old.exists():
            shutil.rmtree(old)
        return ckpt

    def resume(self) -> bool:
        """Load the newest complete checkpoint. A crash while one was being replaced leaves the
        previous one as checkpoint.old, or a finished new one as checkpoint.tmp (state.json is
        written last) beside the previous one: the one with the highest step is used, never a
        silent start from step 0."""
        found, unreadable = [], []
        for c in (self.checkpoint_dir, self.checkpoint_dir.with_name(CHECKPOINT_DIR + ".tmp"),
                  self.checkpoint_dir.with_name(CHECKPOINT_DIR + ".old")):
            if not (c / "state.json").is_file():
                continue
            try:
                state = json_text.loads((c / "state.json").read_bytes())
                found.append((int(state["step"]), state, c))
            except (ValueError, KeyError, TypeError) as exc:  # a write cut short: another may be whole
                unreadable.append(f"{c / 'state.json'}: unreadable ({exc})")
        if not found:
            if unreadable:
                raise DFlashError(f"{unreadable[0]}; the checkpoint cannot be resumed.")
            return False
        _, state, ckpt = max(found, key=lambda f: f[0])
        saved = state["settings"]
        differ = []
        for key in ("layers", "block_size", "batch", "seq_len", "anchors", "seed", "steps", "lr", "init", "taps",
                    "intermediate_size", "warmup", "gamma", "weight_decay", "arch", "selector_rank",
                    "selector_top_k", "conv_kernel", "conv_group"):
            was = saved.get(key, getattr(TrainSettings, key, None))  # keys added since: their default
            if was != getattr(self.s, key):
                differ.append((key, was))
        if differ:  # all of them at once (one per try, before), with the flags that resume it
            made = ", ".join(f"{k}={v}" for k, v in differ)
            now = ", ".join(f"{k}={getattr(self.s, k)}" for k, _ in differ)
            flags = " ".join(f"--{k.replace('_', '-')} {','.join(map(str, v)) if isinstance(v, list) else v}"
                             for k, v in differ if v is not None)
            raise DFlashError(f"{ckpt / 'state.json'}: the checkpoint was made with {made} (this command: {now}); "
                              f"resume with the same settings ({flags}), or use a new --out (a longer run: "
                              "--init the finished drafter).")
        data = state.get("data")  # checkpoints from before it was kept: not checked
        if isinstance(data, dict) and data != self.data:
            what = "for another target" if data.get("target_fingerprint") != self.data["target_fingerprint"] else \
                f"on other text ({data.get('train_tokens')} training tokens, not {self.data['train_tokens']})" \
                if data.get("train_tokens") != self.data["train_tokens"] else "on other text (same length)"
            raise DFlashError(f"{ckpt / 'state.json'}: the checkpoint was trained {what}; resume with the same "
                              "--target, --data and distillation settings, or use a new --out.")
        self.drafter.load_weights([(canonical_name(k), v) for k, v in mx.load(str(ckpt / "model.safetensors")).items()])
        self.optimizer.state = tree_unflatten(list(mx.load(str(ckpt / "optimizer.safetensors")).items()))
        self.step = state["step"]
        self.history = state["history"]
        return True

    def run(
        self,
        checkpoint_every: int = 100,
        on_step: Callable[[int, float], None] = lambda step, loss: None,
        on_eval: Callable[[dict], None] = lambda record: None,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        """Train to `steps`, checkpointing as it goes; an interruption saves before it propagates.

        Ctrl-C (and SIGTERM, SIGHUP) is held back while a step runs (a step cut between its update and its count would be
        saved under the previous step number and applied twice on resume): it ends the run after
        the step, with a checkpoint of a consistent state."""
        interrupted = []
        restore = {}
        if threading.current_thread() is threading.main_thread():  # a closed terminal or a kill saves as Ctrl-C does
            for name in ("SIGINT", "SIGTERM", "SIGHUP"):
                number = getattr(signal, name, None)
                if number is None or (name != "SIGINT" and signal.getsignal(number) is signal.SIG_IGN):
                    continue  # nohup's SIGHUP stays ignored; Ctrl-C always saves and stops (as it always did)
                previous = signal.signal(number, lambda signum, frame: interrupted.append(signum))
                # None: set outside Python, which cannot put it back; the default then, never ours left behind
                restore[number] = previous if previous is not None else signal.SIG_DFL
        try:
            while self.step < self.s.steps and not should_stop():
                if interrupted:
                    raise KeyboardInterrupt
                loss = self.train_step()
                on_step(self.step, loss)
                if self.step % self.s.eval_every == 0 or self.step == self.s.steps:
                    record = {"step": self.step, "train_loss": round(loss, 4), **self.evaluate()}
                    self.history.append(record)
                    on_eval(record)
                if self.step % checkpoint_every == 0:
                    self.save_checkpoint()
            if interrupted:
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            self.save_checkpoint()
            raise
        finally:
            for number, handler in restore.items():
                signal.signal(number, handler)
        self.save_checkpoint()
        self.save_drafter(self.out)
