"""A training run as a SLURM job: its sbatch script (`render_sbatch`), what the job runs
(`worker_command`) and the job's own entry point, `python -m pingctl.executor.slurm.job RUN_DIR`.
Submitting, reporting and following it (every call to SLURM): engine.py beside this module.

The script needs no source tree: it activates the environment pingctl is installed in
(`train.slurm.venv`, default this interpreter's `sys.prefix`), `cd`s to the run directory and
runs the job entry point there. The job appends its output to the run's train.log (as the
local target does) and is submitted with `--requeue`: when SLURM requeues it (preemption, a
failed node, `scontrol requeue`), the same script runs again in the same run directory and
the worker resumes at the last committed checkpoint, parameters and Grain iterator state alike.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from pingctl import __version__
from pingctl.artifacts.run import CONFIG, LOG, STOPPED, SUMMARY, checkpoint_steps
from pingctl.config import Config, load_config
from pingctl.errors import PingctlError
from pingctl.train import metrics as M
from pingctl.train.local import finish, save_metrics, worker_env
from pingctl.train.render import env

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


# ---- the job itself: `python -m pingctl.executor.slurm.job RUN_DIR`, run by the sbatch script ----

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
        print("usage: python -m pingctl.executor.slurm.job RUN_DIR (the job entry point of a `pingctl train --target "
              "slurm` run)", file=sys.stderr)
        return 2
    try:
        return job_main(argv[0])
    except PingctlError as e:  # a run directory damaged or moved since it was submitted
        print(f"pingctl: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
