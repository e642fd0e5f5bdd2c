"""What a fanned-out command hands the driver (pingctl.executor.fanout) and the engines: its
plan, where its tasks write, how a task is run and checked, and how the parts become the output.

A task is `task_ref` ("module:function", called as fn(Path(work), index)) or, as a process,
`python -m TASK_MODULE WORK INDEX`; it writes `WORK/tasks/NNNNN/` atomically, its completion
marker (`marker`) inside. The step, never the engine, says whether a task is done (`why_not_done`).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Callable

from pingctl.fanout.work import task_dir as task_path


def task_function(ref: str) -> Callable[[Path, int], dict]:
    """"module:function" -> the function."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


class FanoutStep(ABC):
    command: str  # "ingest": the command's name, the directory of its work on a remote volume
    task_module: str  # python -m TASK_MODULE WORK INDEX
    task_ref: str  # "module:function"
    function: str  # the name of the task's remote function (Modal)
    marker: str  # the file that completes a task directory

    def __init__(self, plan: dict, work: Path, out: Path):
        self.plan, self.work, self.out = plan, Path(work), Path(out)

    @property
    def size(self) -> int:
        return len(self.plan["tasks"])

    def task_dir(self, index: int) -> Path:
        return task_path(self.work, index)

    @abstractmethod
    def states(self) -> dict[int, str | None]:
        """Each task's state: None when its directory passes the checks, else why it runs."""

    @abstractmethod
    def why_not_done(self, index: int) -> str | None:
        """None when task `index` is complete and passes its checks, else why not."""

    def label(self, index: int) -> str:
        """How a report names task `index`."""
        return f"task {index}"

    @abstractmethod
    def merge(self, started: float) -> dict:
        """Check every task again and publish the output atomically; the summary."""

    @abstractmethod
    def remote_plan(self) -> dict:
        """The plan as a task reads it from a copy of the work directory elsewhere (its inputs
        from `uploads`, relative to the work directory)."""

    @abstractmethod
    def uploads(self, todo: list[int]) -> list[tuple[Path, str]]:
        """(local file, path relative to the work directory) the tasks `todo` read elsewhere."""

    @abstractmethod
    def describe(self, states: dict[int, str | None], todo: list[int]) -> dict:
        """`--dry-run`: the step's side of the plan (tasks, inputs, bytes)."""
