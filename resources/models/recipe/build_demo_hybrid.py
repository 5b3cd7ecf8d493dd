"""Build the hybrid demo pair: a small Qwen3.5-architecture target (GatedDeltaNet + attention) and its drafter.

Stages (each resumable, fixed seeds):
1. target: same corpus and tokenizer recipe as the dense demo target (corpus.py,
   build_demo_target.prepare_data), a `qwen3_5` model from mlx-lm (three GatedDeltaNet
   layers to one full-attention layer), next-token cross-entropy, checkpoints in
   --run-dir; written as an mlx-lm folder with a model card.
2. drafter: build_demo_drafter.py on that target (engine.training's DrafterTrainer).
3. bench: AR vs DFlash with tape replay and with re-run rollback, into the card.

Deep and narrow (24 layers of width 128, as the dense demo target) because on a CPU
one decoding step of a small model is mostly per-layer overhead, which a 16-token
verify pays once: a round then costs about 1.5 AR steps, where the earlier 4-layer,
width-256 target's cost 3.5 and no drafter could win. The GatedDeltaNet heads use
Dk = Dv = 32, a multiple of 32, so on a Mac the Metal kernels in kernels/ run the
recurrence and the tape replay.

The shipped target took two runs: the one its card at commit 20b60e0 describes (500 steps
from the dense demo target's embeddings and MLPs, 1,024/2,048-token windows), then 60 steps
continuing it with --eos-after-text (its card now):

    python resources/models/recipe/build_demo_hybrid.py --stage target --init-from <the first> \
        --eos-after-text --steps 60 --batch-size 4 --seq-len 1024 --file-start-share 0.5 --lr 3e-4 --warmup 5

Its drafter is the shipped one's short-window recovery stage run again for the continued target
(build_demo_drafter.py --steps 0 --init <the drafter before> --arch dflash2 --distill-sequences 600
--definition-prompts 1200 --line-prompts 600 --finetune-steps 200 --finetune-lr 3e-4
--finetune-warmup 10 --distill-bucket 8 --bench-repeats 1; its card has the lineage).

    python resources/models/recipe/build_demo_hybrid.py --stage all
    python resources/models/recipe/build_demo_hybrid.py --stage target --resume   # after an interruption

Cost: several hours of a 2-core Linux CPU for the default sizes (resumable). The target's
GatedDeltaNet layers train through the engine's chunked pass on the CPU (one triangular
solve per head and chunk, instead of mlx-lm's one step per token).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
for p in (str(REPO), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see build_demo_target.py

import engine  # noqa: E402,F401  (preloads OpenBLAS; must precede mlx.core)

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

import build_demo_target as dense  # noqa: E402  (data, schedule, checkpoints, output: shared recipe)
from drafter_card import BENCH_HEADING  # noqa: E402  (where a card's figures start, as --rebench rewrites)
from engine.models.tokenizer_files import EOS_TOKEN, MASK_TOKEN  # noqa: E402
from engine.safe_write import write_atomic  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stage", choices=["target", "drafter", "bench", "all"], default="all")
    ap.add_argument("--out", default=str(REPO / "resources/models/demo-hybrid-target"))
    ap.add_argument("--drafter-out", default=str(REPO / "resources/models/demo-hybrid-drafter"))
    ap.add_argument("--run-dir", default=str(REPO / "runs/demo-hybrid-target"))
    ap.add_argument("--drafter-run-dir", default=str(REPO / "runs/demo-hybrid-drafter"))
    ap.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --run-dir")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--alt-seq-len", type=int, default=0,
                    help="every other step uses windows of this length (build_demo_target.py's option)")
    ap.add_argument("--file-start-share", type=float, default=0.0,
                    help="share of standard-library rows that start at a file's first token")
    ap.add_argument("--init-from-dense", metavar="MODEL_DIR",
                    help="start the embeddings, MLPs and norms from this dense demo target (same tokenizer, "
                         "widths and depth); the GatedDeltaNet and attention layers start random")
    ap.add_argument("--init-from", metavar="MODEL_DIR",
                    help="continue this hybrid target (e.g. the shipped demo-hybrid-target): all its weights "
                         "and its tokenizer; the model flags must match its config")
    dense.add_eos_after_text(ap)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    # model (qwen3_5)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--split", choices=("gpt2", "qwen2"), default="qwen2",
                    help="tokenizer pre-split (see build_demo_target.py); the shipped pair used gpt2 (its card)")
    ap.add_argument("--hidden-size", type=int, default=128)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--full-attention-interval", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--linear-key-heads", type=int, default=2)
    ap.add_argument("--linear-value-heads", type=int, default=4)
    ap.add_argument("--linear-head-dim", type=int, default=32)
    ap.add_argument("--intermediate-size", type=int, default=384)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--max-position-embeddings", type=int, default=2048)
    # drafter and bench
    ap.add_argument("--synthetic-modules", type=int, default=20000,
                    help="synthetic textbook modules next to the standard library (build_demo_target.py)")
    ap.add_argument("--synthetic-share", type=float, default=0.75)
    ap.add_argument("--drafter-steps", type=int, default=400)
    ap.add_argument("--drafter-init", help="start the drafter from this one's weights (build_demo_drafter.py --init)")
    ap.add_argument("--drafter-batch", type=int, default=8, help="build_demo_drafter.py --batch")
    ap.add_argument("--drafter-corpus-in-mix", type=int, default=0,
                    help="build_demo_drafter.py --corpus-in-mix: stage 2 also trains on whole corpus files")
    ap.add_argument("--drafter-distill", type=int, default=600, help="greedy continuations the drafter trains on")
    ap.add_argument("--drafter-anchors", type=int, default=32)
    ap.add_argument("--drafter-finetune-steps", type=int, default=500,
                    help="the drafter's stage 2 (build_demo_drafter.py --finetune-steps)")
    ap.add_argument("--drafter-definition-prompts", type=int, default=1200,
                    help="stage 2 distills the target's continuations of this many def/class prompts")
    ap.add_argument("--drafter-line-prompts", type=int, default=600,
                    help="...and of this many line and comment prompts (code_prompts.line_prompts)")
    ap.add_argument("--taps", default="1,6,12,17,22", help="target layers the drafter reads (GatedDeltaNet and attention)")
    ap.add_argument("--bench-prompts", default=str(HERE / "bench_prompts.jsonl"))
    ap.add_argument("--bench-tokens", type=int, default=128)
    ap.add_argument("--bench-repeats", type=int, default=1)
    return ap.parse_args(argv)


def model_config(args, data) -> dict:
    """A Qwen3.5-style config.json: the text model under text_config, tied embeddings, float32."""
    eos = data["special_ids"][EOS_TOKEN]
    text = {
        "model_type": "qwen3_5_text",
        "hidden_size": args.hidden_size,
        "intermediate_size": args.intermediate_size,
        "num_hidden_layers": args.layers,
        "full_attention_interval": args.full_attention_interval,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "linear_num_key_heads": args.linear_key_heads,
        "linear_num_value_heads": args.linear_value_heads,
        "linear_key_head_dim": args.linear_head_dim,
        "linear_value_head_dim": args.linear_head_dim,
        "linear_conv_kernel_dim": 4,
        "vocab_size": data["vocab_size"],
        "max_position_embeddings": args.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": args.rope_theta, "partial_rotary_factor": 0.25},
        "tie_word_embeddings": True,
        "eos_token_id": eos,
    }
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "tie_word_embeddings": True,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "pad_token_id": eos,
        "mask_token_id": data["special_ids"][MASK_TOKEN],
        "torch_dtype": "float32",
        "text_config": text,
    }


def build_model(cfg: dict) -> nn.Module:
    """mlx-lm's qwen3_5 with its GatedDeltaNet layers instrumented: on the CPU their training
    forward takes the engine's chunked pass (kernels/gated_delta_chunked.py), about twice as fast
    per step as mlx-lm's step-per-token ops; the weights and the checkpoint are mlx-lm's."""
    from mlx_lm.models.qwen3_5 import Model, ModelArgs

    from engine.models.gdn_tape import instrument

    model = Model(ModelArgs.from_dict(cfg))
    instrument(model)
    return model


def transplant_dense(model: nn.Module, folder: Path, data: dict) -> int:
    """Copy a dense demo target's embeddings, MLPs and norms into the hybrid model (names mapped,
    shapes checked); its tokenizer must be the one this run trains. Returns how many tensors."""
    if (folder / "tokenizer.json").read_bytes() != (data["tok_dir"] / "tokenizer.json").read_bytes():
        raise SystemExit(f"--init-from-dense {folder}: its tokenizer differs from the one this recipe trains.")
    mine = dict(tree_flatten(model.parameters()))
    wanted = ("embed_tokens.", "mlp.", "input_layernorm.", "post_attention_layernorm.", "model.norm.")
    taken = []
    for name, value in mx.load(str(folder / "model.safetensors")).items():
        target = "language_model." + name
        if any(w in name for w in wanted) and target in mine and mine[target].shape == value.shape:
            taken.append((target, value.astype(mine[target].dtype)))
    model.load_weights(taken, strict=False)
    mx.eval(model.parameters())
    return len(taken)


def train_target(args) -> dict:
    out, run_dir = Path(args.out), Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if args.resume and not (run_dir / "latest.json").exists():
        dense.log("--resume: no checkpoint found, starting fresh")
        args.resume = False
    if not args.resume:
        for old in list(run_dir.glob("ckpt-*")) + [run_dir / "latest.json"]:
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)
    (run_dir / ("run_args.json" if not args.resume else "run_args.resume.json")).write_text(
        json.dumps(vars(args), indent=2))

    mx.random.seed(args.seed)
    rng = np.random.Generator(np.random.PCG64(args.seed))
    if args.init_from and args.init_from_dense:
        raise SystemExit("--init-from and --init-from-dense: give one (a hybrid target to continue, or a dense "
                         "one to start the embeddings and MLPs from)")
    data = dense.prepare_data(args, run_dir, Path(args.init_from) if args.init_from else None)
    cfg = model_config(args, data)
    model = build_model(cfg)
    mx.eval(model.parameters())
    if args.init_from and not args.resume:
        init = Path(args.init_from)
        try:  # strict: every tensor's name and shape, so flags that build another model are caught
            model.load_weights(str(init / "model.safetensors"), strict=True)
        except ValueError as exc:
            raise SystemExit(f"--init-from {init}: its weights do not fit the model these flags make "
                             f"(give the flags it was trained with): {str(exc)[:200]}") from None
        mx.eval(model.parameters())
        dense.log(f"init: all weights from {init}")
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    dense.log(f"model: qwen3_5, {n_params:,} params, layers "
              + "".join("G" if layer.is_linear else "A" for layer in model.layers))

    if args.init_from_dense and not args.resume:
        copied = transplant_dense(model, Path(args.init_from_dense), data)
        dense.log(f"init: {copied} tensors (embeddings, MLPs, norms) from {args.init_from_dense}")

    starts = (dense.file_starts(data["train_ids"], data["special_ids"][EOS_TOKEN])
              if args.file_start_share else None)

    def batches(step: int):
        batch, seq_len = dense.step_shape(args, step)
        return dense.sample_batch(rng, data["train_ids"], batch, seq_len, data["synth_ids"], args.synthetic_share,
                                  starts, args.file_start_share)

    wall, recent = dense.train_loop(args, model, batches, run_dir, rng)

    heldout = dense.heldout_loss(model, data["held_ids"], args.seq_len)
    longest = max(args.seq_len, args.alt_seq_len)
    by_depth = (dense.heldout_loss_by_depth(model, data["held_ids"], longest, dense.DEPTH_EDGES)
                if longest > 256 else None)
    report = {"params": n_params, "steps": args.steps, "train_wall_s": wall,
              "final_train_loss": float(np.mean(recent)) if recent else float("nan"), "heldout_loss": heldout,
              **({"heldout_loss_by_depth": by_depth, "heldout_depth_window": longest} if by_depth else {})}
    dense.log(f"final: train loss {report['final_train_loss']:.3f} held-out loss {heldout:.3f} "
              f"(perplexity {math.exp(heldout):.1f}) wall {wall / 60:.1f}m")
    dense.write_output(args, cfg, data, model, out, report)
    (run_dir / "report.json").write_text(json.dumps(report, indent=2))
    return report


def train_drafter(args) -> None:
    """The dense demo's drafter recipe, pointed at the hybrid target."""
    cmd = [sys.executable, str(HERE / "build_demo_drafter.py"), "--target", args.out, "--out", args.drafter_out,
           "--run-dir", args.drafter_run_dir, "--steps", str(args.drafter_steps), "--taps", args.taps,
           "--seed", str(args.seed), "--distill-sequences", str(args.drafter_distill),
           "--anchors", str(args.drafter_anchors), "--seq-len", str(args.seq_len),
           "--finetune-steps", str(args.drafter_finetune_steps),
           "--definition-prompts", str(args.drafter_definition_prompts),
           "--line-prompts", str(args.drafter_line_prompts),
           "--bench-tokens", str(args.bench_tokens),
           "--bench-repeats", str(args.bench_repeats),
           "--corpus-in-mix", str(args.drafter_corpus_in_mix), "--batch", str(args.drafter_batch)]
    if args.drafter_init:
        cmd += ["--init", args.drafter_init]
    if args.resume:
        cmd.append("--resume")
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})


