"""Train the demo DFlash drafter for resources/models/demo-target with `engine.training`.

The target first writes the training text itself: greedy continuations of prompts taken
from its corpus (the Python standard library, held-out modules excluded, and the synthetic
textbook modules of synthetic_code.py it was trained on), cached in the run folder. Two stages, fixed seeds, checkpoints in runs/demo-drafter (resume with --resume):

1. from random weights, on continuations of random corpus windows;
2. fine-tuned from stage 1 on those plus continuations of definition prompts (a `def` or
   `class` line and up to three more), the shape of prompt the demo is used with, and
   (--line-prompts) of lines from anywhere and comment prose, the shapes definitions miss.

At the end it benchmarks AR vs DFlash on bench_prompts.jsonl (hand-written prompts of mixed
kinds, none in the training text: tests/test_recipes.py checks) and writes the figures into MODEL_CARD.md next to the weights.

    OPENBLAS_NUM_THREADS=2 PYTHONPATH=. python resources/models/recipe/build_demo_drafter.py

(Two BLAS threads speed training up 1.4x on a 2-core machine with nothing else running;
decoding, and training beside another job, are faster with one.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

import numpy as np

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine  # noqa: E402,F401  (optimised BLAS before MLX)
from code_prompts import definition_prompts, line_prompts  # noqa: E402
from corpus import HELD_OUT, load_corpus, python_version  # noqa: E402
from synthetic_code import synthetic_corpus  # noqa: E402
from train_device import training_device  # noqa: E402
from engine.models.pair import load_pair  # noqa: E402
from engine.safe_write import write_atomic  # noqa: E402
from drafter_card import BENCH_HEADING, bench_section, long_section  # noqa: E402
from engine.training.data import token_stream  # noqa: E402
from engine.training.trainer import DrafterTrainer, TrainSettings  # noqa: E402


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=str(REPO / "resources/models/demo-target"))
    ap.add_argument("--out", default=str(REPO / "resources/models/demo-drafter"))
    ap.add_argument("--run-dir", default=str(REPO / "runs/demo-drafter"))
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--steps", type=int, default=800, help="stage 1 steps (0: none; stage 2 continues --init)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--taps", default="1,6,12,17,22")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--distill-sequences", type=int, default=2400,
                    help="train on this many greedy continuations written by the target (0: the raw corpus)")
    ap.add_argument("--distill-new-tokens", type=int, default=224)
    ap.add_argument("--distill-batch", type=int, default=128,
                    help="rows decoded together while distilling (a GPU, launch-bound on the demo target, "
                         "writes the text several times faster at 1024; the text is the same up to near-ties)")
    ap.add_argument("--distill-bucket", type=int, default=1, metavar="K",
                    help="stage 2's prompts cut at the end to a multiple of K tokens (shorter ones kept whole): "
                         "prompts of one length decode together, and a GPU spends as long on a batch of three "
                         "as of 4,096 (a hundred lengths of one prompt each held a lent GPU for minutes)")
    ap.add_argument("--definition-prompts", type=int, default=2400,
                    help="stage 2: continuations of this many definition prompts (def/class lines)")
    ap.add_argument("--line-prompts", type=int, default=0,
                    help="stage 2 also distills this many line and prose prompts (code_prompts.line_prompts)")
    ap.add_argument("--corpus-in-mix", type=int, default=0, metavar="K",
                    help="stage 2 also trains on the corpus itself (whole files: with a long --seq-len, windows "
                         "deep into real files, labels the target's greedy next tokens there), beside its "
                         "distilled text repeated K times so that short prompts keep their share (0: no corpus)")
    ap.add_argument("--finetune-steps", type=int, default=1000, help="stage 2 steps (0: stop after stage 1)")
    ap.add_argument("--finetune-lr", type=float, default=1e-3)
    ap.add_argument("--finetune-warmup", type=int, default=20)
    ap.add_argument("--synthetic-modules", type=int, default=20000,
                    help="the synthetic modules the target was trained on (same seed), as prompt sources")
    ap.add_argument("--init", help="stage 1 starts from this drafter's weights instead of random ones")
    ap.add_argument("--bench-prompts", default=str(Path(__file__).resolve().parent / "bench_prompts.jsonl"))
    ap.add_argument("--long-prompts", default=str(Path(__file__).resolve().parent / "long_prompts.jsonl"),
                    help="long prompts (600-1,500 tokens) benched too, beside --long-tails, for the card")
    ap.add_argument("--long-tails", default=str(Path(__file__).resolve().parent / "long_tails.jsonl"),
                    help="the long prompts' last lines: the same places without the file above them")
    ap.add_argument("--bench-tokens", type=int, default=128)
    ap.add_argument("--bench-repeats", type=int, default=3)
    ap.add_argument("--arch", choices=("dflash", "dflash2"), default="dflash",
                    help="dflash2: convs and a candidate selector (with --init from a v1 drafter, grown from it)")
    ap.add_argument("--selector-top-k", type=int, default=8)
    ap.add_argument("--selector-rank", type=int, default=64)
    ap.add_argument("--compare-drafter", help="bench this drafter too, on the same AR runs (e.g. the v1 demo drafter)")
    ap.add_argument("--no-bench", action="store_true",
                    help="train, write the drafter and a card without figures, and stop: where training runs on "
                         "another machine (a lent GPU) than the one the speed figures are for; --rebench there fills them")
    ap.add_argument("--rebench", action="store_true",
                    help="train nothing: bench the drafter in --out again (after an engine change) and rewrite the "
                         "benchmark section of its MODEL_CARD.md and its bench.json")
    args = ap.parse_args(argv)
    if args.distill_batch < 1 or args.distill_bucket < 1:
        ap.error("--distill-batch and --distill-bucket must be at least 1")
    if args.eval_every < 1:  # the trainer evaluates at every multiple of it (and at the last step)
        ap.error("--eval-every must be at least 1")
    if args.no_bench and args.rebench:
        ap.error("--no-bench trains and leaves the figures out; --rebench writes them: give one")
    if args.steps == 0 and not (args.init and args.finetune_steps):
        ap.error("--steps 0 skips stage 1, so it needs --init (the drafter stage 2 continues) and --finetune-steps")
    if args.steps == 0 and Path(args.init).resolve() == Path(args.out).resolve():
        ap.error("--steps 0 continues --init into --out: give a new --out (the card of --init tells its stages)")
    return args


def bench(target: str, drafter: str, max_tokens: int, repeats: int, prompts: str,
          compare: Optional[str] = None) -> dict:
    """The project's `bench` command, with the settings a user gets by default, in a fresh process with
    one BLAS thread (the decoding default; training's two threads would slow AR decoding and flatter
    the ratio)."""
    command = [sys.executable, "-m", "engine.tools.cli", "bench", "--target", target, "--drafter", drafter,
               "--prompts", str(prompts), "--max-tokens", str(max_tokens), "--repeats", str(repeats),
               "--raw", "--json"] + (["--compare-drafter", compare] if compare else [])
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _progress(cache: Path):
    started = time.perf_counter()

    def progress(done: int, total: int) -> None:
        rate = (time.perf_counter() - started) / done
        print(f"distill {cache.stem}: {done:.0f}/{total} sequences, ETA {(total - done) * rate / 60:.1f} min", flush=True)

    return progress


def distilled(pair, tokens, cache: Path, sequences: int, args, seed: int):
    """The target's greedy continuations of prompts cut from `tokens`, cached in the run folder."""
    from engine.training.distill import cached_continuations

    return cached_continuations(pair, tokens, cache, sequences, args.distill_new_tokens, seed, _progress(cache),
                                batch=args.distill_batch)


