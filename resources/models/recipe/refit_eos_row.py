"""Refit a demo target's EOS row: stop it ending a text at a bare newline, and change nothing else.

Why: every training file ended in a newline and then EOS, so the demo targets learnt that a newline
may end a text, and a prompt ending at a line end (as pasted code does) could stop at its first
token. `--eos-after-text` fixes the data, but continuing all the weights on it moves every logit:
60 steps at lr 3e-4 on the dense demo target lowered its DFlash2 drafter's tau at a fixed block of
16 from 5.73 to 4.62 on `short_tune_prompts.jsonl` and from 4.50 to 3.09 on `long_tune_tails.jsonl`.

With tied embeddings the EOS logit at a position is h . e (h the target's final normed hidden
state, e the embedding's EOS row), and e is used nowhere else but as the input embedding of EOS,
which no prompt holds. With the hidden states fixed, cross-entropy is convex in e: this fits e alone
(Newton's method) on windows of the `--eos-after-text` token streams, so every other logit stays as
it was and a greedy choice changes only where EOS was or becomes the top token; the drafters
distilled from the target keep their acceptance. The card says what moved.

    PYTHONPATH=. python resources/models/recipe/refit_eos_row.py --target resources/models/demo-target \\
        --out runs/demo-target-eos --run-dir runs/demo-target-eos-run \\
        --probe-prompts resources/models/recipe/short_tune_prompts.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_demo_target import EOS_TOKEN, file_starts, prepare_data, sample_batch  # noqa: E402
from synthetic_code import synthetic_corpus  # noqa: E402

CARD_SECTION = "## EOS row refit"


def log(msg: str) -> None:
    print(msg, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="a demo target folder (tied embeddings)")
    ap.add_argument("--out", required=True, help="the refitted target's folder (must not exist yet)")
    ap.add_argument("--run-dir", required=True, help="token cache (made with --eos-after-text, reused)")
    ap.add_argument("--windows", type=int, default=96, help="training windows whose hidden states the fit uses")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--synthetic-share", type=float, default=0.5)
    ap.add_argument("--file-start-share", type=float, default=0.5)
    ap.add_argument("--synthetic-modules", type=int, default=20000, help="as the target was trained with")
    ap.add_argument("--check-modules", type=int, default=500,
                    help="synthetic modules of another seed, for the held-out check beside the held-out files")
    ap.add_argument("--newton-steps", type=int, default=30)
    ap.add_argument("--ridge", type=float, default=0.0,
                    help="pull toward the old row (ridge / 2 * |e - e0|^2): for a fit on few positions, where "
                         "EOS can be separated exactly and the row would grow without bound")
    ap.add_argument("--probe-prompts", type=Path, help="JSONL prompts whose p(EOS) at their end the card gives")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.eos_after_text, args.vocab_size, args.split = True, 0, "qwen2"  # what prepare_data reads
    args.resume = (Path(args.run_dir) / "data.json").exists()
    if Path(args.out).resolve() == Path(args.target).resolve():
        ap.error("--out is the target itself: the refit writes a new folder, never over its input")
    if Path(args.out).exists():
        ap.error(f"--out {args.out} exists; give a new folder")
    return args


def load_tied_target(folder: Path):
    """The target through mlx-lm's loader, after checking that its EOS row is one plain row of a
    table its lm_head shares (a quantized table packs rows with their scales: refit before quantizing)."""
    from mlx_lm.utils import load_model

    config_path = folder / "config.json"
    if not config_path.is_file():
        raise SystemExit(f"{folder}: no config.json; give a target model folder")
    config = json.loads(config_path.read_text())
    if not config.get("tie_word_embeddings", False):
        raise SystemExit(f"{folder}: not a tied-embedding target; the refit changes the row its lm_head shares")
    if config.get("quantization") or config.get("quantization_config"):
        raise SystemExit(f"{folder}: a quantized target; refit the unquantized one, then quantize it")
    model, config = load_model(folder)
    if not hasattr(model, "model") or not hasattr(model.model, "embed_tokens"):
        raise SystemExit(f"{folder}: its model has no model.embed_tokens table to refit")
    return model, config


def position_stats(model, eos: int, x: mx.array, y: mx.array) -> dict[str, np.ndarray]:
    """Per position: the normed hidden state, the log-sum-exp and the top of the logits without
    EOS's column, the label's logit, and whether the label is EOS."""
    h = model.model(x)
    logits = model.model.embed_tokens.as_linear(h)
    rest = mx.where(mx.arange(logits.shape[-1]) == eos, -mx.inf, logits)
    label = mx.take_along_axis(logits, y[..., None], axis=-1)[..., 0]
    out = {"h": h, "lse": mx.logsumexp(rest, axis=-1), "top": mx.max(rest, axis=-1), "label": label,
           "is_eos": y == eos}
    mx.eval(out)
    return {k: np.asarray(v.astype(mx.float32) if v.dtype != mx.bool_ else v).reshape(-1, *v.shape[2:])
            for k, v in out.items()}


def gather(model, eos: int, batches, what: str = "", total: int = 0) -> dict[str, np.ndarray]:
    """position_stats over batches of windows, with progress (a forward of 4 x 1,024 tokens takes
    about half a minute on a 2-core CPU)."""
    parts, t0 = [], time.time()
    for i, (x, y) in enumerate(batches, 1):
        parts.append(position_stats(model, eos, x, y))
        if what and (i % 5 == 0 or i == total):
            left = (time.time() - t0) / i * (total - i)
            log(f"hidden states, {what}: {i}/{total} batches, {time.time() - t0:.0f} s, ETA {left / 60:.1f} min")
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def eos_loss(stats: dict[str, np.ndarray], e: np.ndarray) -> float:
    """Mean cross-entropy with EOS's logit h . e and every other logit as the target computed it."""
    z = np.asarray(stats["h"], dtype=np.float64) @ e  # no copy when the caller cast it already
    label = np.where(stats["is_eos"], z, stats["label"])
    return float(np.mean(np.logaddexp(stats["lse"], z) - label))


