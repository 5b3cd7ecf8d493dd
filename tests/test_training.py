"""train-drafter: the loss falls, resume equals an uninterrupted run, and the result loads and runs."""

import json
from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest

from app.cli import main as cli
from engine.models.drafter import DFlashDrafter
from engine.models.drafter_config import parse_drafter_config
from engine.errors import DFlashError
from engine.decode.settings import GenerationSettings
from engine.tools.parity import run_parity
from engine.decode.prompts import encode_prompt
from engine.models.pair import load_pair
from fixtures.tiny_models import drafter_config_dict
from engine.training.data import read_texts, token_stream
from engine.training.trainer import DrafterTrainer

from helpers import PROMPTS, SMALL_TRAINING as SMALL, make_trainer

@pytest.mark.parametrize("layer_types, window", [(["full_attention"] * 2, None),
                                                  (["sliding_attention", "full_attention"], 6)])
def test_training_forward_matches_inference(qwen3_pair, layer_types, window):
    """A block trained at anchor p sees exactly what inference shows it at p."""
    t = qwen3_pair.target_config
    raw = drafter_config_dict(t, 1, layers=2, block_size=8, layer_types=layer_types, sliding_window=window)
    cfg = parse_drafter_config(raw, "config.json")
    mx.random.seed(3)
    drafter = DFlashDrafter(cfg)
    S, L = 20, 8
    taps = mx.random.normal((1, S, cfg.num_taps * cfg.hidden_size))
    anchors = mx.array([[3, 11]])
    blocks = mx.random.normal((1, 2, L, cfg.hidden_size))
    trained = drafter.forward_blocks(blocks, taps, anchors)
    for j, p in enumerate([3, 11]):
        cache = drafter.make_cache()
        inferred = drafter(blocks[:, j], taps[:, :p], cache, p)
        assert mx.allclose(trained[:, j], inferred, atol=1e-4).item(), (layer_types, p)


def test_loss_falls(qwen3_tied_dirs, corpus_dir, tmp_path):
    trainer = make_trainer(qwen3_tied_dirs[0], corpus_dir, tmp_path / "d", replace(SMALL, steps=30, eval_every=30))
    before = trainer.evaluate()["eval_loss"]
    trainer.run(checkpoint_every=100)
    after = trainer.evaluate()["eval_loss"]
    assert after < before - 0.5, (before, after)


