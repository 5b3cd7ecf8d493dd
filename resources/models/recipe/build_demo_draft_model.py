"""Build the demo *draft model*: a small autoregressive Qwen3 with the demo target's tokenizer, for
draft-model speculation (`--mode draft-model --draft-model demo-draft-model`, and mlx-lm's own
`--draft-model`), distilled from the target.

Distilled: on windows of the target's corpus (standard library and synthetic modules, the held-out
modules excluded) the labels are the *target's* greedy next tokens, not the text's, so the draft
model learns to write what the target would (what acceptance rewards). It starts from the target's
embeddings (tied, so its output head too), final norm and first layers, so it begins close to the
target's own early representation. Checkpoints every --ckpt-every steps in --run-dir; --resume
continues a killed run.

    python resources/models/recipe/build_demo_draft_model.py --target resources/models/demo-target \
        --out resources/models/demo-draft-model --run-dir runs/demo-draft-model
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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

import build_demo_target as dense  # noqa: E402  (data, model, schedule, checkpoints)
from train_device import training_device  # noqa: E402
from engine.safe_write import write_atomic  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(REPO / "resources/models/demo-target"))
    ap.add_argument("--out", default=str(REPO / "resources/models/demo-draft-model"))
    ap.add_argument("--run-dir", default=str(REPO / "runs/demo-draft-model"))
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--synthetic-modules", type=int, default=20000)
    ap.add_argument("--synthetic-share", type=float, default=0.5)
    ap.add_argument("--split", default="qwen2")
    ap.add_argument("--vocab-size", type=int, default=4096)
    return ap.parse_args(argv)


def draft_config(target_cfg: dict, layers: int) -> dict:
    """The target's config with fewer layers: same widths, tokenizer ids and context."""
    return {**target_cfg, "num_hidden_layers": layers, "max_window_layers": layers}


def start_from_target(model: nn.Module, target_weights: dict, layers: int) -> int:
    """The target's embeddings, final norm and first `layers` layers; how many tensors were copied."""
    mine = dict(tree_flatten(model.parameters()))
    taken = [(k, v) for k, v in target_weights.items() if k in mine and mine[k].shape == v.shape]
    model.load_weights(taken, strict=False)
    mx.eval(model.parameters())
    return len(taken)


def greedy_labels(target: nn.Module, x: mx.array) -> mx.array:
    """The target's own next token at every position of x (its greedy choice given the real prefix)."""
    from kernels.verify_attention import whole_sequences

    with whole_sequences():
        return mx.stop_gradient(mx.argmax(target(x), axis=-1))


def main(argv=None) -> int:
    args = parse_args(argv)
    target_dir, out, run_dir = Path(args.target), Path(args.out), Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if args.resume and not (run_dir / "latest.json").exists():
        args.resume = False
    (run_dir / ("run_args.json" if not args.resume else "run_args.resume.json")).write_text(
        json.dumps(vars(args), indent=2))
    mx.random.seed(args.seed)
    rng = np.random.Generator(np.random.PCG64(args.seed))
    data = dense.prepare_data(args, run_dir, tokenizer_from=target_dir)  # the target's token ids, whatever they are
    target_cfg = json.loads((target_dir / "config.json").read_text())
    target = dense.build_model(target_cfg)
    target.load_weights(str(target_dir / "model.safetensors"), strict=True)
    target.freeze()
    from engine.models.kernel_dispatch import install_kernels

    # The device's own dispatchers: on a CPU the labels' forward takes the host attention
    # (whole_sequences), on a Mac the Metal kernels, on a CUDA GPU MLX's own functions.
    install_kernels(target, mx.default_device())
    cfg = draft_config(target_cfg, args.layers)
    model = dense.build_model(cfg)
    copied = start_from_target(model, dict(tree_flatten(target.parameters())), args.layers)
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    dense.log(f"draft model: {args.layers} layers, {n_params:,} params; {copied} tensors from {target_dir}")

    def batches(step: int):
        x, _ = dense.sample_batch(rng, data["train_ids"], args.batch_size, args.seq_len, data["synth_ids"],
                                  args.synthetic_share)
        return x, greedy_labels(target, x)

    wall, recent = dense.train_loop(args, model, batches, run_dir, rng)
    agreement = heldout_agreement(model, target, data["held_ids"], args.seq_len)
    report = {"params": n_params, "layers": args.layers, "steps": args.steps, "train_wall_s": wall,
              "final_train_loss": float(np.mean(recent)) if recent else float("nan"),
              "heldout_greedy_agreement": agreement}
    dense.log(json.dumps(report))
    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.astype(mx.float32) for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    write_atomic(out / "config.json", json.dumps(cfg, indent=2) + "\n", "the config")
    for name in dense.TOKENIZER_FILES:
        shutil.copyfile(target_dir / name, out / name)
    write_atomic(out / "MODEL_CARD.md", card(args, report, copied), "the model card")
    (run_dir / "report.json").write_text(json.dumps(report, indent=2))
    return 0


def heldout_agreement(model: nn.Module, target: nn.Module, ids: np.ndarray, seq_len: int, batch: int = 4) -> float:
    """How often the draft model's greedy next token is the target's, on held-out windows."""
    n = (len(ids) - 1) // seq_len
    windows = ids[: n * seq_len].reshape(n, seq_len)
    same = total = 0
    for i in range(0, n, batch):
        x = mx.array(windows[i : i + batch])
        agree = mx.argmax(model(x), axis=-1) == greedy_labels(target, x)
        same += int(agree.sum().item())
        total += agree.size
    return round(same / max(total, 1), 4)


def card(args, report: dict, copied: int) -> str:
    return f"""# demo-draft-model

A small autoregressive draft model for `{Path(args.target).name}` (same tokenizer), for classic
draft-model speculation: `dflash-playground generate --mode draft-model --draft-model demo-draft-model`,
or mlx-lm's own `--draft-model`. Built by `resources/models/recipe/build_demo_draft_model.py`.

- Qwen3, {report['layers']} layers of the target's widths (hidden 128, 4 heads / 2 KV heads), tied embeddings,
  float32; {report['params']:,} parameters. Started from the target's embeddings, final norm and first
  {report['layers']} layers ({copied} tensors).
- Distilled: {report['steps']} steps, batch {args.batch_size} x {args.seq_len} tokens of the target's corpus (standard
  library and synthetic modules, held-out modules excluded), labels the target's greedy next tokens;
  AdamW lr {args.lr} (warm-up {args.warmup}, cosine), seed {args.seed}; {report['train_wall_s'] / 60:.1f} min on
  {training_device()}.
- Final train loss {report['final_train_loss']:.3f}; on held-out windows its greedy next token is the target's
  {report['heldout_greedy_agreement']:.1%} of the time.
"""


if __name__ == "__main__":
    sys.exit(main())
