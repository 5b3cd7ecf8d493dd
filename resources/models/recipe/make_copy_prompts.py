"""Check the copy eval set (issue 29): does the target really re-emit spans of its context?

`copy_prompts.jsonl` is the set. Each `copy-*` prompt gives some Python and ends in the start of a
re-emission of it: a function again under a new name, a class renamed, a dict's keys or a table's
rows again, a test repeated for a second case, a docstring-heavy function copied unchanged, a
function given type hints, a module copied whole, a sibling class, a mirrored method, a class with
an attribute renamed everywhere. The `ordinary-*` prompts are code that does not repeat itself, for
the no-regression check. All were written by hand for the set (none comes from the standard
library or the synthetic corpus the demo target was trained on) and committed before this check
ran or any lookup setting was tuned; they are never edited after. (The prompts live in the JSONL
only: as Python constants they would make this file three times the house limit.) Lookup settings
are tuned on `copy_tune_prompts.jsonl` (`--prompts`), ten more written the same way.

    python resources/models/recipe/make_copy_prompts.py [--target T] [--max-tokens 96] [--json]

decodes each prompt greedily with mlx-lm (raw: the string encoded as mlx-lm encodes a plain prompt,
what `dflash-playground generate --mode ar --raw` decodes) and reports, per prompt:

- copy share: the share of the output's tokens that a context lookup predicts from the prompt,
  i.e. LookupIndex(min_n=4, max_n=5) over the prompt and the output so far proposes, from an
  occurrence inside the prompt, exactly the token the target wrote (engine/decode/lookup.py);
- lookup tokens per round: the output replayed as lookup-only rounds at T = 0: each round drafts
  `draft_length(depth, 32)` copied tokens, commits the ones that agree and one more token.

When the set was written (96 tokens), neither demo target copied: copy share 0.00-0.05 on every
copy prompt for demo-target and demo-hybrid-target alike; the outputs ignore the text above them
(even a 5-line function repeated by name right after itself). The lookup rounds that commit more
than one token there come from the output repeating itself ("Po", "Po", ...), not from the prompt.
A perfect copier scores 1.00 and 32 tokens per round on copy-docstring-function.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
PROMPTS = HERE / "copy_prompts.jsonl"
CAP = 32


def copy_share(prompt: list[int], output: list[int]) -> float:
    """The share of `output` that a lookup from the prompt predicts token by token (module docstring)."""
    from engine.decode.lookup import LookupIndex

    index = LookupIndex(min_n=4, max_n=5)
    index.extend(prompt)
    copied = 0
    for token in output:
        match = index.propose(1)
        copied += match is not None and match.source < len(prompt) and match.tokens[0] == token
        index.extend([token])
    return copied / max(1, len(output))


def lookup_tokens_per_round(prompt: list[int], output: list[int], cap: int = CAP) -> float:
    """`output` replayed as lookup-only rounds at T = 0: tokens committed per round."""
    from engine.decode.lookup import LookupIndex, draft_length

    index = LookupIndex(min_n=4, max_n=5)
    index.extend(prompt)
    done = rounds = 0
    while done < len(output):
        match = index.propose(cap)
        drafts = [] if match is None else match.tokens[:draft_length(match.match_depth, cap)]
        accepted = 0
        while accepted < len(drafts) and done + accepted < len(output) and drafts[accepted] == output[done + accepted]:
            accepted += 1
        commit = output[done:done + accepted + 1]
        index.extend(commit)
        done += len(commit)
        rounds += 1
    return len(output) / max(1, rounds)


def greedy(model, tokenizer, prompt: str, max_tokens: int) -> tuple[list[int], list[int]]:
    """(prompt ids, greedy continuation ids up to the end-of-text token) with mlx-lm."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    ids = tokenizer.encode(prompt)
    eos = set(tokenizer.eos_token_ids)
    output = []
    for token, _ in generate_step(mx.array(ids), model, max_tokens=max_tokens, sampler=lambda x: mx.argmax(x, -1)):
        if int(token) in eos:
            break
        output.append(int(token))
    return ids, output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=Path, default=PROMPTS)
    parser.add_argument("--target", type=Path, default=REPO / "resources/models/demo-target")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--json", action="store_true", help="one JSON object per prompt, the output text included")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from mlx_lm import load

    model, tokenizer = load(str(args.target))
    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    if not args.json:
        print(f"{'source':26} {'prompt':>6} {'output':>6} {'copy share':>10} {'lookup tok/round':>16}")
    for row in rows:
        ids, output = greedy(model, tokenizer, row["prompt"], args.max_tokens)
        share, per_round = copy_share(ids, output), lookup_tokens_per_round(ids, output)
        if args.json:
            print(json.dumps({"source": row["source"], "prompt_tokens": len(ids), "output_tokens": len(output),
                              "copy_share": round(share, 3), "lookup_tokens_per_round": round(per_round, 2),
                              "output": tokenizer.decode(output)}), flush=True)
        else:
            print(f"{row['source']:26} {len(ids):6d} {len(output):6d} {share:10.2f} {per_round:16.2f}", flush=True)


if __name__ == "__main__":
    main()
