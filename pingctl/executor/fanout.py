"""The one fan-out driver of `ingest` and `build-rows` (`--target ENGINE`): plan, run the tasks
that are not done, merge.

    1. the step has planned its tasks; each is compared with the work directory: a task whose
       completion marker has this plan's key and whose files pass their checks is kept, every
       other task runs (`--dry-run` stops here and says what would run, and how)
    2. the engine runs them (a SLURM job array, a Modal map, a loop here, ...)
    3. the tasks that still are not done are named, with what the engine says of them and their
       logs, and nothing is published (exit 1): the same command again runs only those
    4. the merge checks every task again and writes the output atomically; the work dir goes
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Callable

from pingctl.errors import PingctlError
from pingctl.executor.base import Executor
from pingctl.fanout.step import FanoutStep
from pingctl.fanout.work import NOT_RUN, locked, write_plan


def run(step: FanoutStep, executor: Executor, *, dry_run: bool = False,
        on_event: Callable[[str], None] | None = None,
        on_start: Callable[[int], None] | None = None,
        on_progress: Callable[[int], None] | None = None) -> dict:
    """Run `step` on `executor` (or, with `dry_run`, say what would run). Returns the step's
    merge summary plus target, tasks, tasks_run, tasks_reused, jobs and work.
    `on_start(n)`: n tasks are about to run; `on_progress(k)`: k of them are done."""
    t0 = time.perf_counter()
    say = on_event or (lambda _m: None)
    executor.check(step)
    states = step.states()
    todo = [i for i, why in states.items() if why is not None]
    if dry_run:
        return _dry_run(step, executor, states, todo)
    executor.prepare(step, todo)  # the engine's tools and credentials, before anything is written
    with locked(step.work, step.command):
        # an earlier driver killed while its tasks ran: they finish before anything is redone
        if executor.wait_for_earlier(step, say):
            states = step.states()
            todo = [i for i, why in states.items() if why is not None]
        write_plan(step.work, step.plan)
        for i in todo:  # what a failed or stale attempt left must not pass for this run's result
            shutil.rmtree(step.task_dir(i), ignore_errors=True)
        if len(todo) < step.size:
            say(f"{step.size - len(todo)} of {step.size} task(s) already done in {step.work}: kept")
        failed: dict[int, str] = {}
        if todo:
            if on_start is not None:
                on_start(len(todo))
            failed = executor.run(step, todo, say, on_progress)
        refuse_unfinished(step, executor, todo, failed)
        summary = step.merge(t0)
    try:  # the output is published: what is left elsewhere is worth a warning, not a failure
        executor.cleanup(step, say)
    except PingctlError as e:
        say(f"warning: the work directory of the {executor.name} engine was not removed ({e})")
    summary.update(target=executor.name, tasks=step.size, tasks_run=len(todo), tasks_reused=step.size - len(todo),
                   workers=len(todo), jobs=list(executor.jobs), work=str(step.work))
    return summary


def refuse_unfinished(step: FanoutStep, executor: Executor, todo: list[int], failed: dict[int, str]) -> None:
    """Name each task of `todo` that is not complete (why, the engine's word, its log's tail)."""
    bad = []
    for i in todo:
        why = step.why_not_done(i)
        if why is None:
            continue
        if why == NOT_RUN:
            why = "it ended without writing its result"
        line = f"{step.label(i)}: {failed.get(i) or why}"
        state, log = executor.task_state(step, i), executor.task_log(step, i)
        line += f" ({state})" if state else ""
        line += f"; log {log}" + tail(log) if log else ""
        bad.append(line)
    if bad:
        shown = "\n  ".join(bad[:10]) + (f"\n  ... and {len(bad) - 10} more" if len(bad) > 10 else "")
        raise PingctlError(f"{len(bad)} of {len(todo)} task(s) did not finish, nothing was published:\n  {shown}\n"
                           f"the other tasks are kept in {step.work}; run the same command again to redo only these")


def tail(log: Path, lines: int = 3) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return " (not written: the task never started, or was cancelled before it did)"
    return (":\n      " + "\n      ".join(text)) if text else " (empty)"


def _dry_run(step: FanoutStep, executor: Executor, states: dict, todo: list[int]) -> dict:
    result = {"target": executor.name, "dry_run": True, "work": str(step.work), "tasks": step.size,
              "tasks_run": len(todo), "tasks_reused": step.size - len(todo), **step.describe(states, todo)}
    if todo:
        result.update(executor.describe(step, todo))
    result["files_written"] = "nothing (--dry-run)"
    return result
