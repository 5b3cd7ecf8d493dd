"""The CLI as users run it: generate, parity, bench, export."""

import json
import re
from types import SimpleNamespace

import pytest

from app.cli import main as cli

from helpers import PROMPTS


def pair_args(dirs):
    return ["--target", str(dirs[0]), "--drafter", str(dirs[1])]


def run_json(capsys, argv):
    assert cli(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_json_fields_and_modes_agree(qwen3_tied_dirs, capsys):
    base = ["generate", *pair_args(qwen3_tied_dirs), "--prompt", PROMPTS[0], "--raw", "--max-tokens", "24", "--json"]
    df = run_json(capsys, base)
    ar = run_json(capsys, base + ["--mode", "ar"])
    for key in ("token_ids", "prompt_token_ids", "text", "mode", "num_generated", "tok_per_s", "prefill_s",
                "mean_acceptance_length", "num_rounds", "stop_reason"):
        assert key in df
    assert df["mode"] == "dflash" and ar["mode"] == "ar"
    assert df["token_ids"] == ar["token_ids"] and df["num_generated"] == 24
    assert df["num_rounds"] > 0 and ar["num_rounds"] == 0 and ar["mean_acceptance_length"] is None


def test_raw_encodes_like_mlx_lm(qwen3_pair, qwen3_tied_dirs, capsys):
    out = run_json(capsys, ["generate", *pair_args(qwen3_tied_dirs), "--prompt", PROMPTS[1], "--raw",
                            "--max-tokens", "2", "--json"])
    assert out["prompt_token_ids"] == qwen3_pair.tokenizer.encode(PROMPTS[1])


def test_chat_is_default_when_template_exists(qwen3_pair, qwen3_tied_dirs, capsys):
    out = run_json(capsys, ["generate", *pair_args(qwen3_tied_dirs), "--prompt", "hi", "--max-tokens", "2", "--json"])
    text = qwen3_pair.tokenizer.decode(out["prompt_token_ids"])
    assert text.startswith("<|im_start|>user\nhi") and text.endswith("<|im_start|>assistant\n")


def test_prompt_file(qwen3_tied_dirs, tmp_path, capsys):
    f = tmp_path / "p.txt"
    f.write_text(PROMPTS[2])
    a = run_json(capsys, ["generate", *pair_args(qwen3_tied_dirs), "--prompt-file", str(f), "--raw",
                          "--max-tokens", "4", "--json"])
    b = run_json(capsys, ["generate", *pair_args(qwen3_tied_dirs), "--prompt", PROMPTS[2], "--raw",
                          "--max-tokens", "4", "--json"])
    assert a["prompt_token_ids"] == b["prompt_token_ids"]
    f.write_bytes(b"\xef\xbb\xbf" + PROMPTS[2].encode())  # a Windows editor's byte-order mark: not prompt text
    c = run_json(capsys, ["generate", *pair_args(qwen3_tied_dirs), "--prompt-file", str(f), "--raw",
                          "--max-tokens", "4", "--json"])
    assert c["prompt_token_ids"] == b["prompt_token_ids"]
    f.write_bytes(PROMPTS[2].encode("utf-16"))  # Windows' "Unicode": UTF-16 with its byte-order mark
    d = run_json(capsys, ["generate", *pair_args(qwen3_tied_dirs), "--prompt-file", str(f), "--raw",
                          "--max-tokens", "4", "--json"])
    assert d["prompt_token_ids"] == b["prompt_token_ids"]
    f.write_bytes(PROMPTS[2].encode("utf-16-le"))  # without its mark it read as UTF-8: 124 junk tokens
    assert cli(["generate", *pair_args(qwen3_tied_dirs), "--prompt-file", str(f), "--raw", "--max-tokens", "4"]) == 2
    assert "holds NUL characters" in capsys.readouterr().err


def test_bench_tables_cut_prompts_between_characters_not_inside_escapes():
    from engine.tools.bench_report import prompt_label

    assert prompt_label("x" * 28 + "\ny") == "x" * 28 + "\\n"
    assert prompt_label("x" * 29 + "\ny") == "x" * 29  # not 'xxx\\': no lone backslash
    assert prompt_label("a\tb") == "a\\tb" and len(prompt_label("x" * 99)) == 30


def test_parity_command(qwen3_tied_dirs, capsys):
    out = run_json(capsys, ["parity", *pair_args(qwen3_tied_dirs), "--prompt", PROMPTS[0], "--raw",
                            "--max-tokens", "32", "--block-size", "16", "--json"])  # fixed: every step a round
    assert out["identical"] is True and out["first_divergence"] is None and out["margin_at_divergence"] is None
    assert out["speedup"] == pytest.approx(out["dflash_tok_s"] / out["ar_tok_s"], rel=1e-3)
    # A round's wall time in AR steps: the tau at which DFlash breaks even with AR.
    assert out["round_in_ar_steps"] > 0
    assert out["round_in_ar_steps"] == pytest.approx(out["mean_round_ms"] / 1000 * out["ar_tok_s"], abs=1e-3)
    # The rounds lie within the decode time (which also holds the steps' bookkeeping between them).
    rounds = (out["dflash_tokens"] - 1) / out["mean_acceptance_length"]
    assert out["mean_round_ms"] / 1000 * rounds <= out["dflash_tokens"] / out["dflash_tok_s"] * 1.01


def test_bench_json(qwen3_tied_dirs, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in PROMPTS[:2]) + "\n")
    out = run_json(capsys, ["bench", *pair_args(qwen3_tied_dirs), "--prompts", str(prompts), "--raw",  # a chain
                            "--max-tokens", "16", "--repeats", "2", "--block-size", "16", "--tree", "0", "--json"])
    assert len(out["per_prompt"]) == 2 and out["auto"] is False and out["block_size"] == 16
    for row in [out] + out["per_prompt"]:
        for key in ("ar_tok_s", "dflash_tok_s", "speedup", "mean_acceptance_length", "draft_ms", "verify_ms",
                    "rollback_ms"):
            assert row[key] is not None and row[key] >= 0, key
        assert row["speedup"] == pytest.approx(row["dflash_tok_s"] / row["ar_tok_s"], rel=1e-2)
    assert out["per_prompt"][0]["ar_tokens"] == 2 * 16 and out["identical"] is True
    for row in out["per_prompt"]:  # each run wrote the same 16 tokens: the pooled ratio lies between its repeats'
        low, high = row["speedup_range"]
        assert low <= high and low <= row["speedup"] * 1.001 and row["speedup"] <= high * 1.001
    assert "speedup_range" not in out  # the overall figure pools every prompt: no one pair of runs to range over
    shares = out["acceptance_by_position"]
    assert 0 < len(shares) <= out["block_size"] - 1 and all(0 <= a <= 1 for a in shares)
    assert shares == sorted(shares, reverse=True)  # a draft is accepted only after all before it
    # A round's wall time in AR steps, and the rounds lie within the decode time (timings themselves vary).
    assert out["round_in_ar_steps"] == pytest.approx(out["round_ms"] / 1000 * out["ar_tok_s"], rel=1e-3)
    assert out["rounds"] == pytest.approx((out["dflash_tokens"] - 2 * 2) / out["mean_acceptance_length"], rel=1e-2)
    assert out["round_ms"] / 1000 * out["rounds"] <= out["dflash_tokens"] / out["dflash_tok_s"] * 1.01


