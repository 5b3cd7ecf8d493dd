"""Draft-model speculation (--mode draft-model): a small AR model of the target's tokenizer drafts,
the target verifies; its cache follows the committed text; lossless at T = 0, exact at T > 0."""

from __future__ import annotations

import json
import random

import mlx.core as mx
import pytest

from app.cli import main as cli
from engine.decode.prompts import encode_prompt
from engine.decode.proposers import DraftModelProposer
from engine.decode.settings import GenerationSettings, SamplingSettings
from engine.errors import DFlashError, IncompatiblePairError, SettingsError
from fixtures import tiny_models as tm

from distribution import check_exactness, exact_outcomes, verified_unfiltered
from helpers import PROMPTS, run


@pytest.fixture(scope="module")
def other_target(models_root, tokenizer_dir):
    """Another tiny target with the same tokenizer: a draft model that is often wrong."""
    path = models_root / "draft-model-other"
    if not path.exists():
        tm.write_target(path, tokenizer_dir, seed=77)
    return path


def test_the_target_as_its_own_draft_model_is_accepted_whole_even_after_rejections(qwen3_pair, qwen3_tied_dirs,
                                                                                 monkeypatch):
    """A draft model that is the target drafts what the target writes, so a round accepts every draft
    up to one we spoil on purpose: any slip in the draft model's cache after a rejection would show."""
    ids = encode_prompt(qwen3_pair.tokenizer, PROMPTS[0], chat=False)
    rng = random.Random(3)
    spoiled: list[int] = []
    real = DraftModelProposer.propose

    def spoil_one(self, anchor, length, position, room):
        proposal = real(self, anchor, length, position, room)
        drafts = proposal.drafts.tolist()
        k = rng.randrange(len(drafts) + 1) if drafts else 0  # len(drafts): none spoiled this round
        spoiled.append(k)
        if k < len(drafts):
            drafts[k] = (drafts[k] + 1) % qwen3_pair.head.vocab_size
            proposal.drafts = mx.array(drafts, dtype=mx.int32)
        return proposal

    monkeypatch.setattr(DraftModelProposer, "propose", spoil_one)
    ar, _ = run(qwen3_pair, ids, mode="ar", max_tokens=60)
    df, rounds = run(qwen3_pair, ids, mode="draft-model", draft_model=str(qwen3_tied_dirs[0]), num_draft=4,
                     max_tokens=60)
    assert df.token_ids == ar.token_ids and df.mode == "draft-model"
    assert rounds and all(r.source == "draft-model" for r in rounds if r.drafted)
    assert [r.accepted for r in rounds if r.drafted] == [k for k, r in zip(spoiled, rounds) if r.drafted]


def test_a_draft_model_that_is_often_wrong_stays_lossless(qwen3_pair, other_target):
    for prompt in PROMPTS:
        ids = encode_prompt(qwen3_pair.tokenizer, prompt, chat=False)
        ar, _ = run(qwen3_pair, ids, mode="ar", max_tokens=40)
        df, rounds = run(qwen3_pair, ids, mode="draft-model", draft_model=str(other_target), num_draft=3,
                         max_tokens=40)
        assert df.token_ids == ar.token_ids
        assert any(r.accepted < len(r.drafted) for r in rounds)


@pytest.mark.parametrize("mutation", [None, verified_unfiltered], ids=["exact", "mutated"])
def test_sampling_with_a_draft_model_is_exact(qwen3_pair, other_target, monkeypatch, mutation):
    ids = encode_prompt(qwen3_pair.tokenizer, PROMPTS[2], chat=False)
    exact = exact_outcomes(qwen3_pair, ids, SamplingSettings(temperature=1.0, top_k=3), tokens=2)

    def outcome(seed):
        sampling = SamplingSettings(temperature=1.0, top_k=3, seed=seed)
        summary, _ = run(qwen3_pair, ids, mode="draft-model", sampling=sampling, max_tokens=3,
                         draft_model=str(other_target), num_draft=2)
        return tuple(summary.token_ids[:2])

    check_exactness(monkeypatch, mutation, exact, outcome)


def test_what_draft_model_mode_refuses(qwen3_pair, oracle_dirs, tmp_path, capsys):
    with pytest.raises(SettingsError, match="needs a draft model"):
        GenerationSettings(mode="draft-model").resolved(qwen3_pair)
    with pytest.raises(SettingsError, match="num draft 0"):
        GenerationSettings(mode="draft-model", draft_model="x", num_draft=0).resolved(qwen3_pair)
    other_tokenizer = tmp_path / "other-tok"
    tm.write_tokenizer(other_tokenizer, vocab_size=300)
    stranger = tmp_path / "stranger"
    tm.write_target(stranger, other_tokenizer, seed=5)
    with pytest.raises(IncompatiblePairError, match="tokenizer"):
        run(qwen3_pair, [5, 6, 7], mode="draft-model", draft_model=str(stranger), max_tokens=4)
    code = cli(["generate", "--target", str(oracle_dirs[0]), "--prompt", "hi", "--raw", "--mode", "draft-model",
                "--max-tokens", "4"])
    assert code == 2 and "needs a draft model" in capsys.readouterr().err


