"""The figures in docs/serve.md: served speed against generate()'s, the HTTP layer's share of a request,
and a conversation's second turn against the same prompt cold. Run from the repository root:

    python -m engine.tools.serve_measure [--port 8765] [--repeats 3] [--max-tokens 256]

It starts `dflash-playground serve` (the demo pair, its defaults: auto verify length and lookup) as a
subprocess, and runs generate() in this process on the same prompt ids with the same settings,
alternating the two so that a machine busy with other work weighs on both alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx  # the openai client's HTTP library (the test extra)

import engine  # noqa: F401  (loads the optimised BLAS before MLX)
from engine.decode.generate import generate
from engine.decode.prompts import encode_messages, encode_prompt
from engine.decode.settings import GenerationSettings
from engine.models.demo import demo_pair
from engine.models.pair import load_pair
from engine.tools.run_flags import tree_settings

ROOT = Path(__file__).resolve().parents[2]


def start_server(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port)], cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if line.startswith("serving "):
            return proc
        print(line, end="", file=sys.stderr)
    raise SystemExit("the server did not start")


CLIENT = httpx.Client(timeout=600)  # one connection kept, as a client library keeps it


def post(url: str, body: dict) -> tuple[dict, float]:
    t0 = time.perf_counter()
    r = CLIENT.post(url, json=body)
    wall = time.perf_counter() - t0
    r.raise_for_status()
    return r.json(), wall


def streamed(url: str, body: dict) -> tuple[dict, float]:
    """A streamed request: its figures (from the last chunk) and the time to its last byte."""
    figures, t0 = None, time.perf_counter()
    with CLIENT.stream("POST", url, json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                figures = chunk.get("dflash", figures)
    return figures, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args()
    prompts = [json.loads(line)["prompt"] for line in
               (ROOT / "resources/models/recipe/bench_prompts.jsonl").read_text().splitlines()[:6]]
    pair = load_pair(*demo_pair())
    settings = GenerationSettings(auto=True, lookup=True, max_tokens=args.max_tokens, diagnostics=False,
                                  **tree_settings(None, "dflash"))  # the server's defaults
    server = start_server(args.port)
    base = f"http://127.0.0.1:{args.port}"
    rows = []
    try:
        for text in prompts:
            ids = encode_prompt(pair.tokenizer, text, chat=False)
            body = {"prompt": text, "max_tokens": args.max_tokens, "temperature": 0}
            local, served, shares, stream_shares = [], [], [], []
            for _ in range(args.repeats):
                s = list(generate(pair, ids, settings))[-1]
                local.append(s.tok_per_s)
                out, wall = post(base + "/v1/completions", body)
                f = out["dflash"]
                assert out["choices"][0]["text"] == s.text, "served text differs from generate()'s"
                served.append(f["tok_per_s"])
                shares.append((wall - f["engine_s"]) / wall)
                f, wall = streamed(base + "/v1/completions", body)
                stream_shares.append((wall - f["engine_s"]) / wall)
            rows.append((text.splitlines()[0][:40], statistics.median(local), statistics.median(served),
                         statistics.median(shares), statistics.median(stream_shares)))
            print(f"{rows[-1][0]!r:44} generate {rows[-1][1]:7.1f} tok/s  served {rows[-1][2]:7.1f} tok/s  "
                  f"({rows[-1][2] / rows[-1][1]:.3f}x)  HTTP share {rows[-1][3]:.2%} whole, {rows[-1][4]:.2%} streamed",
                  flush=True)
        ratio = statistics.median(r[2] / r[1] for r in rows)
        print(f"median served/generate: {ratio:.3f}x; HTTP share median {statistics.median(r[3] for r in rows):.2%} "
              f"whole, {statistics.median(r[4] for r in rows):.2%} streamed")
        second_turn(base, pair, args.max_tokens)
    finally:
        server.terminate()
        server.wait(30)


def second_turn(base: str, pair, max_tokens: int) -> None:
    """Turn 2 of a conversation (its first turn served just before) against the same messages cold
    (a first message no run has seen, so nothing of it is cached)."""
    code = (ROOT / "engine/decode/output.py").read_text()[:3000]
    turn1 = [{"role": "user", "content": "Here is a module:\n" + code}]
    first, _ = post(base + "/v1/chat/completions", {"messages": turn1, "max_tokens": 64})
    turn2 = turn1 + [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "Now write its tests."}]
    warm, _ = post(base + "/v1/chat/completions", {"messages": turn2, "max_tokens": 64})
    cold_turn = [{"role": "user", "content": "Here is a module (again):\n" + code}] + turn2[1:]
    cold, _ = post(base + "/v1/chat/completions", {"messages": cold_turn, "max_tokens": 64})
    print(f"turn 1: {first['usage']['prompt_tokens']} prompt tokens, prefill {first['dflash']['prefill_s'] * 1000:.1f} ms; "
          f"turn 2: {warm['usage']['prompt_tokens']} prompt tokens, {warm['usage']['prompt_tokens_details']['cached_tokens']} "
          f"cached, prefill {warm['dflash']['prefill_s'] * 1000:.1f} ms; the same turn cold "
          f"({cold['usage']['prompt_tokens']} tokens, {cold['usage']['prompt_tokens_details']['cached_tokens']} cached): "
          f"prefill {cold['dflash']['prefill_s'] * 1000:.1f} ms")
    print(f"(turn 2's prompt ids {len(encode_messages(pair.tokenizer, turn2))})")


if __name__ == "__main__":
    main()
