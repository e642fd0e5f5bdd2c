"""SLURM job arrays for a fanned-out command: the tasks to run as array(s), submitted with
sbatch and followed with squeue until none of its tasks is queued or running; the caller
renders the script (its own template) and says when a task is done.

`sbatch --wait` would block too, but it polls slowly (a 2-second job returned after 10 s on a
single-node cluster); squeue is asked instead, often at first and less often as the job runs.
Which tasks succeeded is read from the work directory, never from SLURM's states: a task is
done when its files pass their check, whatever SLURM says (and accounting may be disabled).
"""

from __future__ import annotations


import dataclasses
import json
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

from pingctl.atomic import atomic_file, write_json
from pingctl.errors import PingctlError, UsageError

LOGS = "logs"
SCRIPTS = "slurm"
JOBS = "jobs.json"
# Array task ids run from 0 to MaxArraySize - 1 (SLURM's default MaxArraySize is 1001): more
# inputs go to several arrays, each task id plus its array's offset naming the plan's task.
ARRAY_MAX = 1000
POLL_FIRST_S = 0.2
POLL_MAX_S = 5.0
SQUEUE_PATIENCE_S = 120.0  # how long squeue may keep failing (controller restarting) before giving up


@dataclasses.dataclass(frozen=True)
class SlurmSettings:
    """The job array's resources, per task."""

    job_name: str = "pingctl"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    cpus_per_task: int = 2
    mem: str = "4G"
    time: str = "02:00:00"
    max_parallel: int = 0  # at most this many tasks at once (0 = as the scheduler allows)
    setup: str = ""  # shell lines run first in each task, e.g. module loads
    python: str | None = None  # the interpreter of the tasks (default: this one)


def array_spec(ids: list[int], max_parallel: int = 0) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8" (+ "%N" to run at most N at once)."""
    parts, ids = [], sorted(ids)
    start = prev = ids[0]
    for i in ids[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts) + (f"%{max_parallel}" if max_parallel else "")


