"""`dflash-playground train-drafter`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from engine.errors import DFlashError

DISTILL_FILE = "distill.npy"


def add_parser(sub) -> None:
    t = sub.add_parser("train-drafter", help="train a DFlash drafter for a target")
    t.add_argument("--target", required=True, help="target model: folder or Hugging Face id")
    t.add_argument("--data", required=True, nargs="+", help="text files, folders of them, or JSONL with 'text'")
    t.add_argument("--out", required=True, help="output folder (config.json + model.safetensors)")
    t.add_argument("--layers", type=int, default=1)
    t.add_argument("--block-size", type=int, default=16)
    t.add_argument("--taps", default="auto", help="'auto' or comma-separated target layer ids")
    t.add_argument("--steps", type=int, default=1000)
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--seq-len", type=int, default=256)
    t.add_argument("--anchors", type=int, default=8, help="blocks per sequence per step")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=int, default=50)
    t.add_argument("--intermediate-size", type=int, help="drafter MLP width (default: the target's)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--eval-every", type=int, default=100)
    t.add_argument("--checkpoint-every", type=int, default=100)
    t.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")
    t.add_argument("--distill", type=int, default=0, metavar="N",
                   help="train on N greedy continuations written by the target from prompts cut from --data "
                        "(contexts like those it meets at inference); saved in OUT/distill.npy for --resume")
    t.add_argument("--distill-new-tokens", type=int, default=224, help="tokens per continuation")


def _parse_taps(text: str):
    if text == "auto":
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DFlashError(f"--taps '{text}' must be 'auto' or comma-separated integers.") from None


def _distilled(pair, tokens, out: Path, args: argparse.Namespace):
    from tqdm import tqdm

    from engine.training.distill import cached_continuations

    bar = tqdm(total=args.distill, unit="seq", desc="target writes training text", file=sys.stderr, dynamic_ncols=True)

    def progress(done: int, total: int) -> None:
        bar.update(done - bar.n)

    try:
        return cached_continuations(pair, tokens, out / DISTILL_FILE, args.distill, args.distill_new_tokens,
                                    args.seed, progress)
    except KeyboardInterrupt:
        raise DFlashError("interrupted while the target was writing the training text; nothing was trained yet.") from None
    finally:
        bar.close()


def cmd_train_drafter(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from engine.session import load_pair
    from engine.training.data import read_texts, token_stream
    from engine.training.trainer import CHECKPOINT_DIR, DrafterTrainer, TrainSettings

    out = Path(args.out)
    if (out / CHECKPOINT_DIR).exists() and not args.resume:
        raise DFlashError(f"{out / CHECKPOINT_DIR} exists: pass --resume to continue it, or choose another --out.")
    settings = TrainSettings(
        layers=args.layers, block_size=args.block_size, taps=_parse_taps(args.taps), steps=args.steps,
        batch=args.batch, seq_len=args.seq_len, anchors=args.anchors, lr=args.lr, warmup=args.warmup,
        seed=args.seed, intermediate_size=args.intermediate_size, eval_every=args.eval_every,
    )
    texts = read_texts(args.data)
    pair = load_pair(args.target, None)
    eos = pair.tokenizer.eos_token_id
    tokens = token_stream(pair.tokenizer, texts, eos if eos is not None else 0)
    if args.distill < 0 or args.distill_new_tokens < 1:
        raise DFlashError("--distill must be >= 0 (0: train on --data as it is) and --distill-new-tokens >= 1.")
    if args.distill:
        tokens = _distilled(pair, tokens, out, args)
    trainer = DrafterTrainer(pair, tokens, out, settings)
    if args.resume and trainer.resume():
        print(f"resumed from step {trainer.step}", file=sys.stderr)
    print(f"{len(tokens)} tokens ({len(trainer.eval_tokens)} held out); taps {trainer.cfg.target_layer_ids}; "
          f"mask id {trainer.mask_id}", file=sys.stderr)
    tokens_per_step = settings.batch * settings.seq_len
    bar = tqdm(total=settings.steps, initial=trainer.step, unit="step", file=sys.stderr, dynamic_ncols=True)
    started, start_step = time.perf_counter(), trainer.step

    def on_step(step: int, loss: float) -> None:
        rate = (step - start_step) * tokens_per_step / max(time.perf_counter() - started, 1e-9)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:.0f}")
        bar.update(1)

    def on_eval(record: dict) -> None:
        bar.write(f"step {record['step']}: train {record['train_loss']:.3f}  held-out {record['eval_loss']:.3f}  "
                  f"tau~{record['tau_estimate']:.2f}  (checkpoint in {out / CHECKPOINT_DIR})")

    try:
        trainer.run(args.checkpoint_every, on_step, on_eval)
    except KeyboardInterrupt:
        bar.close()
        print(f"\ninterrupted at step {trainer.step}; saved {out / CHECKPOINT_DIR}. Continue with --resume.",
              file=sys.stderr)
        return 130
    bar.close()
    print(f"wrote {out / 'config.json'} and {out / 'model.safetensors'}", file=sys.stderr)
    return 0
