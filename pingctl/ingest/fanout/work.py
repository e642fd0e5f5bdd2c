"""The work directory of a fanned-out ingest: its plan, its tasks, their checks and the merge.

Layout, beside the output `OUT` (hidden, so a directory walk for inputs never reads it):

    .OUT.fanout/
      plan.json            inputs (path, size, mtime), the resolved options, a key per task
      tasks/00003/         task 3, renamed into place only when complete (pingctl.atomic):
        part-00003.parquet    its rows, exactly as a local run writes them
        .rejects-00003.jsonl  its rejects
        task.json             its part manifest: the input's bytes/sha256/codec, the counts,
                              size and sha256 of the two files, the task key
      logs/, slurm/        SLURM's task logs and the rendered array scripts
      jobs.json            the SLURM array jobs submitted for this output

A task is done when its directory holds a task.json whose key is the plan's and whose files
pass `check_task` (present, the recorded size and sha256, the Parquet schema and row count,
counts that reconcile). A rerun runs only the tasks that are not done; the merge checks every
task again and refuses to publish if one fails, naming it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import socket
import time
from pathlib import Path

from pingctl import __version__
from pingctl.atomic import atomic_dir, write_json
from pingctl.config import IngestConfig
from pingctl.errors import PingctlError
from pingctl.fanout import work as fanout_work
# the work directory's shared layout: .OUT.fanout/ beside the output, WORK/tasks/NNNNN/
from pingctl.fanout.work import NOT_RUN, PLAN, TASKS, task_dir, work_dir  # noqa: F401
from pingctl.ingest.core import ingest_file, part_name, rejects_piece, summarize, write_output
from pingctl.ingest.parse import Options, reconcile
from pingctl.ingest.reader import usable_cores
from pingctl.schema.columns import arrow_schema

LOGS = "logs"
TASK_MANIFEST = "task.json"
PLAN_KIND = "pingctl-ingest-fanout-plan"
TASK_KIND = "pingctl-ingest-fanout-task"


# ---------------------------------------------------------------- the plan


def options_json(opts: Options) -> dict:
    d = dataclasses.asdict(opts)
    return {k: sorted(v) if isinstance(v, frozenset) else v for k, v in d.items()}


def options_from_json(d: dict) -> Options:
    fields = {f.name for f in dataclasses.fields(Options)}
    unknown = set(d) - fields
    if unknown:
        raise PingctlError(f"plan options {sorted(unknown)} are not pingctl {__version__}'s: rerun the command")
    return Options(**{k: frozenset(v) if k in ("msm_ids", "probe_ids") else v for k, v in d.items()})


def _key(options: dict, task: dict) -> str:
    """What a task's output depends on: the pingctl version, the options and the input file.
    `tmax_us` (now + a day, the bound of `bad_time`) is left out: it moves with the clock, and
    a rerun the next day must not redo every task for it."""
    stable = {k: v for k, v in options.items() if k != "tmax_us"}
    ident = {k: task[k] for k in ("index", "path", "source", "bytes", "mtime_ns")}
    text = json.dumps({"version": __version__, "options": stable, "input": ident}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def make_plan(files: list[Path], out: Path, cfg: IngestConfig, opts: Options) -> dict:
    """One task per input, in input order (part numbers follow it, as in a local run)."""
    options = options_json(opts)
    tasks = []
    for i, f in enumerate(files):
        try:
            st = f.stat()
        except OSError as e:
            raise PingctlError(f"cannot read {f}: {e.strerror or e}") from None
        source = str(f.resolve())
        t = {"index": i, "path": str(f), "source": source, "read": source, "bytes": st.st_size,
             "mtime_ns": st.st_mtime_ns}
        t["key"] = _key(options, t)
        tasks.append(t)
    return {
        "kind": PLAN_KIND,
        "pingctl_version": __version__,
        "out": str(Path(out).resolve()),
        "config": cfg.model_dump(mode="json"),
        "options": options,
        "tasks": tasks,
    }


def read_plan(work: Path) -> dict:
    return fanout_work.read_plan(work, PLAN_KIND, "ingest")


write_plan = fanout_work.write_plan


# ---------------------------------------------------------------- one task


def run_task(work: Path, index: int) -> dict:
    """Task `index` of the plan in `work`: its input -> `tasks/INDEX/` (part, rejects piece,
    task.json), replacing whatever an earlier attempt left there. The code every engine runs
    (a SLURM array task, a Modal call, a test); `core.ingest_file` does the work."""
    work = Path(work)
    plan = read_plan(work)
    if not 0 <= index < len(plan["tasks"]):
        raise PingctlError(f"task {index} is not in {work / PLAN} (tasks 0..{len(plan['tasks']) - 1})")
    if plan.get("pingctl_version") != __version__:
        raise PingctlError(f"{work / PLAN} was made by pingctl {plan.get('pingctl_version')}, this task runs "
                           f"{__version__}: the tasks must run the pingctl that made the plan")
    t = plan["tasks"][index]
    opts = options_from_json(plan["options"])
    read = work / t["read"]  # an absolute path (SLURM), or one relative to the work dir (a volume)
    fanout_work.check_unchanged(read, t["index"], t)
    # SLURM without CPU binding (task/none) leaves every core in the affinity mask: the task
    # then keeps to the CPUs it asked for
    cores = min(usable_cores(), int(os.environ.get("SLURM_CPUS_PER_TASK") or 1 << 16))
    t0 = time.perf_counter()
    with atomic_dir(task_dir(work, index)) as tmp:
        r = ingest_file(index, str(read), str(tmp), opts, threaded=cores > 1, bz2_threads=cores, label=t["path"])
        if r["bytes"] != t["bytes"]:
            raise PingctlError(f"{t['path']} changed while task {index} read it ({t['bytes']} bytes planned, "
                               f"{r['bytes']} read)")
        r.pop("rejects")  # None: they were written to the piece
        record = {
            **r,
            "kind": TASK_KIND,
            "pingctl_version": __version__,
            "key": t["key"],
            "part_file": fanout_work.describe(tmp / r["part"]) if r["part"] else None,
            "rejects_file": fanout_work.describe(tmp / rejects_piece(index)),
            "host": socket.gethostname(),
            "elapsed_s": round(time.perf_counter() - t0, 3),
        }
        write_json(tmp / TASK_MANIFEST, record)
    return record


# ---------------------------------------------------------------- checking a task


def read_task(work: Path, task: dict) -> tuple[dict | None, str | None]:
    """(task.json, None) when task `task` of the plan is done and intact, else (None, why not)."""
    d = task_dir(work, task["index"])
    rec, why = fanout_work.read_marker(d, TASK_MANIFEST, TASK_KIND, task, "the input, the options or the pingctl version")
    if rec is None:
        return None, why
    problem = check_task(d, rec)
    return (None, problem) if problem else (rec, None)


def check_task(d: Path, rec: dict) -> str | None:
    """Why the files of a finished task do not match its task.json (None: they match)."""
    try:
        counts = rec["counts"]
        index = rec["index"]
        problems = reconcile(counts)
        if problems:
            return f"its counts do not reconcile ({'; '.join(problems)})"
        part = rec["part"]
        if part is not None:
            if part != part_name(index) or rec["part_file"]["name"] != part:
                return f"{TASK_MANIFEST} names the part {part!r}, not {part_name(index)}"
            bad = fanout_work.compare(d / part, rec["part_file"], TASK_MANIFEST)
            if bad:
                return bad
            bad = _check_parquet(d / part, counts["rows"])
            if bad:
                return bad
        elif counts["rows"]:
            return f"{TASK_MANIFEST} counts {counts['rows']} rows but names no part"
        bad = fanout_work.compare(d / rejects_piece(index), rec["rejects_file"], TASK_MANIFEST)
        if bad:
            return bad
        rejected = sum(counts["rejected"].values())
        if rec["rejects_file"]["lines"] != rejected:
            return (f"{rejects_piece(index)} has {rec['rejects_file']['lines']} line(s) but the counts reject "
                    f"{rejected} record(s)")
    except (KeyError, TypeError) as e:
        return f"{TASK_MANIFEST} lacks a field ({e})"
    return None


def _check_parquet(path: Path, rows: int) -> str | None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(path)
        schema = meta.schema.to_arrow_schema()
    except (OSError, pa.ArrowException) as e:
        return f"{path.name} is not a readable Parquet file ({e})"
    if meta.num_rows != rows:
        return f"{path.name} has {meta.num_rows} rows, {TASK_MANIFEST} counts {rows}"
    want = arrow_schema()
    if not schema.remove_metadata().equals(want.remove_metadata()):
        return f"{path.name} does not have the canonical schema: {schema} (want {want})"
    return None


def task_states(work: Path, plan: dict) -> dict[int, str | None]:
    """Per task index: None when it is done (reused by a rerun), else why it must run."""
    return {t["index"]: read_task(work, t)[1] for t in plan["tasks"]}


# ---------------------------------------------------------------- the merge


def locked(work: Path):
    """One driver per work directory at a time (the tasks themselves take no lock)."""
    return fanout_work.locked(work, "ingest")


def merge(work: Path, out: Path, elapsed_from: float | None = None) -> dict:
    """Check every task of the plan in `work` and write the one output `out` from their parts,
    atomically, with the manifest a local run writes (`core.write_output`); then remove `work`.
    Refuses, naming each, if a task is missing or its files do not match its task.json."""
    work, out = Path(work), Path(out)
    t0 = time.perf_counter() if elapsed_from is None else elapsed_from
    plan = read_plan(work)
    results = fanout_work.finished_tasks(plan, out, lambda t: read_task(work, t),
                                         lambda t: f"task {t['index']} ({t['path']})")
    cfg = IngestConfig.model_validate(plan["config"])
    with atomic_dir(out) as tmp:
        for r in results:
            d = task_dir(work, r["index"])
            names = [rejects_piece(r["index"])] + ([r["part"]] if r["part"] else [])
            for name in names:
                _link(d / name, tmp / name)
        manifest, totals = write_output(tmp, results, cfg)
    shutil.rmtree(work, ignore_errors=True)
    return summarize(manifest, totals, results, out, len(results), time.perf_counter() - t0)


_link = fanout_work.link
