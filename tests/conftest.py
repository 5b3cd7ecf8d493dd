"""Tiny real checkpoints on disk, built once per session, loaded through the users' code path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# No test may read or write the user's own settings and logs; app tests narrow these further.
_SANDBOX = Path(__import__("tempfile").mkdtemp(prefix="dflash-tests-"))
os.environ["DFLASH_CONFIG_DIR"] = str(_SANDBOX / "config")
os.environ["DFLASH_LOG_DIR"] = str(_SANDBOX / "logs")
os.environ["DFLASH_CACHE_DIR"] = str(_SANDBOX / "cache")

import engine  # noqa: E402,F401  (optimised BLAS before MLX)
from engine.models.pair import load_pair  # noqa: E402
from fixtures import fixed_cost_curve, tiny_models as tm  # noqa: E402
from fixtures.tiny_hybrid import HYBRID_KINDS, write_hybrid_drafter, write_hybrid_target  # noqa: E402

@pytest.fixture(autouse=True)
def _fixed_cost_curve(request, monkeypatch):
    """Runs with auto read the fixed cost curve (fixtures/fixed_cost_curve.py) instead of measuring one,
    except in tests marked measures_cost_curve."""
    if request.node.get_closest_marker("measures_cost_curve") is None:
        fixed_cost_curve.install(monkeypatch)


@pytest.fixture(scope="session")
def models_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tokenizer_dir(models_root) -> Path:
    tm.write_tokenizer(models_root / "tokenizer")
    return models_root / "tokenizer"


def _pair_dirs(models_root, tokenizer_dir, name, target_kwargs=None, drafter_kwargs=None, seed=0):
    target = models_root / f"{name}-target"
    drafter = models_root / f"{name}-drafter"
    if not target.exists():
        tm.write_target(target, tokenizer_dir, seed=seed, **(target_kwargs or {}))
        tm.write_drafter(drafter, target, seed=seed + 1, **(drafter_kwargs or {}))
    return target, drafter


@pytest.fixture(scope="session")
def qwen3_tied_dirs(models_root, tokenizer_dir):
    return _pair_dirs(models_root, tokenizer_dir, "qwen3-tied")


@pytest.fixture(scope="session")
def qwen3_untied_dirs(models_root, tokenizer_dir):
    return _pair_dirs(models_root, tokenizer_dir, "qwen3-untied", {"tied": False}, {"schema": "newer"}, seed=10)


@pytest.fixture(scope="session")
def llama_dirs(models_root, tokenizer_dir):
    return _pair_dirs(models_root, tokenizer_dir, "llama", {"model_type": "llama"}, seed=20)


@pytest.fixture(scope="session")
def sliding_dirs(models_root, tokenizer_dir):
    """Newer-schema drafter mixing sliding (window 8) and full layers."""
    return _pair_dirs(
        models_root, tokenizer_dir, "sliding", None,
        {"schema": "newer", "layers": 2, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8},
        seed=30,
    )


@pytest.fixture(scope="session")
def qwen3_pair(qwen3_tied_dirs):
    return load_pair(*qwen3_tied_dirs)


@pytest.fixture(scope="session")
def qwen3_target(qwen3_tied_dirs):
    """The tied qwen3 target loaded alone (no drafter)."""
    return load_pair(qwen3_tied_dirs[0], None)


@pytest.fixture(scope="session")
def untied_target(qwen3_untied_dirs):
    """The untied qwen3 target loaded alone (no drafter)."""
    return load_pair(qwen3_untied_dirs[0], None)


@pytest.fixture(scope="session")
def oracle_ids(tokenizer_dir):
    """Two ordinary token ids for the hand-built oracle pair."""
    return 100, 200


@pytest.fixture(scope="session")
def oracle_dirs(models_root, tokenizer_dir, oracle_ids):
    return tm.write_oracle_pair(models_root / "oracle", tokenizer_dir, *oracle_ids)


@pytest.fixture(scope="session")
def oracle_eos_dirs(models_root, tokenizer_dir, oracle_ids):
    """The oracle pair with its second token declared an EOS token."""
    return tm.write_oracle_pair(models_root / "oracle-eos", tokenizer_dir, *oracle_ids, extra_eos=[oracle_ids[1]])


@pytest.fixture(scope="session")
def oracle_first_eos_dirs(models_root, tokenizer_dir, oracle_ids):
    """The oracle pair with its first token declared an EOS token: every output ends at the prefill."""
    return tm.write_oracle_pair(models_root / "oracle-first-eos", tokenizer_dir, *oracle_ids,
                                extra_eos=[oracle_ids[0]], name="first-eos")


@pytest.fixture(scope="session")
def alternating_dirs(models_root, tokenizer_dir, oracle_ids):
    """Oracle whose target alternates second/third: each round accepts exactly one draft."""
    return tm.write_oracle_pair(models_root / "alt", tokenizer_dir, *oracle_ids, third=300, name="alt")


@pytest.fixture(scope="session")
def oracle_pair(oracle_dirs):
    return load_pair(*oracle_dirs)


@pytest.fixture(scope="session")
def alternating_pair(alternating_dirs):
    return load_pair(*alternating_dirs)


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    """Training text: the fixtures' tokenizer corpus as .py files."""
    d = tmp_path_factory.mktemp("corpus")
    for i, text in enumerate(tm.tokenizer_corpus()):
        (d / f"doc{i}.py").write_text(text)
    return d


HYBRID_WINDOW = 8  # the hybrid pairs' drafters: a sliding layer of this window and a full one


@pytest.fixture(scope="session")
def hybrid_dirs(models_root, tokenizer_dir):
    """{kind: (target, drafter)}: tiny hybrid targets, newer-schema drafters mixing a sliding (window 8)
    and a full layer."""
    dirs = {}
    for n, kind in enumerate(HYBRID_KINDS):
        target, drafter = models_root / f"hybrid-{kind}-target", models_root / f"hybrid-{kind}-drafter"
        if not target.exists():
            write_hybrid_target(target, tokenizer_dir, kind, seed=40 + n)
            write_hybrid_drafter(drafter, target, seed=50 + n, schema="newer", layers=2, block_size=8,
                                 layer_types=["sliding_attention", "full_attention"], sliding_window=HYBRID_WINDOW)
        dirs[kind] = (target, drafter)
    return dirs


@pytest.fixture
def app_env(tmp_path, monkeypatch):
    """Every window test gets its own settings, logs, HF cache and (absent) demo pair."""
    monkeypatch.setenv("DFLASH_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("DFLASH_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("DFLASH_MODELS_DIR", str(tmp_path / "no-demo-models"))
    return tmp_path


@pytest.fixture
def make_window(qtbot, app_env):
    """A factory of shown windows, each closed (worker stopped) at the end of the test."""
    from app.window import MainWindow

    made = []

    def make(**kwargs):
        w = MainWindow(**kwargs)
        qtbot.addWidget(w)
        w.show()
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()
        assert w.host.thread.isFinished()


@pytest.fixture
def fresh_rope_checks(monkeypatch):
    """kernels/cpu_rope.py's one-time exactness checks made afresh for the test."""
    from kernels import cpu_rope

    monkeypatch.setattr(cpu_rope, "_EXACT", {})
