"""`python -m engine.tools.peer_bench`: our `bench` beside the DFlash runtimes on PyPI (z-lab's
`dflash`, `dflash-mlx` in its default mode and with `--verify-mode ddtree`, `mlx-dspark`), on the
same pair and prompt ids, one process each, one after another (docs/peers.md).

The peers run in their own venv (`--peer-python`) through engine/tools/peer_driver.py; none is
imported here. Ours runs as `bench --json` in a process of its own, with its defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from engine.errors import DFlashError
from engine.tools import peer_driver
from engine.tools.peer_report import fastest, format_table, peer_figures

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("peer_driver.py")
# name -> the module it needs in the peer venv (the driver's own table; importing it loads no peer)
PEERS = {name: module for name, (_, module) in peer_driver.PEERS.items()}
DEFAULT_PEERS = ["zlab", "dflash-mlx", "dflash-mlx-ddtree", "dspark"]  # each at its own defaults
INSTALL = {"dflash": "dflash==0.1.0", "dflash_mlx": "dflash-mlx==0.1.8", "mlx_dspark": "mlx-dspark==0.20.3",
           "mlx_lm": "mlx-lm"}


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m engine.tools.peer_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--peer-python", required=True, help="python of the peer venv (docs/peers.md)")
    p.add_argument("--prompts", required=True, help="JSONL prompts, as for bench")
    p.add_argument("--target", help="target folder (default: the demo target)")
    p.add_argument("--drafter", help="drafter folder (default: the demo pair's)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=1, help="runs of each prompt, pooled (ours: bench --repeats)")
    p.add_argument("--peers", default=",".join(DEFAULT_PEERS),
                   help=f"comma list of {', '.join(PEERS)} (default: {','.join(DEFAULT_PEERS)})")
    p.add_argument("--ours-json", help="a saved `bench --json` (or `peer_bench --json`) of the same pair, prompts "
                                       "and --max-tokens, instead of running ours again")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--raw", action="store_true", help="prompts as they are, as bench --raw")
    form.add_argument("--chat", action="store_true", help="through the chat template, as bench --chat")
    p.add_argument("--timeout", type=int, default=3600, help="seconds each process may run (default 3600)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--save", help="also write the JSON result to this file (e.g. for a later --ours-json)")
    return p.parse_args(argv)


def parse_peers(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown or not names:
        raise DFlashError(f"--peers: unknown peer {unknown[0]!r}; choose from {', '.join(PEERS)}." if unknown
                          else f"--peers: name at least one of {', '.join(PEERS)}.")
    return list(dict.fromkeys(names))


def check_peer_python(python: str, peers: list[str]) -> None:
    """One line on what is missing, before anything runs: the python, or a package in its venv."""
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise DFlashError(f"--peer-python {python}: no such executable; make the peer venv first (docs/peers.md).")
    modules = list(dict.fromkeys(["mlx_lm"] + [PEERS[n] for n in peers]))
    probe = "import importlib.util, sys; print(','.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
    out = subprocess.run([python, "-I", "-c", probe, *modules], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise DFlashError(f"--peer-python {python} does not run: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    missing = [m for m in out.stdout.strip().split(",") if m]
    if missing:
        pip = Path(python).with_name("pip")
        raise DFlashError(f"{missing[0]} is not installed in {python}: {pip} install {INSTALL[missing[0]]} "
                          "(docs/peers.md).")


def pair_paths(target: Optional[str], drafter: Optional[str]) -> tuple[str, str]:
    """Absolute folders (the peers run elsewhere); the demo pair's where left out, as bench does."""
    from engine.models.demo import demo_pair

    if target is None or drafter is None:
        demo = demo_pair()
        if demo is None and (target is None or drafter is None):
            raise DFlashError("the demo pair is not installed; give --target and --drafter.")
        target, drafter = target or str(demo[0]), drafter or str(demo[1])
    for role, path in (("target", target), ("drafter", drafter)):
        if not Path(path).is_dir():
            raise DFlashError(f"--{role} {path}: no such folder (the peers load local folders here).")
    return str(Path(target).resolve()), str(Path(drafter).resolve())


def encode(target: str, prompts_file: str, chat: Optional[bool]) -> tuple[list[str], list[list[int]]]:
    """The prompts as bench encodes them, with the target's tokenizer: the ids every peer gets."""
    from mlx_lm.utils import load_tokenizer

    from engine.decode.prompts import encode_prompt
    from engine.tools.bench import load_prompts

    texts = load_prompts(prompts_file, raw=chat is False)
    tokenizer = load_tokenizer(Path(target))
    return texts, [encode_prompt(tokenizer, t, chat) for t in texts]