GPT2_SPLIT_NOTE = (
    "The GPT-2 pre-split joins a newline to the indentation after it (`):` then `\\n    `), so this "
    "target never saw a bare newline token where an indented line follows: after a prompt that ends "
    "so (`def f(x):` and a newline) it often stops at once or starts a new module. Prompts that end "
    "before the newline, or in a newline an unindented line follows, go on as trained; the window "
    "starts a bundled pair with such a tokenizer on its own sample prompt (`engine/models/demo.py`). "
    "The recipe now defaults to `--split qwen2`, as demo-target's tokenizer.")


def bench_rollbacks(args) -> dict:
    """AR vs DFlash on --bench-prompts (bench_prompts.jsonl), once with tape replay and once with re-run; into the
    target's bench.json and model card."""
    from dataclasses import replace

    from engine.tools.bench import load_prompts, run_bench
    from engine.decode.settings import GenerationSettings
    from engine.decode.prompts import encode_prompt
    from engine.models.pair import load_pair

    pair = load_pair(args.out, args.drafter_out)
    texts = load_prompts(Path(args.bench_prompts))
    prompts = [(t, encode_prompt(pair.tokenizer, t, chat=False)) for t in texts]
    base = GenerationSettings(max_tokens=args.bench_tokens, block_size=16)
    results = {mode: run_bench(pair, prompts, replace(base, rollback=mode), args.bench_repeats)
               for mode in ("replay", "rerun")}
    keys = ("ar_tok_s", "dflash_tok_s", "speedup", "mean_acceptance_length", "verify_ms", "rollback_ms", "identical")
    summary = {mode: {k: r[k] for k in keys} for mode, r in results.items()}
    write_atomic(Path(args.out) / "bench.json", json.dumps(summary, indent=2), "bench.json")
    card = hybrid_card(args, summary, blas=results["replay"]["blas"].split(" (")[0])
    write_atomic(Path(args.out) / "MODEL_CARD.md", card, "the model card")
    dense.log(json.dumps(summary))
    return summary