def test_resume_equals_uninterrupted(qwen3_tied_dirs, corpus_dir, tmp_path):
    straight = make_trainer(qwen3_tied_dirs[0], corpus_dir, tmp_path / "a", SMALL)
    straight.run(checkpoint_every=100)

    first = make_trainer(qwen3_tied_dirs[0], corpus_dir, tmp_path / "b", SMALL)
    first.run(checkpoint_every=3, should_stop=lambda: first.step >= 3)  # stopped after step 3
    resumed = make_trainer(qwen3_tied_dirs[0], corpus_dir, tmp_path / "b", SMALL)
    assert resumed.resume() and resumed.step == 3
    resumed.run(checkpoint_every=100)

    a = mx.load(str(tmp_path / "a" / "model.safetensors"))
    b = mx.load(str(tmp_path / "b" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert mx.array_equal(a[k], b[k]).item(), k


def test_resume_refuses_other_settings(qwen3_tied_dirs, corpus_dir, tmp_path):
    t = make_trainer(qwen3_tied_dirs[0], corpus_dir, tmp_path / "c", SMALL)
    t.run(checkpoint_every=3, should_stop=lambda: t.step >= 3)
    other = make_trainer(qwen3_tied_dirs[0], corpus_dir, tmp_path / "c", replace(SMALL, batch=3, seq_len=32))
    with pytest.raises(DFlashError) as info:  # every difference at once (one per try, before), with its flags
        other.resume()
    said = str(info.value)
    assert f"made with batch=2, seq_len={SMALL.seq_len} (this command: batch=3, seq_len=32)" in said
    assert f"(--batch 2 --seq-len {SMALL.seq_len})" in said


def test_resume_refuses_other_text(qwen3_tied_dirs, qwen3_target, corpus_dir, tmp_path):
    """A checkpoint resumed on other text would mix two runs without a word."""
    t = make_trainer(qwen3_tied_dirs[0], corpus_dir, tmp_path / "c", SMALL)
    t.run(checkpoint_every=3, should_stop=lambda: t.step >= 3)
    tokenizer = qwen3_target.tokenizer
    tokens = token_stream(tokenizer, read_texts([str(corpus_dir)]), tokenizer.eos_token_id)
    other = DrafterTrainer(load_pair(qwen3_tied_dirs[0], None), tokens[:-7], tmp_path / "c", SMALL)
    with pytest.raises(DFlashError, match="trained on other text"):
        other.resume()
    assert make_trainer(qwen3_tied_dirs[0], corpus_dir, tmp_path / "c", SMALL).resume()


def test_sigterm_saves_a_checkpoint_as_ctrl_c_does(qwen3_tied_dirs, corpus_dir, tmp_path):
    """A closed terminal (SIGHUP) or a kill (SIGTERM) ends training after the step, with a checkpoint."""
    import os
    import signal

    t = make_trainer(qwen3_tied_dirs[0], corpus_dir, tmp_path / "k", SMALL)
    before = signal.getsignal(signal.SIGTERM)

    def kill_at_two(step, loss):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(KeyboardInterrupt):
        t.run(checkpoint_every=100, on_step=kill_at_two)
    assert json.loads((tmp_path / "k" / "checkpoint" / "state.json").read_text())["step"] == 2
    assert signal.getsignal(signal.SIGTERM) == before  # put back as it was

    # under nohup (SIGHUP ignored) a closed terminal does not end the run
    hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        t = make_trainer(qwen3_tied_dirs[0], corpus_dir, tmp_path / "n", SMALL)
        t.run(checkpoint_every=100, on_step=lambda step, loss: step == 2 and os.kill(os.getpid(), signal.SIGHUP))
        assert t.step == SMALL.steps and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, hup)


def test_cli_trains_a_drafter_that_passes_doctor_and_runs(qwen3_tied_dirs, corpus_dir, tmp_path, capsys):
    out = tmp_path / "drafter"
    code = cli(["train-drafter", "--target", str(qwen3_tied_dirs[0]), "--data", str(corpus_dir),
                "--out", str(out), "--steps", "4", "--batch", "2", "--seq-len", "48", "--block-size", "8",
                "--eval-every", "2", "--checkpoint-every", "2"])
    assert code == 0
    config = json.loads((out / "config.json").read_text())
    assert config["dflash_config"]["block_size"] == 8 and config["block_size"] == 8
    record = json.loads((out / "train_drafter.json").read_text())
    assert record["final"]["step"] == 4 and record["data"]["train_tokens"] > 0
    printed = capsys.readouterr()
    assert "Token indices sequence length" not in printed.err  # the corpus is one long text: no windows run whole
    # steps 2 and 4: an eval line names a checkpoint only where one was written
    assert (printed.out + printed.err).count("(checkpoint in") == 2
    assert cli(["doctor", "--target", str(qwen3_tied_dirs[0]), "--drafter", str(out)]) == 0
    # 4 steps on a small corpus: too few for DFlash to pay, and the doctor says so
    assert record["final"]["tau_estimate"] < 2 and "barely trained" in capsys.readouterr().out
    # bench says when almost nothing was accepted (the table's speedups are then not the drafter's doing)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": PROMPTS[0]}) + "\n")
    bench = ["bench", "--target", str(qwen3_tied_dirs[0]), "--drafter", str(out), "--prompts", str(prompts),
             "--max-tokens", "12", "--block-size", "4", "--raw"]
    assert cli(bench + ["--json"]) == 0
    tau = json.loads(capsys.readouterr().out)["mean_acceptance_length"]
    assert cli(bench) == 0
    assert ("almost no drafts were accepted" in capsys.readouterr().out) == (tau < 1.05)
    assert cli(["train-drafter", "--target", str(qwen3_tied_dirs[0]), "--data", str(corpus_dir),
                "--out", str(out), "--steps", "4"]) == 2
    assert "--resume" in capsys.readouterr().err
    pair = load_pair(qwen3_tied_dirs[0], out)
    ids = encode_prompt(pair.tokenizer, PROMPTS[0], chat=False)
    result = run_parity(pair, ids, GenerationSettings(max_tokens=24))
    assert result.dflash.num_generated == 24


def test_data_formats(tmp_path):
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "beta"}) + "\n" + json.dumps({"text": "gamma"}) + "\n")
    assert read_texts([str(tmp_path)]) == ["alpha", "beta", "gamma"]
    (tmp_path / "c.jsonl").write_text('{"body": 1}\n')
    with pytest.raises(DFlashError, match="'text'"):
        read_texts([str(tmp_path / "c.jsonl")])
    with pytest.raises(DFlashError, match="no such file"):
        read_texts([str(tmp_path / "missing")])


