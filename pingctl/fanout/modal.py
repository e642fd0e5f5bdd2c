"""The boundary of a fanned-out command with Modal: upload files to a Modal Volume, map one
task function over task indices (`Function.map`), download a directory, remove a directory.

The task function is named by reference ("module:function", called as fn(Path(work), index)
in the container): the command's own code, which the tests run too. `ModalBoundary` is the
interface on the Modal SDK (the only code of pingctl that talks to Modal); `DirBoundary` is a
local directory standing in for the volume, and a loop in this process for `map`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import os
import re
import shutil
from pathlib import Path
from typing import Callable, Protocol

import pingctl
from pingctl.errors import PingctlError

MOUNT = "/data"
_SOURCE_IGNORE = ["**/__pycache__", "**/*.pyc"]


@dataclasses.dataclass(frozen=True)
class ModalSettings:
    app_name: str = "pingctl"
    volume: str = "pingctl-data"
    cpu: float = 2.0
    memory_mb: int = 4096
    timeout_s: int = 7200  # per task


class Boundary(Protocol):
    def upload(self, files: list[tuple[Path, str]]) -> None:
        """Local files -> paths on the volume (replacing what is there)."""

    def map(self, work: str, indices: list[int]) -> list[dict | BaseException]:
        """The task function on (MOUNT/work, i) for each i, remotely; per task its record or its error."""

    def download(self, remote: str, local: Path) -> None:
        """A directory of the volume -> the (new, empty) local directory `local`."""

    def remove(self, remote: str) -> None:
        """Delete a directory of the volume, recursively."""


def task_function(ref: str) -> Callable[[Path, int], dict]:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def remote_name(out: Path) -> str:
    """The output's name and a hash of its full path: two outputs called `week` in different
    directories never share a directory on the volume; the same output always has the same."""
    out = Path(out).resolve()
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", out.name) or "out"
    return f"{safe}-{hashlib.sha256(str(out).encode()).hexdigest()[:10]}"


class DirBoundary:
    """A local directory standing in for the volume; `map` runs the task function in this
    process, with the directory where the containers mount the volume. What it does not stand
    in for: the image, the containers and the Modal SDK's transfers."""

    def __init__(self, root: Path, task: str, fail: Callable[[int], BaseException | None] | None = None):
        self.root = Path(root)
        self.task = task
        self.fail = fail  # a task that raises this error instead of running (a crashed container)
        self.calls: list[int] = []

    def _local(self, remote: str) -> Path:
        remote = remote[len(MOUNT):] if remote.startswith(MOUNT + "/") else remote
        return self.root / remote.lstrip("/")

    def upload(self, files: list[tuple[Path, str]]) -> None:
        for local, remote in files:
            dst = self._local(remote)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, dst)

    def map(self, work: str, indices: list[int]) -> list[dict | BaseException]:
        fn = task_function(self.task)
        out: list[dict | BaseException] = []
        for i in indices:
            self.calls.append(i)
            err = self.fail(i) if self.fail else None
            try:
                if err is not None:
                    raise err
                out.append(fn(self._local(work), i))
            except Exception as e:  # noqa: BLE001 - as Function.map(return_exceptions=True)
                out.append(e)
        return out

    def download(self, remote: str, local: Path) -> None:
        src = self._local(remote)
        for f in src.rglob("*"):
            if f.is_file():
                dst = Path(local) / f.relative_to(src)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, dst)

    def remove(self, remote: str) -> None:
        shutil.rmtree(self._local(remote), ignore_errors=True)


def image_requirements() -> list[str]:
    """pingctl's base requirements (no extra: the fanned-out commands need none of training's)."""
    from importlib import metadata

    try:
        reqs = metadata.requires("pingctl") or []
    except metadata.PackageNotFoundError:
        import tomllib

        pyproject = Path(pingctl.__file__).resolve().parents[1] / "pyproject.toml"
        if not pyproject.is_file():
            raise PingctlError("pingctl is not installed and has no pyproject.toml beside it: cannot list its "
                               "requirements for the Modal image") from None
        return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])
    return [r for r in reqs if ";" not in r]


def build_app(s: ModalSettings, task: str, name: str):
    """The Modal app, its per-task function `name` (running `task`, "module:function") and the
    volume: built offline (nothing contacted)."""
    import modal

    image = (
        modal.Image.debian_slim(python_version="3.12")
        .pip_install(*image_requirements())
        .env({"PYTHONUNBUFFERED": "1"})
        # the pingctl that made the plan (each task checks the version), added at container start
        .add_local_python_source("pingctl", ignore=_SOURCE_IGNORE)
    )
    volume = modal.Volume.from_name(s.volume, create_if_missing=True)
    app = modal.App(s.app_name)

    @app.function(image=image, volumes={MOUNT: volume}, cpu=s.cpu, memory=s.memory_mb, timeout=s.timeout_s,
                  serialized=True, name=name)
    def pingctl_task(work: str, index: int) -> dict:
        import importlib
        from pathlib import Path

        module, _, name = task.partition(":")
        record = getattr(importlib.import_module(module), name)(Path(work), index)
        volume.commit()  # the task's directory must be visible to the download that follows
        return record

    return app, pingctl_task, volume


class ModalBoundary:
    """`Boundary` on the Modal SDK."""

    def __init__(self, s: ModalSettings, task: str, name: str):
        self.settings = s
        self.app, self.fn, self.volume = build_app(s, task, name)

    def upload(self, files: list[tuple[Path, str]]) -> None:
        with self.volume.batch_upload(force=True) as batch:
            for local, remote in files:
                batch.put_file(str(local), "/" + remote)

    def map(self, work: str, indices: list[int]) -> list[dict | BaseException]:
        with self.app.run():
            return list(self.fn.map([work] * len(indices), indices, return_exceptions=True, order_outputs=True))

    def download(self, remote: str, local: Path) -> None:
        from modal.volume import FileEntryType

        self.volume.reload()
        for entry in self.volume.listdir("/" + remote, recursive=True):
            if entry.type != FileEntryType.FILE:
                continue
            rel = Path(entry.path).relative_to(remote.lstrip("/"))
            dst = Path(local) / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            with open(dst, "wb") as fh:
                self.volume.read_file_into_fileobj(entry.path, fh)

    def remove(self, remote: str) -> None:
        self.volume.remove_file("/" + remote, recursive=True)


def check_credentials() -> None:
    if not (os.environ.get("MODAL_TOKEN_ID") or Path("~/.modal.toml").expanduser().exists()):
        raise PingctlError("no Modal credentials: set MODAL_TOKEN_ID/MODAL_TOKEN_SECRET or run `modal token new`")


def call(fn):
    """Modal's own errors (no token, an unknown workspace or volume, a quota) are the user's to
    fix: one clear message, exit 1, never an internal error."""
    try:
        return fn()
    except Exception as e:
        if type(e).__module__.split(".")[0] == "modal":  # modal.exception.AuthError, NotFoundError, ...
            raise PingctlError(f"Modal: {type(e).__name__}: {e}") from None
        raise