def stats_key(target: Path, args) -> str:
    """What the cached hidden states depend on: the target's weights and the windows drawn."""
    digest = hashlib.sha256((target / "model.safetensors").read_bytes()).hexdigest()[:16]
    return json.dumps([digest, args.windows, args.seq_len, args.seed, args.synthetic_share, args.file_start_share,
                       args.synthetic_modules, args.check_modules])


def cached_gather(path: Path, key: str, compute) -> dict[str, np.ndarray]:
    """Hidden-state statistics kept in the run folder (half an hour of forwards on a 2-core CPU), so a
    second fit (another --ridge) starts at once; recomputed when the target or the windows differ."""
    if path.exists():
        with np.load(path) as saved:
            if str(saved["key"]) == key:
                log(f"hidden states: reusing {path}")
                return {k: saved[k] for k in saved.files if k != "key"}
    stats = compute()
    tmp = path.with_name(path.stem + ".partial.npz")
    np.savez(tmp, key=np.array(key), **stats)
    tmp.replace(path)
    return stats


def fit_row(stats: dict[str, np.ndarray], e0: np.ndarray, steps: int, ridge: float = 0.0) -> np.ndarray:
    """Newton's method on the convex cross-entropy in e (plus ridge / 2 * |e - e0|^2), each step
    halved until it lowers the loss; none that does: the minimum."""
    h, lse, is_eos = stats["h"].astype(np.float64), stats["lse"].astype(np.float64), stats["is_eos"]
    cast = {**stats, "h": h}  # cast once: the objective is evaluated a few times a step
    e0 = e0.astype(np.float64)

    def objective(e):
        return eos_loss(cast, e) + ridge / 2 * float(np.sum((e - e0) ** 2))

    e, loss, taken = e0.copy(), objective(e0), 0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(h @ e - lse)))  # p(EOS) at each position
        grad = h.T @ (p - is_eos) / len(h) + ridge * (e - e0)
        hess = (h * (p * (1 - p))[:, None]).T @ h / len(h) + (ridge + 1e-8) * np.eye(len(e))
        step, t = np.linalg.solve(hess, grad), 1.0
        while t >= 1e-6:
            candidate = e - t * step
            new = objective(candidate)
            if new < loss:
                break
            t /= 2
        else:
            break  # no step lowers the loss
        if loss - new < 1e-10:
            break
        e, loss, taken = candidate, new, taken + 1
    log(f"fit: {taken} Newton steps, loss {loss:.5f}")
    return e


