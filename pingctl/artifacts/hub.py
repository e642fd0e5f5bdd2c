"""A model named by a Hugging Face Hub repo id (`org/name`) where a directory is expected.

An export (pingctl.artifacts.export) pushed to the Hub as it is, loaded through huggingface_hub's
`snapshot_download` into its cache. huggingface_hub is imported only when a name is not a local
path, so loading a directory needs nothing of it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pingctl.artifacts import export as EX
from pingctl.errors import PingctlError

# The Hub's repo id: `owner/name`, exactly one slash, names of letters, digits, '-', '_', '.'
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
_TRUE = ("1", "true", "yes", "on")


def resolve_model_path(name_or_path: str | Path, revision: str | None = None) -> Path:
    """The directory a model loads from: `name_or_path` itself where it exists (or is a Path,
    or cannot be a repo id), else the local snapshot of the Hub repo it names. The environment
    is read at each call (huggingface_hub reads it once, at its import): HF_HUB_OFFLINE=1 uses
    the cache alone, HF_HUB_CACHE names the cache."""
    if isinstance(name_or_path, Path) or Path(name_or_path).exists() or not REPO_ID.fullmatch(name_or_path):
        return Path(name_or_path)
    name = str(name_or_path)
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise PingctlError(f"{name}: no such directory; as a Hugging Face Hub repo id it needs huggingface_hub "
                           "(pip install huggingface_hub)") from None
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE
    try:
        got = snapshot_download(name, revision=revision, cache_dir=os.environ.get("HF_HUB_CACHE") or None,
                                local_files_only=offline,
                                allow_patterns=[EX.CONFIG, EX.WEIGHTS, EX.CARD, EX.CALIBRATION])
    except Exception as e:  # noqa: BLE001 - huggingface_hub's errors (not found, offline, HTTP) have no common base
        first = (str(e).strip().splitlines() or [""])[0][:200]
        where = " (HF_HUB_OFFLINE is set: the local cache alone was searched)" if offline else ""
        raise PingctlError(f"{name}: no such directory, and not loadable as a Hugging Face Hub repo{where}: "
                           f"{type(e).__name__}: {first}") from None
    path = Path(got)
    if not EX.is_export_dir(path):
        raise PingctlError(f"{name}: the Hugging Face Hub repo holds no `pingctl export` model "
                           f"({EX.CONFIG} and {EX.WEIGHTS}); push an export directory as it is")
    return path