def bucketed(prompts: list[list[int]], bucket: int) -> list[list[int]]:
    """Each prompt cut at the end to a multiple of `bucket` tokens; one shorter than `bucket` kept whole."""
    return [p[: max(len(p) // bucket * bucket, min(len(p), bucket))] for p in prompts]


def distilled_prompts(pair, texts: list[str], cache: Path, count: int, args, seed: int, make=definition_prompts):
    """The target's greedy continuations of `count` prompts that `make` takes from `texts`, cached."""
    from engine.decode.prompts import encode_prompt
    from engine.training.distill import cached_prompt_continuations

    prompts = bucketed([encode_prompt(pair.tokenizer, p, chat=False) for p in make(texts, count, seed)],
                       args.distill_bucket)
    return cached_prompt_continuations(pair, prompts, cache, args.distill_new_tokens, _progress(cache),
                                       batch=args.distill_batch)


def stage1_line(args, first, tokens: int) -> str:
    if first is None:
        return (f"- Stage 1: none (`--steps 0`); stage 2 continues `{args.init}`, whose own card gives its stages.\n"
                f"  Stage 1 text, for stage 2's mix: {distill_line(args, tokens)}")
    return f"""- Stage 1 (from {f"`{args.init}`" if args.init else "random weights"}): {distill_line(args, tokens)}
  {args.steps} steps, batch {args.batch} x {args.seq_len} tokens, {args.anchors} anchors per
  sequence, AdamW lr {args.lr} (warm-up {args.warmup}, cosine), loss weights exp(-(k-1)/7), seed {args.seed}.
  Final: {_final(first)}."""


def distill_line(args, tokens: int) -> str:
    if not args.distill_sequences:
        return f"the corpus itself ({tokens:,} tokens), labels from the target's greedy next tokens."
    from engine.training.distill import PROMPT_LENS

    shortest, longest = PROMPT_LENS
    return (f"the target's own greedy continuations ({tokens:,} tokens): {args.distill_sequences} prompts of "
            f"{shortest}-{longest}\n"
            f"  tokens cut at random from the corpus, each continued for up to {args.distill_new_tokens} tokens\n"
            "  (cut at EOS). The held-out figures use 64 continuations of held-out prompts.")


def _final(trainer: DrafterTrainer) -> str:
    last = trainer.history[-1] if trainer.history else {}
    return (f"train loss {last.get('train_loss')}, held-out loss {last.get('eval_loss')}, "
            f"teacher-forced tau estimate {last.get('tau_estimate')}")


def step_times(seconds_per_step: list[Optional[float]]) -> str:
    """'3.90 s/step (stage 2)': the stages that ran (a continued drafter's card said '- and 3.90 s/step')."""
    ran = [(i + 1, r) for i, r in enumerate(seconds_per_step) if r is not None]
    if not ran:
        return "no steps run here (resumed at its end)"
    return " and ".join(f"{r:.2f} s/step (stage {i})" for i, r in ran)


def model_card(args, stages: list[tuple], corpus_tokens: int, result: Optional[dict],
               seconds_per_step: list[Optional[float]]) -> str:
    first, tokens = stages[0][:2]
    cfg = stages[-1][0].raw_config
    stage2 = ""
    if len(stages) > 1:
        second, mixed, definitions, lines = stages[1]
        stage2 = f"""
- Stage 2 (fine-tune from {"stage 1" if first is not None else f"`{args.init}`"}): the stage 1 text plus the target's continuations of
  {args.definition_prompts} definition prompts ({definitions:,} tokens; a `def` or `class` line of the corpus
  and up to three more lines, dedented, as in `code_prompts.py`{bucket_note(args)}){line_mix(args, lines)}{corpus_mix(args, corpus_tokens)}, {mixed:,} tokens in all;
  {args.finetune_steps} steps, batch {args.batch} x {args.seq_len} tokens, AdamW lr {args.finetune_lr} (warm-up {args.finetune_warmup}, cosine).
  Held-out figures use 64 continuations of definition prompts from the held-out modules.
  Final: {_final(second)}."""
    gen = stages[-1][0].cfg.generation_facts()
    generation = ", ".join(str(v) for v in gen.values())
    return f"""# {Path(args.out).name}

A DFlash drafter for `{Path(args.target).name}`, trained with `dflash-playground`'s own trainer
(`engine/training`) by `resources/models/recipe/build_demo_drafter.py`.

- Corpus: Python {python_version()} standard library (same files as the target), held out:
  {", ".join(HELD_OUT)}, and the target's {args.synthetic_modules:,} synthetic modules; {corpus_tokens:,} tokens.
- Drafter ({generation}): {cfg['num_hidden_layers']} layer(s), hidden {cfg['hidden_size']}, intermediate
  {cfg['intermediate_size']}, block size {cfg['block_size']}, taps {cfg['dflash_config']['target_layer_ids']},
  mask token {cfg['dflash_config']['mask_token_id']}.
{stage1_line(args, first, tokens)}{stage2}
- Training: {step_times(seconds_per_step)} on
  {training_device()}, OPENBLAS_NUM_THREADS={os.environ.get("OPENBLAS_NUM_THREADS", "1")}, nothing else running.

{bench_section(args, result) if result is not None else NO_FIGURES}"""


NO_FIGURES = f"""{BENCH_HEADING}

Not run yet: the drafter was trained with `--no-bench`; `--rebench` with the same `--out` writes this section.
"""


def long_benches(args, drafter: str) -> tuple[dict, dict]:
    """`bench` on the long prompts and on their tails, as the card's long-prompt section reports."""
    return tuple(bench(args.target, drafter, args.bench_tokens, args.bench_repeats, prompts, args.compare_drafter)
                 for prompts in (args.long_prompts, args.long_tails))


def rebench(args) -> int:
    """Bench the finished drafter in --out again and rewrite its card's benchmark section (the
    training text above it stays) and bench.json, each through a temporary file."""
    card = Path(args.out) / "MODEL_CARD.md"
    if not card.is_file() or BENCH_HEADING not in card.read_text():
        print(f"{card}: no model card with a benchmark section to rewrite (train the drafter first)", file=sys.stderr)
        return 2
    result = bench(args.target, args.out, args.bench_tokens, args.bench_repeats, args.bench_prompts,
                   args.compare_drafter)
    long, tails = long_benches(args, args.out)
    text = card.read_text()
    write_atomic(Path(args.out) / "bench.json", json.dumps(result, indent=2), "bench.json")
    write_atomic(Path(args.out) / "bench_long.json", json.dumps({"long": long, "tails": tails}, indent=2),
                 "bench_long.json")
    write_atomic(card, text[: text.index(BENCH_HEADING)] + bench_section(args, result) + long_section(args, long, tails),
                 "the model card")
    print(json.dumps({k: v for k, v in result.items() if k != "per_prompt"}), flush=True)
    return 0


def bucket_note(args) -> str:
    return f"; these and the line prompts cut to a multiple of {args.distill_bucket} tokens" if args.distill_bucket > 1 else ""


def line_mix(args, tokens: int) -> str:
    if not args.line_prompts:
        return ""
    return (f" and of {args.line_prompts} line and prose prompts\n  ({tokens:,} tokens; 1-4 lines from anywhere in a file,"
            " half cut before a space, or a comment's words, as in `code_prompts.line_prompts`)")


def corpus_mix(args, corpus_tokens: int) -> str:
    if not args.corpus_in_mix:
        return ""
    return (f",\n  that text repeated {args.corpus_in_mix} times beside the corpus itself ({corpus_tokens:,} tokens of "
            "whole files, the target's greedy next tokens as labels: windows deep into real files)")


def train_stage(name: str, pair, tokens, held_tokens, out: Path, settings: TrainSettings, checkpoint: Path,
                resume: bool) -> tuple[DrafterTrainer, Optional[float]]:
    """Train (or resume) one stage to its end; also return its mean seconds per step (None when a
    resumed stage had no steps left)."""
    trainer = DrafterTrainer(pair, tokens, out, settings, checkpoint_dir=checkpoint, eval_tokens=held_tokens)
    if resume and trainer.resume():
        print(f"{name}: resumed at step {trainer.step}", flush=True)
    print(f"{name}: {len(tokens):,} tokens; taps {trainer.cfg.target_layer_ids}; mask {trainer.mask_id}", flush=True)
    started, first_step = time.perf_counter(), trainer.step

    def on_step(step: int, loss: float) -> None:
        if step % 10 == 0:
            rate = (time.perf_counter() - started) / max(step - first_step, 1)
            print(f"{name}: step {step}/{settings.steps} loss {loss:.3f} {rate:.2f} s/step "
                  f"ETA {(settings.steps - step) * rate / 60:.1f} min", flush=True)

    trainer.run(checkpoint_every=50, on_step=on_step, on_eval=lambda r: print(json.dumps(r), flush=True))
    steps_run = trainer.step - first_step
    return trainer, (time.perf_counter() - started) / steps_run if steps_run else None


def main() -> int:
    args = parse_args()
    if args.rebench:
        return rebench(args)
    stage1 = TrainSettings(
        layers=args.layers, block_size=args.block_size, taps=[int(x) for x in args.taps.split(",")],
        steps=args.steps, batch=args.batch, seq_len=args.seq_len, anchors=args.anchors, lr=args.lr,
        warmup=args.warmup, seed=args.seed, eval_every=args.eval_every, eval_fraction=0.0, init=args.init,
        arch=args.arch, selector_top_k=args.selector_top_k, selector_rank=args.selector_rank,
    )
    train, held = load_corpus()
    if args.synthetic_modules:
        train = train + [(f"synthetic/{i}.py", t) for i, t in enumerate(synthetic_corpus(args.synthetic_modules, 0))]
    pair = load_pair(args.target, None)
    eos = pair.tokenizer.eos_token_id
    tokens = token_stream(pair.tokenizer, [text for _, text in train], eos)
    held_tokens = token_stream(pair.tokenizer, [text for _, text in held], eos)
    out, run_dir = Path(args.out), Path(args.run_dir)
    corpus_tokens = len(tokens)
    corpus, held_corpus = tokens, held_tokens
    if args.distill_sequences:
        tokens = distilled(pair, tokens, run_dir / "distill_train.npy", args.distill_sequences, args, seed=args.seed)
        held_tokens = distilled(pair, held_tokens, run_dir / "distill_heldout.npy", 64, args, seed=args.seed + 1)
    finetune = args.finetune_steps > 0
    stage1_out = run_dir / "stage1" if finetune else out
    if args.steps:
        trainer, rate = train_stage("stage 1", pair, tokens, held_tokens, stage1_out, stage1, run_dir / "checkpoint",
                                    args.resume)
        stages, rates = [(trainer, len(tokens))], [rate]
    else:  # stage 2 alone, continuing --init (parse_args checked it is given)
        stage1_out, stages, rates = Path(args.init), [(None, len(tokens))], [None]
    if finetune:
        texts = [t for _, t in train]
        definitions = distilled_prompts(pair, texts, run_dir / "distill_code_train.npy", args.definition_prompts,
                                        args, seed=args.seed)
        held_definitions = distilled_prompts(pair, [t for _, t in held], run_dir / "distill_code_heldout.npy",
                                             64, args, seed=args.seed + 1)
        lines = (distilled_prompts(pair, texts, run_dir / "distill_lines_train.npy", args.line_prompts, args,
                                   seed=args.seed, make=line_prompts)
                 if args.line_prompts else np.zeros(0, dtype=np.int32))
        mixed = np.concatenate([tokens, definitions, lines])
        if args.corpus_in_mix:
            mixed = np.concatenate([np.tile(mixed, args.corpus_in_mix), corpus])
            held_definitions = np.concatenate([held_definitions, held_corpus])
        stage2 = replace(stage1, steps=args.finetune_steps, lr=args.finetune_lr, warmup=args.finetune_warmup,
                         init=str(stage1_out))
        pair = load_pair(args.target, None)  # a fresh target: stage 1 installed its taps on the old one
        trainer, rate = train_stage("stage 2", pair, mixed, held_definitions, out, stage2,
                                    run_dir / "finetune_checkpoint", args.resume)
        stages.append((trainer, len(mixed), len(definitions), len(lines)))
        rates.append(rate)
    if args.no_bench:
        for stale in ("bench.json", "bench_long.json"):  # an earlier run's figures are not this drafter's
            (out / stale).unlink(missing_ok=True)
        write_atomic(out / "MODEL_CARD.md", model_card(args, stages, corpus_tokens, None, rates), "the model card")
        print(f"{out}: trained; no figures yet (--no-bench): run --rebench with the same --out to add them", flush=True)
        return 0
    result = bench(args.target, str(out), args.bench_tokens, args.bench_repeats, args.bench_prompts,
                   args.compare_drafter)
    long, tails = long_benches(args, str(out))
    write_atomic(out / "bench.json", json.dumps(result, indent=2), "bench.json")
    write_atomic(out / "bench_long.json", json.dumps({"long": long, "tails": tails}, indent=2), "bench_long.json")
    write_atomic(out / "MODEL_CARD.md", model_card(args, stages, corpus_tokens, result, rates)
                 + long_section(args, long, tails), "the model card")
    print(json.dumps({k: v for k, v in result.items() if k != "per_prompt"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
