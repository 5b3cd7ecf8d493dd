"""The demo-model recipes rebuild from their own defaults.

Each recipe is a script with its own argument parser but shares the data step
(corpus, tokenizer, token streams) with the dense target recipe. A setting the
shared step reads and a recipe's parser lacks only shows up hours into a
rebuild, so this runs that step for every recipe on a tiny corpus.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

RECIPE_DIR = Path(__file__).resolve().parents[1] / "resources" / "models" / "recipe"
sys.path.insert(0, str(RECIPE_DIR))

import build_demo_draft_model  # noqa: E402
import build_demo_hybrid  # noqa: E402
import build_demo_target  # noqa: E402

TRAIN = [(f"pkg/mod{i}.py", f"def f{i}(x):\n    return x + {i}\n\n\nclass C{i}:\n    pass\n") for i in range(40)]
HELD = [("pkg/held.py", "def held(y):\n    return y * 2\n")]


@pytest.mark.parametrize("recipe", [build_demo_target, build_demo_hybrid, build_demo_draft_model],
                         ids=["dense", "hybrid", "draft-model"])
def test_recipe_prepares_its_data_from_its_own_defaults(recipe, tmp_path, monkeypatch):
    monkeypatch.setattr(build_demo_target.corpus, "load_corpus", lambda: (TRAIN, HELD))
    # a few synthetic modules, not the default 20,000: the data step reads the setting all the same
    args = recipe.parse_args(["--vocab-size", "320", "--synthetic-modules", "5", "--run-dir", str(tmp_path)])

    data = build_demo_target.prepare_data(args, tmp_path)

    meta = json.loads((tmp_path / "data.json").read_text())
    assert meta["split"] == args.split
    assert meta["train_files"] == len(TRAIN)
    assert data["train_ids"].size == meta["train_tokens"] > 0
    assert meta["synthetic_modules"] == 5 and data["synth_ids"].size == meta["synthetic_tokens"] > 0
    assert (tmp_path / "tokenizer" / "tokenizer.json").exists()


def test_resume_reuses_the_cached_token_streams(tmp_path, monkeypatch):
    monkeypatch.setattr(build_demo_target.corpus, "load_corpus", lambda: (TRAIN, HELD))
    args = build_demo_target.parse_args(["--vocab-size", "320", "--synthetic-modules", "5"])
    first = build_demo_target.prepare_data(args, tmp_path)

    def no_corpus():
        raise AssertionError("a resumed run must not re-read the corpus")

    monkeypatch.setattr(build_demo_target.corpus, "load_corpus", no_corpus)
    args = build_demo_target.parse_args(["--vocab-size", "320", "--synthetic-modules", "5", "--resume"])
    again = build_demo_target.prepare_data(args, tmp_path)
    assert (again["train_ids"] == first["train_ids"]).all()


def test_a_run_that_continues_a_model_takes_its_tokenizer_instead_of_training_one(tmp_path, monkeypatch):
    """Continuing or distilling a model needs its token ids, whatever the tokenizer trainer would make on
    this machine (another Python, another tokenizers release)."""
    monkeypatch.setattr(build_demo_target.corpus, "load_corpus", lambda: (TRAIN, HELD))
    args = build_demo_target.parse_args(["--vocab-size", "320", "--synthetic-modules", "5"])
    first = build_demo_target.prepare_data(args, tmp_path / "first")
    model = tmp_path / "model"
    model.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).write_bytes((first["tok_dir"] / name).read_bytes())

    def no_training(*_args, **_kwargs):
        raise AssertionError("a run given a model's tokenizer must not train one")

    monkeypatch.setattr(build_demo_target, "train_bpe_tokenizer", no_training)
    again = build_demo_target.prepare_data(args, tmp_path / "again", tokenizer_from=model)
    assert (again["tok_dir"] / "tokenizer.json").read_bytes() == (model / "tokenizer.json").read_bytes()
    assert again["special_ids"] == first["special_ids"] and (again["train_ids"] == first["train_ids"]).all()
    assert json.loads((tmp_path / "again" / "data.json").read_text())["tokenizer_from"] == str(model)

    # The card names the pre-split the copied tokenizer has, not this run's --split.
    other_split = "gpt2" if args.split == "qwen2" else "qwen2"
    assert first["split"] == args.split and build_demo_target.split_of(model / "tokenizer.json") == args.split
    args_other = build_demo_target.parse_args(["--vocab-size", "320", "--synthetic-modules", "5", "--split", other_split])
    assert build_demo_target.prepare_data(args_other, tmp_path / "fourth", tokenizer_from=model)["split"] == args.split

    # A resumed run folder whose cached tokenizer is another one's stops instead of training on the wrong ids.
    resumed = build_demo_target.parse_args(["--vocab-size", "320", "--synthetic-modules", "5", "--resume"])
    assert build_demo_target.prepare_data(resumed, tmp_path / "again", tokenizer_from=model)["special_ids"]
    (tmp_path / "again" / "tokenizer" / "tokenizer.json").write_text("{}")
    with pytest.raises(SystemExit, match="cached tokenizer is not"):
        build_demo_target.prepare_data(resumed, tmp_path / "again", tokenizer_from=model)

    (model / "tokenizer_config.json").unlink()
    with pytest.raises(SystemExit, match="no tokenizer_config.json"):
        build_demo_target.prepare_data(args, tmp_path / "third", tokenizer_from=model)


def test_the_corpus_can_come_from_a_copy_of_another_pythons_standard_library(tmp_path, monkeypatch):
    """A lent machine with another Python trains on the same files when pointed at a copy of them."""
    import corpus

    for rel in ("a.py", "pkg/b.py", "test/test_c.py", "site-packages/d.py") + corpus.HELD_OUT:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"x = {len(rel)}\n")
    monkeypatch.setenv(corpus.STDLIB_ENV, str(tmp_path))
    monkeypatch.setenv(corpus.VERSION_ENV, "3.11.7")
    train, held = corpus.load_corpus()
    assert [rel for rel, _ in train] == ["a.py", "pkg/b.py"] and len(held) == len(corpus.HELD_OUT)
    assert corpus.stdlib_dir() == tmp_path and corpus.python_version() == "3.11.7"
    monkeypatch.delenv(corpus.VERSION_ENV)
    with pytest.raises(SystemExit, match=corpus.VERSION_ENV):  # else the card would name the wrong Python
        corpus.python_version()
    monkeypatch.delenv(corpus.STDLIB_ENV)
    assert corpus.stdlib_dir() != tmp_path and corpus.python_version() == sys.version.split()[0]


def test_drafter_recipe_refuses_settings_it_cannot_run(tmp_path, capsys):
    import build_demo_drafter

    with pytest.raises(SystemExit):
        build_demo_drafter.parse_args(["--rebench", "--no-bench", "--target", "t", "--out", str(tmp_path)])
    assert "give one" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # it crashed at its first step's evaluation (a modulo by zero)
        build_demo_drafter.parse_args(["--eval-every", "0", "--target", "t", "--out", str(tmp_path)])
    assert "--eval-every must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_demo_drafter.parse_args(["--distill-batch", "0", "--target", "t", "--out", str(tmp_path)])
    assert "--distill-batch and --distill-bucket must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_demo_drafter.parse_args(["--distill-bucket", "0", "--target", "t", "--out", str(tmp_path)])
    assert "--distill-bucket must be at least 1" in capsys.readouterr().err


def test_bucketed_prompts_share_few_lengths_and_keep_their_starts():
    """--distill-bucket: prompts cut at the end to a multiple of the bucket decode in few batches
    (a hundred lengths of one prompt each held a lent GPU for minutes); a short one stays whole."""
    import build_demo_drafter

    prompts = [list(range(n)) for n in range(1, 60)]
    cut = build_demo_drafter.bucketed(prompts, 8)
    assert [len(c) for c in cut[:7]] == list(range(1, 8))  # shorter than a bucket: whole
    assert all(len(c) % 8 == 0 and c == p[: len(c)] and len(p) - len(c) < 8 for p, c in zip(prompts[7:], cut[7:]))
    assert len({len(c) for c in cut}) == 7 + 7 and build_demo_drafter.bucketed(prompts, 1) == prompts


def test_drafter_cards_give_the_step_time_of_each_stage_that_ran():
    """A drafter continued with --steps 0 has no stage 1; its card said '- and 0.03 s/step (stage by stage)'."""
    import build_demo_drafter

    assert build_demo_drafter.step_times([None, 0.03]) == "0.03 s/step (stage 2)"
    assert build_demo_drafter.step_times([3.9, 0.5]) == "3.90 s/step (stage 1) and 0.50 s/step (stage 2)"
    assert "resumed" in build_demo_drafter.step_times([None, None])


def test_cards_say_where_training_ran():
    import mlx.core as mx
    from train_device import training_device

    on_cpu = mx.default_device() == mx.cpu
    assert ("CPU" in training_device()) == on_cpu and ("backend" in training_device()) != on_cpu


def test_synthetic_functions_are_correct_python_for_every_draw():
    """Every task body, under every name, parameter list and hint style, passes its own tests."""
    import os

    import numpy as np
    from synthetic_code import render_function, synthetic_corpus
    from synthetic_tasks import TASKS

    for task in TASKS:
        for seed in range(8):
            for hints in (True, False):
                src, name = render_function(np.random.default_rng(seed), task, hints, doc_style=2)
                scope: dict = {"os": os}
                exec(src, scope)
                for call, expected in task["tests"]:
                    assert eval(call.format(f=name), scope) == eval(expected), f"{name}: {call}\n{src}"
    for module in synthetic_corpus(200, seed=0):
        compile(module, "<synthetic>", "exec")  # whole modules parse: imports, classes, tests, main blocks


def test_bench_prompts_are_not_in_the_training_text():
    """The demo pair's benchmark prompts appear nowhere in the text the target and drafter learn from."""
    from corpus import load_corpus
    from synthetic_code import synthetic_corpus

    prompts = [json.loads(line)["prompt"] for line in (RECIPE_DIR / "bench_prompts.jsonl").read_text().splitlines()]
    assert len(prompts) >= 30
    default_modules = build_demo_target.parse_args([]).synthetic_modules
    train, _ = load_corpus()
    text = "\0".join(synthetic_corpus(default_modules, seed=0)) + "\0" + "\0".join(t for _, t in train)
    assert [p for p in prompts if p in text] == []