def test_data_folders_leave_out_hidden_vendor_and_output_folders(tmp_path):
    """`--data .` in a project: its .venv, node_modules and caches are not its text, and the run's own
    --out inside it (checkpoints, config) became training text, so a resumed run found its text
    changed and could never go on (QA pass)."""
    from engine.training.data import data_files

    (tmp_path / "mine.py").write_text("def mine(): pass\n")
    for folder in (".venv/lib", "node_modules/x", "pkg/__pycache__", "drafter/checkpoint", ".git"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "junk.py").write_text("junk = 1\n")
    (tmp_path / "drafter" / "config.json").write_text("{}")
    files, skipped = data_files([str(tmp_path)], exclude=(tmp_path / "drafter",))
    assert files == [tmp_path / "mine.py"] and skipped == 6
    assert read_texts([str(tmp_path)], exclude=(tmp_path / "drafter",)) == ["def mine(): pass\n"]
    (tmp_path / "mine.py").unlink()
    with pytest.raises(DFlashError, match="outside hidden folders"):
        read_texts([str(tmp_path)], exclude=(tmp_path / "drafter",))


def test_trained_drafter_partial_accepts_stay_lossless(qwen3_tied_dirs, corpus_dir, tmp_path):
    """A drafter trained on the target accepts some drafts: partial accepts must keep parity."""
    settings = replace(SMALL, block_size=8, steps=120, batch=4, seq_len=64, lr=5e-3, warmup=10, eval_every=1000)
    trainer = make_trainer(qwen3_tied_dirs[0], corpus_dir, tmp_path / "trained", settings)
    trainer.run(checkpoint_every=1000)
    pair = load_pair(qwen3_tied_dirs[0], tmp_path / "trained")
    partial = 0
    for prompt in PROMPTS:
        ids = encode_prompt(pair.tokenizer, prompt, chat=False)
        rounds = []
        result = run_parity(pair, ids, GenerationSettings(max_tokens=48),
                            on_event=lambda e: rounds.append(e) if e.type == "round" else None)
        assert result.identical or result.margin_at_divergence < result.near_tie, result.to_dict()
        partial += sum(0 < r.accepted < len(r.drafted) for r in rounds)
    assert partial > 0  # the test must exercise partial accepts, or it proves nothing


def _ar_tokens(pair, prompt_ids, n):
    from engine.decode.generate import generate

    settings = GenerationSettings(mode="ar", max_tokens=n)
    return [t for e in generate(pair, prompt_ids, settings) if e.type == "text" for t in e.token_ids]


def _rows(stream, eos):
    ends = np.flatnonzero(stream == eos)
    return np.split(stream, ends[:-1] + 1)


@pytest.fixture(scope="module")
def hybrid_target_pair(models_root, tokenizer_dir):
    from fixtures.tiny_hybrid import write_hybrid_target

    target = models_root / "distill-hybrid-target"
    if not target.exists():
        write_hybrid_target(target, tokenizer_dir, "qwen3_5", seed=7)
    return load_pair(target, None)


