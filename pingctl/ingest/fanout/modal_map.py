"""The Modal engine of a fanned-out ingest: one Modal function call per task (`Function.map`),
reading the inputs from a Modal Volume and writing each task's directory there; the finished
task directories are pulled back into the local work directory, where the merge runs.

Layout on the volume (mounted at /data in the containers), NAME from the output's path:

    /ingest/NAME/plan.json              the plan, each input's `read` path pointing below
    /ingest/NAME/inputs/00003-FILE      the inputs of the tasks to run, uploaded
    /ingest/NAME/tasks/00003/           what `work.run_task` writes, as on any engine

Everything pingctl decides (the plan, the task, its checks, the merge) is pingctl's own code,
also run by the tests; the boundary with Modal is the small `Boundary` interface: upload
files, map the task function over task indices, download a directory, remove a directory
(pingctl.fanout.modal). `ModalBoundary` is that interface on the Modal SDK; `DirBoundary` is a
local directory standing in for the volume, and a loop in this process for `map` (the tests use it).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable

import pingctl
from pingctl import __version__
from pingctl.atomic import atomic_dir
from pingctl.fanout import modal as engine
from pingctl.fanout.modal import MOUNT, Boundary, check_credentials, image_requirements, remote_name
from pingctl.ingest.fanout.work import PLAN, TASKS, task_dir

__all__ = ["MOUNT", "ROOT", "TASK", "Boundary", "DirBoundary", "ModalBoundary", "ModalSettings", "build_app",
           "check_credentials", "cleanup", "describe", "image_requirements", "remote_name", "remote_plan", "run_map"]

ROOT = "ingest"  # directory of the fanned-out ingests on the volume
TASK = "pingctl.ingest.fanout.work:run_task"
FUNCTION = "ingest_task"


@dataclasses.dataclass(frozen=True)
class ModalSettings(engine.ModalSettings):
    app_name: str = "pingctl-ingest"
    timeout_s: int = 7200  # per task (one input file)


def remote_plan(plan: dict) -> dict:
    """The plan as the containers read it: each input from its uploaded copy (relative to the
    work directory on the volume); its mtime is the upload's, so only its size is checked."""
    tasks = []
    for t in plan["tasks"]:
        tasks.append({**t, "read": f"inputs/{t['index']:05d}-{Path(t['source']).name}", "mtime_ns": None})
    return {**plan, "tasks": tasks}


def run_map(work: Path, plan: dict, todo: list[int], boundary: Boundary,
            on_event: Callable[[str], None] | None = None,
            on_progress: Callable[[int], None] | None = None) -> dict[int, str]:
    """Upload the plan and the inputs of `todo`, map the task over them, pull back the task
    directories of those that finished. Returns {index: error} for the calls that failed."""
    say = on_event or (lambda _m: None)
    work = Path(work)
    name = remote_name(Path(plan["out"]))
    base = f"{ROOT}/{name}"
    rplan = remote_plan(plan)
    staged = work / "modal-plan.json"
    staged.write_text(json.dumps(rplan, indent=2, sort_keys=True) + "\n")
    by_index = {t["index"]: t for t in rplan["tasks"]}
    uploads = [(staged, f"{base}/{PLAN}")]
    uploads += [(Path(by_index[i]["source"]), f"{base}/{by_index[i]['read']}") for i in todo]
    say(f"uploading {len(todo)} input(s) to the volume at /{base}")
    boundary.upload(uploads)
    say(f"running {len(todo)} task(s) on Modal")
    outcomes = boundary.map(f"{MOUNT}/{base}", todo)
    failed: dict[int, str] = {}
    done = 0
    for i, res in zip(todo, outcomes):
        if isinstance(res, BaseException):
            failed[i] = f"{type(res).__name__}: {res}"
            continue
        with atomic_dir(task_dir(work, i)) as tmp:
            boundary.download(f"{base}/{TASKS}/{i:05d}", tmp)
        done += 1
        if on_progress is not None:
            on_progress(done)
    return failed


def cleanup(plan: dict, boundary: Boundary) -> None:
    boundary.remove(f"{ROOT}/{remote_name(Path(plan['out']))}")


# ---------------------------------------------------------------- the boundaries


class DirBoundary(engine.DirBoundary):
    """A local directory standing in for the volume, running ingest's task in this process
    (what it does not stand in for: docs/ingest.md)."""

    def __init__(self, root: Path, fail: Callable[[int], BaseException | None] | None = None):
        super().__init__(root, TASK, fail)


def build_app(s: ModalSettings):
    """The Modal app, its per-task function and the volume: built offline (nothing contacted)."""
    return engine.build_app(s, TASK, FUNCTION)


class ModalBoundary(engine.ModalBoundary):
    def __init__(self, s: ModalSettings):
        super().__init__(s, TASK, FUNCTION)


def describe(s: ModalSettings, plan: dict, todo: list[int]) -> dict:
    base = f"{ROOT}/{remote_name(Path(plan['out']))}"
    return {
        "app": s.app_name,
        "function": f"{FUNCTION}(work, index): {TASK}, mapped over {len(todo)} task(s)",
        "image": f"debian_slim python 3.12 + pip: {len(image_requirements())} base requirements of pingctl "
                 f"{__version__}; pingctl added from {Path(pingctl.__file__).resolve().parent}",
        "resources per task": f"{s.cpu:g} CPU, {s.memory_mb} MB, timeout {s.timeout_s} s",
        "volume": f"{s.volume} at {MOUNT}; work at /{base}",
        "uploads": f"{len(todo)} input(s), {sum(plan['tasks'][i]['bytes'] for i in todo):,} bytes",
    }