def test_hybrid_recipe_trains_through_the_chunked_pass_and_loads_as_a_target(tmp_path, monkeypatch):
    """A few steps of the hybrid target's training loop (compiled, GatedDeltaNet layers on the
    chunked pass with its own VJP) write a checkpoint the engine loads as a hybrid target."""
    import math

    import kernels.gated_delta as gd
    from engine.models.gdn_tape import gdn_layers
    from engine.models.target import load_target

    monkeypatch.setattr(build_demo_target.corpus, "load_corpus", lambda: (TRAIN, HELD))
    monkeypatch.setattr(build_demo_target, "verify_and_sample", lambda *a, **k: [])
    calls = []
    chunked = gd.gated_delta_tape_chunked
    monkeypatch.setattr(gd, "gated_delta_tape_chunked", lambda *a: calls.append(1) or chunked(*a))
    out = tmp_path / "target"
    args = build_demo_hybrid.parse_args([
        "--vocab-size", "320", "--run-dir", str(tmp_path / "run"), "--out", str(out), "--steps", "3",
        "--batch-size", "2", "--seq-len", "16", "--hidden-size", "64", "--layers", "4", "--head-dim", "16",
        "--linear-head-dim", "16", "--intermediate-size", "128", "--synthetic-modules", "0", "--warmup", "1",
        "--log-every", "1"])
    report = build_demo_hybrid.train_target(args)
    assert calls  # the training forward took the chunked pass
    assert report["steps"] == 3 and math.isfinite(report["final_train_loss"])
    model, _, config = load_target(out)
    assert config["model_type"] == "qwen3_5" and len(list(gdn_layers(model))) == 3


