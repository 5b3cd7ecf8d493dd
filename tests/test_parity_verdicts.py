"""What `parity` and the window's parity view conclude from a difference: at T > 0 two samples, never
"a real divergence"; at T = 0 a near-tie threshold that follows the logits' dtype, named in the verdict."""

import json

import mlx.core as mx
import pytest

from app.cli import main as cli
from engine.decode.events import StartEvent
from engine.tools.parity import DIVERGENCE, IDENTICAL, NEAR_TIE, SAMPLES, near_tie_threshold, parity_verdict
from fixtures import tiny_models as tm

from helpers import PROMPTS


def pair_args(dirs):
    return ["--target", str(dirs[0]), "--drafter", str(dirs[1])]


def test_threshold_follows_the_logits_dtype():
    assert near_tie_threshold("float32") == 1e-3
    assert near_tie_threshold("bfloat16") == 0.25  # one step of bf16 at 32; logits of 8-16 are 0.0625 apart
    assert near_tie_threshold("float16") == 2.0**-5
    assert near_tie_threshold(mx.bfloat16) == near_tie_threshold("bfloat16")
    # A flip at 0.0625 is rounding in bf16 and a bug in float32; the verdict names the threshold it used.
    bf16 = parity_verdict(False, 3, 0.0625, 0.0, "bfloat16")
    f32 = parity_verdict(False, 3, 0.0625, 0.0, "float32")
    assert bf16.kind == NEAR_TIE and bf16.near_tie == 0.25 and "0.25" in bf16.text and "bfloat16" in bf16.text
    assert f32.kind == DIVERGENCE and "0.001" in f32.text and "float32" in f32.text and "real divergence" in f32.text


def test_at_temperature_outputs_are_samples():
    for identical, first, margin in ((False, 2, 1.5), (True, None, None), (False, 4, None)):
        verdict = parity_verdict(identical, first, margin, 0.7, "float32")
        assert verdict.kind == SAMPLES and verdict.near_tie is None
        assert "divergence" not in verdict.text and "near-tie" not in verdict.text
        assert "samples" in verdict.text and "many seeds" in verdict.text


