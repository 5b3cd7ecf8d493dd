"""The benchmark sections of a demo drafter's model card, from `bench --json` output: short prompts
(per prompt, beside any compared drafter), long prompts beside their tails, and by context depth.
build_demo_drafter.py writes them after training and again with --rebench."""

from __future__ import annotations

from pathlib import Path

from engine.tools.bench_report import decoded, without_rounds

REPO = Path(__file__).resolve().parents[3]


BENCH_HEADING = "## Benchmark"


def bench_section(args, result: dict) -> str:
    """The card's benchmark section, from `bench --json` output."""
    def row(r: dict, label: str, why: str = "ended at its first token") -> str:
        if not decoded(r):  # one token over no time is no rate, and there is no tau
            return f"{label} - | - | - ({why}) | - | - | - |"
        # tau and the round times are None where auto ran plain steps only
        return (f"{label} {r['ar_tok_s']:.1f} | {r['dflash_tok_s']:.1f} | {_x(r['speedup'])} | "
                f"{_t(r['mean_acceptance_length'])} | {_t(r['draft_ms'])} | {_t(r['verify_ms'])} |")

    rows = "\n".join(row(r, f"| `{r['prompt'][:40].replace(chr(10), '⏎')}` |") for r in result["per_prompt"])
    return f"""## Benchmark (`bench`, T=0, default settings ({settings_words(result)}), {result['max_tokens']} tokens, {result['repeats']} repeat{'s' * (result['repeats'] != 1)}, AR and DFlash in one run)

Reproduce with `dflash-playground bench {reproduce_models(args)}--prompts resources/models/recipe/{Path(args.bench_prompts).name} --max-tokens {result['max_tokens']} --repeats {result['repeats']} --raw` (default settings; prompts encoded raw, as the pair was trained).

Prompts from `{Path(args.bench_prompts).name}`, not in the training text. Device: this machine's CPU
(BLAS: {result['blas'].split(' (')[0]}).

| prompt | AR tok/s | DFlash tok/s | speedup | tau | draft ms | verify ms |
| --- | ---: | ---: | ---: | ---: | ---: | ---: |
{rows}
{row(result, "| **overall** |", "no prompt drafted")}

Greedy outputs identical to AR on every prompt: {result['identical']}.{ended_note(result)}
{compared_table(result, Path(args.out).name)}{round_cost(result)}"""


def settings_words(result: dict) -> str:
    """The block setting a bench ran with, in words (results from before `auto` was reported: a fixed block)."""
    if result.get("auto"):
        return f"auto verify length, blocks up to {result['block_size']}"
    return f"block {result['block_size']}"


def round_cost(result: dict) -> str:
    """What a round costs in AR steps, and where drafts were accepted (nothing when no round ran)."""
    if not result["rounds"]:
        return ""
    return f"""
A DFlash round (draft, verify, rollback, bookkeeping) costs {result['round_ms']:.2f} ms, the time of
{result['round_in_ar_steps']:.2f} AR steps: DFlash breaks even at tau {result['round_in_ar_steps']:.2f} and reaches 2x
at tau {2 * result['round_in_ar_steps']:.2f}. Share of rounds whose draft at block position k was accepted:

| k | {" | ".join(str(k) for k in range(1, len(result['acceptance_by_position']) + 1))} |
| --- | {" | ".join("---:" for _ in result['acceptance_by_position'])} |
| accepted | {" | ".join(f"{a:.2f}" for a in result['acceptance_by_position'])} |
"""


def ended_note(result: dict) -> str:
    """A sentence on the prompts whose output ended at its first token (no rounds: their tok/s are
    one token over a prefill's remainder, and they weigh nothing in the overall figures)."""
    ended = without_rounds(result["per_prompt"])
    if not ended:
        return ""
    return (f"\n{len(ended)} of {len(result['per_prompt'])} prompts ended at their first token (the target "
            f"wrote EOS at once), so DFlash never drafted there: their rows have no figures, and the overall "
            f"figures come from the other {len(result['per_prompt']) - len(ended)}.")


def reproduce_models(args) -> str:
    """The bench flags that name this card's models, relative to the repository where they live there."""
    def name(path: str) -> str:
        p = Path(path).resolve()
        return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)

    flags = f"--target {name(args.target)} --drafter {name(args.out)} "
    return flags + (f"--compare-drafter {name(args.compare_drafter)} " if args.compare_drafter else "")


def compared_label(drafter: str, own: str) -> str:
    """A compared drafter's name in the card: its folder's, or with its parent folder where that
    is this drafter's own name (an earlier version of it, kept elsewhere)."""
    path = Path(drafter)
    return path.name if path.name != own else f"{path.parent.name}/{path.name}"