def test_eos_after_text_ends_every_file_without_a_newline_before_its_eos(tmp_path, monkeypatch):
    """A newline token followed by EOS in training made the demo targets stop at the first token of
    prompts that end at a line end; --eos-after-text leaves none, and a resume must keep the setting."""
    from tokenizers import Tokenizer

    monkeypatch.setattr(build_demo_target.corpus, "load_corpus", lambda: (TRAIN, HELD))

    def before_eos(flags, run):
        args = build_demo_target.parse_args(["--vocab-size", "320", "--synthetic-modules", "5", *flags])
        data = build_demo_target.prepare_data(args, tmp_path / run)
        tok = Tokenizer.from_file(str(tmp_path / run / "tokenizer" / "tokenizer.json"))
        eos = data["special_ids"][build_demo_target.EOS_TOKEN]
        ids = [int(i) for i in data["train_ids"]] + [int(i) for i in data["synth_ids"]]
        return [tok.decode([ids[k - 1]]) for k in range(1, len(ids)) if ids[k] == eos]

    plain = before_eos([], "plain")
    assert any(t.endswith("\n") for t in plain)  # the corpus's files end in a newline
    trimmed = before_eos(["--eos-after-text"], "trimmed")
    assert len(trimmed) == len(plain) and all(t.rstrip() == t for t in trimmed)
    with pytest.raises(SystemExit, match="without --eos-after-text"):
        build_demo_target.prepare_data(
            build_demo_target.parse_args(["--vocab-size", "320", "--resume", "--eos-after-text"]), tmp_path / "plain")


