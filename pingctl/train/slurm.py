"""`pingctl train --target slurm`: render an sbatch script into the run dir, submit it, record
the job (remote.json), report it (`--status`) and follow its log (`--follow`); and the job's own
entry point, `python -m pingctl.train.slurm RUN_DIR`.

The script needs no source tree: it activates the environment pingctl is installed in
(`train.slurm.venv`, default this interpreter's `sys.prefix`), `cd`s to the run directory and
runs the job entry point there. The job appends its output to the run's train.log (as the
local target does) and is submitted with `--requeue`: when SLURM requeues it (preemption, a
failed node, `scontrol requeue`), the same script runs again in the same run directory and
the worker resumes at the last committed checkpoint, parameters and Grain iterator state alike.
"""

from __future__ import annotations

import codecs
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pingctl import __version__
from pingctl.artifacts.remote import read_remote, write_remote
from pingctl.artifacts.run import CONFIG, LOG, STOPPED, SUMMARY, checkpoint_steps, has_summary, run_config
from pingctl.atomic import atomic_file
from pingctl.config import Config, load_config
from pingctl.errors import PingctlError, UsageError
from pingctl.train import metrics as M
from pingctl.train.local import finish, prepare_run, save_metrics, worker_env
from pingctl.train.render import env

TARGET = "slurm"
# States in which a job may still run (SLURM's job_state_string); anything else is final.
ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING",
                    "STAGE_OUT", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SPECIAL_EXIT",
                    "RESV_DEL_HOLD", "POWER_UP_NODE", "UPDATE_DB"})
TERMINATED = 128 + signal.SIGTERM  # the job's exit status when SLURM stopped it (requeue, preemption, scancel)


def render_sbatch(cfg: Config, run: Path) -> str:
    s = cfg.train.slurm
    e = env()
    e.filters["shquote"] = lambda v: shlex.quote(str(v))
    return e.get_template("sbatch.sh.j2").render(
        version=__version__,
        s=s,
        hardware=cfg.train.hardware,
        run_dir=str(Path(run).resolve()),
        log=LOG,
        venv=s.venv or sys.prefix,
    )


def worker_command(cfg: Config, run: Path) -> list[str]:
    """What the job runs: one worker, or with several nodes one per node through `srun` (each
    joins the others from the SLURM variables srun sets: pingctl.train.worker.slurm_distributed)."""
    cmd = [sys.executable, "-m", "pingctl.train.worker", str(run)]
    n = cfg.train.slurm.nodes
    if n > 1:
        # --label: the nodes' lines interleave in one log; each says which task wrote it
        cmd = ["srun", "--label", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1", "--kill-on-bad-exit=1", *cmd]
    return cmd


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise PingctlError(f"{name} is not on PATH: run this on a SLURM login node (or one with the SLURM client "
                           "commands and SLURM_CONF set)")
    return path


def _call(*cmd: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([_tool(cmd[0]), *cmd[1:]], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise PingctlError(f"`{' '.join(cmd)}` did not answer in 120 s (is slurmctld reachable?)") from None


def _fields(line: str) -> dict[str, str]:
    """`scontrol -o show job`'s KEY=VALUE words (the values pingctl reads hold no spaces)."""
    return dict(re.findall(r"(?:^|\s)([A-Za-z][\w/:]*)=(\S*)", line))


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


def submit(cfg: Config, run: Path, fresh: bool = False, dry_run: bool = False) -> dict:
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
    path = run / "train.sbatch"
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
    sbatch = _tool("sbatch")
    # cwd: sbatch records it as the job's working directory (the script cds there anyway)
    proc = subprocess.run([sbatch, "--parsable", str(path)], capture_output=True, text=True, cwd=run)
    if proc.returncode != 0:
        raise PingctlError(f"sbatch failed: {proc.stderr.strip() or proc.stdout.strip()}")
    job = re.split(r"[;\s]", proc.stdout.strip())[0]  # --parsable: "ID" or "ID;CLUSTER"
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


# ---- the job itself: `python -m pingctl.train.slurm RUN_DIR`, run by the sbatch script ----

def job_main(run_dir: str) -> int:
    """Run the worker(s) for a prepared run directory inside a SLURM allocation, then write
    metrics.jsonl, loss.png and summary.json as `pingctl train` does locally. Its stdout is the
    run's train.log (sbatch --output, --open-mode=append). Exit status: 0 when the run reached
    its steps (or train.max_minutes stopped it), the worker's on a failure, 143 when SLURM
    stopped the job (a requeued job then runs this again and resumes)."""
    run = Path(run_dir).resolve()
    cfg = load_config(run / CONFIG)
    resumed_from = (checkpoint_steps(run) or [None])[-1]
    (run / STOPPED).unlink(missing_ok=True)  # a marker from an earlier job is not about this one
    job = os.environ.get("SLURM_JOB_ID", "?")
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")
    print(f"\n===== pingctl train {time.strftime('%Y-%m-%dT%H:%M:%S')} (SLURM job {job}, restart {restart}; "
          f"resume from {resumed_from}) =====", flush=True)
    log_start = (run / LOG).stat().st_size if (run / LOG).exists() else 0
    cmd = worker_command(cfg, run)
    worker = worker_env(cfg)
    if cfg.train.slurm.nodes > 1:
        worker.pop("PINGCTL_PARENT_PID")  # srun's tasks are slurmstepd's children, not ours
    t0 = time.time()
    stopped_by = []

    proc = None

    def on_term(signum, frame):
        stopped_by.append(signal.Signals(signum).name)
        if proc is not None:  # SLURM signals every process of the job, but `scancel --batch` only this one
            proc.send_signal(signum)

    signal.signal(signal.SIGTERM, on_term)
    proc = subprocess.Popen(cmd, env=worker, cwd=run)
    rc = proc.wait()  # a SIGTERM runs on_term, then the wait goes on until the worker has ended
    records = save_metrics(cfg, run, M.parse_log(run / LOG, log_start) if (run / LOG).exists() else M.LogParser())
    last = max(checkpoint_steps(run), default=None)
    if stopped_by:
        print(f"pingctl: job {job} stopped by SLURM ({stopped_by[0]}); checkpoint {last} is where it resumes "
              "if it is requeued", flush=True)
        return TERMINATED
    if rc != 0:
        print(f"pingctl: the training worker failed (exit {rc}); checkpoint {last} is where a rerun resumes",
              flush=True)
        return rc if 0 < rc < 256 else 1
    try:
        summary = finish(cfg, run, records, resumed_from, time.time() - t0, slurm_job_id=job,
                         slurm_restarts=int(restart) if restart.isdigit() else None)
    except PingctlError as e:
        print(f"pingctl: {e}", flush=True)
        return 1
    end = summary["last_step"]
    print(f"pingctl: training complete at step {end}; summary {run / SUMMARY}", flush=True)
    return 0


def _main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m pingctl.train.slurm RUN_DIR (the job entry point of a `pingctl train --target "
              "slurm` run)", file=sys.stderr)
        return 2
    try:
        return job_main(argv[0])
    except PingctlError as e:  # a run directory damaged or moved since it was submitted
        print(f"pingctl: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
