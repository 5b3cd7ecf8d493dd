"""Hugging Face downloads report their bytes and stop on Cancel (huggingface_hub's progress hooks)."""

from __future__ import annotations

import pytest

from engine.errors import LoadCancelled
from engine.models import paths


def test_the_progress_class_reports_bytes_and_raises_on_cancel():
    said, stop = [], []
    bar_class = paths.reporting_tqdm("org/model", lambda what, frac: said.append((what, frac)), lambda: bool(stop))
    files = bar_class(total=3, unit="it")  # the files bar: not bytes, nothing said
    files.update(1)
    bar = bar_class(total=4_000_000, unit="B", initial=0)
    bar.update(1_000_000)
    bar.update(2_000_000)
    assert [round(f, 2) for _, f in said] == [0.25, 0.75] and "1 of 4 MB" in said[0][0]
    stop.append(True)
    with pytest.raises(LoadCancelled, match="cancelled"):
        bar.update(1)


def test_a_download_goes_through_the_hooks_and_a_cancel_is_not_a_download_error(monkeypatch, tmp_path):
    """A fake snapshot_download that drives the given tqdm class as the real one does."""
    import huggingface_hub

    calls = []

    def fake_snapshot_download(repo_id, revision=None, allow_patterns=None, local_files_only=False, tqdm_class=None):
        if local_files_only:
            raise FileNotFoundError("not cached")
        calls.append(repo_id)
        bar = tqdm_class(total=10, unit="B")
        for _ in range(10):
            bar.update(1)
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    said = []
    assert paths.resolve_model_path("org/model", progress=lambda w, f: said.append(f)) == tmp_path
    assert said[-1] == 1.0 and len(said) == 10
    with pytest.raises(LoadCancelled):  # not "could not download from Hugging Face"
        paths.resolve_model_path("org/model", progress=lambda w, f: None, should_cancel=lambda: True)


def test_a_failed_download_is_said_in_one_sentence(monkeypatch):
    """The window showed huggingface_hub's whole multi-line text (offline: 'Got: ConnectError ... An
    error happened while trying to locate ...'); now one sentence by cause."""
    import huggingface_hub
    from huggingface_hub import errors

    from engine.errors import CheckpointError

    raised: list[Exception] = []

    def fake_snapshot_download(repo_id, revision=None, allow_patterns=None, local_files_only=False, tqdm_class=None):
        raise FileNotFoundError("not cached") if local_files_only else raised[0]

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    offline = errors.LocalEntryNotFoundError("An error happened while trying to locate the files on the Hub\n"
                                             "and we cannot find the appropriate snapshot folder.\nGot: ConnectError")
    for exc, said in ((offline, "could not be reached (no network?)"),
                      (ValueError("first line\nsecond line"), "ValueError: first line; check the id")):
        raised[:] = [exc]
        with pytest.raises(CheckpointError) as info:
            paths.resolve_model_path("nobody/no-such-model")
        message = str(info.value)
        assert message.startswith("nobody/no-such-model: could not download from Hugging Face: ") and said in message
        assert "\n" not in message and "second line" not in message


def test_an_id_with_a_revision_or_a_page_address_is_understood(monkeypatch, tmp_path):
    """'acme/target@main' failed as an invalid repo id blamed on the network, and a pasted page
    address as 'no such folder' (QA pass)."""
    import huggingface_hub

    asked = []

    def fake_snapshot_download(repo_id, revision=None, allow_patterns=None, local_files_only=False, tqdm_class=None):
        asked.append((repo_id, revision))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    for typed, wanted in (("acme/target@v2", ("acme/target", "v2")),
                          ("https://huggingface.co/acme/target", ("acme/target", None)),
                          ("https://huggingface.co/acme/target/tree/dev", ("acme/target", "dev")),
                          ("hf.co/acme/target/", ("acme/target", None)),
                          ("acme/target", ("acme/target", None))):
        asked.clear()
        assert paths.resolve_model_path(typed) == tmp_path and asked == [wanted], (typed, asked)
