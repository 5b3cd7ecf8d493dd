"""The engine's subcommands: generate, parity, bench, doctor, export, demo.

generate, parity, bench and calibrate also run as the ranks of an `mlx.launch` job: the
target is sharded across them, every rank runs the same rounds, and only rank 0 prints
and writes the trace (engine/runtime/distributed.py, engine/models/sharding.py).

The `dflash-playground` console script (app/cli.py) adds `train-drafter` and `gui` on top of
these; `python -m engine.tools.cli` runs the engine's own commands without Qt.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from typing import Iterator, Optional

import engine  # noqa: F401  (loads the optimised BLAS before MLX)
from engine.decode.events import ENDED_AT_ONCE, NOT_TIMED
from engine.decode.prefill import check_prompt
from engine.errors import DFlashError
from engine.runtime.distributed import SINGLE, Ranks
from engine.tools.bench_report import print_bench, print_block_sizes, print_curve
from engine.tools.curve_progress import measure_cost_curves
from engine.tools.run_summary import summary_line
from engine.tools.run_flags import RunFlags
from engine.tools.unused_flags import check_bench_kind, resolved_saying, say_unused
from engine.tools.cli_parser import build_parser
from engine.tools.cli_run import EXIT_ERROR, run_command


def _pair_args(args) -> tuple[str, Optional[str]]:
    from engine.models.demo import demo_pair

    target, drafter, takes_drafter = args.target, RunFlags.of(args).drafter, "drafter" in vars(args)
    if target is None:
        demo = demo_pair()
        if demo is None:
            raise DFlashError("no --target given and the demo pair is not installed; give --target and --drafter.")
        target = str(demo[0])
        if drafter is None and takes_drafter:
            drafter = str(demo[1])
    return target, drafter


def _settings(args, mode: str):
    return RunFlags.of(args).settings(mode)


def _chat_flag(args) -> Optional[bool]:
    return True if args.chat else (False if args.raw else None)


def _prompt_text(args) -> str:
    from engine.tools.textfiles import read_text

    if args.prompt_file:
        return read_text(args.prompt_file, "the prompt file", no_nul=True)
    if args.prompt is not None:
        return args.prompt
    raise DFlashError("no prompt: give --prompt TEXT or --prompt-file FILE.")


def _prompt_ids(args, tokenizer, text: str) -> list[int]:
    from engine.decode.prompts import encode_prompt

    thinking = None if args.thinking is None else args.thinking == "on"
    return encode_prompt(tokenizer, text, _chat_flag(args), thinking)


def pair_from_args(args, with_drafter: bool = True, ranks: Optional[Ranks] = None):
    """The pair a command's --target/--drafter name, on `ranks` (a run command's, set by run_command;
    a lone process without)."""
    from engine.models.pair import load_pair

    target, drafter = _pair_args(args)
    pair = load_pair(target, drafter if with_drafter else None, ranks=ranks or SINGLE)
    for warning in pair.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return pair


@contextmanager
def _trace_writer(args, prompt: dict, what: str, parity: bool = False) -> Iterator:
    """The --trace writer (None without it, and on ranks other than the root), put in place when the
    block ends normally; when it does not, what was written so far is kept and named on stderr."""
    from engine.tools.trace import TraceWriter

    root = args.ranks.root
    writer = TraceWriter(args.trace, prompt, inputs=(args.prompt_file,), parity=parity) if args.trace and root else None
    complete = False
    try:
        yield writer
        complete = True
    finally:
        where = writer.close(complete=complete) if writer else None
        if not complete and where is not None:
            print(f"\n{what} did not finish; its trace so far is in {where}", file=sys.stderr)


def cmd_generate(args) -> int:
    from engine.decode.generate import generate
    from engine.decode.events import SummaryEvent, TextEvent
    from engine.decode.prompts import format_name
    from engine.safe_write import check_output

    if args.trace:  # before any work: a bad path costs nothing, and nothing is written yet
        check_output(args.trace, "the trace", inputs=(args.prompt_file,))
    say_unused(args, {args.mode})
    pair = pair_from_args(args, with_drafter=args.mode == "dflash", ranks=args.ranks)
    text = _prompt_text(args)
    ids = _prompt_ids(args, pair.tokenizer, text)
    settings = resolved_saying(_settings(args, args.mode), pair, args.tree is not None)  # refused: never traced
    check_prompt(pair, ids, settings.max_tokens)  # nor a prompt past the context (nor is a cost curve measured)
    prompt = {"text": text, "format": format_name(_chat_flag(args))}  # kept in the trace header
    summary = None
    with _trace_writer(args, prompt, "the run") as writer:  # its partial file is checked before minutes of work
        measure_cost_curves(pair, [settings])
        for event in generate(pair, ids, settings):
            if writer:
                writer.write(event)
            if isinstance(event, TextEvent) and not args.json:
                print(event.text, end="", flush=True)
            elif isinstance(event, SummaryEvent):
                summary = event
    if args.json:
        print(json.dumps({
            "token_ids": summary.token_ids,
            "prompt_token_ids": ids,
            "text": summary.text,
            "mode": summary.mode,
            "num_generated": summary.num_generated,
            "tok_per_s": summary.tok_per_s if summary.timed else None,  # no decode to time (see summary_line)
            "prefill_s": summary.prefill_s,
            "mean_acceptance_length": summary.mean_acceptance_length,
            "num_rounds": summary.num_rounds,
            "num_plain_steps": summary.num_plain_steps,  # auto's steps with the drafter skipped
            "stop_reason": summary.stop_reason,
        }))
    else:
        print("\n" + summary_line(summary), file=sys.stderr)
    return 0


def _print_parity(result, as_json: bool) -> None:
    d = result.to_dict()
    if as_json:
        print(json.dumps(d))
        return
    rates = ("ar_tok_s", "dflash_tok_s", "speedup", "round_in_ar_steps") if not result.timed else ()  # said below
    for key, value in d.items():
        if key != "verdict" and key not in rates:
            print(f"{key}: {value}")
    print(f"verdict ({result.verdict.kind}): {result.verdict.text}")
    if not result.timed:
        print(f"no speed: {ENDED_AT_ONCE if result.ended_at_once else NOT_TIMED}")


def cmd_parity(args) -> int:
    from engine.decode.prompts import format_name
    from engine.safe_write import check_output
    from engine.tools.parity import run_parity

    if args.trace:  # before any work: a bad path costs nothing, and nothing is written yet
        check_output(args.trace, "the trace", inputs=(args.prompt_file,))
    say_unused(args, {"ar", "dflash"})
    pair, text = pair_from_args(args, ranks=args.ranks), _prompt_text(args)
    ids, settings = _prompt_ids(args, pair.tokenizer, text), _settings(args, "dflash")
    resolved_saying(settings, pair, args.tree is not None)  # refused settings are refused before the trace
    check_prompt(pair, ids, settings.max_tokens)  # and a prompt past the context, before a cost curve is measured
    prompt = {"text": text, "format": format_name(_chat_flag(args))}
    with _trace_writer(args, prompt, "the check", parity=True) as writer:
        measure_cost_curves(pair, [settings])
        result = run_parity(pair, ids, settings, on_event=writer.write if writer else lambda e: None)
        if writer:
            writer.write_parity(result.to_dict())
    _print_parity(result, args.json)
    return 0


def cmd_bench(args) -> int:
    from engine.tools.bench import check_prompts, load_prompts, run_bench
    from engine.decode.prompts import encode_prompt

    check_bench_kind(args)
    texts = load_prompts(args.prompts, raw=args.raw)
    sizes = methods = None
    if args.methods is not None:
        from engine.tools.race import parse_methods

        methods = parse_methods(args.methods)  # before loading: a typo costs nothing
    say_unused(args, set(methods) if methods else {"ar", "dflash"}, race=bool(methods))
    if args.block_sizes is not None:  # '' is a typo to say, not a plain bench to run instead
        from engine.tools.bench_sizes import parse_sizes

        sizes = parse_sizes(args.block_sizes)  # before loading: a typo costs nothing
    pair = pair_from_args(args, ranks=args.ranks)
    prompts = [(t, encode_prompt(pair.tokenizer, t, _chat_flag(args))) for t in texts]
    check_prompts(pair, prompts, args.max_tokens)  # before any cost curve is measured: a bad line costs nothing
    progress = (lambda msg: None) if args.json else (lambda msg: print(f"  {msg}", file=sys.stderr, flush=True))
    if sizes:
        return _bench_sizes(args, pair, prompts, sizes, progress)
    if methods:
        return _race(args, pair, prompts, methods, progress)
    others = []
    if args.compare_drafter:
        from engine.models.pair import attach_drafter

        others = [attach_drafter(pair, d) for d in args.compare_drafter]
    settings = _settings(args, "dflash")
    resolved_saying(settings, pair, args.tree is not None)
    measure_cost_curves(pair, [settings])
    result = run_bench(pair, prompts, settings, args.repeats, progress, with_mlx_lm=args.with_mlx_lm, others=others)
    if args.json:
        print(json.dumps(result))
    else:
        print_bench(result, with_mlx_lm=args.with_mlx_lm, greedy=args.temperature == 0)
    return _exit_code(result)


def _exit_code(result: dict) -> int:
    """0, or 130 after a Ctrl-C, when the figures printed are those of the prompts measured before it."""
    if not result.get("interrupted"):
        return 0
    print(f"interrupted: the figures are over the {result['prompts']} of {result['prompts_given']} prompts "
          "measured before Ctrl-C (the one it cut short is left out).", file=sys.stderr)
    return 130


def _race(args, pair, prompts, methods, progress) -> int:
    from engine.tools.race import method_settings, print_race, run_race

    settings = _settings(args, "dflash")
    if "dflash-tree" in methods:
        resolved_saying(method_settings(settings, "dflash-tree"), pair)
    measure_cost_curves(pair, [method_settings(settings, m) for m in methods if m != "draft-model"])
    result = run_race(pair, prompts, settings, methods, args.repeats, progress, with_mlx_lm=args.with_mlx_lm)
    if args.json:
        print(json.dumps(result))
    else:
        print_race(result)
    return _exit_code(result)


def _bench_sizes(args, pair, prompts, sizes, progress) -> int:
    from engine.tools.bench_sizes import run_block_sizes

    result = run_block_sizes(pair, prompts, _settings(args, "dflash"), sizes, args.repeats, progress)
    if args.json:
        print(json.dumps(result))
    else:
        print_block_sizes(result)
    return 0


def cmd_doctor(args) -> int:
    from engine.models.doctor import check_pair

    target, drafter = _pair_args(args)
    report = check_pair(target, drafter)
    print(report.text())
    return 0 if report.ok else EXIT_ERROR


def cmd_calibrate(args) -> int:
    from dataclasses import asdict

    from engine.decode.cost_curve import cost_curve
    from engine.decode.settings import GenerationSettings

    pair = pair_from_args(args, ranks=args.ranks)
    if args.block_size == "auto":  # the curve auto runs use: up to the drafter's block
        if pair.drafter is None:
            raise DFlashError("--block-size auto measures the curve DFlash's auto verify length uses, up to the "
                              "drafter's block; without a drafter no run uses it: give --drafter, or a block "
                              "size (1..64).")
        args.block_size = None
    # the checks a run makes (a window and sink in range, a block the drafter can draft; without a
    # drafter, the curve's own 1..64): a curve measured for a setting no run accepts is cached for nothing
    flags = RunFlags.of(args)
    sampling = flags.sampling()
    GenerationSettings(mode="ar", draft_window=args.draft_window, draft_sink=flags.sink(),
                       sampling=sampling).resolved(pair)
    if pair.drafter is not None:
        GenerationSettings(block_size=args.block_size).resolved(pair)
    progress = (lambda msg: None) if args.json else (lambda msg: print(f"  {msg}", file=sys.stderr, flush=True))
    curve, cached = cost_curve(pair, block=args.block_size, repeats=args.repeats, fresh=args.fresh,
                               window=args.draft_window, sink=flags.sink(), progress=progress,
                               sampling=sampling)
    if args.json:
        points = [curve.at(p.depth) for p in curve.points()]
        print(json.dumps({**asdict(curve), "cached": cached,
                          "verify_in_ar_steps": {p.context: p.verify_in_ar_steps() for p in points}}))
        return 0
    print_curve(curve, cached)
    return 0


def cmd_export(args) -> int:
    from engine.tools.trace import export_chrome

    n = export_chrome(args.trace, args.chrome, note=lambda m: print(f"note: {m}", file=sys.stderr))
    print(f"wrote {n} events to {args.chrome} (open it in https://ui.perfetto.dev)")
    return 0


def cmd_demo(args) -> int:
    from engine.models.demo import SAMPLE_PROMPT, demo_pair, models_dir
    from engine.tools.parity import run_parity
    from engine.decode.prompts import encode_prompt
    from engine.models.pair import load_pair

    pair_dirs = demo_pair()
    if pair_dirs is None:
        raise DFlashError(f"the demo pair is not installed (looked in {models_dir()}); "
                          "run `parity --target T --drafter D --prompt P` on a pair of your own.")
    pair = load_pair(*pair_dirs)
    ids = encode_prompt(pair.tokenizer, SAMPLE_PROMPT, chat=False)
    from engine.decode.settings import GenerationSettings

    def show(event):
        if event.type == "round":
            drafted = len(event.drafted)
            print(f"round {event.index:3d} @ {event.position:4d}: accepted {event.accepted:2d}/{drafted:2d} "
                  f"+ {event.bonus_kind:10s} draft {event.draft_ms:6.2f} ms  verify {event.verify_ms:6.2f} ms  "
                  f"rollback {event.rollback_ms:5.2f} ms")

    print(f"target: {pair.target_path}\ndrafter: {pair.drafter_path}\nprompt: {SAMPLE_PROMPT!r}")
    result = run_parity(pair, ids, GenerationSettings(max_tokens=args.max_tokens), on_event=show)
    print("text:", result.dflash.text)
    _print_parity(result, as_json=False)
    return 0


COMMANDS = {
    "generate": cmd_generate,
    "parity": cmd_parity,
    "bench": cmd_bench,
    "doctor": cmd_doctor,
    "export": cmd_export,
    "calibrate": cmd_calibrate,
    "demo": cmd_demo,
}


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    return run_command(parser, parser.parse_args(argv), COMMANDS)


if __name__ == "__main__":
    sys.exit(main())