def test_hybrid_recipe_continues_a_hybrid_target_from_all_its_weights(tmp_path, monkeypatch):
    from mlx.utils import tree_flatten

    monkeypatch.setattr(build_demo_target.corpus, "load_corpus", lambda: (TRAIN, HELD))
    monkeypatch.setattr(build_demo_target, "verify_and_sample", lambda *a, **k: [])
    small = ["--vocab-size", "320", "--steps", "2", "--batch-size", "2", "--seq-len", "16", "--hidden-size", "64",
             "--layers", "4", "--head-dim", "16", "--linear-head-dim", "16", "--intermediate-size", "128",
             "--synthetic-modules", "0", "--warmup", "1"]
    first = tmp_path / "first"
    build_demo_hybrid.train_target(build_demo_hybrid.parse_args(
        [*small, "--run-dir", str(tmp_path / "run1"), "--out", str(first)]))
    started = {}

    def no_training(args, model, batches, run_dir, rng):
        started.update(tree_flatten(model.parameters()))
        return 0.0, []

    monkeypatch.setattr(build_demo_target, "train_loop", no_training)
    build_demo_hybrid.train_target(build_demo_hybrid.parse_args(
        [*small, "--run-dir", str(tmp_path / "run2"), "--out", str(tmp_path / "second"), "--init-from", str(first)]))
    import mlx.core as mx

    saved = mx.load(str(first / "model.safetensors"))
    assert set(saved) == set(started) and all(mx.array_equal(saved[k], started[k]).item() for k in saved)
    other = [*small, "--layers", "8"]  # the last of a repeated flag counts
    with pytest.raises(SystemExit, match="do not fit the model these flags make"):
        build_demo_hybrid.train_target(build_demo_hybrid.parse_args(
            [*other, "--run-dir", str(tmp_path / "run3"), "--out", str(tmp_path / "third"), "--init-from", str(first)]))


def test_line_prompts_cover_code_lines_and_prose():
    from code_prompts import MAX_CHARS, line_prompts

    texts = [text for _, text in TRAIN] + ['def g():\n    """Return the answer to the question, said twice."""\n'
                                           "    # Walk the list from the end to the start\n    return 42\n"]
    prompts = line_prompts(texts, 200, seed=3)
    assert len(prompts) == 200 and prompts == line_prompts(texts, 200, seed=3)
    assert all(0 < len(p) <= MAX_CHARS and p.strip() for p in prompts)
    prose = [p for p in prompts if "\n" not in p and p[0].isupper()]
    assert 20 < len(prose) < 80  # about one in four
    assert all(not p.startswith(("#", '"""')) for p in prose)
    assert any(p.startswith("    ") for p in prompts)  # lines inside a function keep their indentation
    assert any(not p.endswith("\n") and p not in prose for p in prompts)  # some cut inside their last line