def rollback_gap(replay: dict, rerun: dict) -> str:
    """How much a re-run's rollback costs beside tape replay's, in words that hold for either sign."""
    gap = rerun["rollback_ms"] - replay["rollback_ms"]
    return f"{abs(gap):.2f} ms a round {'more' if gap >= 0 else 'less'} than tape replay"


def hybrid_card(args, summary: dict, blas: str) -> str:
    """The target's model card: the training run's settings (--run-dir) and the bench summary."""
    lines = ["# demo-hybrid-target", "",
             "A small Qwen3.5-architecture (`qwen3_5`) causal LM: GatedDeltaNet layers with full-attention",
             "layers every 4th, trained on the Python standard library and synthetic textbook",
             "modules by `resources/models/recipe/build_demo_hybrid.py` (demo-target's corpus recipe).",
             "Its drafter is `demo-hybrid-drafter`; that card has the per-prompt figures.", ""]
    run_dir, old_card = Path(args.run_dir), Path(args.out) / "MODEL_CARD.md"
    old_text = old_card.read_text() if old_card.is_file() else ""
    if (run_dir / "report.json").is_file():
        r = json.loads((run_dir / "report.json").read_text())
        t = json.loads((run_dir / "run_args.json").read_text())  # the training run's own settings
        split = t.get("split", "gpt2")
        lines += [f"- {r['params']:,} parameters; {r['steps']} steps, batch {t['batch_size']} x {t['seq_len']}, "
                  f"seed {t['seed']}; wall {r['train_wall_s'] / 60:.1f} min.",
                  f"- Final train loss {r['final_train_loss']:.3f}; held-out loss {r['heldout_loss']:.3f} "
                  f"(perplexity {math.exp(r['heldout_loss']):.1f}).",
                  *([f"- Held-out loss by position in {r['heldout_depth_window']}-token windows: "
                     + ", ".join(f"{k}: {v:.3f}" for k, v in r["heldout_loss_by_depth"].items()) + "."]
                    if r.get("heldout_loss_by_depth") else []),
                  *([f"- Windows of {t['seq_len']} tokens" + (f", every other step {t['alt_seq_len']}"
                                                             if t.get("alt_seq_len") else "")
                     + (f"; {t['file_start_share']:.0%} of standard-library rows from a file's start"
                        if t.get("file_start_share") else "") + "."] if t.get("alt_seq_len") or t["seq_len"] > 256
                    else []),
                  *([f"- Embeddings, MLPs and norms started from `{t['init_from_dense']}` (the dense demo "
                     "target, same tokenizer); the GatedDeltaNet and attention layers from random weights."]
                    if t.get("init_from_dense") else []),
                  *([f"- Continued from `{t['init_from']}` (all its weights and its tokenizer); that "
                     "model's own training is in its card, in git history before this one."]
                    if t.get("init_from") else []),
                  *(["- `--eos-after-text`: every training file ends in EOS right after its last non-space "
                     "character, so a newline is never followed by EOS and a prompt that ends at a line end "
                     "goes on (before, `def test_is_leap_year():` with one assert line, and a function cut "
                     "after a body line, stopped at their first token)."]
                    if t.get("eos_after_text") else []),
                  f"- Tokenizer: byte-level BPE, vocab {t['vocab_size']}, {split} pre-split."]
        resumed = run_dir / "run_args.resume.json"
        steps_after = json.loads(resumed.read_text())["steps"] if resumed.is_file() else t["steps"]
        if steps_after != t["steps"]:
            lines.append(f"- Started with `--steps {t['steps']}` and resumed with `--steps {steps_after}`: the "
                         "learning-rate schedule changed at the resume (the run folder's log says at which step).")
        lines += [""] + ([GPT2_SPLIT_NOTE, ""] if split == "gpt2" else [])
    elif BENCH_HEADING in old_text:  # benched again without the training run's folder: that section stays
        lines = old_text[: old_text.index(BENCH_HEADING)].rstrip("\n").split("\n") + [""]
    lines += [f"{BENCH_HEADING} (`bench`, T=0, block 16, this machine's CPU, BLAS: {blas})", "",
              "Reproduce with `dflash-playground bench --target demo-hybrid-target --drafter demo-hybrid-drafter "
              f"--prompts resources/models/recipe/{Path(args.bench_prompts).name} --max-tokens {args.bench_tokens} "
              f"--repeats {args.bench_repeats}` (add `--rollback rerun` for the second row; prompts are encoded "
              "raw, as the pair was trained).", "",
              "| rollback | AR tok/s | DFlash tok/s | speedup | tau | verify ms | rollback ms | identical |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for mode, r in summary.items():
        lines.append(f"| {mode} | {r['ar_tok_s']:.1f} | {r['dflash_tok_s']:.1f} | {r['speedup']:.2f}x | "
                     f"{r['mean_acceptance_length']:.2f} | {r['verify_ms']:.2f} | {r['rollback_ms']:.2f} | "
                     f"{r['identical']} |")
    replay, rerun = summary["replay"], summary["rerun"]
    ar_moved = abs(rerun["ar_tok_s"] / replay["ar_tok_s"] - 1)
    runs = "one run" if args.bench_repeats == 1 else f"{args.bench_repeats} runs"
    lines += ["", f"Each row is {runs} of each prompt beside its own AR runs; AR speed moved {ar_moved:.0%} "
                  "between the two, so the speedups differ by that noise as well as by the rollback. The rollback "
                  f"column compares them directly: a re-run costs {rollback_gap(replay, rerun)}, beside a verify of "
                  f"{replay['verify_ms']:.2f} ms."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.stage in ("target", "all"):
        train_target(args)
    if args.stage in ("drafter", "all"):
        train_drafter(args)
    if args.stage in ("bench", "all"):
        bench_rollbacks(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
