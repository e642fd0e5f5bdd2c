"""The SLURM engine: every call pingctl makes to SLURM (sbatch, squeue, scontrol, sacct,
scancel), for a fanned-out step's job arrays and for a training job.

Fan-out: the tasks to run go as job array(s) rendered from pingctl/templates/fanout_array.sh.j2
(`python -m STEP_TASK_MODULE WORK INDEX` per array task), submitted with sbatch and followed
with squeue until none is queued or running. `sbatch --wait` would block too, but it polls
slowly (a 2-second job returned after 10 s on a single-node cluster); squeue is asked instead,
often at first and less often as the job runs. Which tasks succeeded is read from the work
directory, never from SLURM's states: a task is done when its files pass the step's checks,
whatever SLURM says (and accounting may be disabled).

Training (`train --target slurm`): the run directory is prepared here, its sbatch script
rendered by job.py beside this module (which also holds the job's own entry point), submitted
with `--requeue`, recorded in remote.json, reported (`--status`) and followed (`--follow`).
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pingctl
from pingctl import __version__
from pingctl.artifacts.remote import read_remote, write_remote
from pingctl.artifacts.run import LOG, SUMMARY, checkpoint_steps, has_summary, run_config
from pingctl.atomic import atomic_file, write_json
from pingctl.config import Config
from pingctl.errors import PingctlError, UsageError
from pingctl.executor.base import Executor, Progress, Say
from pingctl.executor.slurm.job import render_sbatch
from pingctl.fanout.step import FanoutStep
from pingctl.train import metrics as M
from pingctl.train.local import prepare_run

TEMPLATE = "fanout_array.sh.j2"
TRAIN_SCRIPT = "train.sbatch"

# ---------------------------------------------------------------- job arrays (fan-out)

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


def render(step: FanoutStep, s: SlurmSettings, offset: int, ids: list[int]) -> str:
    """The job-array script of tasks OFFSET + ids of `step`."""
    return template_env().get_template(TEMPLATE).render(
        version=__version__, command=step.command, module=step.task_module, out=step.plan["out"],
        work=str(step.work), logs=str(step.work / LOGS), s=s, array=array_spec(ids, s.max_parallel),
        offset=offset, python=s.python or sys.executable, source=str(Path(pingctl.__file__).resolve().parents[1]),
    )


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
        raise PingctlError(f"{name} is not on PATH: `--target slurm` runs where SLURM's commands are (a login node, "
                           "or one with the SLURM client commands and SLURM_CONF set); `--dry-run` shows what it "
                           "would submit without them")
    return path


def require_tools() -> None:
    for name in ("sbatch", "squeue"):
        _tool(name)


def _run(cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"{Path(cmd[0]).name} did not answer within {timeout:g} s "
                                           "(is slurmctld reachable?)")


def sbatch(script: Path, chdir: Path) -> str:
    """Submit `script` with its working directory `chdir`; the job id."""
    proc = _run([_tool("sbatch"), "--parsable", f"--chdir={chdir}", str(script)])
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


def run_array(work: Path, scripts: list[tuple[int, list[int], str]], prefix: str,
              on_event: Callable[[str], None] | None = None,
              on_poll: Callable[[], None] | None = None) -> list[str]:
    """Submit `scripts` ((offset, array task ids, script) per job array, as `batches` cuts the
    tasks) as PREFIX-OFFSET.sh in WORK/slurm, wait for them (`on_poll` after each look at the
    queue); returns the job ids. Interrupted (Ctrl-C) while waiting, the jobs are cancelled:
    nothing is left running that no one waits for."""
    say = on_event or (lambda _m: None)
    work = Path(work)
    (work / LOGS).mkdir(parents=True, exist_ok=True)
    (work / SCRIPTS).mkdir(parents=True, exist_ok=True)
    history = earlier_jobs(work)
    jobs: list[str] = []
    try:
        for off, ids, text in scripts:
            path = work / SCRIPTS / f"{prefix}-{off:05d}.sh"
            with atomic_file(path) as tmp:
                tmp.write_text(text)
                tmp.chmod(0o755)
            job = sbatch(path, work)
            jobs.append(job)
            history.append({"id": job, "offset": off, "tasks": [i + off for i in ids]})
            write_json(work / JOBS, {"jobs": history})
            say(f"submitted job array {job}: {len(ids)} task(s), logs in {work / LOGS}/{job}_*.out")
        wait(jobs, on_poll)
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


# ---------------------------------------------------------------- training

TARGET = "slurm"
# States in which a job may still run (SLURM's job_state_string); anything else is final.
ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING",
                    "STAGE_OUT", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SPECIAL_EXIT",
                    "RESV_DEL_HOLD", "POWER_UP_NODE", "UPDATE_DB"})


def _fields(line: str) -> dict[str, str]:
    """`scontrol -o show job`'s KEY=VALUE words (the values pingctl reads hold no spaces)."""
    return dict(re.findall(r"(?:^|\s)([A-Za-z][\w/:]*)=(\S*)", line))