def test_distillation_reports_progress_within_a_batch(qwen3_pair, corpus_dir):
    """A batch of rows takes minutes on a real target: the bar moves as its tokens are written, and the
    rows are the same as without a progress report."""
    from engine.training.distill import PROGRESS_EVERY, greedy_continuations

    eos = qwen3_pair.tokenizer.eos_token_id
    tokens = token_stream(qwen3_pair.tokenizer, read_texts([str(corpus_dir)]), eos)
    seen = []
    args = dict(new_tokens=4 * PROGRESS_EVERY, batch=8, seed=1)
    stream = greedy_continuations(qwen3_pair, tokens, 6, progress=lambda done, total: seen.append((done, total)),
                                  **args)
    assert np.array_equal(stream, greedy_continuations(qwen3_pair, tokens, 6, **args))
    within = [done for done, total in seen if done < 6]
    assert len(within) == 3 and within == sorted(within) and 0 < within[0] < 6  # one batch: 6 rows, 4 reports
    assert seen[-1] == (6, 6) and all(total == 6 for _, total in seen)


@pytest.mark.parametrize("which", ["qwen3", "qwen3_5 hybrid"])
def test_distilled_rows_are_the_targets_own_greedy_continuations(which, request, corpus_dir):
    """Batched decoding (attention and GatedDeltaNet caches) writes what AR generate writes."""
    from engine.training.distill import greedy_continuations

    pair = request.getfixturevalue("qwen3_pair" if which == "qwen3" else "hybrid_target_pair")
    eos = pair.tokenizer.eos_token_id
    tokens = token_stream(pair.tokenizer, read_texts([str(corpus_dir)]), eos)
    tokens = tokens[tokens != eos]  # so that the only EOS in a row is the one that ends it
    prompt_len, new = 12, 20
    stream = greedy_continuations(pair, tokens, 5, prompt_lens=(prompt_len, prompt_len), new_tokens=new, batch=2)
    rows = _rows(stream, eos)
    assert len(rows) == 5
    text = tokens.tobytes()
    for row in rows:
        prompt, gen = row[:prompt_len], row[prompt_len:-1]
        assert row[-1] == eos and prompt.tobytes() in text  # a window of the data
        expected = _ar_tokens(pair, prompt.tolist(), new)
        if eos in expected:
            expected = expected[: expected.index(eos)]
        assert gen.tolist() == expected


def test_distillation_is_seeded_and_cached(qwen3_pair, corpus_dir, tmp_path):
    from engine.training.distill import cached_continuations

    pair = qwen3_pair
    tokens = token_stream(pair.tokenizer, read_texts([str(corpus_dir)]), pair.tokenizer.eos_token_id)
    cache = tmp_path / "distill.npy"
    first = cached_continuations(pair, tokens, cache, 3, new_tokens=8, seed=1)
    np.save(cache, first[::-1])  # a cache hit must return the file, not generate again
    assert np.array_equal(cached_continuations(pair, tokens, cache, 3, new_tokens=8, seed=1), first[::-1])
    again = cached_continuations(pair, tokens, cache, 3, new_tokens=8, seed=2)  # other settings: regenerate
    assert not np.array_equal(again, first[::-1])
    assert np.array_equal(cached_continuations(pair, tokens, tmp_path / "b.npy", 3, new_tokens=8, seed=2), again)


def test_the_distillation_batch_is_a_setting(qwen3_pair, corpus_dir, tmp_path, monkeypatch):
    """`batch` sets how many rows decode together (a GPU recipe run passes 1,024): here one row at a time,
    so each of the 4 prompts is its own batch, and the rows are those of one batch of all four."""
    import engine.training.distill as distill

    pair = qwen3_pair
    tokens = token_stream(pair.tokenizer, read_texts([str(corpus_dir)]), pair.tokenizer.eos_token_id)
    prompts = [tokens[i: i + 6].tolist() for i in range(0, 24, 6)]
    together = distill.cached_prompt_continuations(pair, prompts, tmp_path / "a.npy", new_tokens=8)
    batches = []
    real_rows = distill._rows
    monkeypatch.setattr(distill, "_rows", lambda pair, p, *a, **k: batches.append(len(p)) or real_rows(pair, p, *a, **k))
    alone = distill.cached_prompt_continuations(pair, prompts, tmp_path / "b.npy", new_tokens=8, batch=1)
    assert batches == [1, 1, 1, 1] and np.array_equal(alone, together)


