"""A model named by a Hugging Face Hub repo id (`org/name`) where a directory is expected, and an
export pushed to one.

An export (pingctl.artifacts.export) is pushed to the Hub as it is (`push`: huggingface_hub's
`upload_folder`) and loaded back through `snapshot_download` into the Hub cache
(`resolve_model_path`): both move exactly the files the export layout lists (`EX.FILES`), so
what an export holds comes back. huggingface_hub is imported only when a name is not a local
path, or a push is asked for, so loading a directory needs nothing of it.

huggingface_hub reads its environment once, when it is imported; these functions read
HF_ENDPOINT, HF_HOME, HF_HUB_CACHE and HF_HUB_OFFLINE at each call instead, so a process (a
test, a notebook) that changes them is heard. The token is huggingface_hub's own business
(HF_TOKEN, or `hf auth login`'s stored one): it is never read into a message here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pingctl.artifacts import export as EX
from pingctl.errors import PingctlError, UsageError, install_line, require_command

# The Hub's repo id: `owner/name`, exactly one slash, names of letters, digits, '-', '_', '.'
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
_TRUE = ("1", "true", "yes", "on")


def is_repo_id(name: str | Path) -> bool:
    """Whether `name` is to be read as a Hub repo id: a string of the form `owner/name` that is
    not a path on this machine (a Path, or anything that exists here, is a path)."""
    return isinstance(name, str) and not Path(name).exists() and REPO_ID.fullmatch(name) is not None


def resolve_model_path(name_or_path: str | Path, revision: str | None = None) -> Path:
    """The directory a model loads from: `name_or_path` itself where it exists (or is a Path,
    or cannot be a repo id), else the local snapshot of the Hub repo it names at `revision` (a
    branch, tag or commit; default: the repo's main branch). HF_HUB_OFFLINE=1 uses the cache
    alone; HF_HUB_CACHE (else HF_HOME/hub) names the cache, HF_ENDPOINT the Hub."""
    if not is_repo_id(name_or_path):
        if revision is not None:
            raise UsageError(f"revision {revision!r}: a revision picks a version of a Hugging Face Hub repo; "
                             f"{name_or_path} is a directory (or no repo id)")
        return Path(name_or_path)
    name = str(name_or_path)
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise PingctlError(f"{name}: no such directory; as a Hugging Face Hub repo id it needs the [hub] extra "
                           f"(huggingface_hub): {install_line('hub')}") from None
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE
    at = f" at revision {revision}" if revision else ""
    try:
        got = snapshot_download(name, revision=revision, cache_dir=_cache_dir(), endpoint=_endpoint(),
                                local_files_only=offline, allow_patterns=list(EX.FILES))
    except Exception as e:  # noqa: BLE001 - huggingface_hub's errors (not found, offline, HTTP) have no common base
        where = " (HF_HUB_OFFLINE is set: the local cache alone was searched)" if offline else ""
        raise PingctlError(f"{name}: no such directory, and not loadable as a Hugging Face Hub repo{at}{where}: "
                           f"{_first_line(e)}") from None
    path = Path(got)
    if not EX.is_export_dir(path):
        raise PingctlError(f"{name}: the Hugging Face Hub repo{at} holds no `pingctl export` model "
                           f"({EX.CONFIG} and {EX.WEIGHTS}); push an export directory as it is")
    return path


def hub_name(path: Path | str) -> str | None:
    """`owner/name@commit` for a snapshot directory of the Hub cache (what `resolve_model_path`
    returns for a repo id: `models--owner--name/snapshots/COMMIT`), None for any other path."""
    path = Path(path)
    repo = path.parent.parent.name
    if path.parent.name != "snapshots" or not repo.startswith("models--"):
        return None
    return f"{repo.removeprefix('models--').replace('--', '/', 1)}@{path.name}"


def check_push() -> None:
    """What a push needs before an export is written for it: huggingface_hub, and a token (its
    value is not read here)."""
    require_command("export --push-to-hub")
    from huggingface_hub import get_token

    if get_token() is None:
        raise UsageError("--push-to-hub needs a Hugging Face token with write access: set HF_TOKEN in the "
                         "environment (or run `hf auth login`)")


def push(export: Path | str, repo_id: str, revision: str | None = None, private: bool = False) -> dict:
    """Upload the export directory `export` to the Hub model repo `repo_id` (created if it does not
    exist, `private` then), on branch `revision` (created from main if new; default: main), in
    one commit. The repo's files of the export layout that this export lacks are deleted in that
    commit (a stale calibration.json or hints.npz would otherwise be downloaded with it); other
    files (the Hub's .gitattributes) stay. Returns {repo, revision, commit, url}."""
    from huggingface_hub import HfApi

    export = Path(export)
    if not EX.is_export_dir(export):
        raise UsageError(f"{export}: not a `pingctl export` model directory")
    if not REPO_ID.fullmatch(repo_id):
        raise UsageError(f"--push-to-hub {repo_id}: not a Hugging Face Hub repo id (owner/name)")
    api = HfApi(endpoint=_endpoint())
    held = [f["name"] for f in EX.files(export)]
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision is not None:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        info = api.upload_folder(repo_id=repo_id, folder_path=str(export), revision=revision,
                                 allow_patterns=held, delete_patterns=list(EX.FILES),
                                 commit_message=f"pingctl export ({', '.join(held)})")
    except Exception as e:  # noqa: BLE001 - huggingface_hub's errors (HTTP, auth, network) have no common base
        raise PingctlError(f"--push-to-hub {repo_id}: the upload failed: {_first_line(e)}") from None
    return {"repo": repo_id, "revision": revision or "main", "commit": info.oid, "url": info.commit_url}


def _endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT", "").strip().rstrip("/") or None


def _cache_dir() -> str | None:
    home = os.environ.get("HF_HOME", "").strip()
    return os.environ.get("HF_HUB_CACHE", "").strip() or (str(Path(home).expanduser() / "hub") if home else None)


# What huggingface_hub's errors mean for a pingctl user (their messages start with the HTTP status)
_WHY = {"RepositoryNotFoundError": "no such model repo (or a private one the token does not reach)",
        "RevisionNotFoundError": "the repo has no such branch, tag or commit",
        "GatedRepoError": "a gated repo: accept its conditions on the Hub with the token's account",
        "LocalEntryNotFoundError": "not in the local Hub cache, and the Hub was not reached"}


def _first_line(e: Exception) -> str:
    """An error of huggingface_hub in one line: what it means where that is known, its type and
    first line (no token is ever in it: huggingface_hub sends the token in a header and does not
    quote it)."""
    status = getattr(getattr(e, "response", None), "status_code", None)
    why = _WHY.get(type(e).__name__) or ("the Hub refused the token (HF_TOKEN, or `hf auth login`'s) for this repo"
                                         if status in (401, 403) else None)
    text = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
    return f"{why} ({text})" if why else text