def test_bench_table(qwen3_tied_dirs, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": PROMPTS[0]}) + "\n")
    assert cli(["bench", *pair_args(qwen3_tied_dirs), "--prompts", str(prompts), "--max-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "OVERALL" in out and "speedup" in out and "break-even at tau" in out and "repeats range" not in out
    assert cli(["bench", *pair_args(qwen3_tied_dirs), "--prompts", str(prompts), "--max-tokens", "8",
                "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("1. " + PROMPTS[0][:20].replace("\n", "\\n")))
    assert "repeats range" in out and re.search(r"\d+\.\d\d-\d+\.\d\dx$", row), out
    assert "worst prompt: #1, " in out  # numbered as its row: pasted files often start alike


def test_bench_says_which_prompts_below_ar_ran_above_it_in_a_repeat():
    from engine.tools.bench_report import below_ar

    rows = [{"speedup": 0.9, "speedup_range": [0.8, 1.1]}, {"speedup": 0.7, "speedup_range": [0.6, 0.8]},
            {"speedup": 1.4, "speedup_range": [1.2, 1.6]}, {"speedup": 0.95, "speedup_range": None}]
    assert below_ar(rows) == ("3 of 4 prompts below AR (1 of them at or above AR in a repeat: within the "
                              "run-to-run spread)")
    assert below_ar(rows[1:2]) == "1 of 1 prompts below AR"
    from engine.tools.bench_report import ratio_text  # a prompt counted below AR never reads 1.00x

    assert [ratio_text(x) for x in (0.999, 0.9996, 0.994, 0.9949, 1.004, 2.5)] == ["0.999x", "0.999x", "0.99x",
                                                                                 "0.99x", "1.00x", "2.50x"]


def test_bench_bad_prompts_file(qwen3_tied_dirs, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "ok"}\n{"text": "no prompt field"}\n')
    assert cli(["bench", *pair_args(qwen3_tied_dirs), "--prompts", str(prompts)]) == 2
    assert "line 2" in capsys.readouterr().err
    from engine.tools.bench import load_prompts

    prompts.write_bytes(b'\xef\xbb\xbf{"prompt": "ok"}\n')  # a byte-order mark: line 1 read "not JSON"
    assert load_prompts(prompts) == ["ok"]


@pytest.mark.parametrize("command", ["bench", "bench --methods ar,dflash-auto", "generate", "parity"])
def test_a_prompt_too_long_is_refused_before_the_cost_curve_is_measured(qwen3_tied_dirs, tmp_path, capsys,
                                                                       monkeypatch, command):
    """A prompt past the target's context is refused before the cost curve is measured (20 s on the demo
    pair, minutes for a large vocabulary), naming the prompt; it was refused only after the measurement."""
    from engine.decode import cost_curve as cc

    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    measured = []
    monkeypatch.setattr(cc, "measure_steps", lambda *a, **k: measured.append(k) or iter(()))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"prompt": "word " * 5000}) + "\n")
    given = ["--prompts", str(prompts)] if command.startswith("bench") else ["--prompt", "word " * 5000]
    argv = [*command.split(), *pair_args(qwen3_tied_dirs), *given, "--max-tokens", "8", "--block-size", "auto"]
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert "context is 4096" in err and err.count("\n") == 1
    assert "prompt 2 ('word word" in err if command.startswith("bench") else "the prompt has" in err
    assert measured == []


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--max-tokens", "0"], "max tokens"),
        (["--block-size", "40"], "block size"),
        (["--temperature", "-2"], "temperature"),
        (["--stop", ""], "an empty stop string matches nothing"),  # it was ignored without a word
        (["--seed", "99999999999999999999"], "is outside 0..9223372036854775807"),  # said "non-negative"
    ],
)
def test_absurd_settings_refused(qwen3_tied_dirs, capsys, extra, words):
    assert cli(["generate", *pair_args(qwen3_tied_dirs), "--prompt", "x", *extra]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_no_prompt_says_what_to_do(qwen3_tied_dirs, capsys):
    assert cli(["generate", *pair_args(qwen3_tied_dirs)]) == 2
    assert "--prompt" in capsys.readouterr().err


def test_bench_warms_up_on_a_prompt_that_drafts(oracle_eos_dirs, oracle_ids, monkeypatch):
    """The warm-up must run a round: when the first prompt ends at its first token, the first
    prompt that drafts would otherwise pay for compiling the round's kernels inside its timing."""
    from engine.decode.settings import GenerationSettings
    from engine.models.pair import load_pair
    from engine.tools import bench

    pair = load_pair(*oracle_eos_dirs)
    ends_at_once, drafts, never_needed = [7, oracle_ids[0]], [7, 8], [9, 10]  # after oracle_ids[0]: EOS
    seen = []
    real = bench.run_once

    def spy(pair, ids, settings, cancel):
        out = real(pair, ids, settings, cancel)
        if settings.mode == "dflash":
            seen.append((ids, any(r.drafted for r in out[1])))
        return out

    monkeypatch.setattr(bench, "run_once", spy)
    bench.warm_up(pair, [ends_at_once, drafts, never_needed], GenerationSettings(mode="ar", max_tokens=8),
                  GenerationSettings(max_tokens=8), None)
    assert seen == [(ends_at_once, False), (drafts, True)]


def test_generate_says_when_the_target_ended_at_its_first_token(oracle_first_eos_dirs, qwen3_tied_dirs, capsys):
    """One token over no decoding time printed as 21,000 tok/s; the line now says what happened."""
    assert cli(["generate", *pair_args(oracle_first_eos_dirs), "--prompt", "hello world", "--raw",
                "--max-tokens", "8"]) == 0
    err = capsys.readouterr().err
    assert "the target wrote EOS as its first token" in err and "tok/s" not in err
    assert cli(["generate", *pair_args(qwen3_tied_dirs), "--prompt", "hello world", "--raw", "--max-tokens", "4"]) == 0
    assert re.search(r"\[dflash: 4 tokens, [0-9.]+ tok/s, tau [0-9.]+, \d+ rounds?", capsys.readouterr().err)


def test_parity_of_a_prompt_the_target_ends_at_once_gives_no_speed(oracle_first_eos_dirs, qwen3_tied_dirs, tmp_path,
                                                                    capsys):
    """Two one-token runs printed a speedup (AR 40,501 tok/s against 65,445); the check says why there
    is no speed instead (test_app_files opens such a trace in the window)."""
    trace = tmp_path / "eos.jsonl"
    assert cli(["parity", *pair_args(oracle_first_eos_dirs), "--prompt", "hello world", "--raw", "--max-tokens", "8",
                "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "ended_at_once: True" in out and "no speed: the target wrote EOS as its first token" in out
    assert "speedup" not in out and "tok_s" not in out
    assert cli(["parity", *pair_args(qwen3_tied_dirs), "--prompt", "hello world", "--raw", "--max-tokens", "4"]) == 0
    assert re.search(r"^speedup: [0-9.]+$", capsys.readouterr().out, re.M)  # a run that decoded keeps its speed


def test_a_run_of_one_token_gives_no_speed_and_says_why(qwen3_tied_dirs, tmp_path, capsys):
    """--max-tokens 1 printed 8,583 tok/s (generate) and a 2.24x speedup (parity): one token, the
    prefill's, over almost no time. No rate now, and the reason is the limit, not an EOS."""
    one = ["--prompt", "hello world", "--raw", "--max-tokens", "1"]
    assert cli(["generate", *pair_args(qwen3_tied_dirs), *one]) == 0
    err = capsys.readouterr().err
    assert "1 token, no speed: only the prefill's token was written" in err and "tok/s" not in err
    assert "stop: max_tokens" in err and "EOS" not in err
    assert run_json(capsys, ["generate", *pair_args(qwen3_tied_dirs), *one, "--json"])["tok_per_s"] is None
    trace = tmp_path / "one.jsonl"
    assert cli(["parity", *pair_args(qwen3_tied_dirs), *one, "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "no speed: only the prefill's token was written" in out and "ended_at_once: False" in out
    assert "speedup" not in out and "tok_s" not in out
    parity = run_json(capsys, ["parity", *pair_args(qwen3_tied_dirs), *one, "--json"])
    assert parity["timed"] is False and parity["speedup"] is None
    from engine.tools.trace import read_runs

    assert read_runs(trace).parity["speedup"] is None  # the trace reads back (the window opens it)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello world"}\n')
    for extra in ([], ["--methods", "ar,dflash"], ["--block-sizes", "2,4"]):
        assert cli(["bench", *pair_args(qwen3_tied_dirs), "--prompts", str(prompts), *one[2:], *extra]) == 2
        assert "bench times decoding: --max-tokens 1 leaves nothing to time" in capsys.readouterr().err


def test_bench_says_which_prompts_ended_before_any_round(oracle_first_eos_dirs, tmp_path, capsys):
    """An output that ends at its first token has no rounds: its speedup is no figure, not a ratio
    of two prefills, and both tables name the prompt instead of crashing or ranking it worst."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello world"}\n')
    out = run_json(capsys, ["bench", *pair_args(oracle_first_eos_dirs), "--prompts", str(prompts), "--raw",
                            "--max-tokens", "8", "--json"])
    row = out["per_prompt"][0]
    assert row["rounds"] == 0 and row["speedup"] is None and row["ar_tokens"] == 1
    assert (out["target"], out["drafter"], out["rollback"]) == (*map(str, oracle_first_eos_dirs), "replay")
    assert cli(["bench", *pair_args(oracle_first_eos_dirs), "--prompts", str(prompts), "--raw", "--max-tokens", "8"]) == 0
    text = capsys.readouterr().out
    assert "1 prompt(s) ended at their first token" in text
    for name in ("1. hello world", "OVERALL"):  # no rate from one token over no time, per prompt or overall
        row = next(line for line in text.splitlines() if line.startswith(name))
        assert not any(c.isdigit() for c in row.removeprefix("1. ")), row
    assert cli(["bench", *pair_args(oracle_first_eos_dirs), "--prompts", str(prompts), "--raw", "--max-tokens", "8",
                "--block-sizes", "2,auto"]) == 0
    text = capsys.readouterr().out
    assert "'hello world'" in text and "ended at their first token" in text
    row = next(line for line in text.splitlines() if line.startswith("hello world"))
    assert not any(c.isdigit() for c in row), row


def test_block_size_zero_is_refused(qwen3_tied_dirs, capsys):
    """0 is not a block size (the window's "drafter's" is None by the time it reaches the engine)."""
    assert cli(["generate", *pair_args(qwen3_tied_dirs), "--prompt", "x", "--block-size", "0"]) == 2
    err = capsys.readouterr().err
    assert "block size 0 is not a block size" in err and err.count("\n") == 1 and "unexpected" not in err


def test_block_size_one_runs(qwen3_tied_dirs, capsys):
    """Block size 1 never drafts, so there is no tau: the run's last line says so instead of failing."""
    argv = ["generate", *pair_args(qwen3_tied_dirs), "--prompt", PROMPTS[0], "--raw", "--max-tokens", "6"]
    assert cli(argv + ["--block-size", "1"]) == 0
    err = capsys.readouterr().err
    assert "[dflash: 6 tokens" in err and "5 rounds" in err and "tau" not in err and "unexpected" not in err
    assert cli(argv + ["--block-size", "2"]) == 0
    assert ", tau " in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [(["generate", "--block-size", "1.5"], "'1.5' is not a whole number or 'auto'"),
                                         (["bench", "--prompts", "p.jsonl", "--max-tokens", "abc"], "invalid int value"),
                                         (["nosuch"], "invalid choice: 'nosuch'")])
def test_a_flag_argparse_cannot_read_is_one_line(argv, says, capsys):
    """As every other bad input: one line and exit 2 (argparse printed its whole usage above it)."""
    with pytest.raises(SystemExit) as done:
        cli(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and says in err and err.count("\n") == 1 and "usage:" not in err


def test_lone_surrogate_prompt_is_refused(qwen3_tied_dirs, capsys):
    for fmt in ("--raw", "--chat"):
        assert cli(["generate", *pair_args(qwen3_tied_dirs), "--prompt", "a\udc80b", fmt]) == 2
        err = capsys.readouterr().err
        assert "U+DC80 at character 1" in err and err.count("\n") == 1 and "unexpected" not in err


@pytest.fixture(scope="module")
def block32_dirs(qwen3_tied_dirs, models_root):
    """The tiny Qwen3 target with a drafter whose native block (32) is above what a user may ask for."""
    from fixtures import tiny_models as tm

    drafter = models_root / "block32-drafter"
    if not drafter.exists():
        tm.write_drafter(drafter, qwen3_tied_dirs[0], seed=80, block_size=32)
    return qwen3_tied_dirs[0], drafter


def test_a_drafter_above_the_limit_runs_at_its_own_block(block32_dirs, capsys):
    """The limit bounds what a user asks for, not the drafter's own block, which the user did not set."""
    from engine.decode.settings import MAX_BLOCK, GenerationSettings
    from engine.models.pair import load_pair
    from helpers import run

    pair = load_pair(*block32_dirs)
    assert pair.drafter.cfg.block_size == 32 > MAX_BLOCK
    assert GenerationSettings().resolved(pair).block_size == 32
    assert GenerationSettings(block_size=8).resolved(pair).block_size == 8
    _, rounds = run(pair, PROMPTS[0], max_tokens=40)
    assert len(rounds[0].drafted) == 31  # a whole block of 32, the anchor included
    out = run_json(capsys, ["parity", *pair_args(block32_dirs), "--prompt", PROMPTS[0], "--raw", "--max-tokens", "40",
                            "--json"])
    assert out["verdict"] in ("identical", "near_tie"), out
    assert cli(["generate", *pair_args(block32_dirs), "--prompt", "x", "--block-size", "32"]) == 2
    err = capsys.readouterr().err
    assert f"outside 1..{MAX_BLOCK}" in err and "leave it unset" in err and err.count("\n") == 1


def test_bench_races_every_method_on_every_prompt(qwen3_tied_dirs, tmp_path, capsys):
    """bench --methods: AR once per prompt and every other method after it, one process; per method a
    speedup, tau, an identical-to-AR verdict and per-prompt rows; mlx-lm's speculative loop timed."""
    import json

    from app.cli import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "import json\\n\\nclass Decoder:\\n"}\n{"prompt": "x = [1, 2, 3]\\ny = [1, 2, 3]\\n"}\n')
    t, d = qwen3_tied_dirs
    args = ["bench", "--target", str(t), "--drafter", str(d), "--prompts", str(prompts), "--max-tokens", "12", "--raw",
            "--methods", "dflash,lookup,dflash+lookup,draft-model,dflash-auto", "--draft-model", str(t),
            "--num-draft", "2", "--with-mlx-lm"]
    assert main(args + ["--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert list(result["methods"]) == ["ar", "dflash", "lookup", "dflash+lookup", "draft-model", "dflash-auto"]
    for name, m in result["methods"].items():
        assert {"speedup", "mean_acceptance_length", "identical", "per_prompt"} <= set(m)
        assert len(m["per_prompt"]) == 2 and m["ar_tokens"] == result["methods"]["ar"]["ar_tokens"]
        assert m["identical"] is True, name
        assert m["verdict"] == "identical" and all(r["verdict"] == "identical" for r in m["per_prompt"]), name
        assert all(r["speedup_range"] is None for r in m["per_prompt"])  # one repeat: no range
    assert result["mlx_lm_speculative_tok_s"] > 0 and result["draft_model_vs_mlx_lm"] > 0
    low, high = result["draft_model_vs_mlx_lm_range"]  # two prompts, each run by both loops
    assert 0 < low <= high
    assert result["mlx_lm_generation_tps"] > 0 and result["draft_model_after_first_round_tok_s"] > 0
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "identical to AR: dflash True" in out and "worst prompt for lookup" in out and "mlx-lm speculative" in out
    assert "prompts below AR" in out and re.search(r"of it \(runs \d+\.\d\d-\d+\.\d\dx\)", out)
    # sampled, with a chat model's filters: one line on what sampled outputs mean, not a verdict per
    # prompt and method; the JSON keeps every sampling setting
    sampled = args[:10] + ["--methods", "dflash,lookup", "--temperature", "0.9", "--seed", "3", "--top-k", "20",
                           "--top-p", "0.95", "--min-p", "0.02"]
    assert main(sampled + ["--json"]) == 0
    race = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert race["sampling"] == {"temperature": 0.9, "top_p": 0.95, "top_k": 20, "min_p": 0.02, "seed": 3}
    differ = {m: sum(not r["identical"] for r in race["methods"][m]["per_prompt"]) for m in ("dflash", "lookup")}
    assert main(sampled) == 0  # the same seed: the same samples
    out = capsys.readouterr().out
    assert "identical to AR" not in out and "draw their random numbers" not in out
    line = [ln for ln in out.splitlines() if ln.startswith("at temperature 0.9 every output is a sample")]
    assert len(line) == 1
    assert line[0].endswith(f"differ from AR's: dflash {differ['dflash']}/2, lookup {differ['lookup']}/2")
    assert main(["bench", "--prompts", str(prompts), "--methods", "ar,warp"]) == 2
    assert "unknown method(s) warp" in capsys.readouterr().err
    assert main(["bench", "--prompts", str(prompts), "--methods", "ar,ar"]) == 2  # printed an empty race table
    assert "a race needs a method besides ar" in capsys.readouterr().err
    assert main(["bench", "--prompts", str(prompts), "--methods", "dflash", "--block-sizes", "4"]) == 2
    assert "two different benches" in capsys.readouterr().err  # --methods was silently ignored
    assert main(["bench", "--target", str(t), "--drafter", str(d), "--prompts", str(prompts),
                 "--methods", "draft-model"]) == 2
    assert "needs --draft-model" in capsys.readouterr().err


def test_a_race_names_prompts_that_ended_at_their_first_token(oracle_first_eos_dirs, tmp_path, capsys):
    """The race table printed one token over no time as AR's rate (46,511 tok/s); it says "-" and names
    the prompt, as bench's own table does."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello world"}\n')
    assert cli(["bench", *pair_args(oracle_first_eos_dirs), "--prompts", str(prompts), "--raw", "--max-tokens", "8",
                "--methods", "ar,dflash,lookup"]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("hello world"))
    assert row.split()[2:] == ["-", "-", "-"]
    assert "1 prompt(s) ended at their first token, so no method drafted" in text


def test_a_race_prices_a_difference_by_the_ar_logit_margin_where_it_starts(qwen3_tied_dirs):
    """Where a method's output is not AR's, the race says where, by what AR logit margin, and whether
    that is a floating-point near-tie or a real divergence, as parity does; a method's verdict is its
    worst prompt's."""
    from dataclasses import replace

    from engine.decode.generate import generate
    from engine.decode.events import SummaryEvent
    from engine.decode.settings import GenerationSettings
    from engine.models.pair import load_pair
    from engine.tools.parity import DIVERGENCE, NEAR_TIE, logit_margin, near_tie_threshold, output_verdict
    from engine.tools.race import method_verdict

    pair = load_pair(*qwen3_tied_dirs)
    ids = pair.tokenizer.encode("import json\n")
    ar = [e for e in generate(pair, ids, GenerationSettings(mode="ar", max_tokens=8)) if isinstance(e, SummaryEvent)][0]
    flipped = list(ar.token_ids)
    flipped[3] = (flipped[3] + 1) % 50
    other = replace(ar, token_ids=flipped)
    verdict = output_verdict(pair, ids, ar, other, 0.0, "lookup")
    margin = logit_margin(pair, ids, ar.token_ids[:3])
    expected = NEAR_TIE if margin < near_tie_threshold("float32") else DIVERGENCE
    assert verdict.kind == expected and "token 3" in verdict.text and f"{margin:.3g}" in verdict.text
    assert output_verdict(pair, ids, ar, ar, 0.0).kind == "identical"
    assert output_verdict(pair, ids, ar, other, 1.0).kind == "samples"
    rows = [{"verdict": "identical"}, {"verdict": NEAR_TIE}]
    assert method_verdict(rows) == NEAR_TIE and method_verdict(rows + [{"verdict": DIVERGENCE}]) == DIVERGENCE
    assert method_verdict([{"verdict": "identical"}]) == "identical"


def test_both_speculative_loops_are_timed_after_their_first_round():
    """mlx-lm's generation_tps starts its clock at the first token, which its speculative loop yields
    after a whole round; ours starts after the prefill. The race reads both past their first round."""
    from engine.tools.race import after_first_round

    assert after_first_round([0.1, 0.3, 0.6], [4, 2, 3]) == (5, 0.5)
    assert after_first_round([0.2], [4]) == (0, 0.0)


def test_mlx_lm_and_our_loops_take_turns_going_first(qwen3_tied_dirs, monkeypatch):
    """Their ratio is ~1.0, so an order bias (the second always on a machine the first warmed) would be
    the size of what is measured: over prompts and repeats each goes first half the time."""
    from engine.decode.settings import GenerationSettings
    from engine.models.pair import load_pair
    from engine.tools import race

    pair = load_pair(*qwen3_tied_dirs)
    order: list[str] = []
    real_reference, real_race = race.mlx_lm_speculative, race.race_prompt

    def reference(*args, **kwargs):
        order.append("mlx-lm")
        return real_reference(*args, **kwargs)

    def ours(*args, **kwargs):
        order.append("ours")
        yield from real_race(*args, **kwargs)

    monkeypatch.setattr(race, "mlx_lm_speculative", reference)
    monkeypatch.setattr(race, "race_prompt", ours)
    prompts = [(text, pair.tokenizer.encode(text)) for text in ("import json\n", "x = [1, 2, 3]\n")]
    settings = GenerationSettings(mode="ar", max_tokens=6, draft_model=str(qwen3_tied_dirs[0]), num_draft=2)
    result = race.run_race(pair, prompts, settings, ["ar", "draft-model"], repeats=2, with_mlx_lm=True)
    pairs = [tuple(order[i : i + 2]) for i in range(0, len(order), 2)]
    assert len(pairs) == 4 and set(pairs) == {("mlx-lm", "ours"), ("ours", "mlx-lm")}
    assert pairs.count(("mlx-lm", "ours")) == 2 and result["draft_model_vs_mlx_lm"] > 0


def test_mlx_lm_reference_loops_sample_at_the_runs_settings_and_need_our_draft_model_run(qwen3_tied_dirs):
    """At T > 0 mlx-lm's loops sample with the run's settings and seed (they were greedy, timed beside
    our sampled runs); a race times mlx-lm's speculative loop only beside our draft-model method (it
    printed 'ours 0.0' without one)."""
    from engine.decode.settings import GenerationSettings, SamplingSettings
    from engine.errors import DFlashError
    from engine.models.pair import load_pair
    from engine.tools import race
    from engine.tools.bench import mlx_lm_responses

    pair = load_pair(*qwen3_tied_dirs)
    ids = pair.tokenizer.encode("import json\n")
    greedy = [r.token for r in mlx_lm_responses(pair, ids, 12)]
    hot = SamplingSettings(temperature=1.5, seed=3)
    sampled = [r.token for r in mlx_lm_responses(pair, ids, 12, hot)]
    assert sampled == [r.token for r in mlx_lm_responses(pair, ids, 12, hot)] and sampled != greedy
    assert [r.token for r in mlx_lm_responses(pair, ids, 12, SamplingSettings())] == greedy
    settings = GenerationSettings(max_tokens=4, draft_model=str(qwen3_tied_dirs[0]), num_draft=2)
    with pytest.raises(DFlashError, match="add draft-model to --methods"):
        race.run_race(pair, [("x", ids)], settings, ["ar", "lookup"], with_mlx_lm=True)


def test_generate_parity_and_bench_verify_auto_lengths_unless_given_a_block():
    """auto is what a user gets (the measured default, engine/decode/settings.py); a number fixes the block."""
    from engine.tools.cli import _settings
    from engine.tools.cli_parser import build_parser

    parser = build_parser()
    for command in (["generate", "--prompt", "x"], ["parity", "--prompt", "x"], ["bench", "--prompts", "p.jsonl"]):
        settings = _settings(parser.parse_args(command), "dflash")
        assert settings.auto is True and settings.block_size is None
        fixed = _settings(parser.parse_args(command + ["--block-size", "8"]), "dflash")
        assert fixed.auto is False and fixed.block_size == 8


def test_dflash_runs_take_copies_of_the_context_unless_told_not_to():
    """Lookup inside DFlash rounds is what a user gets (the measured default, engine/decode/settings.py);
    --no-lookup runs the drafter alone; a draft-model run never takes copies, whatever the flag."""
    from engine.decode.settings import LOOKUP_BY_DEFAULT
    from engine.tools.cli import _settings
    from engine.tools.cli_parser import build_parser

    assert LOOKUP_BY_DEFAULT is True
    parser = build_parser()
    for command in (["generate", "--prompt", "x"], ["parity", "--prompt", "x"], ["bench", "--prompts", "p.jsonl"]):
        assert _settings(parser.parse_args(command), "dflash").lookup is True
        assert _settings(parser.parse_args(command + ["--no-lookup"]), "dflash").lookup is False
        assert _settings(parser.parse_args(command + ["--lookup"]), "dflash").lookup is True
    draft_model = _settings(parser.parse_args(["generate", "--prompt", "x", "--draft-model", "m"]), "draft-model")
    vocab_only = SimpleNamespace(head=SimpleNamespace(vocab_size=100), drafter=None)  # what resolved() reads here
    assert draft_model.lookup is True and draft_model.resolved(vocab_only).lookup is False


def test_a_prompt_auto_decoded_in_plain_steps_alone_did_not_end_at_its_first_token(qwen3_tied_dirs, tmp_path, capsys,
                                                                                     monkeypatch):
    """Where auto finds drafting never pays it decodes in plain steps, no rounds: that prompt has a
    speedup like any other and is not one of those that ended at their first token."""
    from engine.decode.verify_length import VerifyLengthController

    monkeypatch.setattr(VerifyLengthController, "best", lambda self, depth=0: 1)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": PROMPTS[0]}) + "\n")
    args = ["bench", *pair_args(qwen3_tied_dirs), "--prompts", str(prompts), "--raw", "--max-tokens", "4"]
    row = run_json(capsys, args + ["--json"])["per_prompt"][0]
    assert row["rounds"] == 0 and row["plain_steps"] == 3 and row["speedup"] is not None
    assert cli(args) == 0
    text = capsys.readouterr().out
    assert "ended at their first token" not in text
    line = next(line for line in text.splitlines() if line.startswith("1. " + PROMPTS[0][:10].replace("\n", "\\n")))
    assert any(c.isdigit() for c in line), line


def test_ctrl_c_in_bench_reports_the_prompts_measured_so_far(qwen3_tied_dirs, tmp_path, capsys, monkeypatch):
    """Ctrl-C during the third prompt: the figures of the first two are printed (they were thrown away,
    'error: interrupted.' and nothing else), the one cut short is left out, and the exit code says so."""
    from engine.tools import bench

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in PROMPTS[:3]) + "\n")
    real, cut = bench.run_once, []

    def ctrl_c_in_the_third(pair, ids, settings, cancel):
        if ids == pair.tokenizer.encode(PROMPTS[2]) and settings.mode == "dflash":
            cut.append(ids)
            raise KeyboardInterrupt
        return real(pair, ids, settings, cancel)

    monkeypatch.setattr(bench, "run_once", ctrl_c_in_the_third)
    argv = ["bench", *pair_args(qwen3_tied_dirs), "--prompts", str(prompts), "--raw", "--max-tokens", "8",
            "--block-size", "4"]
    assert cli([*argv, "--json"]) == 130 and cut
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["interrupted"] is True and out["prompts"] == 2 and out["prompts_given"] == 3
    assert [r["prompt"] for r in out["per_prompt"]] == PROMPTS[:2] and out["ar_tokens"] == 2 * 8
    assert "interrupted: the figures are over the 2 of 3 prompts" in captured.err
    assert cli(argv) == 130
    assert "OVERALL" in capsys.readouterr().out


def test_ctrl_c_in_a_race_reports_the_prompts_raced_so_far(qwen3_tied_dirs, tmp_path, capsys, monkeypatch):
    from engine.tools import race

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in PROMPTS[:3]) + "\n")
    real = race.race_prompt

    def ctrl_c_in_the_third(pair, ids, *a, **k):
        if ids == pair.tokenizer.encode(PROMPTS[2]):
            raise KeyboardInterrupt
        return real(pair, ids, *a, **k)

    monkeypatch.setattr(race, "race_prompt", ctrl_c_in_the_third)
    assert cli(["bench", *pair_args(qwen3_tied_dirs), "--prompts", str(prompts), "--raw", "--max-tokens", "8",
                "--methods", "dflash,lookup", "--json"]) == 130
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["interrupted"] is True and out["prompts"] == 2 and out["prompts_given"] == 3
    for m in ("ar", "dflash", "lookup"):
        assert [r["prompt"] for r in out["methods"][m]["per_prompt"]] == PROMPTS[:2]
    assert "interrupted: the figures are over the 2 of 3 prompts" in captured.err


def test_thinking_on_a_raw_prompt_is_refused_not_dropped(qwen3_tied_dirs, capsys):
    """--thinking with a prompt encoded raw was silently ignored."""
    argv = ["generate", *pair_args(qwen3_tied_dirs), "--prompt", PROMPTS[0], "--max-tokens", "4", "--thinking", "on",
            "--raw"]
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert "thinking on/off is an option of the chat template" in err and "encoded as raw text" in err


def test_a_sampled_race_counts_the_samples_that_differ(capsys):
    """At T > 0 every verdict is 'samples', identical outputs too: the one line counts the outputs
    that differ from AR's, not the verdicts."""
    from engine.tools.race import print_race

    def row(identical: bool) -> dict:
        return {"prompt": "p", "ar_tok_s": 10.0, "speedup": 1.5, "mean_acceptance_length": 2.0, "identical": identical,
                "verdict": "samples", "verdict_text": "two samples", "speedup_range": None, "ar_tokens": 8,
                "rounds": 4}

    def method(rows: list[dict]) -> dict:
        return {"ar_tok_s": 10.0, "dflash_tok_s": 15.0, "speedup": 1.5, "mean_acceptance_length": 2.0,
                "identical": all(r["identical"] for r in rows), "per_prompt": rows, "ar_tokens": 24}

    print_race({"temperature": 0.7, "repeats": 1, "methods": {"ar": method([row(True)] * 3),
                                                 "dflash": method([row(True), row(False), row(True)])}})
    out = capsys.readouterr().out
    assert out.count("every output is a sample") == 1 and "differ from AR's: dflash 1/3" in out
    assert "two samples" not in out and "identical to AR" not in out


def test_an_empty_list_of_block_sizes_or_methods_is_refused_not_dropped(qwen3_tied_dirs, tmp_path, capsys):
    """`--block-sizes ''` ran a plain bench instead, with no word (while '4,,8' was refused)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello world"}\n')
    for flag, words in (("--block-sizes", "is not a whole number"), ("--methods", "unknown method")):
        assert cli(["bench", *pair_args(qwen3_tied_dirs), "--prompts", str(prompts), flag, ""]) == 2
        captured = capsys.readouterr()
        assert words in captured.err and "OVERALL" not in captured.out  # refused: no bench ran
