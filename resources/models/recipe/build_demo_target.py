"""Build the demo *target*: a small Qwen3 trained on the Python standard library
and on synthetic "textbook" modules (synthetic_code.py).

The standard library alone left the model writing one phrase in a loop from a bare
`def` line; the synthetic modules (short functions with docstrings, tests, classes)
teach it to write, and end, the kind of code a demo user starts.

Steps: collect the corpus (corpus.py, synthetic_code.py), train a byte-level BPE tokenizer with an
EOS and a mask token (engine.models.tokenizer_files), train a Qwen3 model from mlx-lm
with next-token cross-entropy, then write a Hugging Face / mlx-lm folder
(config.json, model.safetensors, tokenizer files, MODEL_CARD.md) and check that
`mlx_lm.load` reads it back.

Checkpoints (weights + optimizer state + step + RNG state) go to --run-dir every
--ckpt-every steps; `--resume` continues a killed run without losing anything.

    python resources/models/recipe/build_demo_target.py \
        --out resources/models/demo-target --run-dir runs/demo-target

The shipped demo target took three runs; the first two used this recipe as it was at
earlier commits (git worktrees of this repository), the third this one:

1. Standard library only, at f369b04 (defaults: 1000 steps, lr 1.5e-3, warm-up 50,
   OPENBLAS_NUM_THREADS=2). Its weights are in git at that commit, byte for byte:
   `git archive f369b04 resources/models/demo-target | tar -x -C step1`.
2. At 9bd4c11 (the first synthetic corpus: tests gathered at the end of each module):
   `--init-from step1/resources/models/demo-target --steps 600 --lr 1e-3 --warmup 30
   --ckpt-every 300`; that run was stopped after step 300 of its 600-step schedule. Its
   weights are `<run-dir>/ckpt-000300/weights.safetensors`: copy step 1's folder and put
   that file in it as model.safetensors (same config and tokenizer).
3. Here: `--init-from <step 2's folder> --steps 300 --lr 7e-4 --warmup 10` (and an
   --init-note saying the above).

On an MLX GPU the same command runs as it is (MLX picks the GPU): on an NVIDIA H200 through
MLX's CUDA backend a step of 16 x 1,024 tokens took 0.09 s, where this 2-core CPU takes ~10 s
for 4 x 1,024. A machine whose Python is not 3.11.7 sets DEMO_CORPUS_STDLIB (corpus.py) to a copy
of that standard library, so the corpus and its token ids stay the same.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
for p in (str(REPO), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

# One BLAS thread: on this 2-core CPU, a multi-threaded OpenBLAS next to any other busy
# process spins and slows down ~10x (measured 34 s/step vs 3.8 s/step). Override via env.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import engine  # noqa: E402,F401  (preloads OpenBLAS; must precede mlx.core)
from engine.models.tokenizer_files import EOS_TOKEN, MASK_TOKEN, special_ids, train_bpe_tokenizer  # noqa: E402
from engine.safe_write import write_atomic  # noqa: E402

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import mlx.optimizers as optim  # noqa: E402
import numpy as np  # noqa: E402
from mlx.utils import tree_flatten, tree_unflatten  # noqa: E402
from mlx_lm.models.qwen3 import Model, ModelArgs  # noqa: E402

import corpus  # noqa: E402
from copy_rows import copy_probe, copy_row  # noqa: E402
from synthetic_code import synthetic_corpus  # noqa: E402
from train_device import training_device  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
DEPTH_EDGES = (256, 512, 1024)  # held-out loss is reported per range of positions split here


def log(msg: str) -> None:
    print(msg, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "resources/models/demo-target"))
    ap.add_argument("--run-dir", default=str(REPO / "runs/demo-target"), help="checkpoints, token cache")
    ap.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --run-dir")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--init-from", metavar="MODEL_DIR",
                    help="start from this target's weights (e.g. the shipped demo-target) instead of random "
                         "ones; its tokenizer.json must equal the one this recipe trains")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--alt-seq-len", type=int, default=0,
                    help="every other step uses windows of this length instead (batch scaled to keep the "
                         "tokens per step), e.g. --seq-len 1024 --alt-seq-len 2048 for long-context training")
    ap.add_argument("--file-start-share", type=float, default=0.0,
                    help="share of standard-library rows that start at a file's first token, so long windows "
                         "see whole files from the top (the rest start anywhere)")
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--max-minutes", type=float, default=0.0,
                    help="stop training after this many minutes (checkpoint and output written; the schedule "
                         "stays --steps'), for a run on a lent machine with a fixed time")
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--copy-share", type=float, default=0.0,
                    help="share of rows that repeat a span of the corpus, often with an identifier renamed "
                         "(copy_rows.py): teaches the target to copy from its context")
    ap.add_argument("--host-attention", action="store_true",
                    help="attention through kernels/verify_attention.py's NumPy forward and backward (long "
                         "windows train ~1.7x faster on a CPU, where MLX's softmax is slow); the step is not "
                         "compiled then")
    # model
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--split", choices=("gpt2", "qwen2"), default="qwen2",
                    help="tokenizer pre-split: gpt2 joins a newline to the indentation after it; qwen2 "
                         "(as Qwen3's own tokenizer) keeps them apart, so prompts may end in a newline")
    ap.add_argument("--hidden-size", type=int, default=128)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--intermediate-size", type=int, default=384)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--max-position-embeddings", type=int, default=2048)
    ap.add_argument("--sample-tokens", type=int, default=120)
    ap.add_argument("--init-note", default="",
                    help="how the --init-from weights were made, for the model card")
    ap.add_argument("--synthetic-modules", type=int, default=20000,
                    help="synthetic textbook modules to generate (0: standard library only)")
    ap.add_argument("--synthetic-share", type=float, default=0.75,
                    help="share of each batch's rows drawn from the synthetic modules")
    add_eos_after_text(ap)
    return ap.parse_args(argv)


def add_eos_after_text(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--eos-after-text", action="store_true",
                    help="end each training file with EOS right after its last non-space character (its "
                         "trailing newlines dropped), so a newline is never followed by EOS and a prompt "
                         "ending at a line end goes on")


# ---------------------------------------------------------------- data


def prepare_data(args, run_dir: Path, tokenizer_from: Path | None = None) -> dict:
    """Tokenizer + token streams, cached in run_dir so a resumed run reuses them exactly.

    tokenizer_from: a model folder whose tokenizer to use instead of training one (a run that continues
    or distils that model needs its token ids, whatever the tokenizer trainer would make here)."""
    tok_dir = run_dir / "tokenizer"
    meta_path = run_dir / "data.json"
    if args.resume and meta_path.exists():
        cached = tok_dir / "tokenizer.json"
        if tokenizer_from is not None and not (
                cached.is_file() and cached.read_bytes() == (Path(tokenizer_from) / "tokenizer.json").read_bytes()):
            raise SystemExit(f"{run_dir}: its cached tokenizer is not {tokenizer_from}'s; the token ids would not "
                             "fit that model (start a new --run-dir)")
        meta = json.loads(meta_path.read_text())
        if meta.get("eos_after_text", False) != getattr(args, "eos_after_text", False):
            raise SystemExit(f"{run_dir}: its cached token streams were made "
                             f"{'with' if meta.get('eos_after_text') else 'without'} --eos-after-text; resume "
                             "with the same setting (or start a new --run-dir)")
        train_ids = np.load(run_dir / "train_tokens.npy")
        held_ids = np.load(run_dir / "heldout_tokens.npy")
        synth = run_dir / "synthetic_tokens.npy"
        synth_ids = np.load(synth) if synth.exists() else np.zeros(0, dtype=np.int32)
        log(f"data: reusing cache in {run_dir} ({len(train_ids)} train tokens, {len(synth_ids)} synthetic)")
        return {**meta, "train_ids": train_ids, "held_ids": held_ids, "synth_ids": synth_ids, "tok_dir": tok_dir}

    train, held = corpus.load_corpus()
    texts = [t for _, t in train]
    t0 = time.time()
    # A base model: no chat template, so every entry point encodes prompts raw, as it was trained.
    from tokenizers import Tokenizer

    if tokenizer_from is not None:
        specials = copy_tokenizer(Path(tokenizer_from), tok_dir)
    else:
        specials = train_bpe_tokenizer(texts, tok_dir, args.vocab_size, chat_template=False, split=args.split)

    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    eos = specials[EOS_TOKEN]

    # A file's trailing newline before its EOS taught the demo targets that a bare newline token may
    # end a text: a prompt ending at a line end (as pasted code does) then stopped at its first
    # token (p(EOS) 0.55-0.80 after `    assert is_leap_year(2000)` and a newline).
    trim = getattr(args, "eos_after_text", False)

    def stream(docs):
        out = []
        for enc in tok.encode_batch([d.rstrip() for d in docs] if trim else docs):
            out.extend(enc.ids)
            out.append(eos)
        return np.asarray(out, dtype=np.int32)

    train_ids = stream(texts)
    held_ids = stream([t for _, t in held])
    # The tokenizer is trained on the standard library only, so it (and --init-from) is
    # the same with or without the synthetic modules.
    modules = getattr(args, "synthetic_modules", 0)  # the hybrid recipe shares this function
    synth_ids = stream(synthetic_corpus(modules, args.seed)) if modules else np.zeros(0, dtype=np.int32)
    log(f"tokenizer: vocab {tok.get_vocab_size()} in {time.time() - t0:.1f}s; "
        f"{len(train_ids)} train tokens, {len(held_ids)} held-out tokens")
    meta = {
        "tokenizer_from": str(tokenizer_from) if tokenizer_from is not None else None,
        "python_version": corpus.python_version(),
        "stdlib": str(corpus.stdlib_dir()),
        "train_files": len(train),
        "train_chars": sum(len(t) for t in texts),
        "train_tokens": int(len(train_ids)),
        "heldout_files": [r for r, _ in held],
        "heldout_tokens": int(len(held_ids)),
        "synthetic_modules": modules,
        "synthetic_tokens": int(len(synth_ids)),
        "eos_after_text": trim,
        "vocab_size": tok.get_vocab_size(),
        "split": split_of(tok_dir / "tokenizer.json") if tokenizer_from is not None else args.split,
        "special_ids": specials,
    }
    np.save(run_dir / "train_tokens.npy", train_ids)
    np.save(run_dir / "heldout_tokens.npy", held_ids)
    np.save(run_dir / "synthetic_tokens.npy", synth_ids)
    meta_path.write_text(json.dumps(meta, indent=2))
    return {**meta, "train_ids": train_ids, "held_ids": held_ids, "synth_ids": synth_ids, "tok_dir": tok_dir}


def copy_tokenizer(model_dir: Path, tok_dir: Path) -> dict[str, int]:
    """Copy a model's tokenizer files into tok_dir; return its special ids (as train_bpe_tokenizer does)."""
    from tokenizers import Tokenizer

    tok_dir.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if not (model_dir / name).is_file():
            raise SystemExit(f"{model_dir}: no {name} to take the tokenizer from")
        shutil.copyfile(model_dir / name, tok_dir / name)
    specials = special_ids(Tokenizer.from_file(str(tok_dir / "tokenizer.json")))
    missing = [name for name, i in specials.items() if i is None]
    if missing:
        raise SystemExit(f"{model_dir}: its tokenizer lacks the special tokens {', '.join(missing)}")
    return specials