@pytest.fixture
def benched_once(monkeypatch) -> dict:
    """A rebench runs `bench` in a fresh process on the short prompts, the long ones and their tails
    (in these tests one file): each distinct bench runs for real once and is reused after, since the
    card written from them is what the tests check. The runs made, by arguments."""
    import build_demo_drafter

    real, results = build_demo_drafter.bench, {}

    def bench_once(*args):
        if args not in results:
            results[args] = real(*args)
        return results[args]

    monkeypatch.setattr(build_demo_drafter, "bench", bench_once)
    return results


def test_rebench_rewrites_only_the_cards_benchmark(qwen3_tied_dirs, tmp_path, benched_once):
    import shutil

    import build_demo_drafter

    target, drafter = qwen3_tied_dirs
    out = tmp_path / "drafter"
    shutil.copytree(drafter, out)
    weights = (out / "model.safetensors").read_bytes()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ("def f(x):\n", "import os\n")) + "\n")
    args = build_demo_drafter.parse_args(["--rebench", "--target", str(target), "--out", str(out),
                                          "--bench-prompts", str(prompts), "--bench-tokens", "12",
                                          "--bench-repeats", "1", "--long-prompts", str(prompts),
                                          "--long-tails", str(prompts)])
    assert build_demo_drafter.rebench(args) == 2  # no card yet: nothing to rewrite

    # A drafter trained with --no-bench (on a lent GPU, say) has a card whose figures are still to come.
    (out / "MODEL_CARD.md").write_text("# drafter\n\nHow it was trained.\n\n" + build_demo_drafter.NO_FIGURES)
    assert build_demo_drafter.rebench(args) == 0
    card = (out / "MODEL_CARD.md").read_text()
    assert "Not run yet" not in card
    (out / "MODEL_CARD.md").write_text("# drafter\n\nHow it was trained.\n\n## Benchmark\n\nold figures\n")
    assert build_demo_drafter.rebench(args) == 0
    card = (out / "MODEL_CARD.md").read_text()
    assert card.startswith("# drafter\n\nHow it was trained.\n\n## Benchmark (`bench`, T=0, default settings (auto "
                           "verify length, blocks up to 16), 12 tokens")  # the setting a user gets, named
    assert "## Long prompts" in card and "tail alone" in card and "By context depth" in card
    assert json.loads((out / "bench_long.json").read_text())["long"]["identical"] is True
    assert "old figures" not in card and "| `def f(x):⏎` |" in card and "| `import os⏎` |" in card
    result = json.loads((out / "bench.json").read_text())
    assert len(result["per_prompt"]) == 2 and result["identical"] is True
    assert (out / "model.safetensors").read_bytes() == weights
    assert len(benched_once) == 1  # one real bench of the one prompts file


def test_card_rows_of_prompts_that_ended_at_once_have_no_rate(oracle_first_eos_dirs, tmp_path, benched_once):
    """A prompt whose output ends at its first token has no rounds: its row says so instead of an AR
    rate of one token over no time (it printed 23809.5 tok/s and a speedup of '-x'), and a card
    whose prompts all ended so is still written (the overall row has no figures either)."""
    import shutil

    import build_demo_drafter

    target, drafter = oracle_first_eos_dirs
    out = tmp_path / drafter.name  # a new version of the drafter it is compared with, same folder name
    shutil.copytree(drafter, out)
    (out / "MODEL_CARD.md").write_text("# drafter\n\n## Benchmark\n\nold figures\n")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello world"}\n{"prompt": "goodbye"}\n')
    args = build_demo_drafter.parse_args(["--rebench", "--target", str(target), "--out", str(out),
                                          "--bench-prompts", str(prompts), "--bench-tokens", "8", "--bench-repeats", "1",
                                          "--compare-drafter", str(drafter), "--long-prompts", str(prompts),
                                          "--long-tails", str(prompts)])
    assert build_demo_drafter.rebench(args) == 0
    card = (out / "MODEL_CARD.md").read_text()
    short, long = card.split("## Long prompts")
    rows = [line for line in short.splitlines() if line.startswith(("| `hello world`", "| `goodbye`", "| **overall**"))]
    assert len(rows) == 6, rows  # the per-prompt table and the drafters' table, each with its overall row
    long_rows = [line for line in long.splitlines() if line.startswith(("| `hello world`", "| `goodbye`"))]
    assert len(long_rows) == 2 and all(line.count(" - ") >= 4 for line in long_rows), long_rows  # no rates there
    assert sum("ended at its first token" in line for line in rows) == 2
    assert not any(c.isdigit() for line in rows for c in line.split("|", 2)[2]), rows
    assert "2 of 2 prompts ended at their first token" in card
    assert f"### Beside `{drafter.parent.name}/{drafter.name}`" in card  # not its own name
    tables = [[line for line in block.splitlines() if line.startswith("|")] for block in card.split("\n\n")]
    for table in (t for t in tables if t):  # every row as many cells as its header, or it renders as text
        assert {line.count("|") for line in table} == {table[0].count("|")}, table