def compared_table(result: dict, own: str) -> str:
    """Per prompt, this drafter beside each `--compare-drafter` one, on the same AR runs."""
    if not result.get("compared"):
        return ""
    others = result["compared"]
    labels = [compared_label(o["drafter"], own) for o in others]

    def x(v) -> str:
        return "-" if v is None else f"{v:.2f}x"

    def t(v) -> str:
        return "-" if v is None else f"{v:.2f}"

    def ar_rate(r: dict) -> str:  # ended at its first token: one token over no time is no rate
        return f"{r['ar_tok_s']:.1f}" if decoded(r) else "-"

    head = " | ".join(f"{label} speedup | tau" for label in labels)
    rows = "\n".join(
        f"| `{r['prompt'][:40].replace(chr(10), '⏎')}` | {ar_rate(r)} | {x(r['speedup'])} | "
        f"{t(r['mean_acceptance_length'])} | "
        + " | ".join(f"{x(o['per_prompt'][i]['speedup'])} | {t(o['per_prompt'][i]['mean_acceptance_length'])}"
                     for o in others) + " |"
        for i, r in enumerate(result["per_prompt"]))
    overall = (f"| **overall** | {ar_rate(result)} | {x(result['speedup'])} | "
               f"{t(result['mean_acceptance_length'])} | "
               + " | ".join(f"{x(o['speedup'])} | {t(o['mean_acceptance_length'])}" for o in others) + " |")
    cols = 4 + 2 * len(others)  # prompt, AR tok/s, this drafter's speedup and tau, then two a drafter
    return f"""
### Beside {", ".join(f"`{label}`" for label in labels)} (same AR runs, same bench)

| prompt | AR tok/s | this speedup | tau | {head} |
| {" | ".join(["---"] + ["---:"] * (cols - 1))} |
{rows}
{overall}

Identical to AR: {" and ".join(str(o['identical']) for o in others)}.
"""


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _t(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def long_section(args, long: dict, tails: dict) -> str:
    """The card's long-prompt figures: per prompt beside the same place without the file above it
    (the prompt's last lines alone), overall, and by context depth."""
    def cells(r: dict) -> str:
        if not decoded(r):
            return "- | - | - | -"
        return f"{r['ar_tok_s']:.1f} | {r['dflash_tok_s']:.1f} | {_x(r['speedup'])} | {_t(r['mean_acceptance_length'])}"

    rows = "\n".join(f"| `{r['prompt'][:32].replace(chr(10), '⏎')}` | {r['prompt_tokens']} | {cells(r)} | "
                      f"{_x(t['speedup'])} |" for r, t in zip(long["per_prompt"], tails["per_prompt"]))
    drafted = [r for r in long["per_prompt"] if r["speedup"] is not None]
    worst = min(drafted, key=lambda r: r["speedup"]) if drafted else None
    depth = "\n".join(f"| {d['depth']} | {d['rounds']} | {_t(d['tau'])} | {_x(d['speedup'])} |"
                       for d in long.get("by_depth", []))
    ratio = long["speedup"] / tails["speedup"] if long["speedup"] and tails["speedup"] else None
    worst_text = f"{worst['speedup']:.2f}x, `{worst['prompt'][:40].replace(chr(10), '⏎')}`" if worst else "-"
    return f"""
## Long prompts (`bench`, T=0, default settings ({settings_words(long)}), {long['max_tokens']} tokens)

`{Path(args.long_prompts).name}`: library modules from outside the corpus, cut at a line end within 600-1,500
tokens; beside each, the speedup on the same file's last 10 lines alone (`{Path(args.long_tails).name}`).

| prompt | tokens | AR tok/s | DFlash tok/s | speedup | tau | tail alone |
| --- | ---: | ---: | ---: | ---: | ---: | ---: |
{rows}
| **overall** | | {cells(long)} | {_x(tails['speedup'])} |

Long prompts {_x(long['speedup'])} at tau {_t(long['mean_acceptance_length'])}; their tails alone {_x(tails['speedup'])} at tau
{_t(tails['mean_acceptance_length'])}{f" (long over tails: {ratio:.2f})" if ratio else ""}. Worst long prompt: {worst_text};
below AR: {sum(r['speedup'] < 1 for r in drafted)} of {len(drafted)}. Identical to AR: {long['identical']} and {tails['identical']}.

By context depth (rounds pooled over the long prompts):

| depth | rounds | tau | speedup |
| --- | ---: | ---: | ---: |
{depth}
"""
