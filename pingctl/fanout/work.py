"""What every fanned-out command's work directory needs: one driver at a time, files described
by size and sha256 when a task writes them and compared when the merge reads them, and the
merge's link (not copy) of a task's file into the output."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Iterator

from pingctl.atomic import write_json
from pingctl.errors import PingctlError

PLAN = "plan.json"  # in the work directory: the tasks, their keys and the command's options
TASKS = "tasks"  # in the work directory: one directory per task, tasks/NNNNN/
NOT_RUN = "not done yet"


def work_dir(out: Path) -> Path:
    """Where the tasks of `out` are written: a hidden sibling, on the output's file system
    (a cluster's tasks must see it; the merge links their files into the output)."""
    out = Path(out).resolve()
    return out.parent / f".{out.name}.fanout"


def task_dir(work: Path, index: int) -> Path:
    return Path(work) / TASKS / f"{index:05d}"


def read_plan(work: Path, kind: str, command: str) -> dict:
    """The work directory's plan, refused by name unless it is a plan of `kind`."""
    path = Path(work) / PLAN
    try:
        plan = json.loads(path.read_text())
    except FileNotFoundError:
        raise PingctlError(f"{work} has no {PLAN}: not the work directory of a fanned-out {command}") from None
    except (OSError, ValueError) as e:
        raise PingctlError(f"cannot read {path}: {e}") from None
    if not isinstance(plan, dict) or plan.get("kind") != kind:
        raise PingctlError(f"{path} is not a pingctl {command} plan")
    return plan


def write_plan(work: Path, plan: dict) -> None:
    Path(work).mkdir(parents=True, exist_ok=True)
    write_json(Path(work) / PLAN, plan)


@contextlib.contextmanager
def locked(work: Path, command: str) -> Iterator[None]:
    """One driver per work directory at a time (the tasks themselves take no lock)."""
    import fcntl

    Path(work).mkdir(parents=True, exist_ok=True)
    with open(Path(work) / ".lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise PingctlError(f"another `pingctl {command}` is running on {work}: wait for it to finish") from None
        yield


def read_marker(d: Path, name: str, kind: str, task: dict, changed: str) -> tuple[dict | None, str | None]:
    """A task directory's completion marker `name` when it is one of `kind` made for `task`'s
    key: (record, None), else (None, why not). `changed`: what a stale key means for this step."""
    if not d.is_dir():
        return None, NOT_RUN
    try:
        rec = json.loads((d / name).read_text())
    except FileNotFoundError:
        return None, f"{d} has no {name}: the task did not finish"
    except (OSError, ValueError) as e:
        return None, f"{d / name} is unreadable ({e})"
    if not isinstance(rec, dict) or rec.get("kind") != kind:
        return None, f"{d / name} is not a pingctl {kind.removeprefix('pingctl-').replace('-', ' ')}"
    if rec.get("key") != task["key"]:
        return None, f"made for another plan ({changed} changed)"
    return rec, None


def describe(path: Path) -> dict:
    """Name, bytes, sha256 and newline count of a file a task wrote."""
    sha = hashlib.sha256()
    lines = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
            lines += chunk.count(b"\n")
    return {"name": path.name, "bytes": path.stat().st_size, "sha256": sha.hexdigest(), "lines": lines}


def compare(path: Path, want: dict, manifest: str) -> str | None:
    """Why `path` is not the file `want` describes (None: it is)."""
    if not path.is_file():
        return f"{path.name} is missing"
    size = path.stat().st_size
    if size != want["bytes"]:
        return f"{path.name} has {size} bytes, {manifest} recorded {want['bytes']} (the file changed after the task wrote it)"
    got = describe(path)
    if got["sha256"] != want["sha256"]:
        return (f"{path.name}: sha256 {got['sha256'][:16]}... differs from {want['sha256'][:16]}... recorded in "
                f"{manifest} (the file changed after the task wrote it)")
    return None


def link(src: Path, dst: Path) -> None:
    """A hard link where the file system has them (no copy of the parts), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def finished_tasks(plan: dict, out: Path, read, label) -> list[dict]:
    """Every task's record, `read(task)` giving (record, problem); where any is not done or not
    intact, a PingctlError naming each (`label(task)`) and how to finish them."""
    done, bad = [], []
    for t in plan["tasks"]:
        rec, problem = read(t)
        if problem:
            bad.append(f"{label(t)}: {problem}")
        else:
            done.append(rec)
    if bad:
        shown = "\n  ".join(bad[:20]) + (f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else "")
        raise PingctlError(f"cannot merge {out}: {len(bad)} of {len(plan['tasks'])} task(s) are not done or not "
                           f"intact:\n  {shown}\nrun the same command again: it redoes these tasks and keeps the others")
    return done


def check_unchanged(read: Path, index: int, source: dict) -> None:
    """Refuse a task whose input is not the file the plan described (`source`: its path, bytes
    and mtime_ns): a task must read what was planned. A copy on a volume has its own mtime, so
    there (mtime_ns None) only its size is compared."""
    try:
        st = read.stat()
    except OSError as e:
        raise PingctlError(f"task {index} cannot read {source['path']} ({read}): {e.strerror or e}") from None
    moved = source["mtime_ns"] is not None and st.st_mtime_ns != source["mtime_ns"]
    if st.st_size != source["bytes"] or moved:
        raise PingctlError(f"{source['path']} changed since the plan was made ({source['bytes']} bytes then, "
                           f"{st.st_size} now{', modified since' if moved else ''}): rerun the command to plan it again")
