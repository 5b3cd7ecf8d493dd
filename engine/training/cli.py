"""`dflash-playground train-drafter`."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
from typing import Optional
from pathlib import Path

from engine.errors import DFlashError
from engine.json_text import is_int

DISTILL_FILE = "distill.npy"
DISTILL_PROMPTS_FILE = "distill_prompts.npy"


def add_parser(sub) -> None:
    t = sub.add_parser("train-drafter", help="train a DFlash drafter for a target")
    t.add_argument("--target", required=True, help="target model: folder or Hugging Face id")
    t.add_argument("--data", required=True, nargs="+", help="text files, folders of them, or JSONL with 'text'")
    t.add_argument("--out", required=True, help="output folder (config.json + model.safetensors)")
    t.add_argument("--init", metavar="DRAFTER",
                   help="fine-tune this drafter (folder or Hugging Face id) instead of starting from random "
                        "weights; it fixes layers, taps, block size and MLP width")
    t.add_argument("--arch", choices=("dflash", "dflash2"), default="dflash",
                   help="dflash (v1, the default) or dflash2 (a conv around each sublayer and a candidate selector); "
                        "with --init from a v1 drafter, dflash2 keeps its weights and adds the new parts")
    t.add_argument("--selector-top-k", type=int, default=8, help="DFlash2: candidates per drafted position")
    t.add_argument("--selector-rank", type=int, default=64, help="DFlash2: rank of the selector's codebooks")
    t.add_argument("--conv-kernel", type=int, default=2, help="DFlash2: taps of each conv")
    t.add_argument("--conv-group", type=int, default=16, help="DFlash2: channels sharing one dynamic kernel")
    t.add_argument("--layers", type=int, help="drafter layers (default 1)")
    t.add_argument("--block-size", type=int, help="block size (default 16)")
    t.add_argument("--taps", help="'auto' (the default) or comma-separated target layer ids")
    t.add_argument("--steps", type=int, default=1000, help="training steps (default %(default)s)")
    t.add_argument("--batch", type=int, default=8,
                   help="windows of the text per step (default %(default)s; batch x seq-len tokens a step, at most "
                        "the training text's)")
    t.add_argument("--seq-len", type=int, default=256,
                   help="tokens per window (default %(default)s; drafts deep in long prompts want longer windows)")
    t.add_argument("--anchors", type=int, default=8, help="blocks per sequence per step")
    t.add_argument("--lr", type=float, default=1e-3, help="AdamW peak learning rate, cosine decay (default %(default)s)")
    t.add_argument("--warmup", type=int, default=50, help="steps of linear warm-up (default %(default)s)")
    t.add_argument("--intermediate-size", type=int, help="drafter MLP width (default: the target's)")
    t.add_argument("--seed", type=int, default=0, help="initial weights and windows drawn (default %(default)s)")
    t.add_argument("--eval-every", type=int, default=100,
                   help="steps between held-out loss and tau estimates (default %(default)s)")
    t.add_argument("--checkpoint-every", type=int, default=100,
                   help="steps between checkpoints that --resume goes on from (default %(default)s)")
    t.add_argument("--resume", action="store_true",
                   help="continue from OUT/checkpoint; give the run's settings again (it names any that differ)")
    t.add_argument("--force", action="store_true",
                   help="replace the drafter already in --out, or start an unfinished run there anew (never the "
                        "target itself, nor the --init drafter)")
    t.add_argument("--distill", type=int, default=0, metavar="N",
                   help="train on N greedy continuations written by the target from prompts cut from --data "
                        "(contexts like those it meets at inference); saved in OUT/distill.npy for --resume")
    t.add_argument("--distill-prompts", metavar="JSONL",
                   help="also train on the target's continuation of every prompt in this file (one "
                        "{\"prompt\": ...} per line, as for bench, encoded as generate encodes them): prompts "
                        "shaped like your own use; saved in OUT/distill_prompts.npy")
    t.add_argument("--distill-new-tokens", type=int, default=224, help="tokens per continuation")


def _parse_taps(text: str):
    if text == "auto":
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DFlashError(f"--taps '{text}' must be 'auto' or comma-separated integers.") from None


def _distilled(pair, tokens, out: Path, args: argparse.Namespace):
    """The training stream: continuations of --distill windows and/or of --distill-prompts, each cached."""
    import numpy as np

    from engine.tools.bench import load_prompts
    from engine.decode.prompts import encode_prompt
    from engine.training.distill import cached_continuations, cached_prompt_continuations

    parts = []  # (what, tokens): --distill's continuations replace the corpus; --distill-prompts' add to it
    if args.distill:
        parts.append((f"the target's continuations of {args.distill:,} windows of --data", _with_bar(
            args.distill, lambda progress: cached_continuations(
                pair, tokens, out / DISTILL_FILE, args.distill, args.distill_new_tokens, args.seed, progress))))
    else:
        parts.append(("--data", tokens))
    if args.distill_prompts:
        prompts = [encode_prompt(pair.tokenizer, text) for text in load_prompts(args.distill_prompts)]
        parts.append((f"the target's continuations of {len(prompts):,} --distill-prompts", _with_bar(
            len(prompts), lambda progress: cached_prompt_continuations(
                pair, prompts, out / DISTILL_PROMPTS_FILE, args.distill_new_tokens, progress))))
    print("training text: " + " + ".join(f"{what} ({len(part):,} tokens)" for what, part in parts), file=sys.stderr)
    return np.concatenate([part for _, part in parts])


def _with_bar(total: int, make):
    from tqdm import tqdm

    bar = tqdm(total=total, unit="seq", desc="target writes training text", file=sys.stderr, dynamic_ncols=True,
               bar_format="{l_bar}{bar}| {n:.0f}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]")  # n moves within a batch
    try:
        return make(lambda done, _total: bar.update(done - bar.n))
    except KeyboardInterrupt:
        bar.close()
        from engine.training.distill import DISTILL_BATCH

        print(f"\ninterrupted while the target was writing the training text, after {bar.n:.0f} of {total} "
              f"sequences; nothing was trained yet. The target writes {DISTILL_BATCH} sequences at a time: each "
              "such batch it finished is kept, and the same command goes on from them (a batch cut short is "
              "written again).", file=sys.stderr)
        raise
    finally:
        bar.close()


def _check_numbers(args: argparse.Namespace) -> None:
    """Every numeric option, before any work: one sentence naming the option and its range."""
    from engine.decode.settings import MAX_BLOCK

    for flag, value, low in (("--steps", args.steps, 1), ("--batch", args.batch, 1),
                             ("--anchors", args.anchors, 1), ("--warmup", args.warmup, 0),
                             ("--eval-every", args.eval_every, 1), ("--checkpoint-every", args.checkpoint_every, 1),
                             ("--layers", args.layers, 1), ("--block-size", args.block_size, 2),
                             ("--intermediate-size", args.intermediate_size, 1)):
        if value is not None and value < low:
            raise DFlashError(f"{flag} {value} must be at least {low}.")
    if args.block_size is not None and args.block_size > MAX_BLOCK:
        raise DFlashError(f"--block-size {args.block_size} is outside 2..{MAX_BLOCK}.")
    if args.seq_len <= (args.block_size or 16):
        raise DFlashError(f"--seq-len {args.seq_len} must be longer than the block ({args.block_size or 16}).")
    if args.distill < 0 or args.distill_new_tokens < 1:
        raise DFlashError("--distill must be >= 0 (0: train on --data as it is) and --distill-new-tokens >= 1.")
    if not (math.isfinite(args.lr) and 0 < args.lr <= 1):
        raise DFlashError(f"--lr {args.lr} must be a number in (0, 1] (1e-3 is the default).")
    depth = _target_layers(args.target)
    if args.layers is not None and depth is not None and args.layers > depth:
        raise DFlashError(f"--layers {args.layers} is more than the target's own {depth}: a drafter deeper than its "
                          "target drafts slower than the target writes (DFlash drafters have 1-5).")


def _target_layers(target: Optional[str]) -> Optional[int]:
    """The target's layer count from its local config.json, None where it is not local (read later)."""
    from engine.models.drafter_config import flat_config, read_config_json
    from engine.models.paths import resolve_model_path

    try:
        layers = flat_config(read_config_json(resolve_model_path(target, download=False))).get("num_hidden_layers")
    except (DFlashError, OSError, ValueError, TypeError):
        return None
    return layers if is_int(layers) else None


