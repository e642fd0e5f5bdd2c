"""`pingctl build-rows --target slurm|modal`: plan, run the tasks that are not done, merge
(docs/rows.md, "Fanned out"). The engines are pingctl.fanout's; what a task does and how the
parts become one output is pingctl.records.fanout.

    1. resolve the split as a local build does; N tasks, one per hash partition of the probes
    2. compare the plan with the work directory: a task whose part.json has this plan's key and
       whose files pass their check is kept; every other task runs (`--dry-run` stops here)
    3. the engine runs them (SLURM job array / Modal map), each one `fanout.run_task`
    4. the tasks that still are not done are named, with their logs, and nothing is published
       (exit 1): the same command again runs only those
    5. the merge checks every task again and writes the output atomically; the work dir goes
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Callable

import pingctl
from pingctl import __version__
from pingctl.artifacts.records import BY
from pingctl.artifacts.table import refuse_whole_shard_output, resolve_inputs
from pingctl.atomic import atomic_dir, check_replaceable
from pingctl.errors import PingctlError, UsageError
from pingctl.fanout import modal as modal_engine
from pingctl.fanout import slurm
from pingctl.fanout.modal import MOUNT, Boundary, DirBoundary, ModalBoundary
from pingctl.fanout.work import locked
from pingctl.records.fanout import (NOT_RUN, PART, PLAN, TASKS, make_plan, merge, read_task, task_dir, task_states,
                                    work_dir, write_plan)

TARGETS = ("slurm", "modal")
TEMPLATE = "build_rows_array.sh.j2"
TASK = "pingctl.records.fanout:run_task"
FUNCTION = "build_rows_task"
ROOT = "build-rows"  # directory of the fanned-out builds on the volume
DEFAULT_TASKS = 8


@dataclasses.dataclass(frozen=True)
class SlurmSettings(slurm.SlurmSettings):
    """The job array's resources (per task: one hash partition of the probes; each reads the split)."""

    job_name: str = "pingctl-build-rows"


@dataclasses.dataclass(frozen=True)
class ModalSettings(modal_engine.ModalSettings):
    app_name: str = "pingctl-build-rows"


def dir_boundary(root: Path, fail: Callable[[int], BaseException | None] | None = None) -> DirBoundary:
    """A local directory standing in for the Modal volume, running build-rows' task here."""
    return DirBoundary(root, TASK, fail)


def render(work: Path, plan: dict, s: SlurmSettings, offset: int, ids: list[int]) -> str:
    return slurm.template_env().get_template(TEMPLATE).render(
        version=__version__, out=plan["out"], work=str(work), logs=str(Path(work) / slurm.LOGS), s=s,
        array=slurm.array_spec(ids, s.max_parallel), offset=offset, python=s.python or sys.executable,
        source=str(Path(pingctl.__file__).resolve().parents[1]),
    )


def scripts(work: Path, plan: dict, s: SlurmSettings, todo: list[int]) -> list[tuple[int, list[int], str]]:
    return [(off, ids, render(work, plan, s, off, ids)) for off, ids in slurm.batches(todo)]


def fanout(
    inputs: list[str | Path],
    out: Path,
    target: str,
    *,
    tasks: int = DEFAULT_TASKS,
    by: str = "source",
    max_row_mb: float = 8.0,
    dst_max_row_mb: float | None = None,
    memory_limit: str = "4GB",
    config: dict | None = None,
    force: bool = False,
    dry_run: bool = False,
    slurm_settings: SlurmSettings | None = None,
    modal_settings: ModalSettings | None = None,
    boundary: Boundary | None = None,
    on_event: Callable[[str], None] | None = None,
) -> dict:
    """Run a fanned-out build-rows (or, with `dry_run`, say what it would run). Returns a local
    build's result plus target, tasks, tasks_run, tasks_reused, jobs and work dir.
    `boundary`: the Modal boundary (default: the Modal SDK; `dir_boundary` for a local directory)."""
    t0 = time.perf_counter()
    say = on_event or (lambda _m: None)
    if target not in TARGETS:
        raise UsageError(f"--target {target!r}: a fanned-out build-rows runs on {' or '.join(TARGETS)}")
    if by not in BY:
        raise UsageError(f"--by {by!r}: expected one of {', '.join(BY)}")
    if tasks < 1:
        raise UsageError(f"--tasks {tasks}: give at least 1")
    out = Path(out)
    s = slurm_settings or SlurmSettings()
    m = modal_settings or ModalSettings()
    refuse_whole_shard_output(inputs)
    files = resolve_inputs(inputs)
    check_replaceable(out, force, inputs=files)
    plan = make_plan(files, out, by, tasks, max_row_mb, dst_max_row_mb, memory_limit, config)
    work = work_dir(out)
    if target == "slurm":
        slurm.check_settings(s, work, "build-rows")
    states = task_states(work, plan)
    todo = [i for i, why in states.items() if why is not None]
    if dry_run:
        return _dry_run(plan, work, target, states, todo, s, m)
    if target == "slurm":
        slurm.require_tools()
    elif todo and boundary is None:
        modal_engine.check_credentials()
        boundary = modal_engine.call(lambda: ModalBoundary(m, TASK, FUNCTION))
    with locked(work, "build-rows"):
        if target == "slurm" and slurm.wait_for_earlier(work, say):
            states = task_states(work, plan)
            todo = [i for i, why in states.items() if why is not None]
        write_plan(work, plan)
        for i in todo:  # what a failed or stale attempt left must not pass for this run's result
            shutil.rmtree(task_dir(work, i), ignore_errors=True)
        if len(todo) < tasks:
            say(f"{tasks - len(todo)} of {tasks} task(s) already done in {work}: kept")
        jobs: list[str] = []
        failed: dict[int, str] = {}
        if todo:
            if target == "slurm":
                jobs = slurm.run_array(work, scripts(work, plan, s, todo), "build-rows-array",
                                       lambda i: (task_dir(work, i) / PART).is_file(), say)
            else:
                failed = modal_engine.call(lambda: _run_map(work, plan, todo, boundary, say))
        _refuse_unfinished(work, plan, target, todo, failed)
        result = merge(work, out)
    if target == "modal" and boundary is not None:
        try:  # the output is published: a volume left with the uploads is worth a warning, not a failure
            modal_engine.call(lambda: boundary.remove(f"{ROOT}/{modal_engine.remote_name(out)}"))
        except PingctlError as e:
            say(f"warning: the work directory on the volume was not removed ({e})")
    result.update(target=target, tasks=tasks, tasks_run=len(todo), tasks_reused=tasks - len(todo), jobs=jobs,
                  work=str(work), elapsed_s=time.perf_counter() - t0)
    result["measurements_per_s"] = result["measurements"] / result["elapsed_s"]
    return result