def _call(*cmd: str) -> subprocess.CompletedProcess:
    return _run([_tool(cmd[0]), *cmd[1:]], timeout=120)


def job_state(job_id: str) -> dict:
    """A job's state: from the controller (`scontrol show job`: pending, running, and finished
    ones for MinJobAge, 300 s by default), else from accounting (`sacct`, which needs slurmdbd),
    else from the job completion log (`sacct -c`, with JobCompType=jobcomp/filetxt)."""
    r = _call("scontrol", "-o", "show", "job", job_id)
    if r.returncode == 0 and r.stdout.strip():
        f = {k: v for k, v in _fields(r.stdout.splitlines()[0]).items() if v not in ("", "None", "(null)")}
        return {"state": f.get("JobState", "UNKNOWN"), "reason": f.get("Reason"), "exit_code": f.get("ExitCode"),
                "restarts": int(f.get("Restarts") or 0), "nodes": f.get("NodeList"), "elapsed": f.get("RunTime"),
                "source": "scontrol"}
    if shutil.which("sacct"):
        fields = "JobID,State,ExitCode,Elapsed,NodeList"
        for extra in (["-X"], ["-c"]):
            r = _call("sacct", *extra, "-n", "-P", "-j", job_id, "-o", fields)
            rows = [line.split("|") for line in r.stdout.splitlines() if line.split("|")[0] == job_id]
            if r.returncode == 0 and rows:
                # a requeued job has a record per run: the last is the latest
                _, state, code, elapsed, nodes = (rows[-1] + [""] * 5)[:5]
                return {"state": state.split()[0] if state else "UNKNOWN", "reason": None, "exit_code": code or None,
                        "restarts": len(rows) - 1, "nodes": nodes or None, "elapsed": elapsed or None,
                        "source": "sacct" + " ".join(["", *extra])}
    return {"state": "UNKNOWN", "reason": "the controller no longer holds the job and accounting (sacct) has no "
            "record of it", "exit_code": None, "restarts": None, "nodes": None, "elapsed": None, "source": None}


def _succeeded(job: dict) -> bool:
    return job["state"] == "COMPLETED" and job.get("exit_code") in (None, "0:0")


def _record(run: Path) -> dict:
    rec = read_remote(run)
    if rec is None or rec.get("target") != TARGET or not rec.get("job_id"):
        raise PingctlError(f"{run}: no SLURM job recorded (remote.json); submit it with `pingctl train ROWS "
                           f"--run-dir {run} --target slurm`")
    return rec


def submit_run(cfg: Config, run: Path, fresh: bool = False, dry_run: bool = False) -> dict:
    multi = cfg.train.slurm.nodes > 1
    if multi and cfg.train.hardware == "cpu":
        raise UsageError("multi-node SLURM training needs train.hardware=gpu (or tpu)")
    if re.search(r"\s", str(Path(run).resolve())):
        # #SBATCH lines are not shell: sbatch would cut --output at the first space
        raise UsageError(f"--run-dir {Path(run).resolve()}: SLURM runs need a path without spaces")
    prior = read_remote(Path(run)) if Path(run).is_dir() else None
    if not dry_run and prior and prior.get("target") == TARGET and prior.get("job_id"):
        # a second job would rewrite config.yaml under the first and train into the same checkpoints
        state = job_state(prior["job_id"])["state"] if shutil.which("scontrol") else "UNKNOWN"
        if state in ACTIVE:
            raise PingctlError(f"{Path(run).resolve()}: SLURM job {prior['job_id']} is {state} for this run; follow it "
                               f"(`pingctl train {run} --follow`) or cancel it (`scancel {prior['job_id']}`) first")
    existing = Path(run).is_dir() and any(Path(run).iterdir())
    run = prepare_run(cfg, run, fresh, dry_run=dry_run)
    script = render_sbatch(cfg, run)
    path = run / TRAIN_SCRIPT
    written = not (dry_run and existing)
    result = {
        "target": TARGET,
        "run_dir": str(run),
        "script": str(path),
        "dry_run": dry_run,
        "show": [("sbatch script", script)] if dry_run else [],
        "summary": {"run dir": str(run), "script": str(path), "nodes": cfg.train.slurm.nodes},
    }
    if written:
        with atomic_file(path) as tmp:
            tmp.write_text(script)
            tmp.chmod(0o755)
    else:
        result["summary"]["script"] = "not written (--dry-run leaves an existing run as it is)"
    if dry_run:
        result["summary"]["submitted"] = "no (--dry-run)"
        return result
    job = sbatch(path, run)  # the run directory is the job's working directory (the script cds there anyway)
    rec = write_remote(run, TARGET, job_id=job, log=str(run / LOG), script=str(path), nodes=cfg.train.slurm.nodes)
    result.update(job_id=job, log=rec["log"], submitted_at=rec["submitted_at"])
    result["summary"].update({"job id": job, "log": rec["log"], "follow": f"pingctl train {run} --follow",
                              "status": f"pingctl train {run} --status"})
    return result