def ours_checkpoint(folder: Path) -> bool:
    """Whether `folder` is plainly a checkpoint train-drafter wrote (a real folder of its own files, with its
    state.json unless a crash cut a swap short): the only kind --force may remove."""
    from engine.training.trainer import CHECKPOINT_FILES

    if folder.is_symlink() or not folder.is_dir():
        return False
    names = {f.name for f in folder.iterdir()}
    own = all(n in CHECKPOINT_FILES or n.startswith(".") and n.endswith((".tmp", ".safetensors")) for n in names)
    # a .tmp one may not have its state.json yet, an .old one may have lost it to a kill mid-removal
    return own and ("state.json" in names or folder.name.endswith((".tmp", ".old")))


def _check_out(args: argparse.Namespace) -> None:
    """--out must be a folder we may write a drafter into: never the target's or --init's own folder
    or one inside it, never among the app's bundled demo models, never a file, and never a folder
    holding a model (one train-drafter made and finished included) unless --force, or --resume for
    its own run."""
    from engine.models.demo import models_dir
    from engine.models.paths import resolve_model_path
    from engine.safe_write import same_path
    from engine.training.trainer import CHECKPOINT_NAMES, MADE_BY_FILE

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise DFlashError(f"--out {out} is a file; give a folder for the drafter.")
    where = out.resolve()
    for flag, given in (("--target", args.target), ("--init", args.init)):
        if given is None:
            continue
        try:
            folder = resolve_model_path(given, download=False).resolve()
        except DFlashError:
            continue  # not local: it cannot be --out either
        if same_path(where, folder):
            raise DFlashError(f"--out {out} is the {flag} model's own folder; write the drafter elsewhere.")
        if any(same_path(p, folder) for p in where.parents):
            raise DFlashError(f"--out {out} is inside the {flag} model's folder {folder}; write the drafter "
                              "elsewhere (a model's folder holds its own files only).")
    bundled = models_dir().resolve()
    if any(same_path(p, bundled) for p in (where, *where.parents)):
        raise DFlashError(f"--out {out} is among the app's bundled demo models ({bundled}), which updates replace; "
                          "write the drafter elsewhere (the demos' recipes in resources/models/recipe rebuild them).")
    ours = (out / MADE_BY_FILE).is_file() or any(ours_checkpoint(out / name) for name in CHECKPOINT_NAMES)
    holds_model = any((out / name).exists() for name in ("config.json", "model.safetensors")) or \
        any(out.glob("*.safetensors"))
    if holds_model and not ours and not args.force:
        raise DFlashError(f"--out {out} holds a model that train-drafter did not make; choose an empty folder, "
                          "or pass --force to replace it.")
    if holds_model and ours and not (args.force or args.resume):  # a drafter it finished: the user's now
        raise DFlashError(f"--out {out} holds a drafter train-drafter made before; choose another folder, or pass "
                          "--force to replace it (--resume goes on with a run that did not finish).")


