"""Write the long-prompt eval sets: library modules from outside the demo corpus, and their tails.

The demo pairs are trained on the Python standard library and synthetic modules (corpus.py,
synthetic_code.py); these prompts come from third-party packages installed beside the project,
which no demo model saw. One file per package, chosen by a fixed rule, never by how a model
does on it:

- packages: LONG_PACKAGES, in that order;
- the n-th package gets a token budget spread evenly over 600..1500 demo tokens;
- its .py files (sorted by path, shuffled with seed 0) are tried in turn: the first one with at
  least budget + 100 tokens gives the prompt, its lines from the top cut at the last line end
  within the budget (a user pasting a file and asking the model to go on);
- the tail prompt is the long prompt's last 10 lines (the same place, without the file above it).

Written once, before the long-context training and tuning (issue 28), and never edited after:
`long_prompts.jsonl` and `long_tails.jsonl` are committed as written; this script says how they
were made. Rerunning it on other package versions gives other prompts, which is why its
output, not the script, is the eval set.

    python resources/models/recipe/make_long_prompts.py --out-dir resources/models/recipe
    python resources/models/recipe/make_long_prompts.py --tune   # long_tune_*.jsonl, for choosing defaults
"""

from __future__ import annotations

import argparse
import json
import random
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
LONG_PACKAGES = ("mlx_lm", "pyqtgraph", "platformdirs", "tqdm", "huggingface_hub", "jinja2", "click", "rich",
                 "pygments", "requests", "attr", "pluggy", "filelock", "fsspec", "typer", "h11")
# A tuning set (defaults such as the drafter's context window are chosen on it, never on the
# eval sets): other packages, by the same rule.
TUNE_PACKAGES = ("numpy", "transformers", "pydantic", "setuptools", "_pytest", "urllib3", "yaml", "jsonschema",
                 "anyio", "markdown_it", "charset_normalizer", "pytestqt")
LOW, HIGH = 600, 1500
TAIL_LINES = 10


def budgets(n: int) -> list[int]:
    return [round(LOW + (HIGH - LOW) * i / (n - 1)) for i in range(n)]


def cut(text: str, tok: Tokenizer, budget: int) -> str:
    """The file's first lines, as many as fit in `budget` tokens (whole lines only)."""
    lines = text.splitlines(keepends=True)
    lo, hi = 0, len(lines)
    while lo < hi:  # the most lines whose text stays within the budget
        mid = (lo + hi + 1) // 2
        if len(tok.encode("".join(lines[:mid])).ids) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return "".join(lines[:lo])


def pick(package: Path, tok: Tokenizer, budget: int, rng: random.Random) -> tuple[Path, str] | None:
    files = sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)
    rng.shuffle(files)
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if len(tok.encode(text).ids) >= budget + 100:
            return path, cut(text, tok, budget)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=str(HERE))
    ap.add_argument("--tokenizer", default=str(REPO / "resources/models/demo-target/tokenizer.json"))
    ap.add_argument("--tune", action="store_true", help="write the tuning set (long_tune_*.jsonl) instead")
    args = ap.parse_args()
    packages, stem = (TUNE_PACKAGES, "long_tune") if args.tune else (LONG_PACKAGES, "long")
    tok = Tokenizer.from_file(args.tokenizer)
    site = Path(sysconfig.get_paths()["purelib"])
    rng = random.Random(0)
    longs, tails = [], []
    for name, budget in zip(packages, budgets(len(packages))):
        found = pick(site / name, tok, budget, rng)
        if found is None:
            raise SystemExit(f"{name}: no file of {budget + 100} tokens or more")
        path, prompt = found
        source = path.relative_to(site).as_posix()
        tail = "".join(prompt.splitlines(keepends=True)[-TAIL_LINES:])
        longs.append({"prompt": prompt, "source": source, "tokens": len(tok.encode(prompt).ids)})
        tails.append({"prompt": tail, "source": source, "tokens": len(tok.encode(tail).ids)})
        print(f"{source}: {longs[-1]['tokens']} tokens, tail {tails[-1]['tokens']}")
    out = Path(args.out_dir)
    for name, rows in ((f"{stem}_prompts.jsonl", longs), (f"{stem}_tails.jsonl", tails)):
        (out / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


if __name__ == "__main__":
    main()