def test_flags_a_run_would_ignore_are_named_and_a_contradiction_refused(oracle_dirs, tmp_path, capsys):
    """A flag taken and ignored reads as a setting that took effect: generate, parity and bench name each
    one on stderr (the run goes on, so a command line can be rerun with another --mode); --mode lookup
    --no-lookup and --compare-drafter in a race are refused."""
    target, drafter = (str(d) for d in oracle_dirs[:2])
    base = ["--target", target, "--prompt", "hi", "--raw", "--max-tokens", "3"]
    assert cli(["generate", *base, "--mode", "ar", "--drafter", drafter, "--draft-model", target, "--num-draft", "2",
                "--lookup", "--block-size", "4"]) == 0
    err = capsys.readouterr().err
    for flag in ("--draft-model", "--num-draft", "--lookup/--no-lookup", "--drafter", "--block-size"):
        assert f"note: {flag} is not used" in err, flag
    assert cli(["generate", *base, "--mode", "lookup", "--draft-window", "8", "--draft-sink", "2"]) == 0
    assert "note: --draft-window/--draft-sink is not used" in capsys.readouterr().err
    assert cli(["generate", *base, "--mode", "draft-model", "--draft-model", target, "--num-draft", "2",
                "--block-size", "4"]) == 0
    assert capsys.readouterr().err.count("note:") == 1  # the block: a draft model drafts --num-draft a round
    assert cli(["generate", *base, "--mode", "dflash", "--drafter", drafter, "--num-draft", "2"]) == 0
    assert "note: --num-draft is not used: only --mode draft-model takes it" in capsys.readouterr().err
    assert cli(["generate", *base, "--mode", "dflash", "--drafter", drafter, "--no-lookup"]) == 0
    assert "note:" not in capsys.readouterr().err  # everything given was used
    assert cli(["generate", *base, "--mode", "lookup", "--no-lookup"]) == 2
    assert "--no-lookup contradicts it" in capsys.readouterr().err
    assert cli(["parity", *base, "--drafter", drafter, "--draft-model", target]) == 0
    err = capsys.readouterr().err  # parity has no --mode: it points to the commands that run a draft model
    assert "note: --draft-model is not used: this command runs DFlash against AR; generate --mode draft-model" in err
    assert "bench --methods ar,draft-model" in err
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    bench = ["bench", "--target", target, "--drafter", drafter, "--prompts", str(prompts), "--max-tokens", "3",
             "--raw", "--json"]
    assert cli([*bench, "--methods", "ar,lookup", "--num-draft", "5", "--no-lookup"]) == 0
    captured = capsys.readouterr()
    report, err = json.loads(captured.out), captured.err
    assert (report["target"], report["drafter"]) == (target, drafter) and report["rollback"] == "replay"
    assert "the draft-model method in --methods takes it" in err and "each method says whether it looks up" in err
    assert cli([*bench, "--methods", "ar,lookup", "--compare-drafter", drafter]) == 2
    assert "--compare-drafter belongs to the plain bench" in capsys.readouterr().err


def test_a_drafter_or_broken_weights_as_the_draft_model_get_their_own_sentence(qwen3_pair, qwen3_tied_dirs,
                                                                               tmp_path):
    """mlx-lm's load error called either 'this target' (a DFlash drafter's 25 extra parameters, or the
    raw safetensors header error)."""
    import shutil

    from engine.errors import CheckpointError

    with pytest.raises(IncompatiblePairError, match="this is a DFlash drafter, not a draft model"):
        run(qwen3_pair, [5, 6, 7], mode="draft-model", draft_model=str(qwen3_tied_dirs[1]), max_tokens=4)
    broken = tmp_path / "broken"
    shutil.copytree(qwen3_tied_dirs[0], broken)
    (broken / "model.safetensors").write_bytes((broken / "model.safetensors").read_bytes()[:5000])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        run(qwen3_pair, [5, 6, 7], mode="draft-model", draft_model=str(broken), max_tokens=4)
    # A folder without weights or tokenizer is named the draft model, not the target (the user would look there).
    (broken / "model.safetensors").unlink()
    with pytest.raises(DFlashError, match="no \\*.safetensors weights in the draft model folder"):
        run(qwen3_pair, [5, 6, 7], mode="draft-model", draft_model=str(broken), max_tokens=4)
    shutil.copy(qwen3_tied_dirs[0] / "model.safetensors", broken)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (broken / name).unlink(missing_ok=True)
    with pytest.raises(DFlashError, match="the draft model cannot read a prompt"):
        run(qwen3_pair, [5, 6, 7], mode="draft-model", draft_model=str(broken), max_tokens=4)