def status(run_dir: Path) -> dict:
    """The recorded job's state and the run's progress, from the run directory's files."""
    run = Path(run_dir).resolve()
    rec = _record(run)
    job = job_state(rec["job_id"])
    steps = checkpoint_steps(run)
    train = [r for r in M.run_history(run) if r["kind"] == "train"]
    try:
        total = run_config(run).train.steps
    except PingctlError:
        total = None
    return {
        "target": TARGET,
        "run_dir": str(run),
        "job_id": rec["job_id"],
        "submitted_at": rec.get("submitted_at"),
        **job,
        "active": job["state"] in ACTIVE,
        "ok": _succeeded(job),
        "checkpoints": steps,
        "last_checkpoint": steps[-1] if steps else None,
        "last_step": train[-1]["step"] if train else None,
        "steps_total": total,
        "log": rec.get("log") or str(run / LOG),
        "summary": str(run / SUMMARY) if has_summary(run) else None,
    }


def _tail_offset(path: Path, lines: int) -> int:
    """Where the last `lines` lines of a file start."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            f.seek(max(0, end - 64 * 1024))
            data = f.read()
    except FileNotFoundError:
        return 0
    cut = len(data)
    for _ in range(lines + 1):
        cut = data.rfind(b"\n", 0, cut)
        if cut < 0:
            return max(0, end - len(data))
    return end - len(data) + cut + 1


def follow(run_dir: Path, write: Callable[[str], object] | None = None, lines: int = 20,
           poll_s: float = 0.25, state_every_s: float = 2.0) -> dict:
    """Stream the job's log (its last `lines` lines, then what it appends) until the job has
    ended, through requeues; returns the final `status` (its `ok` says whether the job succeeded)."""
    if write is None:
        def write(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()
    run = Path(run_dir).resolve()
    rec = _record(run)
    log = Path(rec.get("log") or run / LOG)
    pos = _tail_offset(log, lines)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    checked = 0.0
    ended = False
    while True:
        try:
            with open(log, "rb") as f:
                f.seek(pos)
                chunk = f.read()
        except FileNotFoundError:  # not started yet
            chunk = b""
        if chunk:
            pos += len(chunk)
            write(decoder.decode(chunk))
        elif ended:
            break
        if not ended and time.monotonic() - checked >= state_every_s:
            checked = time.monotonic()
            ended = job_state(rec["job_id"])["state"] not in ACTIVE
            continue  # read what the job wrote before it ended
        time.sleep(poll_s)
    tail = decoder.decode(b"", final=True)
    if tail:
        write(tail)
    return status(run)




# ---------------------------------------------------------------- the engine


class SlurmExecutor(Executor):
    """Fan-out: job arrays (settings: `SlurmSettings`); training: one job from `train.slurm.*`."""

    name = TARGET
    Settings = SlurmSettings

    @classmethod
    def from_options(cls, command: str, options: dict) -> "SlurmExecutor":
        ex = super().from_options(command, options)
        if "job_name" not in options:
            ex.settings = dataclasses.replace(ex.settings, job_name=f"pingctl-{command}")
        return ex

    def check(self, step: FanoutStep) -> None:
        check_settings(self.settings, step.work, step.command)

    def prepare(self, step: FanoutStep, todo: list[int]) -> None:
        require_tools()

    def wait_for_earlier(self, step: FanoutStep, say: Say) -> bool:
        return bool(wait_for_earlier(step.work, say))

    def scripts(self, step: FanoutStep, todo: list[int]) -> list[tuple[int, list[int], str]]:
        """(offset, array task ids, script) per job array to submit for `todo`."""
        return [(off, ids, render(step, self.settings, off, ids)) for off, ids in batches(todo)]

    def run(self, step: FanoutStep, todo: list[int], say: Say, on_progress: Progress = None) -> dict[int, str]:
        progress = None if on_progress is None else (lambda: on_progress(self.completed(step, todo)))
        self.jobs += run_array(step.work, self.scripts(step, todo), f"{step.command}-array", say, progress)
        return {}

    def describe(self, step: FanoutStep, todo: list[int]) -> dict:
        return {"scripts": [text for _, _, text in self.scripts(step, todo)], "logs": str(step.work / LOGS)}

    def task_state(self, step: FanoutStep, index: int) -> str | None:
        return state_of(step.work, index)

    def task_log(self, step: FanoutStep, index: int) -> Path | None:
        return log_of(step.work, index)

    def cancel(self, step: FanoutStep) -> None:
        cancel([j["id"] for j in earlier_jobs(step.work)])

    def submit(self, cfg, run: Path, *, fresh: bool = False, dry_run: bool = False, **options) -> dict:
        return submit_run(cfg, run, fresh=fresh, dry_run=dry_run)

    def status(self, run: Path) -> dict:
        return status(run)

    def follow(self, run: Path) -> dict:
        return follow(run)
