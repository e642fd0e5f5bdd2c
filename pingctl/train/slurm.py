"""`pingctl train --target slurm`: render an sbatch script into the run dir and submit it.

The script needs no source tree: it activates the environment pingctl is installed in
(`train.slurm.venv`, default this interpreter's `sys.prefix`), `cd`s to the run directory and
runs `python -m pingctl.train.worker RUN_DIR` there, as `pingctl train` does locally."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from pingctl import __version__
from pingctl.atomic import atomic_file
from pingctl.config import Config
from pingctl.errors import PingctlError, UsageError
from pingctl.train.local import prepare_run
from pingctl.train.render import env

COORDINATOR_PORT = 12355


def render_sbatch(cfg: Config, run: Path) -> str:
    s = cfg.train.slurm
    e = env()
    e.filters["shquote"] = lambda v: shlex.quote(str(v))
    return e.get_template("sbatch.sh.j2").render(
        version=__version__,
        s=s,
        hardware=cfg.train.hardware,
        run_dir=str(Path(run).resolve()),
        venv=s.venv or sys.prefix,
        coordinator_port=COORDINATOR_PORT,
    )


def submit(cfg: Config, run: Path, fresh: bool = False, dry_run: bool = False) -> dict:
    multi = cfg.train.slurm.nodes > 1
    if multi and cfg.train.hardware == "cpu":
        raise UsageError("multi-node SLURM training needs train.hardware=gpu (or tpu)")
    if re.search(r"\s", str(Path(run).resolve())):
        # #SBATCH lines are not shell: sbatch would cut --output at the first space
        raise UsageError(f"--run-dir {Path(run).resolve()}: SLURM runs need a path without spaces")
    existing = Path(run).is_dir() and any(Path(run).iterdir())
    run = prepare_run(cfg, run, fresh, dry_run=dry_run)
    script = render_sbatch(cfg, run)
    path = run / "train.sbatch"
    written = not (dry_run and existing)
    result = {
        "target": "slurm",
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
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise PingctlError(f"sbatch is not on PATH: this is not a SLURM login node. The script is at {path}")
    proc = subprocess.run([sbatch, "--parsable", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise PingctlError(f"sbatch failed: {proc.stderr.strip() or proc.stdout.strip()}")
    job = re.split(r"[;\s]", proc.stdout.strip())[0]
    result["job_id"] = job
    result["summary"]["job id"] = job
    result["summary"]["logs"] = str(run / f"slurm-{job}.out")
    return result