def split_of(tokenizer_json: Path) -> str:
    """The pre-split a tokenizer.json was trained with: qwen2's is a Split before the byte-level step."""
    pre = json.loads(tokenizer_json.read_text()).get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre])
    return "qwen2" if any(step.get("type") == "Split" for step in steps) else "gpt2"


def sample_batch(rng: np.random.Generator, ids: np.ndarray, batch: int, seq_len: int,
                 synth: np.ndarray | None = None, share: float = 0.0,
                 file_starts: np.ndarray | None = None, start_share: float = 0.0,
                 copy_share: float = 0.0, tokenizer=None):
    """Random windows; each row comes from `synth` with probability `share`; a row from `ids` starts
    at one of `file_starts` (a file's first token) with probability `start_share`, or (with
    probability `copy_share`) is a copy row (copy_rows.py) of a span of its source. Copy rows drew
    on the standard library alone until stop 49, whose GPU run drifted the target's style towards it."""
    rows = []
    for _ in range(batch):
        src = synth if synth is not None and len(synth) > seq_len + 1 and rng.random() < share else ids
        if copy_share and rng.random() < copy_share:
            rows.append(copy_row(rng, tokenizer, src, seq_len))
            continue
        s = int(rng.integers(0, len(src) - seq_len - 1))
        if src is ids and file_starts is not None and start_share > 0 and rng.random() < start_share:
            fitting = file_starts[file_starts < len(ids) - seq_len - 1]
            s = int(fitting[rng.integers(0, len(fitting))])
        rows.append(src[s : s + seq_len + 1])
    rows = np.stack(rows)
    return mx.array(rows[:, :-1]), mx.array(rows[:, 1:])