def batches(todo: list[int]) -> list[tuple[int, list[int]]]:
    """Tasks to run -> (offset, array task ids) per job array."""
    groups: dict[int, list[int]] = {}
    for i in sorted(todo):
        groups.setdefault(i // ARRAY_MAX * ARRAY_MAX, []).append(i)
    return [(off, [i - off for i in ids]) for off, ids in sorted(groups.items())]


def template_env():
    import jinja2

    e = jinja2.Environment(
        loader=jinja2.PackageLoader("pingctl", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    e.filters["shquote"] = lambda v: shlex.quote(str(v))
    return e


def check_settings(s: SlurmSettings, work: Path, command: str) -> None:
    if re.search(r"\s", str(work)):
        # #SBATCH lines are not shell: sbatch would cut --output at the first space
        raise UsageError(f"{work}: a SLURM {command} needs an output path without spaces (its work directory is beside it)")
    for name in ("job_name", "partition", "account", "qos", "mem", "time"):
        v = getattr(s, name)
        if v is not None and (not str(v) or re.search(r"\s", str(v))):
            raise UsageError(f"SLURM {name.replace('_', '-')} {v!r}: give one word without spaces")
    if s.cpus_per_task < 1 or s.max_parallel < 0:
        raise UsageError("SLURM --cpus-per-task must be >= 1 and --max-parallel >= 0")


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise PingctlError(f"{name} is not on PATH: `--target slurm` runs where SLURM's commands are (a login node); "
                           "`--dry-run` shows the job array without them")
    return path


def require_tools() -> None:
    for name in ("sbatch", "squeue"):
        _tool(name)


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"{Path(cmd[0]).name} did not answer within 60 s")


def submit(script: Path, work: Path) -> str:
    proc = _run([_tool("sbatch"), "--parsable", f"--chdir={work}", str(script)])
    if proc.returncode != 0:
        raise PingctlError(f"sbatch {script} failed: {(proc.stderr or proc.stdout).strip()}")
    job = re.split(r"[;\s]", proc.stdout.strip())[0]
    if not job.isdigit():
        raise PingctlError(f"sbatch {script} printed no job id: {proc.stdout.strip()!r}")
    return job


def queued(jobs: list[str]) -> list[str]:
    """The jobs of `jobs` that still have a task queued or running."""
    squeue = _tool("squeue")
    left = []
    for job in jobs:
        proc = _run([squeue, "-h", "-j", job, "-o", "%i"])
        if proc.returncode != 0:
            if "Invalid job id" in proc.stderr:  # finished long enough ago to be forgotten
                continue
            raise _SqueueFailed(proc.stderr.strip() or f"exit {proc.returncode}")
        if proc.stdout.strip():
            left.append(job)
    return left


class _SqueueFailed(Exception):
    pass


def wait(jobs: list[str], on_poll: Callable[[], None] | None = None, sleep=time.sleep) -> None:
    """Return once no task of `jobs` is queued or running."""
    delay, failing_since = POLL_FIRST_S, None
    while True:
        try:
            left = queued(jobs)
            failing_since = None
        except _SqueueFailed as e:
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > SQUEUE_PATIENCE_S:
                raise PingctlError(f"squeue keeps failing ({e}); the job(s) {', '.join(jobs)} may still run: "
                                   "rerun the command once SLURM answers, it waits for them") from None
            left = jobs
        if on_poll is not None:
            on_poll()
        if not left:
            return
        sleep(delay)
        delay = min(POLL_MAX_S, delay * 1.5)


def cancel(jobs: list[str]) -> None:
    scancel = shutil.which("scancel")
    if scancel and jobs:
        _run([scancel, *jobs])


def earlier_jobs(work: Path) -> list[dict]:
    try:
        return json.loads((Path(work) / JOBS).read_text())["jobs"]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _last_job_of(work: Path, index: int) -> dict | None:
    return next((j for j in reversed(earlier_jobs(work)) if index in j["tasks"]), None)


def log_of(work: Path, index: int) -> Path | None:
    """The log of the last SLURM task that ran task `index`, if one was submitted."""
    job = _last_job_of(work, index)
    return None if job is None else Path(work) / LOGS / f"{job['id']}_{index - job['offset']}.out"


def state_of(work: Path, index: int) -> str | None:
    """How SLURM says the last array task of task `index` ended ("FAILED, exit 1:0"), while the
    controller still remembers it (MinJobAge); None when it does not."""
    job = _last_job_of(work, index)
    scontrol = shutil.which("scontrol")
    if job is None or scontrol is None:
        return None
    proc = _run([scontrol, "-o", "show", "job", f"{job['id']}_{index - job['offset']}"])
    fields = dict(kv.split("=", 1) for kv in proc.stdout.split() if "=" in kv) if proc.returncode == 0 else {}
    if "JobState" not in fields:
        return None
    return f"SLURM job {job['id']}_{index - job['offset']} {fields['JobState']}, exit {fields.get('ExitCode', '?')}"


def run_array(work: Path, scripts: list[tuple[int, list[int], str]], prefix: str, done: Callable[[int], bool],
              on_event: Callable[[str], None] | None = None,
              on_progress: Callable[[int], None] | None = None) -> list[str]:
    """Submit `scripts` ((offset, array task ids, script) per job array, as `batches` cuts the
    tasks) as PREFIX-OFFSET.sh in WORK/slurm, wait for them; returns the job ids. `done(i)`: task
    i has written its result (for progress). Interrupted (Ctrl-C) while waiting, the jobs are
    cancelled: nothing is left running that no one waits for."""
    say = on_event or (lambda _m: None)
    work = Path(work)
    (work / LOGS).mkdir(parents=True, exist_ok=True)
    (work / SCRIPTS).mkdir(parents=True, exist_ok=True)
    history = earlier_jobs(work)
    jobs: list[str] = []
    try:
        todo = [off + i for off, ids, _ in scripts for i in ids]
        for off, ids, text in scripts:
            path = work / SCRIPTS / f"{prefix}-{off:05d}.sh"
            with atomic_file(path) as tmp:
                tmp.write_text(text)
                tmp.chmod(0o755)
            job = submit(path, work)
            jobs.append(job)
            history.append({"id": job, "offset": off, "tasks": [i + off for i in ids]})
            write_json(work / JOBS, {"jobs": history})
            say(f"submitted job array {job}: {len(ids)} task(s), logs in {work / LOGS}/{job}_*.out")

        def poll() -> None:
            if on_progress is not None:
                on_progress(sum(done(i) for i in todo))

        wait(jobs, poll)
    except BaseException:
        cancel(jobs)
        raise
    return jobs


def wait_for_earlier(work: Path, on_event: Callable[[str], None] | None = None) -> list[str]:
    """Jobs an earlier run submitted for this output and that still run (its driver was killed):
    wait for them instead of starting the same tasks twice. Returns the ids waited for."""
    ids = [j["id"] for j in earlier_jobs(work)]
    if not ids or shutil.which("squeue") is None:
        return []
    try:
        left = queued(ids)
    except _SqueueFailed:
        left = ids
    if left:
        if on_event is not None:
            on_event(f"waiting for job(s) {', '.join(left)} submitted earlier for this output")
        wait(left)
    return left