def saved_ours(path: str, pair: tuple[str, str], prompts: int, max_tokens: int) -> dict:
    """Our result from a saved `bench --json`, or from a saved `peer_bench --json` (its "ours"),
    refused where it measured another pair, other prompts or another length."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DFlashError(f"--ours-json {path}: {exc}") from None
    ours = data["ours"] if isinstance(data, dict) and "peers" in data else data
    if not isinstance(ours, dict) or "per_prompt" not in ours:
        raise DFlashError(f"--ours-json {path}: not the JSON of `bench --json` or `peer_bench --json`.")
    for role, want in zip(("target", "drafter"), pair):
        if Path(str(ours.get(role))).resolve() != Path(want):
            raise DFlashError(f"--ours-json {path}: measured the {role} {ours.get(role)}, not {want}.")
    if (ours.get("prompts_given"), ours.get("max_tokens")) != (prompts, max_tokens):
        raise DFlashError(f"--ours-json {path}: measured {ours.get('prompts_given')} prompts at "
                          f"{ours.get('max_tokens')} tokens, not these {prompts} at {max_tokens}.")
    return ours


def run_ours(args: argparse.Namespace, target: str, drafter: str, prompts: int) -> dict:
    """`bench --json` with its defaults, in its own process, on the same file and pair."""
    if args.ours_json:
        return saved_ours(args.ours_json, (target, drafter), prompts, args.max_tokens)
    cmd = [sys.executable, "-m", "engine.tools.cli", "bench", "--prompts", args.prompts, "--target", target,
           "--drafter", drafter, "--max-tokens", str(args.max_tokens), "--repeats", str(args.repeats), "--json"]
    cmd += ["--raw"] if args.raw else ["--chat"] if args.chat else []
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    try:
        return json.loads(out.stdout)
    except ValueError:
        raise DFlashError(f"our bench failed (exit {out.returncode}): "
                          f"{(out.stderr.strip().splitlines() or ['no output'])[-1]}") from None


def run_peer(python: str, name: str, spec: dict, timeout: int) -> list[dict]:
    """The peer's JSON lines; its last stderr line as the error where it wrote none."""
    try:
        out = subprocess.run([python, "-I", str(DRIVER)], input=json.dumps({**spec, "peer": name}),
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [{"error": f"did not finish in {timeout} s (--timeout)"}]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 and not any("error" in line for line in lines):
        lines.append({"error": f"exit {out.returncode}: {(out.stderr.strip().splitlines() or ['no output'])[-1]}"})
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    try:
        for flag, value in (("--max-tokens", args.max_tokens), ("--repeats", args.repeats)):
            if value < 1:
                raise DFlashError(f"{flag} {value} must be at least 1.")
        peers = parse_peers(args.peers)
        check_peer_python(args.peer_python, peers)
        target, drafter = pair_paths(args.target, args.drafter)
        texts, ids = encode(target, args.prompts, True if args.chat else False if args.raw else None)
        print(f"ours (bench): {len(texts)} prompts, {args.max_tokens} tokens", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        ours = run_ours(args, target, drafter, len(texts))
        walls = {"ours": round(time.perf_counter() - t0, 1)}
        results = {}
        spec = {"target": target, "drafter": drafter, "prompts": ids, "max_tokens": args.max_tokens,
                "repeats": args.repeats}
        for name in peers:
            print(f"{name}: running", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            results[name] = peer_figures(run_peer(args.peer_python, name, spec, args.timeout), args.max_tokens)
            walls[name] = round(time.perf_counter() - t0, 1)
    except DFlashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    best = fastest(results)
    result = json.dumps({"target": target, "drafter": drafter, "max_tokens": args.max_tokens,
                         "repeats": args.repeats, "prompts": texts, "ours": ours, "peers": results, "wall_s": walls,
                         "fastest_peer": best and best[0],
                         "ours_vs_fastest": best and ours.get("dflash_tok_s") and ours["dflash_tok_s"] / best[1]},
                        indent=1)
    if args.save:
        Path(args.save).write_text(result + "\n")
    if args.json:
        print(result)
    else:
        print(f"target {target}\ndrafter {drafter}\n{args.max_tokens} tokens, {args.repeats} repeat(s), "
              f"wall s {walls}\n")
        print(format_table(ours, results, texts))
    return 1 if any(r["overall"] is None for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