@pytest.mark.parametrize("kind", ["windows", "prompts"])
def test_a_stopped_distillation_goes_on_from_its_finished_batches(qwen3_pair, corpus_dir, tmp_path, monkeypatch, kind):
    """Ctrl-C in the third batch: the two finished batches are kept beside the cache and not written again,
    and the stream is the one an unstopped run writes."""
    import engine.training.distill as distill

    pair = qwen3_pair
    tokens = token_stream(pair.tokenizer, read_texts([str(corpus_dir)]), pair.tokenizer.eos_token_id)
    prompts = [tokens[i: i + 5 + i % 3].tolist() for i in range(0, 60, 6)]  # lengths 5-7: batches by length
    monkeypatch.setattr(distill, "DISTILL_BATCH", 2)

    def make(cache, progress=None):
        if kind == "windows":
            return distill.cached_continuations(pair, tokens, cache, 7, new_tokens=8, seed=3, progress=progress)
        return distill.cached_prompt_continuations(pair, prompts, cache, new_tokens=8, progress=progress)

    whole = make(tmp_path / "whole.npy")
    batches = []
    real_rows = distill._rows

    def counted(pair, prompts, new_tokens, on_progress=None):
        batches.append(len(prompts))
        if len(batches) == 3:
            raise KeyboardInterrupt
        return real_rows(pair, prompts, new_tokens, on_progress)

    monkeypatch.setattr(distill, "_rows", counted)
    cache = tmp_path / "distill.npy"
    with pytest.raises(KeyboardInterrupt):
        make(cache)
    assert not cache.exists() and (tmp_path / "distill.npy.partial.npz").exists()
    assert len(batches) == 3  # two batches finished, the third stopped
    written = []
    monkeypatch.setattr(distill, "_rows", lambda *a, **k: written.append(1) or real_rows(*a, **k))
    again = make(cache)
    assert np.array_equal(again, whole)
    whole_batches = len(written)
    written.clear()
    make(tmp_path / "fresh.npy")  # an unstopped run of the same description, for the count
    assert whole_batches == len(written) - 2  # the two kept batches were not written again
    assert not (tmp_path / "distill.npy.partial.npz").exists()  # gone once the cache is whole


def test_distillation_cache_of_another_target_is_not_reused(qwen3_pair, corpus_dir, tmp_path):
    """A run folder reused after the target was retrained must distil again, not train the drafter on
    the old target's text (the settings alone match)."""
    import dataclasses
    import shutil

    import mlx.core as mx

    from engine.models.checkpoint import target_fingerprint
    from engine.training.distill import cached_continuations

    pair = qwen3_pair
    same, other = tmp_path / "same", tmp_path / "other"
    shutil.copytree(pair.target_path, same)
    shutil.copytree(pair.target_path, other)
    weights = mx.load(str(other / "model.safetensors"))
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1
    mx.save_safetensors(str(other / "model.safetensors"), weights)
    assert target_fingerprint(same) == target_fingerprint(pair.target_path) != target_fingerprint(other)

    # Large weights are sampled, not read whole: a change to a middle tensor alone still shows.
    big = tmp_path / "big"
    big.mkdir()
    tensors = {"a": mx.zeros((1 << 20,)), "b": mx.zeros((1 << 20,)), "c": mx.zeros((1 << 20,))}
    mx.save_safetensors(str(big / "model.safetensors"), tensors)
    before = target_fingerprint(big)
    mx.save_safetensors(str(big / "model.safetensors"), {**tensors, "b": tensors["b"] + 1})
    assert target_fingerprint(big) != before
    with pytest.raises(DFlashError, match="no .safetensors"):
        target_fingerprint(tmp_path)

    tokens = token_stream(pair.tokenizer, read_texts([str(corpus_dir)]), pair.tokenizer.eos_token_id)
    cache = tmp_path / "distill.npy"
    first = cached_continuations(pair, tokens, cache, 3, new_tokens=8, seed=1)
    np.save(cache, first[::-1])
    assert np.array_equal(cached_continuations(dataclasses.replace(pair, target_path=same), tokens, cache, 3,
                                               new_tokens=8, seed=1), first[::-1])  # the same weights: a hit
    retrained = dataclasses.replace(pair, target_path=other)  # (the weights in memory stand in for the new ones)
    assert np.array_equal(cached_continuations(retrained, tokens, cache, 3, new_tokens=8, seed=1), first)


