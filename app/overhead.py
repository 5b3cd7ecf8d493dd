"""Measure what watching costs: tok/s of the same run from the CLI, headless in-process, and in the window.

    QT_QPA_PLATFORM=offscreen python -m app.overhead --target T --drafter D --max-tokens 200 --runs 7

Runs are interleaved (CLI, headless, window, CLI, ...) so drift on a shared machine hits all three
alike; each figure is the median of the engine's own tok/s (decode only, as `generate --json` reports).
The window runs with every view live (output, rounds, plots, status) on the offscreen platform.
On a busy machine the tok/s ratios are noisy; `gui_thread_cpu_share` (CPU seconds the GUI thread
spent per second of decoding, from `time.thread_time`, between the first token and the summary)
bounds what watching can take from the worker whatever else the machine is doing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from typing import Optional


def cli_tok_s(args) -> float:
    cmd = ["dflash-playground", "generate", "--target", args.target, "--drafter", args.drafter,
           "--prompt", args.prompt, "--raw", "--max-tokens", str(args.max_tokens), "--mode", args.mode, "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return float(json.loads(out)["tok_per_s"])


class Headless:
    """The engine on a plain worker thread, no Qt: the in-process baseline."""

    def __init__(self, args):
        from engine.models.pair import load_pair

        self.args = args
        self.pair = None
        self._run_in_thread(lambda: setattr(self, "pair", load_pair(args.target, args.drafter)))

    def _run_in_thread(self, fn) -> None:
        errors = []

        def target():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        t = threading.Thread(target=target)
        t.start()
        t.join()
        if errors:
            raise errors[0]

    def tok_s(self) -> float:
        from engine.decode.generate import generate
        from engine.decode.settings import AUTO_BY_DEFAULT, LOOKUP_BY_DEFAULT, GenerationSettings
        from engine.decode.prompts import encode_prompt

        result = []

        def run():
            ids = encode_prompt(self.pair.tokenizer, self.args.prompt, chat=False)
            # what the CLI arm and the window run: the defaults (auto verify length, copy lookup)
            settings = GenerationSettings(mode=self.args.mode, max_tokens=self.args.max_tokens, auto=AUTO_BY_DEFAULT,
                                          lookup=LOOKUP_BY_DEFAULT)
            result.append(list(generate(self.pair, ids, settings))[-1].tok_per_s)

        self._run_in_thread(run)
        return result[0]


class Windowed:
    def __init__(self, args):
        from PySide6.QtWidgets import QApplication

        from app.theme import apply_theme
        from app.window import MainWindow
        from engine.decode.settings import AUTO_BY_DEFAULT, LOOKUP_BY_DEFAULT

        self.app = QApplication.instance() or QApplication(sys.argv[:1])
        apply_theme(self.app)
        self.w = MainWindow(persist=False)
        self.w.resize(1600, 1000)
        self.w.models.target.set_value(args.target)
        self.w.models.drafter.set_value(args.drafter)
        p = self.w.prompt
        p.set_prompt(args.prompt)
        p.format.setCurrentIndex(p.format.findData("raw"))
        p.max_tokens.setValue(args.max_tokens)
        p.temperature.setValue(0.0)
        p.block_size.setValue(0)
        p.block_auto.setChecked(AUTO_BY_DEFAULT)  # the CLI arm's defaults, whatever a saved file said
        p.lookup.setChecked(LOOKUP_BY_DEFAULT)
        p.set_mode(args.mode)
        self.w.show()
        self.gui_share: list[float] = []  # GUI-thread CPU seconds per second of decoding
        self._marks: dict[str, tuple[float, float]] = {}
        handle = self.w.controller.handle

        def timed_handle(msg):  # note GUI CPU and wall time when decoding starts and ends
            from engine.decode.events import SummaryEvent, TextEvent

            event = getattr(msg, "event", None)
            if isinstance(event, TextEvent) and event.round is None and "first" not in self._marks:
                self._marks["first"] = (time.perf_counter(), time.thread_time())
            elif isinstance(event, SummaryEvent):
                self._marks["last"] = (time.perf_counter(), time.thread_time())
            return handle(msg)

        self.w.controller.handle = timed_handle

    def tok_s(self) -> float:
        from PySide6.QtCore import QEventLoop

        loop = QEventLoop()
        self.w.run_finished.connect(loop.quit)
        self._marks = {}
        self.w.start_run()
        loop.exec()
        self.w.run_finished.disconnect(loop.quit)
        if self.w.errors:
            raise RuntimeError(self.w.errors[-1])
        (w0, c0), (w1, c1) = self._marks["first"], self._marks["last"]
        self.gui_share.append((c1 - c0) / max(w1 - w0, 1e-9))
        return self.w.current_run.summary.tok_per_s

    def close(self) -> None:
        self.w.close()


def main(argv: Optional[list[str]] = None) -> int:
    import engine  # noqa: F401  (optimised BLAS before MLX)
    from engine.models.demo import SAMPLE_PROMPT

    ap = argparse.ArgumentParser(prog="python -m app.overhead", description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--prompt", default=SAMPLE_PROMPT)
    ap.add_argument("--mode", choices=["dflash", "ar"], default="dflash")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured in-process runs first")
    args = ap.parse_args(argv)

    headless, windowed = Headless(args), Windowed(args)
    for _ in range(args.warmup):
        headless.tok_s()
        windowed.tok_s()
    got: dict[str, list[float]] = {"cli": [], "headless": [], "window": []}
    for i in range(args.runs):
        got["cli"].append(cli_tok_s(args))
        got["headless"].append(headless.tok_s())
        got["window"].append(windowed.tok_s())
        print(f"run {i + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in got.items()), file=sys.stderr)
    shares = windowed.gui_share[args.warmup:]
    windowed.close()
    med = {k: statistics.median(v) for k, v in got.items()}
    report = {
        "mode": args.mode, "max_tokens": args.max_tokens, "runs": args.runs,
        "median_tok_s": {k: round(v, 2) for k, v in med.items()},
        "window_vs_cli": round(med["window"] / med["cli"], 4),
        "window_vs_headless": round(med["window"] / med["headless"], 4),
        # Runs i of each kind are seconds apart: their ratio cancels slow drift on a shared machine.
        "paired_window_vs_cli": round(statistics.median(w / c for w, c in zip(got["window"], got["cli"])), 4),
        "paired_window_vs_headless": round(
            statistics.median(w / h for w, h in zip(got["window"], got["headless"])), 4),
        "gui_thread_cpu_share": round(statistics.median(shares), 4),
        "all": got,
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
