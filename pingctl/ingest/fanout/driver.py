"""`pingctl ingest --target slurm|modal`: plan, run the tasks that are not done, merge.

    1. resolve the inputs as a local run does; one task per input file, in input order
    2. compare the plan with the work directory: a task whose task.json has this plan's key and
       whose files pass their check is kept; every other task runs (`--dry-run` stops here)
    3. the engine runs them (SLURM job array / Modal map), each one `work.run_task`
    4. the tasks that still are not done are named, with their logs, and nothing is published
       (exit 1): the same command again runs only those
    5. the merge checks every task again and writes the output atomically; the work dir goes
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Callable, Iterable

from pingctl.atomic import check_replaceable
from pingctl.errors import PingctlError, UsageError
from pingctl.ingest.core import is_stream, resolve
from pingctl.fanout import modal as modal_engine
from pingctl.ingest.fanout import modal_map, slurm
from pingctl.ingest.fanout.modal_map import Boundary, ModalSettings
from pingctl.ingest.fanout.slurm import SlurmSettings
from pingctl.ingest.fanout.work import (LOGS, NOT_RUN, locked, make_plan, merge, read_task, task_dir, task_states,
                                        work_dir, write_plan)
from pingctl.ingest.parse import Options
from pingctl.ingest.reader import usable_cores

TARGETS = ("slurm", "modal")


def plan_for(inputs: Iterable[str | Path], out: Path, cfg, target: str, force: bool = False) -> tuple[dict, Path]:
    out = Path(out)
    if target not in TARGETS:
        raise UsageError(f"--target {target!r}: a fanned-out ingest runs on {' or '.join(TARGETS)}")
    files = resolve(inputs, out)
    streams = [f for f in files if is_stream(f)]
    if streams:
        raise UsageError(f"{streams[0]} is a pipe or device: with --target {target} each input is read by its own "
                         "task elsewhere, and a stream can only be read here; save it to a file first")
    check_replaceable(out, force)
    return make_plan(files, out, cfg, Options.from_config(cfg)), work_dir(out)


def fanout(
    inputs: Iterable[str | Path],
    out: Path,
    cfg,
    target: str,
    *,
    force: bool = False,
    dry_run: bool = False,
    slurm_settings: SlurmSettings | None = None,
    modal_settings: ModalSettings | None = None,
    boundary: Boundary | None = None,
    on_event: Callable[[str], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> dict:
    """Run a fanned-out ingest (or, with `dry_run`, say what it would run). Returns the summary:
    a local run's counts plus target, tasks, tasks_run, tasks_reused, jobs and work dir.

    `boundary`: the Modal boundary (default: the Modal SDK); a `modal_map.DirBoundary` runs the
    Modal path against a local directory. `on_start(n)`: n tasks are about to run;
    `on_progress(k)`: k of them are done."""
    t0 = time.perf_counter()
    say = on_event or (lambda _m: None)
    out = Path(out)
    s = slurm_settings or SlurmSettings()
    m = modal_settings or ModalSettings()
    plan, work = plan_for(inputs, out, cfg, target, force)
    if target == "slurm":
        slurm.check_settings(s, work)
    states = task_states(work, plan)
    todo = [i for i, why in states.items() if why is not None]
    if dry_run:
        return _dry_run(plan, work, target, states, todo, s, m)
    # what the engine needs is checked before anything is written
    if target == "slurm":
        slurm.require_tools()
    elif todo and boundary is None:
        boundary = _modal_boundary(m)
    with locked(work):
        if target == "slurm":
            # an earlier driver killed while its array ran: its tasks finish before anything is redone
            if slurm.wait_for_earlier(work, say):
                states = task_states(work, plan)
                todo = [i for i, why in states.items() if why is not None]
        write_plan(work, plan)
        for i in todo:  # what a failed or stale attempt left must not pass for this run's result
            shutil.rmtree(task_dir(work, i), ignore_errors=True)
        reused = len(plan["tasks"]) - len(todo)
        if reused:
            say(f"{reused} of {len(plan['tasks'])} task(s) already done in {work}: kept")
        jobs: list[str] = []
        failed: dict[int, str] = {}
        if todo:
            if on_start is not None:
                on_start(len(todo))
            if target == "slurm":
                jobs = slurm.run_array(work, plan, todo, s, say, on_progress)
            else:
                failed = _modal_call(lambda: modal_map.run_map(work, plan, todo, boundary, say, on_progress))
        _refuse_unfinished(work, plan, target, todo, failed)
        summary = merge(work, out, elapsed_from=t0)
    if target == "modal" and boundary is not None:
        try:  # the output is published: a volume left with the uploads is worth a warning, not a failure
            _modal_call(lambda: modal_map.cleanup(plan, boundary))
        except PingctlError as e:
            say(f"warning: the work directory on the volume was not removed ({e})")
    summary.update(target=target, tasks=len(plan["tasks"]), tasks_run=len(todo), tasks_reused=len(plan["tasks"]) - len(todo),
                   workers=len(todo), jobs=jobs, work=str(work))
    return summary


def _modal_boundary(m: ModalSettings) -> Boundary:
    modal_map.check_credentials()
    return _modal_call(lambda: modal_map.ModalBoundary(m))


_modal_call = modal_engine.call


def _refuse_unfinished(work: Path, plan: dict, target: str, todo: list[int], failed: dict[int, str]) -> None:
    bad = []
    for i in todo:
        t = plan["tasks"][i]
        rec, why = read_task(work, t)
        if rec is not None:
            continue
        if why == NOT_RUN:
            why = "it ended without writing its result"
        line = f"task {i} ({t['path']}): {failed.get(i) or why}"
        if target == "slurm":
            state = slurm.state_of(work, i)
            log = slurm.log_of(work, i)
            line += f" ({state})" if state else ""
            line += f"; log {log}" + _tail(log) if log else ""
        bad.append(line)
    if bad:
        shown = "\n  ".join(bad[:10]) + (f"\n  ... and {len(bad) - 10} more" if len(bad) > 10 else "")
        raise PingctlError(f"{len(bad)} of {len(todo)} task(s) did not finish, nothing was published:\n  {shown}\n"
                           f"the other tasks are kept in {work}; run the same command again to redo only these")


def _tail(log: Path, lines: int = 3) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return " (not written: the task never started, or was cancelled before it did)"
    return (":\n      " + "\n      ".join(text)) if text else " (empty)"


def _dry_run(plan, work, target, states, todo, s, m) -> dict:
    tasks = plan["tasks"]
    result = {
        "target": target,
        "dry_run": True,
        "out": plan["out"],
        "work": str(work),
        "tasks": len(tasks),
        "files": len(tasks),
        "input_bytes": sum(t["bytes"] for t in tasks),
        "tasks_run": len(todo),
        "tasks_reused": len(tasks) - len(todo),
        "bytes_to_run": sum(tasks[i]["bytes"] for i in todo),
        "plan": [{"task": t["index"], "path": t["path"], "bytes": t["bytes"],
                  "state": "done: kept" if states[t["index"]] is None else f"to run ({states[t['index']]})"}
                 for t in tasks],
    }
    if target == "slurm" and todo:
        result["scripts"] = [text for _, _, text in slurm.scripts(work, plan, s, todo)]
        result["logs"] = str(work / LOGS)
    if target == "modal" and todo:
        result["modal"] = modal_map.describe(m, plan, todo)
    result["files_written"] = "nothing (--dry-run)"
    return result


def local_dry_run(inputs: Iterable[str | Path], out: Path, cfg, force: bool = False) -> dict:
    """What `--target local` would do: the files in input order (part numbers), their bytes and
    the worker processes; nothing is read but the file sizes, nothing is written."""
    out = Path(out)
    files = resolve(inputs, out)
    check_replaceable(out, force)
    streams = any(is_stream(f) for f in files)
    sizes = [None if is_stream(f) else f.stat().st_size for f in files]
    return {
        "target": "local",
        "dry_run": True,
        "out": str(out),
        "files": len(files),
        "input_bytes": None if streams else sum(sizes),
        "workers": 1 if streams else min(cfg.workers or usable_cores(), len(files)),
        "plan": [{"task": i, "path": str(f), "bytes": b, "state": "to run"} for i, (f, b) in enumerate(zip(files, sizes))],
        "files_written": "nothing (--dry-run)",
    }
