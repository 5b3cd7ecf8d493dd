"""Turn what the user typed (a folder or a Hugging Face id) into a local folder."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from engine.errors import CheckpointError, LoadCancelled

# (what is being done, fraction done): a download's bytes as they arrive
Progress = Callable[[str, float], None]

ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja"]


HUB_URLS = ("https://huggingface.co/", "http://huggingface.co/", "huggingface.co/", "https://hf.co/", "hf.co/")


def hf_id_and_revision(text: str) -> tuple[str, Optional[str]]:
    """('org/name', revision or None) from what a user pastes: an id, 'org/name@revision', or the
    model's page address (https://huggingface.co/org/name, .../tree/revision)."""
    for prefix in HUB_URLS:
        if text.startswith(prefix):
            parts = text[len(prefix):].strip("/").split("/")
            revision = parts[3] if len(parts) >= 4 and parts[2] == "tree" else None
            return "/".join(parts[:2]), revision
    repo, at, revision = text.partition("@")
    return (repo, revision) if at and revision and "/" in repo else (text, None)


def looks_like_hf_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def resolve_model_path(name: str | Path, download: bool = True, progress: Optional[Progress] = None,
                       should_cancel: Callable[[], bool] = lambda: False) -> Path:
    """A local folder as is; a bundled demo model by name; otherwise the Hugging Face cache,
    then (if allowed) a download, reported to `progress` as its bytes arrive and stopped (LoadCancelled)
    at the next chunk once `should_cancel` says so."""
    from engine.models.demo import bundled_model

    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise CheckpointError(f"{path}: expected a model folder, found a file.")
        return path
    text = str(name)
    bundled = bundled_model(text)
    if bundled is not None:
        return bundled
    text, revision = hf_id_and_revision(text)
    if not looks_like_hf_id(text):
        raise CheckpointError(f"{name}: no such folder (and it is not a Hugging Face id like 'org/name').")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(text, revision=revision, allow_patterns=ALLOW_PATTERNS, local_files_only=True))
    except Exception:
        if not download:
            raise CheckpointError(
                f"{text}: not found in the Hugging Face cache yet (loading the model downloads it), or give a local folder."
            ) from None
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:  # HF_HUB_OFFLINE=1: the download would fail with a page of text saying so
        raise CheckpointError(f"{text}: not in the Hugging Face cache, and HF_HUB_OFFLINE is set, so it cannot be "
                              "downloaded; unset it (or download the model elsewhere), or give a local folder.")
    try:
        return Path(snapshot_download(text, revision=revision, allow_patterns=ALLOW_PATTERNS,
                                      tqdm_class=reporting_tqdm(text, progress, should_cancel)))
    except LoadCancelled:
        raise
    except Exception as exc:  # network, auth, missing repo
        raise CheckpointError(f"{text}: could not download from Hugging Face: {download_problem(exc)}") from None


def download_problem(exc: Exception) -> str:
    """One sentence for why a download failed (huggingface_hub's messages run to several lines of
    its own advice, which the window showed whole)."""
    from huggingface_hub import errors

    if isinstance(exc, errors.GatedRepoError):
        return "the model is gated: accept its terms on its Hugging Face page and log in (`hf auth login`)."
    if isinstance(exc, errors.RepositoryNotFoundError):
        return ("no such model, or a private one: check the id (org/name), or log in (`hf auth login`) "
                "if it is yours.")
    if isinstance(exc, errors.LocalEntryNotFoundError) or isinstance(exc, (ConnectionError, TimeoutError)):
        return "huggingface.co could not be reached (no network?), and the model is not in the cache; give a local folder."
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    first = first if len(first) <= 160 else first[:159] + "…"
    return f"{type(exc).__name__}: {first}; check the id and your network, or give a local folder."


def reporting_tqdm(name: str, progress: Optional[Progress], should_cancel: Callable[[], bool]) -> type:
    """A tqdm class for huggingface_hub's progress hooks: it prints nothing, reports the bytes of
    the download to `progress` and raises LoadCancelled from the download's threads once
    `should_cancel` says so (each file stops at its next chunk)."""
    from tqdm.auto import tqdm

    class ReportingTqdm(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True  # no terminal bar: the numbers go to `progress`
            super().__init__(*args, **kwargs)
            self.in_bytes = kwargs.get("unit") == "B"
            self.done = float(kwargs.get("initial") or 0)

        def update(self, n=1):
            if should_cancel():
                raise LoadCancelled(f"the download of {name} was cancelled; what was fetched stays in the "
                                    "Hugging Face cache for next time.")
            self.done += n or 0
            if self.in_bytes and progress is not None and self.total:
                progress(f"downloading {name}: {self.done / 1e6:,.0f} of {self.total / 1e6:,.0f} MB",
                         min(self.done / self.total, 1.0))

    return ReportingTqdm
