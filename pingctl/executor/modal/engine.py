"""The Modal engine. Fan-out: one Modal function call per task (`Function.map`), reading the
step's inputs from a Modal Volume and writing each task's directory there; the finished task
directories are pulled back into the local work directory, where the merge runs. Training
(`train --target modal`): run.py beside this module (the image, the app, the container's code,
the volume's uploads and the pull are its neighbours too: pingctl/executor/modal/__init__.py).

Layout of a fanned-out step on the volume (mounted at /data in the containers), NAME from
the output's path:

    /COMMAND/NAME/plan.json              the plan, each input's `read` path pointing below
    /COMMAND/NAME/inputs/00003-FILE      the inputs of the tasks to run, uploaded
    /COMMAND/NAME/tasks/00003/           what the step's task writes, as on any engine

The boundary with Modal is the small `Boundary` interface: upload files, map a task function
(named by reference, "module:function", called as fn(Path(work), index) in the container: the
step's own code, which the tests run too) over task indices, download a directory, remove a
directory. `ModalBoundary` is that interface on the Modal SDK; `DirBoundary` is a local
directory standing in for the volume, and a loop in this process for `map` (the tests use it;
what it does not stand in for: the image, the containers and the Modal SDK's transfers).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Callable, Protocol

import pingctl
from pingctl import __version__
from pingctl.atomic import atomic_dir
from pingctl.errors import PingctlError
from pingctl.executor.base import Executor, Progress, Say
from pingctl.executor.modal import run as training
from pingctl.executor.modal.image import base_image, base_requirements, with_source
from pingctl.executor.modal.sync import MOUNT
from pingctl.fanout.step import FanoutStep, task_function
from pingctl.fanout.work import PLAN, TASKS


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

    def map(self, task: str, name: str, work: str, indices: list[int]) -> list[dict | BaseException]:
        """The task function `task` ("module:function", the remote function `name`) on
        (MOUNT/work, i) for each i, remotely; per task its record or its error."""

    def download(self, remote: str, local: Path) -> None:
        """A directory of the volume -> the (new, empty) local directory `local`."""

    def remove(self, remote: str) -> None:
        """Delete a directory of the volume, recursively."""


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

    def __init__(self, root: Path, fail: Callable[[int], BaseException | None] | None = None):
        self.root = Path(root)
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

    def map(self, task: str, name: str, work: str, indices: list[int]) -> list[dict | BaseException]:
        fn = task_function(task)
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


def build_app(s: ModalSettings, task: str, name: str):
    """The Modal app, its per-task function `name` (running `task`, "module:function") and the
    volume: built offline (nothing contacted)."""
    import modal

    # the pingctl that made the plan (each task checks the version), added at container start
    image = with_source(base_image(base_requirements()))
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

    def __init__(self, s: ModalSettings):
        import modal

        self.settings = s
        self.volume = modal.Volume.from_name(s.volume, create_if_missing=True)

    def upload(self, files: list[tuple[Path, str]]) -> None:
        with self.volume.batch_upload(force=True) as batch:
            for local, remote in files:
                batch.put_file(str(local), "/" + remote)

    def map(self, task: str, name: str, work: str, indices: list[int]) -> list[dict | BaseException]:
        app, fn, _ = build_app(self.settings, task, name)
        with app.run():
            return list(fn.map([work] * len(indices), indices, return_exceptions=True, order_outputs=True))

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


# ---------------------------------------------------------------- the engine


class ModalExecutor(Executor):
    """Fan-out: a Modal map over the tasks (settings: `ModalSettings`; `boundary`: the Modal
    SDK unless given, e.g. a `DirBoundary`); training: run.py."""

    name = "modal"
    Settings = ModalSettings
    submit_options = frozenset({"name", "detach"})

    def __init__(self, settings: ModalSettings | None = None, boundary: Boundary | None = None):
        super().__init__(settings)
        self.boundary = boundary

    @classmethod
    def from_options(cls, command: str, options: dict) -> "ModalExecutor":
        ex = super().from_options(command, options)
        extra = {"app_name": f"pingctl-{command}"} if "app_name" not in options else {}
        if options.get("modal_cpu") is not None:
            extra["cpu"] = options["modal_cpu"]
        ex.settings = dataclasses.replace(ex.settings, **extra)
        return ex

    def prepare(self, step: FanoutStep, todo: list[int]) -> None:
        if todo and self.boundary is None:
            check_credentials()
            self.boundary = call(lambda: ModalBoundary(self.settings))

    @staticmethod
    def base(step: FanoutStep) -> str:
        """The step's work directory on the volume."""
        return f"{step.command}/{remote_name(step.out)}"

    def run(self, step: FanoutStep, todo: list[int], say: Say, on_progress: Progress = None) -> dict[int, str]:
        return call(lambda: self._map(step, todo, say, on_progress))

    def _map(self, step: FanoutStep, todo: list[int], say: Say, on_progress: Progress) -> dict[int, str]:
        """Upload the plan and the inputs of `todo`, map the task over them, pull back the task
        directories of those that finished. Returns {index: error} for the calls that failed."""
        base = self.base(step)
        staged = step.work / "modal-plan.json"
        staged.write_text(json.dumps(step.remote_plan(), indent=2, sort_keys=True) + "\n")
        uploads = [(staged, f"{base}/{PLAN}")] + [(local, f"{base}/{rel}") for local, rel in step.uploads(todo)]
        say(f"uploading {len(uploads) - 1} input(s) to the volume at /{base}")
        self.boundary.upload(uploads)
        say(f"running {len(todo)} task(s) on Modal")
        failed: dict[int, str] = {}
        done = 0
        for i, res in zip(todo, self.boundary.map(step.task_ref, step.function, f"{MOUNT}/{base}", todo)):
            if isinstance(res, BaseException):
                failed[i] = f"{type(res).__name__}: {res}"
                continue
            with atomic_dir(step.task_dir(i)) as tmp:
                self.boundary.download(f"{base}/{TASKS}/{i:05d}", tmp)
            done += 1
            if on_progress is not None:
                on_progress(done)
        return failed

    def cleanup(self, step: FanoutStep, say: Say) -> None:
        if self.boundary is not None:
            call(lambda: self.boundary.remove(self.base(step)))

    def describe(self, step: FanoutStep, todo: list[int]) -> dict:
        s = self.settings
        ups = step.uploads(todo)
        return {"modal": {
            "app": s.app_name,
            "function": f"{step.function}(work, index): {step.task_ref}, mapped over {len(todo)} task(s)",
            "image": f"debian_slim python 3.12 + pip: {len(base_requirements())} base requirements of pingctl "
                     f"{__version__}; pingctl added from {Path(pingctl.__file__).resolve().parent}",
            "resources per task": f"{s.cpu:g} CPU, {s.memory_mb} MB, timeout {s.timeout_s} s",
            "volume": f"{s.volume} at {MOUNT}; work at /{self.base(step)}",
            "uploads": f"{len(ups)} input(s), {sum(p.stat().st_size for p, _ in ups):,} bytes",
        }}

    def submit(self, cfg, run: Path, *, fresh: bool = False, dry_run: bool = False, **options) -> dict:
        return training.submit(cfg, run, fresh=fresh, dry_run=dry_run, **options)

    def status(self, run: Path) -> dict:
        return training.status(run)

    def follow(self, run: Path) -> dict:
        return training.follow(run)
