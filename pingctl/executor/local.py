"""The local engine: here, in this process tree. `ingest` and `build-rows` then run their own
local paths (worker processes, one DuckDB build), and `train` its worker with the live view;
handed a fanned-out step, it runs the tasks one after the other in this process (what a test,
or a machine without a cluster, can check a step's tasks with)."""

from __future__ import annotations

from pathlib import Path

from pingctl.executor.base import Executor, Progress, Say
from pingctl.fanout.step import FanoutStep, task_function
from pingctl.train.local import run_local


class LocalExecutor(Executor):
    name = "local"
    remote = False

    def run(self, step: FanoutStep, todo: list[int], say: Say, on_progress: Progress = None) -> dict[int, str]:
        fn = task_function(step.task_ref)
        failed: dict[int, str] = {}
        for k, i in enumerate(todo, 1):
            try:
                fn(step.work, i)
            except Exception as e:  # noqa: BLE001 - a task's failure is reported with the others
                failed[i] = f"{type(e).__name__}: {e}"
            if on_progress is not None:
                on_progress(k)
        return failed

    def submit(self, cfg, run: Path, *, fresh: bool = False, dry_run: bool = False, **options) -> dict:
        """Train here; `options`: run_local's `on_record`/`on_start` (the CLI's live view)."""
        return run_local(cfg, run, fresh=fresh, **options)
