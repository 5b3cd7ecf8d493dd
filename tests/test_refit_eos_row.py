"""The EOS-row refit changes a target's EOS logit and nothing else, and never writes over a model.

The recipe exists so that a demo target can stop ending texts at a bare newline without its
drafters losing acceptance; that holds only if every other logit is exactly what it was.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

RECIPE_DIR = Path(__file__).resolve().parents[1] / "resources" / "models" / "recipe"
sys.path.insert(0, str(RECIPE_DIR))

import build_demo_target  # noqa: E402
import refit_eos_row  # noqa: E402

TRAIN = [(f"pkg/mod{i}.py", f"def f{i}(x):\n    return x + {i}\n\n\nclass C{i}:\n    pass\n") for i in range(40)]
HELD = [("pkg/held.py", "def held(y):\n    return y * 2\n" * 8)]


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    """A dense demo target made by its own recipe (a few steps, on files that end in a newline)."""
    tmp = tmp_path_factory.mktemp("target")
    patch = pytest.MonkeyPatch()
    patch.setattr(build_demo_target.corpus, "load_corpus", lambda: (TRAIN, HELD))
    patch.setattr(build_demo_target, "verify_and_sample", lambda *a, **k: [("def f(x):\n", "    return x\n")])
    build_demo_target.main(["--vocab-size", "320", "--steps", "3", "--batch-size", "2", "--seq-len", "32",
                            "--hidden-size", "32", "--layers", "2", "--heads", "2", "--kv-heads", "1",
                            "--head-dim", "16", "--intermediate-size", "64", "--synthetic-modules", "20",
                            "--warmup", "1", "--run-dir", str(tmp / "run"), "--out", str(tmp / "target")])
    yield tmp / "target", patch
    patch.undo()


def refit(target: Path, tmp_path: Path, *extra: str) -> Path:
    prompts = tmp_path / "probe.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ("def f1(x):\n", "class C3:\n")) + "\n")
    out = tmp_path / "refit"
    refit_eos_row.main(["--target", str(target), "--out", str(out), "--run-dir", str(tmp_path / "run"),
                        "--windows", "8", "--seq-len", "32", "--synthetic-modules", "20", "--check-modules", "10",
                        "--probe-prompts", str(prompts), *extra])
    return out


def test_only_the_eos_logit_moves_and_the_fit_is_its_optimum(tiny_target, tmp_path):
    from engine.models.target import load_target

    target, _ = tiny_target
    out = refit(target, tmp_path, "--ridge", "0.01")  # a few hundred positions: a finite optimum needs it
    old, tokenizer, _ = load_target(target)
    new, _, config = load_target(out)  # through the loader users hit
    eos = tokenizer.convert_tokens_to_ids(build_demo_target.EOS_TOKEN)

    before, after = mx.load(str(target / "model.safetensors")), mx.load(str(out / "model.safetensors"))
    assert set(before) == set(after)
    row = "model.embed_tokens.weight"
    for name in before:
        if name != row:
            assert mx.array_equal(before[name], after[name]).item(), name
    changed = np.flatnonzero(np.any(np.asarray(before[row] != after[row]), axis=1))
    assert changed.tolist() == [eos]

    ids = mx.array(tokenizer.encode("def f7(x):\n    return x + 7\n\n\nclass C7:\n"))[None]
    l0, l1 = old(ids)[0], new(ids)[0]
    others = np.arange(l0.shape[-1]) != eos
    assert np.array_equal(np.asarray(l0)[:, others], np.asarray(l1)[:, others])  # every other logit, exactly
    assert not np.allclose(np.asarray(l0)[:, eos], np.asarray(l1)[:, eos])

    report = json.loads((out / "eos_refit.json").read_text())
    assert report["fit"]["loss_after"] <= report["fit"]["loss_before"]
    # Newton's method found the minimum of a convex loss: no nearby row does better on the fit positions.
    rng = np.random.default_rng(0)
    model, _ = refit_eos_row.load_tied_target(target)
    stats = refit_eos_row.gather(model, eos, [build_demo_target.sample_batch(
        np.random.default_rng(0), np.load(tmp_path / "run" / "train_tokens.npy"), 4, 32,
        np.load(tmp_path / "run" / "synthetic_tokens.npy"), 0.5, None, 0.0) for _ in range(2)])
    e0 = np.asarray(before[row][eos]).astype(np.float64)
    best = refit_eos_row.fit_row(stats, e0, 30, ridge=0.01)

    def objective(e):
        return refit_eos_row.eos_loss(stats, e) + 0.01 / 2 * float(np.sum((e - e0) ** 2))

    assert objective(best) < objective(e0)
    assert all(objective(best) <= objective(best + d) for d in rng.normal(0, 0.05, (8, len(e0))))
    card = (out / "MODEL_CARD.md").read_text()
    assert refit_eos_row.CARD_SECTION in card and "`probe.jsonl`" in card
    assert [p["prompt"] for p in report["probe"]] == ["def f1(x):\n", "class C3:\n"]


def test_refit_never_writes_over_a_model(tiny_target, tmp_path, capsys):
    target, _ = tiny_target
    weights = (target / "model.safetensors").read_bytes()
    with pytest.raises(SystemExit):
        refit_eos_row.parse_args(["--target", str(target), "--out", str(target), "--run-dir", str(tmp_path)])
    assert "never over its input" in capsys.readouterr().err
    (tmp_path / "taken").mkdir()
    with pytest.raises(SystemExit):
        refit_eos_row.parse_args(["--target", str(target), "--out", str(tmp_path / "taken"),
                                  "--run-dir", str(tmp_path)])
    assert "exists; give a new folder" in capsys.readouterr().err
    assert (target / "model.safetensors").read_bytes() == weights and not any((tmp_path / "taken").iterdir())


def test_refit_refuses_a_target_whose_eos_row_is_not_one_shared_plain_row(tiny_target, tmp_path):
    import shutil

    target, _ = tiny_target
    untied = tmp_path / "untied"
    shutil.copytree(target, untied)
    config = json.loads((untied / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (untied / "config.json").write_text(json.dumps(config))
    weights = mx.load(str(untied / "model.safetensors"))
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    mx.save_safetensors(str(untied / "model.safetensors"), weights)
    with pytest.raises(SystemExit, match="not a tied-embedding target"):
        refit(untied, tmp_path)
    assert not (tmp_path / "refit").exists()

    quantized = tmp_path / "quantized"
    shutil.copytree(target, quantized)
    config = json.loads((quantized / "config.json").read_text())
    config["quantization"] = {"group_size": 64, "bits": 4}
    (quantized / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit, match="a quantized target; refit the unquantized one"):
        refit(quantized, tmp_path)
    assert not (tmp_path / "refit").exists()


def test_a_second_fit_reuses_the_hidden_states_of_the_same_target_and_windows(tiny_target, tmp_path, monkeypatch):
    target, _ = tiny_target
    first = refit(target, tmp_path, "--ridge", "0.01")
    calls = []
    real_gather = refit_eos_row.gather
    monkeypatch.setattr(refit_eos_row, "gather", lambda *a, **k: calls.append(1) or real_gather(*a, **k))
    second = tmp_path / "second"
    refit_eos_row.main(["--target", str(target), "--out", str(second), "--run-dir", str(tmp_path / "run"),
                        "--windows", "8", "--seq-len", "32", "--synthetic-modules", "20", "--check-modules", "10",
                        "--ridge", "1.0"])
    assert calls == []  # every statistic came from the run folder
    rows = [np.asarray(mx.load(str(d / "model.safetensors"))["model.embed_tokens.weight"]) for d in (target, first, second)]
    eos = int(json.loads((first / "eos_refit.json").read_text())["eos_id"])
    # a stronger pull toward the old row moves it less
    assert 0 < np.linalg.norm(rows[2][eos] - rows[0][eos]) < np.linalg.norm(rows[1][eos] - rows[0][eos])

    other = tmp_path / "other-target"  # other weights: the cached states are not theirs
    import shutil

    shutil.copytree(target, other)
    weights = mx.load(str(other / "model.safetensors"))
    weights = {k: v * 1.01 if k.endswith("mlp.down_proj.weight") else v for k, v in weights.items()}
    mx.save_safetensors(str(other / "model.safetensors"), weights)
    refit_eos_row.main(["--target", str(other), "--out", str(tmp_path / "third"), "--run-dir", str(tmp_path / "run"),
                        "--windows", "8", "--seq-len", "32", "--synthetic-modules", "20", "--check-modules", "10"])
    assert len(calls) == 3  # fit windows, held-out files, held-out modules