def test_cli_distill_trains_on_the_targets_text(qwen3_tied_dirs, corpus_dir, tmp_path, capsys):
    out = tmp_path / "distilled"
    args = ["train-drafter", "--target", str(qwen3_tied_dirs[0]), "--data", str(corpus_dir), "--out", str(out),
            "--steps", "2", "--batch", "2", "--seq-len", "32", "--block-size", "8", "--eval-every", "2"]
    assert cli(args + ["--distill", "-1"]) == 2
    assert "--distill" in capsys.readouterr().err
    assert cli(args + ["--distill", "6", "--distill-new-tokens", "24"]) == 0
    assert np.load(out / "distill.npy").size > 6 * 24 // 2
    assert cli(["doctor", "--target", str(qwen3_tied_dirs[0]), "--drafter", str(out)]) == 0


def test_prompt_continuations_keep_order_and_match_ar(qwen3_pair, tmp_path):
    """Prompts of mixed lengths decode in length groups, yet each row is its own prompt's AR output."""
    from engine.training.distill import cached_prompt_continuations, prompt_continuations

    pair = qwen3_pair
    eos = pair.tokenizer.eos_token_id
    texts = ["def f(x):\n", "class Stack:\n    def push(self, item):\n", "import os\n", "def g():\n    return 1\n"]
    prompts = [encode_prompt(pair.tokenizer, t, chat=False) for t in texts]
    assert len({len(p) for p in prompts}) > 1
    new = 16
    stream = prompt_continuations(pair, prompts, new_tokens=new, batch=2)
    rows = _rows(stream, eos)
    assert len(rows) == len(prompts)
    for prompt, row in zip(prompts, rows):
        assert row[: len(prompt)].tolist() == prompt
        expected = _ar_tokens(pair, prompt, new)
        if eos in expected:
            expected = expected[: expected.index(eos)]
        assert row[len(prompt) : -1].tolist() == expected

    cache = tmp_path / "p.npy"
    first = cached_prompt_continuations(pair, prompts, cache, new_tokens=new)
    assert np.array_equal(first, stream)
    np.save(cache, first[::-1])  # a hit returns the file
    assert np.array_equal(cached_prompt_continuations(pair, prompts, cache, new_tokens=new), first[::-1])
    other = cached_prompt_continuations(pair, prompts[:2], cache, new_tokens=new)  # other prompts: regenerate
    assert len(_rows(other, eos)) == 2


def test_init_fine_tunes_the_given_drafter(qwen3_tied_dirs, corpus_dir, tmp_path):
    """--init starts from the drafter's own weights and architecture, and rejects one that does not fit."""
    start = tmp_path / "start"
    make_trainer(qwen3_tied_dirs[0], corpus_dir, start, SMALL).run(checkpoint_every=100)
    fresh = make_trainer(qwen3_tied_dirs[0], corpus_dir, tmp_path / "fresh", replace(SMALL, block_size=16))
    tuned = make_trainer(qwen3_tied_dirs[0], corpus_dir, tmp_path / "tuned",
                         replace(SMALL, block_size=16, layers=3, init=str(start)))
    assert tuned.s.block_size == SMALL.block_size and tuned.s.layers == 1  # the drafter's, not the settings'
    assert tuned.evaluate() == make_trainer(qwen3_tied_dirs[0], corpus_dir, tmp_path / "again",
                                            replace(SMALL, init=str(start))).evaluate()
    assert tuned.evaluate()["eval_loss"] < fresh.evaluate()["eval_loss"] - 0.3  # trained weights, not random
    tuned.run(checkpoint_every=100)
    assert cli(["doctor", "--target", str(qwen3_tied_dirs[0]), "--drafter", str(tmp_path / "tuned")]) == 0

    wrong = tmp_path / "wrong"
    wrong.mkdir()
    for f in start.iterdir():
        if f.is_file():
            (wrong / f.name).write_bytes(f.read_bytes())
    config = json.loads((wrong / "config.json").read_text())
    config["hidden_size"] = 32
    (wrong / "config.json").write_text(json.dumps(config))
    with pytest.raises(DFlashError, match="--init .*wrong.*has shape"):
        make_trainer(qwen3_tied_dirs[0], corpus_dir, tmp_path / "w", replace(SMALL, init=str(wrong)))