def test_hybrid_recipe_bench_stage_writes_the_card_from_both_rollbacks(tmp_path, tokenizer_dir):
    """The bench stage runs once a pair has trained for hours: it must write its card and bench.json
    (both rollback modes, the training run's settings and what a GPT-2 pre-split costs)."""
    from fixtures.tiny_hybrid import write_hybrid_drafter, write_hybrid_target

    target = write_hybrid_target(tmp_path / "target", tokenizer_dir, "qwen3_5", seed=3)
    drafter = write_hybrid_drafter(tmp_path / "drafter", target, seed=4, block_size=16)
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.json").write_text(json.dumps({"params": 1234, "steps": 3, "train_wall_s": 60.0,
                                                 "final_train_loss": 2.5, "heldout_loss": 3.0}))
    (run / "run_args.json").write_text(json.dumps({"batch_size": 2, "seq_len": 16, "seed": 0, "vocab_size": 320,
                                                   "split": "gpt2", "steps": 20}))
    (run / "run_args.resume.json").write_text(json.dumps({"steps": 3}))
    prompts = tmp_path / "bench_prompts.jsonl"  # two of the recipe's, as its card names them
    prompts.write_text("".join((build_demo_hybrid.HERE / "bench_prompts.jsonl").read_text().splitlines(True)[:2]))
    assert build_demo_hybrid.main(["--stage", "bench", "--out", str(target), "--drafter-out", str(drafter),
                                   "--run-dir", str(run), "--bench-tokens", "6", "--bench-prompts", str(prompts)]) == 0
    summary = json.loads((target / "bench.json").read_text())
    assert set(summary) == {"replay", "rerun"} and all(r["identical"] for r in summary.values())
    card = (target / "MODEL_CARD.md").read_text()
    assert card.count("| replay |") == 1 and "beside its own AR runs" in card
    assert "| replay |" in card and "| rerun |" in card and "gpt2 pre-split" in card
    assert build_demo_hybrid.GPT2_SPLIT_NOTE in card and "held-out loss 3.000" in card
    assert "Started with `--steps 20` and resumed with `--steps 3`" in card

    # benched again once the run folder is gone: the card's training section is kept, the figures redone
    (target / "MODEL_CARD.md").write_text(card.replace("| replay |", "| old replay |"))
    assert build_demo_hybrid.main(["--stage", "bench", "--out", str(target), "--drafter-out", str(drafter),
                                   "--run-dir", str(tmp_path / "gone"), "--bench-tokens", "6",
                                   "--bench-prompts", str(prompts)]) == 0
    again = (target / "MODEL_CARD.md").read_text()
    assert "old replay" not in again and again.count("| replay |") == 1
    assert again[: again.index("## Benchmark")] == card[: card.index("## Benchmark")]


