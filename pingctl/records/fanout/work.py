"""The work directory of a fanned-out build-rows: its plan, its tasks, their checks and the merge
(docs/rows.md, "Fanned out").

Task i of N builds the records of the probes whose key (the one build-rows groups by:
`prb:ID` or `src:ADDRESS`) has an md5 equal to i modulo N, and, for `--by destination|both`,
of the destinations whose key (`dst:ADDRESS`) does, with the same code as a local build
(`build.build_groups`). Every task reads the whole split (validation and the address table
are the split's), so its records hold what a local build's records of the same probes hold.

Layout, beside the output `OUT` (hidden):

    .OUT.fanout/
      plan.json            the split's files (path, bytes, mtime), the options, a key per task
      tasks/00003/         task 3, renamed into place only when complete (pingctl.atomic):
        rows-00003-00000.arrayrecord ...    its probe records
        by-destination/rows-00003-....      its destination records (--by both)
        rejects.jsonl                       the split's rejects (task 0 only)
        part.json                           its part manifest: counts, files with size and
                                            sha256, the destination index, the task key
      logs/, slurm/, jobs.json               SLURM's task logs, the array scripts, the jobs

The merge checks every part again, links the record files into the output in task order
(record ids: a destination index entry of task i is offset by the records of tasks < i) and
writes the manifests a local build writes, atomically; then it removes the work directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import time
from pathlib import Path

from pingctl import __version__
from pingctl.atomic import atomic_dir, write_json
from pingctl.errors import PingctlError
from pingctl.fanout import work as fanout_work
# the work directory's shared layout: .OUT.fanout/ beside the output, WORK/tasks/NNNNN/
from pingctl.fanout.work import NOT_RUN, PLAN, TASKS, task_dir, work_dir  # noqa: F401
from pingctl.fanout.work import compare, describe, link
from pingctl.records.build import (max_measurements, build_groups, common_fields, group_dirs, group_manifest,
                                   write_manifests)

PART = "part.json"
REJECTS = "rejects.jsonl"
PLAN_KIND = "pingctl-build-rows-fanout-plan"
PART_KIND = "pingctl-build-rows-fanout-part"


def prefix(index: int) -> str:
    return f"rows-{index:05d}"


# ---------------------------------------------------------------- the plan


def make_plan(files: list[Path], out: Path, by: str, tasks: int, max_row_mb: float, dst_max_row_mb: float | None,
              memory_limit: str, config: dict | None) -> dict:
    if tasks < 1:
        raise PingctlError(f"--tasks {tasks}: a fanned-out build-rows needs at least one task")
    sources = []
    for f in files:
        try:
            st = f.stat()
        except OSError as e:
            raise PingctlError(f"cannot read {f}: {e.strerror or e}") from None
        src = str(f.resolve())
        sources.append({"path": str(f), "source": src, "read": src, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns})
    options = {"by": by, "tasks": tasks, "max_row_mb": max_row_mb, "dst_max_row_mb": dst_max_row_mb,
               "max_n": max_measurements(max_row_mb),
               "dst_max_n": max_measurements(max_row_mb if dst_max_row_mb is None else dst_max_row_mb)}
    ident = [{k: s[k] for k in ("source", "bytes", "mtime_ns")} for s in sources]
    base = json.dumps({"version": __version__, "options": options, "inputs": ident}, sort_keys=True)
    return {
        "kind": PLAN_KIND,
        "pingctl_version": __version__,
        "out": str(Path(out).resolve()),
        "options": options,
        "memory_limit": memory_limit,
        "config": config or {},
        "sources": sources,
        "tasks": [{"index": i, "key": hashlib.sha256(f"{base}/{i}".encode()).hexdigest()} for i in range(tasks)],
    }


def read_plan(work: Path) -> dict:
    return fanout_work.read_plan(work, PLAN_KIND, "build-rows")


write_plan = fanout_work.write_plan


# ---------------------------------------------------------------- one task


def _cores() -> int:
    # SLURM without CPU binding leaves every core in the affinity mask: keep to those asked for
    have = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(have, int(os.environ.get("SLURM_CPUS_PER_TASK") or 1 << 16))


def run_task(work: Path, index: int) -> dict:
    """Task `index` of the plan in `work` -> `tasks/INDEX/` (its records and part.json),
    replacing whatever an earlier attempt left there. What every engine runs."""
    work = Path(work)
    plan = read_plan(work)
    n = len(plan["tasks"])
    if not 0 <= index < n:
        raise PingctlError(f"task {index} is not in {work / PLAN} (tasks 0..{n - 1})")
    if plan.get("pingctl_version") != __version__:
        raise PingctlError(f"{work / PLAN} was made by pingctl {plan.get('pingctl_version')}, this task runs "
                           f"{__version__}: the tasks must run the pingctl that made the plan")
    files = []
    for s in plan["sources"]:
        read = work / s["read"]  # absolute (SLURM) or relative to the work dir (a volume)
        fanout_work.check_unchanged(read, index, s)
        files.append(read)
    o = plan["options"]
    t0 = time.perf_counter()
    with atomic_dir(task_dir(work, index)) as tmp:
        stats, written = build_groups(files, tmp, o["by"], o["max_n"], o["dst_max_n"], plan["memory_limit"],
                                      _cores(), partition=(index, n), prefix=prefix(index), rejects=index == 0)
        dirs = group_dirs(tmp, o["by"])
        for group, w in written.items():
            w["described"] = [describe(dirs[group] / f) for f in w["files"]]
        record = {
            "kind": PART_KIND,
            "pingctl_version": __version__,
            "key": plan["tasks"][index]["key"],
            "index": index,
            "stats": stats,
            "groups": written,
            "rejects_file": describe(tmp / REJECTS) if (tmp / REJECTS).exists() else None,
            "host": socket.gethostname(),
            "elapsed_s": round(time.perf_counter() - t0, 3),
        }
        write_json(tmp / PART, record)
    return json.loads((task_dir(work, index) / PART).read_text())


# ---------------------------------------------------------------- checking a task


def read_task(work: Path, task: dict, by: str) -> tuple[dict | None, str | None]:
    """(part.json, None) when task `task` of the plan is done and intact, else (None, why not)."""
    d = task_dir(work, task["index"])
    rec, why = fanout_work.read_marker(d, PART, PART_KIND, task, "the split, the options or the pingctl version")
    if rec is None:
        return None, why
    problem = check_task(d, rec, by)
    return (None, problem) if problem else (rec, None)


def check_task(d: Path, rec: dict, by: str) -> str | None:
    """Why the files of a finished task do not match its part.json (None: they match)."""
    try:
        dirs = group_dirs(d, by)
        if set(rec["groups"]) != set(dirs):
            return f"{PART} holds the layouts {sorted(rec['groups'])}, not those of --by {by}"
        for group, w in rec["groups"].items():
            if [x["name"] for x in w["described"]] != w["files"] or len(w["files"]) != len(w["record_measurements"]):
                return f"{PART}: the {group} files and their descriptions do not match"
            if sum(map(len, w["record_measurements"])) != w["records"] or \
                    sum(map(sum, w["record_measurements"])) != w["measurements"]:
                return f"{PART}: the {group} record sizes do not add up to its counts"
            for want in w["described"]:
                bad = compare(dirs[group] / want["name"], want, PART)
                if bad:
                    return bad
        if rec["rejects_file"] is not None:
            bad = compare(d / REJECTS, rec["rejects_file"], PART)
            if bad:
                return bad
    except (KeyError, TypeError) as e:
        return f"{PART} lacks a field ({e})"
    return None


def task_states(work: Path, plan: dict) -> dict[int, str | None]:
    """Per task index: None when it is done (reused by a rerun), else why it must run."""
    return {t["index"]: read_task(work, t, plan["options"]["by"])[1] for t in plan["tasks"]}


# ---------------------------------------------------------------- the merge


def merge(work: Path, out: Path) -> dict:
    """Check every task of the plan in `work` and write the one output `out` from their records,
    atomically, with the manifests a local build writes; then remove `work`. Refuses, naming
    each, if a task is missing or its files do not match its part.json."""
    work, out = Path(work), Path(out)
    plan = read_plan(work)
    by = plan["options"]["by"]
    parts = fanout_work.finished_tasks(plan, out, lambda t: read_task(work, t, by), lambda t: f"task {t['index']}")
    stats = parts[0]["stats"]
    for p in parts[1:]:
        if p["stats"] != stats:
            raise PingctlError(f"cannot merge {out}: task {p['index']} read the split differently from task 0 "
                               f"({p['stats']} vs {stats}); rerun with --force after removing {work}")
    valid = stats["rows_read"] - stats["rows_rejected"]
    o = plan["options"]
    files = [Path(s["path"]) for s in plan["sources"]]  # named as a local build names them
    limits = {"source": (o["max_row_mb"], o["max_n"]),
              "destination": (o["max_row_mb"] if o["dst_max_row_mb"] is None else o["dst_max_row_mb"], o["dst_max_n"])}
    with atomic_dir(out) as tmp:
        results = {}
        for group, where in group_dirs(tmp, by).items():
            where.mkdir(exist_ok=True)
            merged = _merge_group(work, parts, group, by, where)
            if merged["measurements"] != valid:
                raise PingctlError(f"cannot merge {out}: the tasks' {group} records hold {merged['measurements']:,} "
                                   f"measurements, the split {valid:,} valid ones")
            results[group] = group_manifest(out, by, group, merged, *limits[group], common_fields(stats, files, plan["config"]))
        first = task_dir(work, 0) / REJECTS
        if first.exists():
            link(first, tmp / REJECTS)
        write_manifests(tmp, by, results)
    shutil.rmtree(work, ignore_errors=True)
    result = dict(results["destination" if by == "destination" else "source"])
    if by == "both":
        d = results["destination"]
        result["destination"] = {k: d[k] for k in ("out", "records", "destinations", "measurements", "bytes")}
    return result


def _merge_group(work: Path, parts: list[dict], group: str, by: str, where: Path) -> dict:
    """One layout's records of every task, in task order, linked into `where`."""
    files, sizes, index = [], [], {}
    records = measurements = groups = nbytes = 0
    count = "probes" if group == "source" else "destinations"
    for p in parts:
        w = p["groups"][group]
        src = group_dirs(task_dir(work, p["index"]), by)[group]
        for name, desc in zip(w["files"], w["described"]):
            link(src / name, where / name)
            nbytes += desc["bytes"]
        files += w["files"]
        sizes += w["record_measurements"]
        if group == "destination":
            for addr, entries in w["index"].items():
                if addr in index:
                    raise PingctlError(f"destination {addr} is in two tasks' records: the partition is not one")
                index[addr] = [[rid + records, t] for rid, t in entries]
        records += w["records"]
        measurements += w["measurements"]
        groups += w[count]
    out = {"records": records, "measurements": measurements, "files": files, "record_measurements": sizes,
           count: groups, "bytes": nbytes}
    if group == "destination":
        out["index"] = index
    return out


__all__ = ["make_plan", "merge", "read_plan", "read_task", "run_task", "task_dir", "task_states",
           "work_dir", "write_plan"]