def moved(stats: dict[str, np.ndarray], e0: np.ndarray, e1: np.ndarray) -> dict:
    """What the new row changes on a set of positions: loss, greedy choices, EOS as the top token."""
    h = stats["h"].astype(np.float64)
    cast = {**stats, "h": h}  # eos_loss then reuses it instead of casting again for each row
    top0, top1 = h @ e0 > stats["top"], h @ e1 > stats["top"]
    return {"positions": int(len(h)), "loss_before": round(eos_loss(cast, e0), 5),
            "loss_after": round(eos_loss(cast, e1), 5), "greedy_changed": int(np.sum(top0 != top1)),
            "eos_top_before": int(top0.sum()), "eos_top_after": int(top1.sum()),
            "eos_labels": int(stats["is_eos"].sum())}


def batch_count(ids: np.ndarray, seq_len: int) -> int:
    return -(-((len(ids) - 1) // seq_len) // 4)


def windows(ids: np.ndarray, seq_len: int):
    """Consecutive whole windows of a stream, 4 a batch (the held-out check)."""
    n = (len(ids) - 1) // seq_len
    for i in range(0, n, 4):
        rows = [ids[k * seq_len : k * seq_len + seq_len + 1] for k in range(i, min(i + 4, n))]
        rows = np.stack(rows)
        yield mx.array(rows[:, :-1]), mx.array(rows[:, 1:])


def probe(model, tokenizer, prompts: list[str], eos: int, e0: np.ndarray, e1: np.ndarray) -> list[dict]:
    """p(EOS) at each prompt's end (its first generated token) with the old row and the new."""
    rows = []
    for text in prompts:
        ids = mx.array(tokenizer.encode(text).ids)[None]
        s = position_stats(model, eos, ids, ids)  # labels unused
        h, lse = s["h"][-1].astype(np.float64), float(s["lse"][-1])
        p0, p1 = (float(1 / (1 + np.exp(lse - h @ e))) for e in (e0, e1))
        rows.append({"prompt": text, "p_eos_before": round(p0, 4), "p_eos_after": round(p1, 4)})
    return rows


def write_refit(target: Path, out: Path, e1: np.ndarray, eos: int, report: dict) -> None:
    """The target's folder with the new EOS row, written to a temporary name and renamed."""
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(target, tmp)
    weights = mx.load(str(target / "model.safetensors"))
    key = next(k for k in weights if k.endswith("embed_tokens.weight"))
    table = weights[key]
    weights[key] = mx.concatenate([table[:eos], mx.array(e1, dtype=table.dtype)[None], table[eos + 1 :]])
    mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
    (tmp / "eos_refit.json").write_text(json.dumps(report, indent=2) + "\n")
    card = tmp / "MODEL_CARD.md"
    old = card.read_text() if card.exists() else f"# {target.name}\n"
    card.write_text(old.rstrip("\n") + "\n\n" + card_section(report) + "\n")
    tmp.rename(out)


def card_section(r: dict) -> str:
    fit, held, synth = r["fit"], r["held_out_files"], r["held_out_synthetic"]
    lines = [CARD_SECTION, "",
             f"The embedding's EOS row (tied: the lm_head's EOS row too) refitted by `refit_eos_row.py`, every other "
             f"weight as above: fitted on {fit['positions']:,} positions of {r['windows']} training windows of the "
             f"`--eos-after-text` streams ({r['seconds']:.0f} s). Cross-entropy before -> after, and greedy choices "
             "changed (only where EOS is or was the top token):", "",
             "| positions | loss | greedy changed | EOS the top token | EOS labels |",
             "| --- | --- | ---: | --- | ---: |"]
    for name, m in (("fit windows", fit), ("held-out files", held), ("held-out synthetic modules", synth)):
        lines.append(f"| {name} ({m['positions']:,}) | {m['loss_before']:.4f} -> {m['loss_after']:.4f} | "
                     f"{m['greedy_changed']} | {m['eos_top_before']} -> {m['eos_top_after']} | {m['eos_labels']} |")
    if r.get("probe"):
        worst = sorted(r["probe"], key=lambda p: -p["p_eos_after"])[:5]
        lines += ["", f"p(EOS) at the end of `{r['probe_file']}`'s prompts (the highest five after):", ""]
        lines += [f"- `{json.dumps(p['prompt'], ensure_ascii=False)[1:-1][:30]}`: "
                  f"{p['p_eos_before']:.3f} -> {p['p_eos_after']:.3f}"
                  for p in worst]
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    target, out, run_dir = Path(args.target), Path(args.out), Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    model, _ = load_tied_target(target)
    data = prepare_data(args, run_dir, tokenizer_from=target)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(data["tok_dir"] / "tokenizer.json"))
    eos = data["special_ids"][EOS_TOKEN]
    e0 = np.asarray(model.model.embed_tokens.weight[eos].astype(mx.float32)).astype(np.float64)

    rng = np.random.default_rng(args.seed)
    starts = file_starts(data["train_ids"], eos)
    batches = (sample_batch(rng, data["train_ids"], 4, args.seq_len, data["synth_ids"], args.synthetic_share,
                            starts, args.file_start_share) for _ in range(args.windows // 4))
    check = [d.rstrip() for d in synthetic_corpus(args.check_modules, args.seed + 1)]
    check_ids = np.asarray([i for enc in tokenizer.encode_batch(check) for i in [*enc.ids, eos]], dtype=np.int32)
    key = stats_key(target, args)
    fit = cached_gather(run_dir / "eos_fit_stats.npz", key, lambda: gather(
        model, eos, batches, "fit windows", args.windows // 4))
    e1 = fit_row(fit, e0, args.newton_steps, args.ridge)
    np.save(run_dir / "eos_row.npy", e1)  # kept if the checks below are stopped
    held = cached_gather(run_dir / "eos_held_stats.npz", key, lambda: gather(
        model, eos, windows(data["held_ids"], args.seq_len), "held-out files",
        batch_count(data["held_ids"], args.seq_len)))
    synth = cached_gather(run_dir / "eos_synth_stats.npz", key, lambda: gather(
        model, eos, windows(check_ids, args.seq_len), "held-out modules", batch_count(check_ids, args.seq_len)))
    report = {"target": str(target), "eos_id": eos, "windows": args.windows, "seq_len": args.seq_len,
              "ridge": args.ridge, "row_change": round(float(np.linalg.norm(e1 - e0)), 4),
              "row_norm": round(float(np.linalg.norm(e0)), 4), "fit": moved(fit, e0, e1),
              "held_out_files": moved(held, e0, e1), "held_out_synthetic": moved(synth, e0, e1)}
    if args.probe_prompts:
        prompts = [json.loads(line)["prompt"] for line in args.probe_prompts.read_text().splitlines() if line.strip()]
        report["probe_file"], report["probe"] = args.probe_prompts.name, probe(model, tokenizer, prompts, eos, e0, e1)
    report["seconds"] = round(time.time() - t0, 1)
    for name in ("fit", "held_out_files", "held_out_synthetic"):
        log(f"{name}: {report[name]}")
    write_refit(target, out, e1, eos, report)
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
