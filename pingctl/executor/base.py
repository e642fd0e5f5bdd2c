"""The one interface every engine implements (the shape of datatrove's executors): run a list
of tasks somewhere, say which are complete, why one failed and where its log is, cancel what it
started, and submit a training run, report on it and follow it.

A fanned-out command (`ingest`, `build-rows`) describes its work as a `pingctl.fanout.step.
FanoutStep`: a plan of N tasks, each `fn(WORK, index)` writing `WORK/tasks/NNNNN/` and, last, its
completion marker (the step's `marker` file, renamed into place with the directory). The engine
never decides whether a task succeeded: the step's checks do, whatever the engine says
(`pingctl.executor.fanout` runs plan -> tasks -> completion -> merge, and redoes only the tasks
that are not complete). Training hands the engine the resolved config and the run directory.

Adding an engine: one module with a subclass of `Executor`, one line in `registry.ENGINES`
(docs/architecture.md, "Adding an engine").
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, ClassVar

from pingctl.errors import UsageError
from pingctl.fanout.step import FanoutStep

Say = Callable[[str], None]
Progress = Callable[[int], None] | None


@dataclasses.dataclass(frozen=True)
class NoSettings:
    """An engine without options."""


class Executor(ABC):
    """One engine. `Settings`: its options (a frozen dataclass); `from_options` picks them out
    of the options the CLI collected, so a new engine needs no CLI change."""

    name: ClassVar[str]
    Settings: ClassVar[type] = NoSettings
    # False: the command runs here its own way (worker processes, the live training view);
    # the fan-out driver and `submit` are for the engines that run elsewhere
    remote: ClassVar[bool] = True
    # the options of `submit` beyond the config (`train --name/--detach` for Modal)
    submit_options: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, settings: Any = None):
        self.settings = settings if settings is not None else self.Settings()
        self.jobs: list[str] = []  # what `run` submitted (job ids), for the summary

    @classmethod
    def from_options(cls, command: str, options: dict[str, Any]) -> "Executor":
        """The engine with the options of `options` that name a field of its Settings (None:
        the default); `command` ("ingest", "build-rows") may name its jobs."""
        fields = {f.name for f in dataclasses.fields(cls.Settings)}
        chosen = {k: v for k, v in options.items() if k in fields and v is not None}
        return cls(cls.Settings(**chosen))

    # ------------------------------------------------------------ a list of tasks

    def check(self, step: FanoutStep) -> None:
        """Refuse settings this engine cannot run with (before anything is planned or written)."""

    def prepare(self, step: FanoutStep, todo: list[int]) -> None:
        """What the engine needs (its tools, credentials), checked before anything is written."""

    def wait_for_earlier(self, step: FanoutStep, say: Say) -> bool:
        """Wait for tasks an earlier, killed driver left running; True if it waited."""
        return False

    @abstractmethod
    def run(self, step: FanoutStep, todo: list[int], say: Say, on_progress: Progress = None) -> dict[int, str]:
        """Run tasks `todo` of `step` until none is running; return {index: error} for those the
        engine saw fail (the driver checks every task's completion itself)."""

    def completed(self, step: FanoutStep, todo: list[int]) -> int:
        """How many of `todo` have written their completion marker (for progress)."""
        return sum((step.task_dir(i) / step.marker).is_file() for i in todo)

    def describe(self, step: FanoutStep, todo: list[int]) -> dict:
        """`--dry-run`: what the engine would run (scripts, an app), as extra report keys."""
        return {}

    def task_state(self, step: FanoutStep, index: int) -> str | None:
        """How the engine says task `index` ended, when it knows."""
        return None

    def task_log(self, step: FanoutStep, index: int) -> Path | None:
        """The log of the last attempt at task `index`, when there is one."""
        return None

    def cancel(self, step: FanoutStep) -> None:
        """Stop what this engine started for `step` and still runs."""

    def cleanup(self, step: FanoutStep, say: Say) -> None:
        """After the merge: remove what the engine left elsewhere (a volume's copies)."""

    # ------------------------------------------------------------ training

    def submit(self, cfg, run: Path, *, fresh: bool = False, dry_run: bool = False, **options) -> dict:
        """Start training `cfg` in run directory `run`. A remote engine returns the submission
        (`target`, `run_dir`, `show`: [(title, text)], `summary`: {label: value}) and records it
        in the run's remote.json; a local one trains and returns the run's summary."""
        raise UsageError(f"--target {self.name}: this engine does not train")

    def status(self, run: Path) -> dict:
        """A submitted run's state (`job_id`, `state`, `ok`, `log`, progress)."""
        raise UsageError(f"--target {self.name}: this engine keeps no record of submitted runs")

    def follow(self, run: Path) -> dict:
        """Stream a submitted run's log to stdout until it ends; returns the final `status`."""
        raise UsageError(f"--target {self.name}: this engine keeps no record of submitted runs")