# ---------------------------------------------------------------- model


def model_config(args, data) -> dict:
    eos = data["special_ids"][EOS_TOKEN]
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": args.hidden_size,
        "intermediate_size": args.intermediate_size,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "vocab_size": data["vocab_size"],
        "max_position_embeddings": args.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": args.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": args.layers,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "pad_token_id": eos,
        "mask_token_id": data["special_ids"][MASK_TOKEN],
        "torch_dtype": "float32",
    }


def build_model(cfg: dict) -> Model:
    margs = ModelArgs(
        model_type="qwen3",
        hidden_size=cfg["hidden_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        intermediate_size=cfg["intermediate_size"],
        num_attention_heads=cfg["num_attention_heads"],
        rms_norm_eps=cfg["rms_norm_eps"],
        vocab_size=cfg["vocab_size"],
        num_key_value_heads=cfg["num_key_value_heads"],
        max_position_embeddings=cfg["max_position_embeddings"],
        head_dim=cfg["head_dim"],
        tie_word_embeddings=True,
        rope_theta=cfg["rope_theta"],
    )
    return Model(margs)


def lr_schedule(args):
    warm = optim.linear_schedule(args.lr * 0.01, args.lr, max(args.warmup, 1))
    decay = optim.cosine_decay(args.lr, max(args.steps - args.warmup, 1), args.lr * args.min_lr_ratio)
    return optim.join_schedules([warm, decay], [max(args.warmup, 1)])


def file_starts(ids: np.ndarray, eos: int) -> np.ndarray:
    """Positions of every file's first token in a stream of files joined by EOS."""
    return np.concatenate([[0], np.flatnonzero(ids == eos) + 1]).astype(np.int64)


def step_shape(args, step: int) -> tuple[int, int]:
    """(batch, seq_len) of a step: --alt-seq-len on even steps, same tokens per step."""
    if args.alt_seq_len and step % 2 == 0:
        return max(1, args.batch_size * args.seq_len // args.alt_seq_len), args.alt_seq_len
    return args.batch_size, args.seq_len


def heldout_loss_by_depth(model: Model, ids: np.ndarray, seq_len: int, edges: tuple[int, ...],
                          batch: int = 4) -> dict[str, float]:
    """Held-out loss per range of positions in windows of seq_len (does the model use a long context?)."""
    n = (len(ids) - 1) // seq_len
    x_all = ids[: n * seq_len].reshape(n, seq_len)
    y_all = ids[1 : n * seq_len + 1].reshape(n, seq_len)
    sums = np.zeros(seq_len)
    for i in range(0, n, batch):
        x, y = mx.array(x_all[i : i + batch]), mx.array(y_all[i : i + batch])
        sums += np.array(nn.losses.cross_entropy(model(x), y, reduction="none").sum(axis=0))
    bounds = [b for b in edges if b < seq_len] + [seq_len]
    lo, out = 0, {}
    for hi in bounds:
        out[f"{lo}-{hi}"] = round(float(sums[lo:hi].sum() / (n * (hi - lo))), 4)
        lo = hi
    return out


def heldout_loss(model: Model, ids: np.ndarray, seq_len: int, batch: int = 16) -> float:
    n = (len(ids) - 1) // seq_len
    x_all = ids[: n * seq_len].reshape(n, seq_len)
    y_all = ids[1 : n * seq_len + 1].reshape(n, seq_len)
    total, count = 0.0, 0
    for i in range(0, n, batch):
        x, y = mx.array(x_all[i : i + batch]), mx.array(y_all[i : i + batch])
        loss = nn.losses.cross_entropy(model(x), y, reduction="sum")
        total += loss.item()
        count += y.size
    return total / count


def train_loop(args, model, batches, run_dir: Path, rng) -> tuple[float, list[float]]:
    """AdamW with --lr's schedule over `batches(step) -> (x, y)`, cross-entropy, a compiled step,
    checkpoints every --ckpt-every steps (model, optimizer, RNG) and --resume from the latest;
    (training wall seconds, the last 50 losses). The hybrid and draft-model recipes train this way."""
    opt = optim.AdamW(learning_rate=lr_schedule(args), weight_decay=args.weight_decay)
    opt.init(model.trainable_parameters())
    start, prev_wall, recent = 0, 0.0, []
    if args.resume:
        state = load_checkpoint(run_dir, model, opt, rng)
        start, prev_wall, recent = state["step"], state.get("train_wall_s", 0.0), state.get("recent_losses", [])

    def loss_fn(model, x, y):
        return nn.losses.cross_entropy(model(x), y, reduction="mean")

    loss_and_grad = nn.value_and_grad(model, loss_fn)
    state = [model.state, opt.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step_fn(x, y):
        loss, grads = loss_and_grad(model, x, y)
        grads, _ = optim.clip_grad_norm(grads, args.grad_clip)
        opt.update(model, grads)
        return loss

    t0 = time.time()
    for step in range(start + 1, args.steps + 1):
        loss = step_fn(*batches(step))
        mx.eval(loss, state)
        recent = (recent + [loss.item()])[-50:]
        if step % args.log_every == 0 or step == start + 1:
            per = (time.time() - t0) / (step - start)
            log(f"step {step}/{args.steps} loss {recent[-1]:.3f} {per:.2f} s/step "
                f"ETA {per * (args.steps - step) / 60:.1f}m")
        if step % args.ckpt_every == 0 or step == args.steps:
            save_checkpoint(run_dir, model, opt, step, rng, {
                "train_wall_s": prev_wall + time.time() - t0, "steps_run_total": step, "recent_losses": recent})
    return prev_wall + time.time() - t0, recent


# ---------------------------------------------------------------- checkpoints


def save_checkpoint(run_dir: Path, model, opt, step: int, rng, extra: dict) -> None:
    name = f"ckpt-{step:06d}"
    tmp = run_dir / (name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    mx.save_safetensors(str(tmp / "weights.safetensors"), dict(tree_flatten(model.parameters())))
    mx.save_safetensors(str(tmp / "optimizer.safetensors"), dict(tree_flatten(opt.state)))
    # The numpy generator draws every batch; MLX's RNG is only used for the initial
    # weights (no dropout), so the weights + optimizer + numpy state are the whole run state.
    state = {"step": step, "np_rng": rng.bit_generator.state, **extra}
    (tmp / "state.json").write_text(json.dumps(state, indent=2))
    final = run_dir / name
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    latest_tmp = run_dir / "latest.json.tmp"
    latest_tmp.write_text(json.dumps({"checkpoint": name, "step": step}))
    os.replace(latest_tmp, run_dir / "latest.json")
    done = sorted(p for p in run_dir.glob("ckpt-*") if p.is_dir() and not p.name.endswith(".tmp"))
    for old in done[:-2]:  # keep the newest two
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(run_dir: Path, model, opt, rng) -> dict:
    name = json.loads((run_dir / "latest.json").read_text())["checkpoint"]
    ck = run_dir / name
    model.load_weights(str(ck / "weights.safetensors"), strict=True)
    opt.state = tree_unflatten(list(mx.load(str(ck / "optimizer.safetensors")).items()))
    opt.init(model.trainable_parameters())
    state = json.loads((ck / "state.json").read_text())
    rng.bit_generator.state = state["np_rng"]
    mx.eval(model.parameters(), opt.state)
    log(f"resumed from {ck} at step {state['step']}")
    return state


# ---------------------------------------------------------------- output


def write_output(args, cfg, data, model, out: Path, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.astype(mx.float32) for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(data["tok_dir"] / name, out / name)
    log(f"wrote {out}")


def verify_and_sample(out: Path, prompts: list[str], max_tokens: int) -> list[tuple[str, str]]:
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(out))
    samples = []
    for p in prompts:
        # The tokenizer's decode of the tokens: mlx-lm's streamed text drops a leading space.
        tokens = [r.token for r in mlx_lm.stream_generate(model, tokenizer, prompt=p, max_tokens=max_tokens)]
        samples.append((p, tokenizer.decode(tokens, skip_special_tokens=True)))
    return samples


def write_model_card(out: Path, args, cfg, data, report: dict, samples) -> None:
    n_params = report["params"]
    size_mb = (out / "model.safetensors").stat().st_size / 1e6
    fib = samples[0]
    stopped = "stopped_at_step" in report
    ran = report["stopped_at_step"] if stopped else report["steps"]
    lines = [
        "# demo-target",
        "",
        "A small Qwen3-architecture causal LM trained on the Python standard library's",
        "source code and on synthetic textbook modules (short functions and classes with",
        "docstrings and tests). It is the *target* of the DFlash Playground demo pair.",
        "Built by `resources/models/recipe/build_demo_target.py`.",
        "",
        "## Corpus",
        "",
        f"- Python {data['python_version']} standard library (`{data['stdlib']}`), `.py` files only,",
        "  excluding `site-packages`, `test`/`tests`/`idlelib`/`lib2to3` folders and test files",
        "  (see `resources/models/recipe/corpus.py`). Files sorted by path, joined with `<|endoftext|>`.",
        f"- Training files: {data['train_files']} ({data['train_chars'] / 1e6:.1f} M characters, "
        f"{data['train_tokens']:,} tokens).",
        f"- Held out (not used for tokenizer or training): {', '.join(data['heldout_files'])} "
        f"({data['heldout_tokens']:,} tokens).",
        f"- Synthetic modules: {data.get('synthetic_modules', 0):,} drawn by `synthetic_code.py` (seed {args.seed}), "
        f"{data.get('synthetic_tokens', 0):,} tokens; {args.synthetic_share:.0%} of each batch's rows.",
        "",
        "## Tokenizer",
        "",
        f"- Byte-level BPE, vocab {data['vocab_size']}, {data.get('split', 'gpt2')} pre-split; specials: "
        + ", ".join(f"`{k}`={v}" for k, v in data["special_ids"].items())
        + ". `<|mask|>` is never seen in training; it is for the DFlash drafter.",
        "",
        "## Model",
        "",
        f"- Qwen3: hidden {cfg['hidden_size']}, {cfg['num_hidden_layers']} layers, "
        f"{cfg['num_attention_heads']} heads / {cfg['num_key_value_heads']} KV heads, head_dim {cfg['head_dim']}, "
        f"intermediate {cfg['intermediate_size']}, rope_theta {cfg['rope_theta']:g}, tied embeddings, float32.",
        f"- Parameters: {n_params:,} ({size_mb:.1f} MB `model.safetensors`).",
        "",
        "## Training",
        "",
        *([f"- Initialised from `{args.init_from}`: {args.init_note}"] if args.init_from else []),
        f"- {ran} steps" + (f" (stopped by --max-minutes; the schedule was {report['steps']})" if stopped else "")
        + f", batch {args.batch_size} x {args.seq_len} tokens"
        + (f" (every other step {step_shape(args, 2)[0]} x {args.alt_seq_len})" if args.alt_seq_len else "")
        + f" ({ran * args.batch_size * args.seq_len:,} tokens, "
        f"{ran * args.batch_size * args.seq_len / data['train_tokens']:.2f} epochs; random windows"
        + (f", {args.file_start_share:.0%} of standard-library rows from a file's start" if args.file_start_share else "")
        + (f", {args.copy_share:.0%} of rows a span and its copy (copy_rows.py)" if args.copy_share else "")
        + ").",
        f"- AdamW lr {args.lr:g} (linear warm-up {args.warmup} steps, cosine to {args.lr * args.min_lr_ratio:g}), "
        f"weight decay {args.weight_decay}, grad clip {args.grad_clip}.",
        f"- OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}.",
        f"- Seed {args.seed} (mlx init and numpy batch sampler). MLX {mx.__version__}, {training_device()}.",
        f"- Wall time (training loop): {report['train_wall_s'] / 60:.1f} min; "
        f"mean step {report['train_wall_s'] / max(report['steps_run_total'], 1):.2f} s.",
        f"- Final train loss (mean of last {report['train_loss_window']} steps): {report['final_train_loss']:.3f}.",
        f"- Held-out loss: {report['heldout_loss']:.3f} (perplexity {math.exp(report['heldout_loss']):.1f}).",
        *([f"- Held-out loss by position in {report['heldout_depth_window']}-token windows: "
           + ", ".join(f"{k}: {v:.3f}" for k, v in report["heldout_loss_by_depth"].items())
           + " (a model that uses its long context gets lower loss deeper in a window)."]
          if report.get("heldout_loss_by_depth") else []),
        *([f"- Copy probe (`copy_rows.copy_probe`, 24 held-out spans with disguised names, each followed by "
           f"itself): loss {report['copy_probe']['span']:.2f} on the spans, {report['copy_probe']['copy']:.2f} on "
           "their copies (a model that copies scores near 0 there)."] if report.get("copy_probe") else []),
        "",
        "## Sample (greedy, `mlx_lm.stream_generate`)",
        "",
        "```python",
        fib[0] + fib[1],
        "```",
        "",
    ]
    write_atomic(out / "MODEL_CARD.md", "\n".join(lines), "the model card")


# ---------------------------------------------------------------- main


def main(argv=None) -> None:
    args = parse_args(argv)
    out, run_dir = Path(args.out), Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if args.resume and not (run_dir / "latest.json").exists():
        log("--resume: no checkpoint found, starting fresh")
        args.resume = False
    if not args.resume:
        for old in list(run_dir.glob("ckpt-*")) + [run_dir / "latest.json"]:
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)
    (run_dir / ("run_args.json" if not args.resume else "run_args.resume.json")).write_text(
        json.dumps(vars(args), indent=2))

    mx.random.seed(args.seed)
    rng = np.random.Generator(np.random.PCG64(args.seed))
    # Continuing a model keeps its tokenizer (its token ids); a fresh one trains its own.
    data = prepare_data(args, run_dir, Path(args.init_from) if args.init_from else None)
    cfg = model_config(args, data)
    model = build_model(cfg)
    mx.eval(model.parameters())
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    log(f"model: {n_params:,} params ({n_params * 4 / 1e6:.1f} MB fp32)")

    if args.init_from and not args.resume:  # prepare_data took its tokenizer (or checked a resumed one)
        init = Path(args.init_from)
        model.load_weights(str(init / "model.safetensors"), strict=True)
        mx.eval(model.parameters())
        log(f"init: weights from {init}")

    opt = optim.AdamW(learning_rate=lr_schedule(args), weight_decay=args.weight_decay)
    opt.init(model.trainable_parameters())

    start_step, prev_wall, steps_run_total, recent = 0, 0.0, 0, []
    if args.resume:
        st = load_checkpoint(run_dir, model, opt, rng)
        start_step, prev_wall = st["step"], st.get("train_wall_s", 0.0)
        steps_run_total, recent = st.get("steps_run_total", st["step"]), st.get("recent_losses", [])

    def loss_fn(model, x, y):
        return nn.losses.cross_entropy(model(x), y, reduction="mean")

    loss_and_grad = nn.value_and_grad(model, loss_fn)
    state = [model.state, opt.state]

    def step_fn(x, y):
        loss, grads = loss_and_grad(model, x, y)
        if args.grad_clip > 0:
            grads, _ = optim.clip_grad_norm(grads, args.grad_clip)
        opt.update(model, grads)
        return loss

    if args.host_attention:  # the CPU kernels' dispatchers: a forward without a cache takes the host path
        from engine.models.kernel_dispatch import install_kernels
        from kernels.verify_attention import whole_sequences

        install_kernels(model, mx.cpu)
        step_fn = whole_sequences()(step_fn)
    elif not args.no_compile:
        step_fn = partial(mx.compile, inputs=state, outputs=state)(step_fn)

    tokens_per_step = args.batch_size * args.seq_len
    starts = file_starts(data["train_ids"], data["special_ids"][EOS_TOKEN]) if args.file_start_share else None
    tokenizer = None
    if args.copy_share:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(data["tok_dir"] / "tokenizer.json"))
    heldout = None
    t_start = time.time()
    t_window = time.time()
    t_aside = 0.0  # time spent on evals and checkpoints, kept out of the step timings
    step, out_of_time = start_step, False
    for step in range(start_step + 1, args.steps + 1):
        batch, seq_len = step_shape(args, step)
        x, y = sample_batch(rng, data["train_ids"], batch, seq_len, data["synth_ids"], args.synthetic_share,
                            starts, args.file_start_share, args.copy_share, tokenizer)
        loss = step_fn(x, y)
        mx.eval(loss, state)
        recent = (recent + [loss.item()])[-50:]
        steps_run_total += 1
        if step % args.log_every == 0 or step == start_step + 1 or step == args.steps:
            now = time.time()
            n_done = step - start_step
            per_step = (now - t_start - t_aside) / n_done  # training steps only
            win = now - t_window
            t_window = now
            n_win = args.log_every if step % args.log_every == 0 else 1
            log(f"step {step}/{args.steps} loss {recent[-1]:.3f} avg10 {np.mean(recent[-10:]):.3f} "
                f"lr {float(opt.learning_rate):.2e} {tokens_per_step * n_win / max(win, 1e-9):.0f} tok/s "
                f"{per_step:.2f} s/step elapsed {(prev_wall + now - t_start) / 60:.1f}m "
                f"ETA {per_step * (args.steps - step) / 60:.1f}m")
        if args.eval_every and step % args.eval_every == 0 and step != args.steps:
            te = time.time()
            heldout = heldout_loss(model, data["held_ids"], args.seq_len)
            probe = f", copy probe {'/'.join(f'{v:.2f}' for v in copy_probe(model, tokenizer, data['held_ids']))}" \
                if tokenizer else ""
            log(f"step {step} held-out loss {heldout:.3f}{probe} ({time.time() - te:.1f}s)")
            t_aside += time.time() - te
            t_window += time.time() - te
        out_of_time = args.max_minutes and time.time() - t_start > args.max_minutes * 60
        if step % args.ckpt_every == 0 or step == args.steps or out_of_time:
            tc = time.time()
            save_checkpoint(run_dir, model, opt, step, rng, {
                "train_wall_s": prev_wall + time.time() - t_start,
                "steps_run_total": steps_run_total,
                "recent_losses": recent,
            })
            t_aside += time.time() - tc
            t_window += time.time() - tc
        if out_of_time:
            log(f"--max-minutes {args.max_minutes:g}: stopped after step {step} of {args.steps} (--resume goes on)")
            break
    train_wall = prev_wall + time.time() - t_start

    heldout = heldout_loss(model, data["held_ids"], args.seq_len)
    longest = max(args.seq_len, args.alt_seq_len)
    by_depth = heldout_loss_by_depth(model, data["held_ids"], longest, DEPTH_EDGES) if longest > 256 else None
    final_train = float(np.mean(recent[-50:])) if recent else float("nan")
    log(f"final: train loss {final_train:.3f} held-out loss {heldout:.3f} wall {train_wall / 60:.1f}m")
    report = {
        "params": n_params, "steps": args.steps, "steps_run_total": steps_run_total,
        **({"stopped_at_step": step} if out_of_time else {}),
        "train_wall_s": train_wall, "final_train_loss": final_train,
        "train_loss_window": min(len(recent), 50), "heldout_loss": heldout,
        **({"heldout_loss_by_depth": by_depth, "heldout_depth_window": longest} if by_depth else {}),
    }
    if tokenizer:
        report["copy_probe"] = dict(zip(("span", "copy"), copy_probe(model, tokenizer, data["held_ids"])))
        log(f"copy probe: loss {report['copy_probe']['span']:.2f} on held-out spans, "
            f"{report['copy_probe']['copy']:.2f} on their copies")
    write_output(args, cfg, data, model, out, report)

    prompts = [json.loads(l)["prompt"] for l in (HERE / "eval_prompts.jsonl").read_text().splitlines() if l.strip()]
    samples = verify_and_sample(out, prompts, args.sample_tokens)
    for p, s in samples:
        log("=" * 60 + "\n" + p + s)
    write_model_card(out, args, cfg, data, report, samples)
    (run_dir / "report.json").write_text(json.dumps(report, indent=2))
    log(f"done: {out} ({(out / 'model.safetensors').stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
