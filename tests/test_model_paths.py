"""Hugging Face ids resolve through the HF cache (offline), and fail with one clear sentence."""

import shutil

import pytest

from engine.models.doctor import check_pair
from engine.errors import CheckpointError
from engine.models.paths import resolve_model_path


def fake_hf_cache(cache_dir, repo_id, source):
    """The on-disk layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<rev>/...}."""
    rev = "0123456789abcdef0123456789abcdef01234567"
    repo = cache_dir / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(rev)
    shutil.copytree(source, repo / "snapshots" / rev)
    return repo / "snapshots" / rev


def test_hf_id_found_in_cache(qwen3_tied_dirs, tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    target = fake_hf_cache(cache, "tiny-org/tiny-target", qwen3_tied_dirs[0])
    drafter = fake_hf_cache(cache, "tiny-org/tiny-drafter", qwen3_tied_dirs[1])
    assert resolve_model_path("tiny-org/tiny-target") == target
    report = check_pair("tiny-org/tiny-target", "tiny-org/tiny-drafter")
    assert report.ok, report.problems
    assert report.facts["drafter"] == str(drafter)


def test_hf_id_missing_offline_says_so(tmp_path, monkeypatch):
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    with pytest.raises(CheckpointError, match="not found in the Hugging Face cache"):
        resolve_model_path("nobody/nothing", download=False)
    with pytest.raises(CheckpointError, match="not in the Hugging Face cache, and HF_HUB_OFFLINE is set"):
        resolve_model_path("nobody/nothing")


def test_nothing_is_written_into_a_cache_snapshot(qwen3_tied_dirs, tmp_path):
    """A trace, an export or a screenshot pointed into a cached model's snapshot folder is refused: the cache
    is huggingface_hub's (its files are links into blobs/ shared by revisions)."""
    from engine.errors import DFlashError
    from engine.safe_write import check_output

    snapshot = fake_hf_cache(tmp_path / "hub", "org/tiny", qwen3_tied_dirs[0])
    blob = snapshot.parents[1] / "blobs" / "0a1b2c"  # huggingface_hub's layout: snapshot files link into blobs/
    blob.parent.mkdir()
    blob.write_text("# tiny\n")
    (snapshot / "README.md").symlink_to(blob)
    (tmp_path / "my-models").mkdir()
    (tmp_path / "my-models" / "tiny").symlink_to(snapshot)  # a folder link a user made to the snapshot
    for where in (snapshot / "run.jsonl", snapshot / "README.md", tmp_path / "my-models" / "tiny" / "run.jsonl"):
        with pytest.raises(DFlashError, match="in the Hugging Face cache, which only the cache may change"):
            check_output(where, "the trace")
    assert blob.read_text() == "# tiny\n"
    assert check_output(tmp_path / "run.jsonl", "the trace") == tmp_path / "run.jsonl"


def test_a_file_is_not_a_model_folder(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_text("x")
    with pytest.raises(CheckpointError, match="expected a model folder"):
        resolve_model_path(f)


def test_bundled_demo_models_resolve_by_name(qwen3_tied_dirs, tmp_path, monkeypatch):
    models = tmp_path / "models"
    models.mkdir()
    (models / "demo-hybrid-target").symlink_to(qwen3_tied_dirs[0])
    monkeypatch.setenv("DFLASH_MODELS_DIR", str(models))
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("demo-hybrid-target") == models / "demo-hybrid-target"
    with pytest.raises(CheckpointError, match="demo-hybrid-drafter: no such folder"):
        resolve_model_path("demo-hybrid-drafter")  # a bundled name that is not installed
    (tmp_path / "demo-hybrid-target").mkdir()  # a folder the user named the same way wins
    assert resolve_model_path("demo-hybrid-target").resolve() == tmp_path / "demo-hybrid-target"
    with pytest.raises(CheckpointError, match="no such folder"):
        resolve_model_path("stray-name")  # other bare names are not looked up among the bundled models


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    """atomic_path, the one way files are written in place: the new file replaces the old only whole."""
    from engine.safe_write import atomic_path, write_atomic

    path = tmp_path / "settings.json"
    write_atomic(path, "old")
    with pytest.raises(RuntimeError):
        with atomic_path(path, ".npy") as tmp:
            tmp.write_text("half")
            raise RuntimeError("the writer failed")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["settings.json"]
    with atomic_path(path) as tmp:
        tmp.write_text("new")
    assert path.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["settings.json"]