def test_copy_rows_hold_a_span_and_its_copy(tmp_path, monkeypatch):
    """Rows that reward copying: the second half repeats the first (one identifier renamed, or
    verbatim), so from the copy's start every token is in the context already."""
    import numpy as np
    from tokenizers import Tokenizer

    import copy_rows
    from copy_rows import copy_row, cue, disguised, renamed, renaming

    rng = np.random.default_rng(0)
    source = "def count_lines(path):\n    with open(path) as handle:\n        return len(list(handle))\n"
    masked = disguised(source, rng)
    names = r"[A-Za-z_]\w*"
    pairs = list(zip(re.findall(names, source), re.findall(names, masked)))
    assert len(pairs) == len(re.findall(names, masked)) and re.sub(names, "", masked) == re.sub(names, "", source)
    mapping = dict(pairs)
    assert all(mapping[a] == b for a, b in pairs)  # a name is replaced the same way everywhere
    assert len(set(mapping.values())) == len(mapping)  # by a name of its own
    assert all(mapping[k] == k for k in ("def", "with", "open", "as", "return", "len", "list"))
    assert any(mapping[n] != n for n in ("count_lines", "path", "handle"))

    monkeypatch.setattr(copy_rows, "SYLLABLES", ("ka", "lo"))  # made-up names that often coincide
    crowded = " ".join(f"name{i}" for i in range(6)) + " kaka"
    for _ in range(20):  # never two names made one, nor one made into a name the text has
        words = disguised(crowded, rng).split()
        assert len(set(words)) == len(words), words
    loop = "total = 0\nfor item in items:\n    total += item\n"  # total and item occur twice
    changed = renamed(loop, rng)
    assert changed != loop and changed.count("\n") == loop.count("\n") and "items" in changed
    assert renamed("x = 1\n", rng) == "x = 1\n"  # nothing occurs twice: nothing to rename
    again, old, new = renaming(loop, rng)
    assert old in ("total", "item") and re.findall(names, again).count(new) == 2 and old not in re.findall(names, again)
    assert renaming("x = 1\n", rng) == ("x = 1\n", "", "")
    cues = [cue(rng, "total", "tally") for _ in range(40)]
    assert all(c.startswith("\n\n") and (c.strip() in copy_rows.CUES or "tally" in c) for c in cues)
    assert any("total" in c and "tally" in c for c in cues) and any(not c.strip() for c in cues)
    assert all(cue(rng, "", "").strip() in copy_rows.CUES for _ in range(20))  # no rename: no names
    builtin_twice = "n = len(items)\nprint(len(items), n)\n"
    assert all("len(" in renamed(builtin_twice, rng) and "print(" in renamed(builtin_twice, rng) for _ in range(10))
    monkeypatch.setattr(build_demo_target.corpus, "load_corpus", lambda: (TRAIN * 5, HELD))
    args = build_demo_target.parse_args(["--vocab-size", "320", "--run-dir", str(tmp_path), "--synthetic-modules", "0"])
    data = build_demo_target.prepare_data(args, tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer" / "tokenizer.json"))
    for _ in range(20):
        row = copy_row(rng, tok, data["train_ids"], 64)
        assert row.shape == (65,) and row.dtype == data["train_ids"].dtype
        text = tok.decode(row.tolist())
        lines = [line for line in text.splitlines() if line.strip()]
        assert len(set(lines)) < len(lines)  # something is written twice


def test_copy_probe_tells_a_model_that_copies_from_one_that_does_not(tmp_path, monkeypatch):
    """copy_probe's two losses: a model that predicts what followed the last occurrence of the
    current token (an induction head, by hand) scores far lower on the copies than on the spans;
    one that ignores its context scores the same on both."""
    import numpy as np
    import mlx.core as mx
    from tokenizers import Tokenizer

    from copy_rows import copy_probe

    monkeypatch.setattr(build_demo_target.corpus, "load_corpus", lambda: (TRAIN * 5, HELD))
    args = build_demo_target.parse_args(["--vocab-size", "320", "--synthetic-modules", "0"])
    data = build_demo_target.prepare_data(args, tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer" / "tokenizer.json"))
    vocab = tok.get_vocab_size()

    def induction(x):  # predicts what followed the longest earlier match of the text so far
        row = x[0].tolist()
        logits = np.zeros((1, len(row), vocab), dtype=np.float32)
        for t in range(len(row)):
            best, at = 0, None
            for i in range(t):
                n = 0
                while n <= i and row[i - n] == row[t - n]:
                    n += 1
                if n > best:
                    best, at = n, i
            if at is not None:
                logits[0, t, row[at + 1]] = 10.0
        return mx.array(logits)

    span, copy = copy_probe(induction, tok, data["train_ids"], spans=4)
    assert copy < 0.3 * span
    blind_span, blind_copy = copy_probe(lambda x: mx.zeros((1, x.shape[1], vocab)), tok, data["train_ids"], spans=4)
    assert abs(blind_span - blind_copy) < 1e-3 and abs(blind_span - np.log(vocab)) < 1e-3


def test_target_recipe_stops_at_max_minutes_with_its_checkpoint_and_card(tmp_path, monkeypatch):
    """--max-minutes (a lent GPU's fixed time) ends training early, yet writes the checkpoint a
    --resume goes on from, the model and a card that says it stopped; a copy run's card and report
    carry the copy probe."""
    import json
    import math

    monkeypatch.setattr(build_demo_target.corpus, "load_corpus", lambda: (TRAIN * 5, HELD * 20))
    monkeypatch.setattr(build_demo_target, "verify_and_sample", lambda *a, **k: [("def f():", "\n    pass")])
    out, run = tmp_path / "target", tmp_path / "run"
    argv = ["--vocab-size", "320", "--synthetic-modules", "0", "--run-dir", str(run), "--out", str(out),
            "--hidden-size", "64", "--layers", "2", "--head-dim", "16", "--intermediate-size", "128",
            "--steps", "40", "--batch-size", "2", "--seq-len", "32", "--warmup", "1", "--eval-every", "0",
            "--copy-share", "0.5", "--max-minutes", "1e-6"]
    build_demo_target.main(argv)
    report = json.loads((run / "report.json").read_text())
    assert report["stopped_at_step"] == 1 and report["steps"] == 40
    assert json.loads((run / "latest.json").read_text())["step"] == 1
    assert all(math.isfinite(v) for v in report["copy_probe"].values())
    card = (out / "MODEL_CARD.md").read_text()
    assert "1 steps (stopped by --max-minutes; the schedule was 40)" in card and "Copy probe" in card
    build_demo_target.main(argv[:-2] + ["--resume"])
    assert "stopped_at_step" not in json.loads((run / "report.json").read_text())


def test_draft_model_recipe_distills_a_small_target_and_loads(tmp_path, monkeypatch):
    """A few steps of the draft model's distillation from a tiny target of the recipe's tokenizer:
    it starts from the target's embeddings and first layers, loads as an mlx-lm model with the
    target's tokenizer, and its card says how often it agrees with the target."""
    from mlx.utils import tree_flatten
    import mlx.core as mx

    from engine.models.target import load_target

    monkeypatch.setattr(build_demo_target.corpus, "load_corpus", lambda: (TRAIN * 5, HELD * 20))
    small = ["--vocab-size", "320", "--synthetic-modules", "0"]
    targs = build_demo_target.parse_args(small + ["--run-dir", str(tmp_path / "trun"), "--hidden-size", "64",
                                                  "--layers", "3", "--head-dim", "16", "--intermediate-size", "128"])
    data = build_demo_target.prepare_data(targs, tmp_path / "trun")
    cfg = build_demo_target.model_config(targs, data)
    target = build_demo_target.build_model(cfg)
    mx.eval(target.parameters())
    build_demo_target.write_output(targs, cfg, data, target, tmp_path / "target", {})
    out = tmp_path / "draft"
    assert build_demo_draft_model.main(small + [
        "--target", str(tmp_path / "target"), "--out", str(out), "--run-dir", str(tmp_path / "run"), "--layers", "1",
        "--steps", "3", "--batch-size", "2", "--seq-len", "16", "--warmup", "1", "--log-every", "1"]) == 0
    model, tokenizer, config = load_target(out)
    assert config["num_hidden_layers"] == 1 and (out / "tokenizer.json").read_bytes() == (
        tmp_path / "target" / "tokenizer.json").read_bytes()
    weights = dict(tree_flatten(model.parameters()))
    first = weights["model.layers.0.mlp.up_proj.weight"]
    assert first.shape == target.model.layers[0].mlp.up_proj.weight.shape
    card = (out / "MODEL_CARD.md").read_text()
    assert "held-out windows its greedy next token is the target's" in card