def cmd_train_drafter(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from engine.models.pair import load_pair
    from engine.training.data import SKIPPED_FOLDERS, data_files, texts_of, token_stream
    from engine.training.trainer import CHECKPOINT_DIR, CHECKPOINT_NAMES, DrafterTrainer, TrainSettings

    _check_numbers(args)
    _check_out(args)
    out = Path(args.out)
    leftovers = [out / name for name in CHECKPOINT_NAMES if os.path.lexists(out / name)]
    for folder in leftovers:  # a `checkpoint` of something else (a folder of notes, TensorFlow's file): never ours
        if not ours_checkpoint(folder):
            raise DFlashError(f"{folder} is not a train-drafter checkpoint, and a run writes its own there; move it, "
                              "or choose another --out.")
    if leftovers and not args.resume and not args.force:
        raise DFlashError(f"{out / CHECKPOINT_DIR} exists: pass --resume to continue that run, --force to start "
                          "anew over it, or choose another --out.")
    if args.init:
        given = [flag for flag, value in (("--layers", args.layers), ("--block-size", args.block_size),
                                          ("--taps", args.taps), ("--intermediate-size", args.intermediate_size))
                 if value is not None]
        if given:
            raise DFlashError(f"{', '.join(given)} cannot be combined with --init: a fine-tuned drafter keeps "
                              "the architecture of the one it starts from.")
    settings = TrainSettings(
        layers=args.layers or 1, block_size=args.block_size or 16, taps=_parse_taps(args.taps or "auto"),
        steps=args.steps, batch=args.batch, seq_len=args.seq_len, anchors=args.anchors, lr=args.lr,
        warmup=args.warmup, seed=args.seed, intermediate_size=args.intermediate_size,
        eval_every=args.eval_every, init=args.init, arch=args.arch, selector_rank=args.selector_rank,
        selector_top_k=args.selector_top_k, conv_kernel=args.conv_kernel, conv_group=args.conv_group,
    )
    files, skipped = data_files(args.data, exclude=(out,))
    texts = texts_of(files)  # one walk of the folders: each resolves every file
    pair = load_pair(args.target, None)
    eos = pair.tokenizer.eos_token_id
    tokens = token_stream(pair.tokenizer, texts, eos if eos is not None else 0)
    if args.distill < 0 or args.distill_new_tokens < 1:
        raise DFlashError("--distill must be >= 0 (0: train on --data as it is) and --distill-new-tokens >= 1.")
    if args.distill or args.distill_prompts:
        tokens = _distilled(pair, tokens, out, args)
    trainer = DrafterTrainer(pair, tokens, out, settings)
    if leftovers and not args.resume:  # --force: train-drafter's own checkpoints, once every input was read
        for folder in leftovers:
            shutil.rmtree(folder)
    if args.resume:
        if not trainer.resume():
            raise DFlashError(f"--resume: no checkpoint in {out / CHECKPOINT_DIR}; leave out --resume to start anew.")
        print(f"resumed from step {trainer.step}", file=sys.stderr)
    left_out = (f", {skipped:,} left out: hidden folders, {', '.join(sorted(SKIPPED_FOLDERS))}, --out" if skipped
                else "")
    print(f"{len(tokens)} tokens from {len(files):,} file(s){left_out} ({len(trainer.eval_tokens)} held out); "
          f"taps {trainer.cfg.target_layer_ids}; mask id {trainer.mask_id}", file=sys.stderr)
    tokens_per_step = settings.batch * settings.seq_len
    bar = tqdm(total=settings.steps, initial=trainer.step, unit="step", file=sys.stderr, dynamic_ncols=True)
    started, start_step = time.perf_counter(), trainer.step

    def on_step(step: int, loss: float) -> None:
        rate = (step - start_step) * tokens_per_step / max(time.perf_counter() - started, 1e-9)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:.0f}")
        bar.update(1)

    def on_eval(record: dict) -> None:
        saved = record["step"] % args.checkpoint_every == 0 or record["step"] == settings.steps
        bar.write(f"step {record['step']}: train {record['train_loss']:.3f}  held-out {record['eval_loss']:.3f}  "
                  f"tau~{record['tau_estimate']:.2f}" + (f"  (checkpoint in {out / CHECKPOINT_DIR})" if saved else ""))

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