def test_cli_fine_tunes_on_prompts_shaped_like_use(qwen3_tied_dirs, corpus_dir, tmp_path, capsys):
    target, drafter = qwen3_tied_dirs
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    out = tmp_path / "tuned"
    args = ["train-drafter", "--target", str(target), "--data", str(corpus_dir), "--out", str(out), "--init",
            str(drafter), "--steps", "2", "--batch", "2", "--seq-len", "32", "--eval-every", "2"]
    assert cli(args + ["--layers", "2"]) == 2
    assert "--layers cannot be combined with --init" in capsys.readouterr().err
    assert cli(args + ["--distill-prompts", str(prompts), "--distill-new-tokens", "12"]) == 0
    written = np.load(out / "distill_prompts.npy")
    tokenizer = load_pair(target, None).tokenizer
    corpus = token_stream(tokenizer, read_texts([str(corpus_dir)]), tokenizer.eos_token_id)
    # the continuations are added to the corpus (they replaced it, silently: 182 tokens to train on)
    assert f"training text: --data ({len(corpus):,} tokens) + the target's continuations of {len(PROMPTS)} " \
           f"--distill-prompts ({len(written):,} tokens)" in capsys.readouterr().err
    assert len(_rows(written, tokenizer.eos_token_id)) == len(PROMPTS)
    assert json.loads((out / "config.json").read_text()) == json.loads((drafter / "config.json").read_text())
    assert cli(["doctor", "--target", str(target), "--drafter", str(out)]) == 0


def test_resume_takes_the_newest_whole_checkpoint(qwen3_tied_dirs, corpus_dir, tmp_path):
    """Killed between writing checkpoint.tmp and renaming it: the finished newer one is used; a
    checkpoint.tmp cut short is passed over for the whole one beside it."""
    import shutil

    out = tmp_path / "d"
    t = make_trainer(qwen3_tied_dirs[0], corpus_dir, out, SMALL)
    t.run(checkpoint_every=3, should_stop=lambda: t.step >= 3)  # checkpoint at step 3
    newer = make_trainer(qwen3_tied_dirs[0], corpus_dir, out, SMALL)
    assert newer.resume() and newer.step == 3
    newer.run(checkpoint_every=100, should_stop=lambda: newer.step >= 5)  # checkpoint at step 5
    shutil.copytree(out / "checkpoint", out / "checkpoint.tmp")  # step 5, finished but not renamed
    shutil.rmtree(out / "checkpoint")
    shutil.copytree(tmp_path / "d" / "checkpoint.tmp", out / "checkpoint")
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    state["step"] = 3
    (out / "checkpoint" / "state.json").write_text(json.dumps(state))
    again = make_trainer(qwen3_tied_dirs[0], corpus_dir, out, SMALL)
    assert again.resume() and again.step == 5
    (out / "checkpoint.tmp" / "state.json").write_text('{"step": 7, "sett')  # torn
    last = make_trainer(qwen3_tied_dirs[0], corpus_dir, out, SMALL)
    assert last.resume() and last.step == 3


def test_a_models_name_is_its_hub_id_in_the_cache(tmp_path):
    from engine.models.checkpoint import model_name

    assert model_name(tmp_path / "hub" / "models--Qwen--Qwen3-4B" / "snapshots" / "0123abcd") == "Qwen/Qwen3-4B"
    assert model_name(tmp_path / "demo-target") == "demo-target"


def test_a_step_larger_than_the_training_text_is_refused(qwen3_tied_dirs, qwen3_target, corpus_dir, tmp_path):
    """--batch 100000 was killed by the kernel for memory without a word, and --batch 1000 took 6.8 GB
    and 150 s a step for more tokens a step than the whole text (QA pass)."""
    tokens = len(token_stream(qwen3_target.tokenizer, read_texts([str(corpus_dir)]), 0))
    huge = tokens // SMALL.seq_len + 1
    with pytest.raises(DFlashError, match=f"--batch {huge} x --seq-len {SMALL.seq_len} is .* tokens a step, more than"):
        make_trainer(qwen3_tied_dirs[0], corpus_dir, tmp_path / "d", replace(SMALL, batch=huge))