def _run_map(work: Path, plan: dict, todo: list[int], boundary: Boundary, say) -> dict[int, str]:
    """Upload the plan and the split, map the task over `todo`, pull back the task directories
    of those that finished. Returns {index: error} for the calls that failed."""
    base = f"{ROOT}/{modal_engine.remote_name(Path(plan['out']))}"
    # the containers read the split from its uploaded copy; its mtime is the upload's: size only
    sources = [{**src, "read": f"inputs/{i:05d}-{Path(src['source']).name}", "mtime_ns": None}
               for i, src in enumerate(plan["sources"])]
    staged = work / "modal-plan.json"
    staged.write_text(json.dumps({**plan, "sources": sources}, indent=2, sort_keys=True) + "\n")
    uploads = [(staged, f"{base}/{PLAN}")] + [(Path(src["source"]), f"{base}/{src['read']}") for src in sources]
    say(f"uploading the split ({len(sources)} file(s)) to the volume at /{base}")
    boundary.upload(uploads)
    say(f"running {len(todo)} task(s) on Modal")
    failed: dict[int, str] = {}
    for i, res in zip(todo, boundary.map(f"{MOUNT}/{base}", todo)):
        if isinstance(res, BaseException):
            failed[i] = f"{type(res).__name__}: {res}"
            continue
        with atomic_dir(task_dir(work, i)) as tmp:
            boundary.download(f"{base}/{TASKS}/{i:05d}", tmp)
    return failed


def _refuse_unfinished(work: Path, plan: dict, target: str, todo: list[int], failed: dict[int, str]) -> None:
    bad = []
    by = plan["options"]["by"]
    for i in todo:
        rec, why = read_task(work, plan["tasks"][i], by)
        if rec is not None:
            continue
        line = f"task {i}: {failed.get(i) or ('it ended without writing its result' if why == NOT_RUN else why)}"
        if target == "slurm":
            state, log = slurm.state_of(work, i), slurm.log_of(work, i)
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
    result = {
        "target": target,
        "dry_run": True,
        "out": plan["out"],
        "work": str(work),
        "by": plan["options"]["by"],
        "tasks": len(plan["tasks"]),
        "files": len(plan["sources"]),
        "input_bytes": sum(src["bytes"] for src in plan["sources"]),
        "tasks_run": len(todo),
        "tasks_reused": len(plan["tasks"]) - len(todo),
        "plan": [{"task": i, "partition": f"md5(probe key) % {len(plan['tasks'])} == {i}",
                  "state": "done: kept" if why is None else f"to run ({why})"} for i, why in states.items()],
    }
    if target == "slurm" and todo:
        result["scripts"] = [text for _, _, text in scripts(work, plan, s, todo)]
        result["logs"] = str(work / slurm.LOGS)
    if target == "modal" and todo:
        base = f"{ROOT}/{modal_engine.remote_name(Path(plan['out']))}"
        result["modal"] = {
            "app": m.app_name,
            "function": f"{FUNCTION}(work, index): {TASK}, mapped over {len(todo)} task(s)",
            "resources per task": f"{m.cpu:g} CPU, {m.memory_mb} MB, timeout {m.timeout_s} s",
            "volume": f"{m.volume} at {MOUNT}; work at /{base}",
            "uploads": f"the split: {len(plan['sources'])} file(s), {result['input_bytes']:,} bytes",
        }
    result["files_written"] = "nothing (--dry-run)"
    return result


def local_dry_run(inputs: list[str | Path], out: Path, by: str = "source", force: bool = False) -> dict:
    """What a local build-rows would do: the split's files and bytes; nothing is written."""
    if by not in BY:
        raise UsageError(f"--by {by!r}: expected one of {', '.join(BY)}")
    refuse_whole_shard_output(inputs)
    files = resolve_inputs(inputs)
    check_replaceable(Path(out), force, inputs=files)
    return {"target": "local", "dry_run": True, "out": str(out), "by": by, "tasks": 1, "files": len(files),
            "input_bytes": sum(f.stat().st_size for f in files),
            "plan": [{"task": 0, "partition": "every probe", "state": "to run"}],
            "files_written": "nothing (--dry-run)"}