def test_parity_command_at_temperature(qwen3_tied_dirs, capsys):
    """The case a user met: T = 1, seed 3; AR and DFlash differ, as two samples may."""
    argv = ["parity", *pair_args(qwen3_tied_dirs), "--prompt", PROMPTS[3], "--raw", "--max-tokens", "24",
            "--temperature", "1.0", "--seed", "3"]
    assert cli(argv) == 0
    out = capsys.readouterr().out
    verdict = next(line for line in out.splitlines() if line.startswith("verdict"))
    assert "real divergence" not in out and verdict.startswith("verdict (samples): ") and "many seeds" in verdict
    assert cli(argv + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["identical"] is False, "this seed must give a diverging pair of outputs"
    assert report["verdict"] == SAMPLES and report["near_tie"] is None and report["temperature"] == 1.0


def test_parity_json_names_its_threshold(qwen3_tied_dirs, capsys):
    assert cli(["parity", *pair_args(qwen3_tied_dirs), "--prompt", PROMPTS[0], "--raw", "--max-tokens", "8",
                "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == IDENTICAL and report["logits_dtype"] == "float32" and report["near_tie"] == 1e-3


@pytest.fixture(scope="module")
def bf16_dirs(models_root, tokenizer_dir):
    target, drafter = models_root / "bf16-target", models_root / "bf16-drafter"
    if not target.exists():
        tm.write_target(target, tokenizer_dir, seed=60, dtype=mx.bfloat16)
        tm.write_drafter(drafter, target, seed=61, dtype=mx.bfloat16)
    return target, drafter


def test_bf16_pair_is_judged_at_bf16_spacing(bf16_dirs, capsys):
    from engine.decode.prefill import prefill
    from engine.decode.prompts import encode_prompt
    from engine.models.pair import load_pair
    from engine.models.target import make_target_cache
    from engine.runtime.streams import STREAM

    pair = load_pair(*bf16_dirs)
    ids = encode_prompt(pair.tokenizer, PROMPTS[0], chat=False)
    with mx.stream(STREAM):  # the head's dtype is the one the logits come in
        logits, _ = prefill(pair, make_target_cache(pair.target), ids, record_taps=False)
    assert logits.dtype == mx.bfloat16 == pair.head.dtype
    assert cli(["parity", *pair_args(bf16_dirs), "--prompt", PROMPTS[0], "--raw", "--max-tokens", "24",
                "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["logits_dtype"] == "bfloat16" and report["near_tie"] == 0.25
    assert report["verdict"] in (IDENTICAL, NEAR_TIE), report


def _done(**kw):
    from app.jobs import ParityDone

    fields = dict(identical=False, first_divergence=2, margin_at_divergence=0.0625, speedup=1.5, ar_tok_s=10.0,
                  dflash_tok_s=15.0, cancelled=False)
    return ParityDone(**{**fields, **kw})


def test_window_headline_follows_temperature_and_dtype():
    from app.parity_view import headline, run_conditions
    from app.run_record import RunRecord

    sampled = headline(_done(), 1.0, "float32")
    assert "real divergence" not in sampled and "samples" in sampled and "differ from token 2" in sampled
    assert "near-tie flip" in headline(_done(), 0.0, "bfloat16") and "0.25" in headline(_done(), 0.0, "bfloat16")
    assert "real divergence" in headline(_done(), 0.0, "float32")
    assert headline(_done(identical=True, first_divergence=None, margin_at_divergence=None), 0.0,
                    "float32").startswith("Identical: DFlash reproduced AR token for token.")
    start = StartEvent("ar", {"sampling": {"temperature": 0.8}}, {"dtype": "bfloat16"}, [1, 2])
    assert run_conditions(RunRecord(start)) == (0.8, "bfloat16")


def test_window_headline_of_one_token_runs_gives_no_speed():
    """Both mode at max tokens 1: the verdict stands, but two rates of one token each are no speedup."""
    from app.parity_view import headline

    one = _done(identical=True, first_divergence=None, margin_at_divergence=None, timed=False, speedup=None)
    for temperature in (0.0, 0.7):
        text = headline(one, temperature, "float32")
        assert "no speed: only the prefill's token was written" in text.lower() and "×" not in text
    assert "Speedup ×" in headline(_done(identical=True, first_divergence=None, margin_at_divergence=None), 0.0,
                                   "float32")


def test_window_headline_of_a_stopped_comparison():
    """Stop leaves a shorter run: the headline says how far the comparison got and shows no speed."""
    from app.parity_view import headline, parity_mark
    from app.run_record import RunRecord

    so_far = headline(_done(identical=True, first_divergence=None, margin_at_divergence=None, cancelled=True,
                            compared=37), 0.0, "float32")
    assert so_far.startswith("Stopped before the end: identical over the 37 tokens") and "tok" in so_far
    assert "speedup" not in so_far
    diverged = headline(_done(cancelled=True, compared=37), 0.0, "float32")
    assert "within the 37 tokens" in diverged and "real divergence" in diverged
    nothing = _done(identical=True, first_divergence=None, margin_at_divergence=None, cancelled=True, compared=0,
                    dflash_ran=False)
    assert headline(nothing, 0.0, "float32").startswith("Stopped during the AR run: DFlash did not start")
    before_first = _done(identical=True, first_divergence=None, margin_at_divergence=None, cancelled=True, compared=0)
    assert headline(before_first, 0.0, "float32").startswith("Stopped before DFlash wrote its first token")
    ar = RunRecord(StartEvent("ar", {"sampling": {"temperature": 0.0}}, {"dtype": "float32"}, [1, 2]))
    assert parity_mark(nothing, ar) == "–"
    assert parity_mark(_done(identical=True, first_divergence=None, margin_at_divergence=None, cancelled=True,
                             compared=37), ar) == "✓"
