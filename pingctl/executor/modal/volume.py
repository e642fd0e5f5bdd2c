"""The Modal Volume as pingctl uses it: a few file operations behind one small interface.

Everything pingctl decides about a volume (which row files to upload, what `--fresh` deletes,
what `pingctl pull` brings home) is written against `Volume`, so it runs the same on Modal's
volume (`ModalVolume`, wrapping `modal.Volume`) and on a local directory standing in for it
(the tests). Paths are relative to the volume's root, '/'-separated, without a leading '/'.

Modal's own errors never reach the user as an internal error: `modal_errors` turns a missing
or refused token, an unknown volume, an unreachable service and any other `modal.exception`
into a PingctlError (exit 1) that says what to do.
"""

from __future__ import annotations

import contextlib
import os
import tomllib
from pathlib import Path
from typing import Iterator, NamedTuple, Protocol, Sequence

from pingctl.errors import PingctlError


class Entry(NamedTuple):
    path: str  # relative to the volume's root
    is_dir: bool
    size: int


class Volume(Protocol):
    name: str

    def listdir(self, path: str, recursive: bool = False) -> list[Entry]:
        """The entries under `path` ([] when nothing is there)."""

    def read(self, path: str) -> bytes | None:
        """A small file's bytes, None when it is not there."""

    def download(self, path: str, dest: Path) -> None:
        """Write the file at `path` to `dest` (whose directory exists)."""

    def upload(self, files: Sequence[tuple[Path, str]]) -> None:
        """Put each local file at its volume path, replacing what is there."""

    def remove(self, path: str) -> None:
        """Remove a file or a directory tree; nothing there is no error."""


def norm(path: str) -> str:
    return path.strip("/")


def credentials_source() -> str | None:
    """Where Modal would find a token: the environment, or a profile of its config file
    (MODAL_CONFIG_PATH, else ~/.modal.toml). Only names are returned, never a secret."""
    if os.environ.get("MODAL_TOKEN_ID") and os.environ.get("MODAL_TOKEN_SECRET"):
        return "MODAL_TOKEN_ID/MODAL_TOKEN_SECRET"
    path = Path(os.environ.get("MODAL_CONFIG_PATH") or "~/.modal.toml").expanduser()
    try:
        profiles = tomllib.loads(path.read_text())
    except (OSError, ValueError):
        return None
    wanted = os.environ.get("MODAL_PROFILE")
    for name, p in profiles.items():
        if isinstance(p, dict) and p.get("token_id") and p.get("token_secret") and (wanted in (None, name)):
            return f"{path} (profile {name})"
    return None


def require_credentials() -> str:
    where = credentials_source()
    if where is None:
        raise PingctlError("no Modal token: set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET, or run `modal token new` "
                           "(it writes ~/.modal.toml)")
    return where


@contextlib.contextmanager
def modal_errors(volume: str | None = None) -> Iterator[None]:
    """Modal's exceptions as PingctlErrors naming the cause (the message never holds a token)."""
    import modal.exception as E

    try:
        yield
    except E.AuthError as e:
        raise PingctlError(f"Modal refused the token ({_first(e)}): check MODAL_TOKEN_ID/MODAL_TOKEN_SECRET or "
                           "~/.modal.toml (`modal token new` makes a new one)") from None
    except E.NotFoundError as e:
        what = f"Modal volume {volume!r}" if volume else "a Modal object"
        raise PingctlError(f"{what} not found ({_first(e)}): check train.modal.volume and the Modal environment "
                           "(`modal volume list`)") from None
    except E.ConnectionError as e:
        raise PingctlError(f"cannot reach Modal ({_first(e)}); check the network and retry") from None
    except E.Error as e:
        raise PingctlError(f"Modal: {type(e).__name__}: {_first(e)}") from None


def _first(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


class ModalVolume:
    """`modal.Volume.from_name(name)`, looked up at once so an unknown name is an error here
    (`create=True`: made when missing, as a first submission needs)."""

    def __init__(self, name: str, create: bool = False):
        import modal

        self.name = name
        with modal_errors(name):
            self.vol = modal.Volume.from_name(name, create_if_missing=create)
            self.vol.hydrate()

    def listdir(self, path: str, recursive: bool = False) -> list[Entry]:
        from modal.exception import NotFoundError
        from modal.types import FileEntryType

        with modal_errors(self.name):
            try:
                entries = self.vol.listdir("/" + norm(path), recursive=recursive)
            except (NotFoundError, FileNotFoundError):
                return []
        return [Entry(norm(e.path), e.type == FileEntryType.DIRECTORY, int(e.size)) for e in entries]

    def read(self, path: str) -> bytes | None:
        with modal_errors(self.name):
            try:
                return b"".join(self.vol.read_file("/" + norm(path)))
            except FileNotFoundError:
                return None

    def download(self, path: str, dest: Path) -> None:
        with modal_errors(self.name), open(dest, "wb") as f:
            try:
                for chunk in self.vol.read_file("/" + norm(path)):
                    f.write(chunk)
            except FileNotFoundError:
                # listed a moment ago: a run still training removed it (an old checkpoint)
                raise PingctlError(f"{self.name}:/{norm(path)} went away while it was being fetched; run the "
                                   "command again") from None

    def upload(self, files: Sequence[tuple[Path, str]]) -> None:
        if not files:
            return
        with modal_errors(self.name), self.vol.batch_upload(force=True) as batch:
            for local, remote in files:
                batch.put_file(str(local), "/" + norm(remote))

    def remove(self, path: str) -> None:
        with modal_errors(self.name):
            try:
                self.vol.remove_file("/" + norm(path), recursive=True)
            except FileNotFoundError:
                pass
