"""Turn what the user typed (a folder or a Hugging Face id) into a local folder."""

from __future__ import annotations

from pathlib import Path

from engine.errors import CheckpointError

ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja"]


def looks_like_hf_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def resolve_model_path(name: str | Path, download: bool = True) -> Path:
    """A local folder as is; a bundled demo model by name; otherwise the Hugging Face cache,
    then (if allowed) a download."""
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
    if not looks_like_hf_id(text):
        raise CheckpointError(f"{path}: no such folder (and it is not a Hugging Face id like 'org/name').")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(text, allow_patterns=ALLOW_PATTERNS, local_files_only=True))
    except Exception:
        if not download:
            raise CheckpointError(
                f"{text}: not found in the Hugging Face cache; download it first or give a local folder."
            ) from None
    try:
        return Path(snapshot_download(text, allow_patterns=ALLOW_PATTERNS))
    except Exception as exc:  # network, auth, missing repo: all reported the same way
        raise CheckpointError(
            f"{text}: could not download from Hugging Face ({type(exc).__name__}: {exc}); "
            "check the id and your network, or give a local folder."
        ) from None
