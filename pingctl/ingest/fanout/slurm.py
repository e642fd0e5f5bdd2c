"""The SLURM engine of a fanned-out ingest: its job-array script (one task per input file,
pingctl/templates/ingest_array.sh.j2) on the shared engine of pingctl.fanout.slurm (sbatch,
squeue, cancel, failures)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Callable

import pingctl
from pingctl import __version__
from pingctl.fanout import slurm as engine
from pingctl.fanout.slurm import (ARRAY_MAX, JOBS, SCRIPTS, array_spec, batches, cancel, earlier_jobs, log_of,
                                  queued, require_tools, state_of, submit, wait, wait_for_earlier)
from pingctl.ingest.fanout.work import LOGS, TASK_MANIFEST, task_dir

__all__ = ["ARRAY_MAX", "JOBS", "SCRIPTS", "TEMPLATE", "SlurmSettings", "array_spec", "batches", "cancel",
           "check_settings", "earlier_jobs", "log_of", "queued", "render", "require_tools", "run_array", "scripts",
           "state_of", "submit", "wait", "wait_for_earlier"]

TEMPLATE = "ingest_array.sh.j2"


@dataclasses.dataclass(frozen=True)
class SlurmSettings(engine.SlurmSettings):
    """The job array's resources (per task: one input file)."""

    job_name: str = "pingctl-ingest"


def check_settings(s: SlurmSettings, work: Path) -> None:
    engine.check_settings(s, work, "ingest")


def render(work: Path, plan: dict, s: SlurmSettings, offset: int, ids: list[int]) -> str:
    return engine.template_env().get_template(TEMPLATE).render(
        version=__version__,
        out=plan["out"],
        work=str(work),
        logs=str(Path(work) / LOGS),
        s=s,
        array=array_spec(ids, s.max_parallel),
        offset=offset,
        python=s.python or sys.executable,
        source=str(Path(pingctl.__file__).resolve().parents[1]),
    )


def scripts(work: Path, plan: dict, s: SlurmSettings, todo: list[int]) -> list[tuple[int, list[int], str]]:
    """(offset, array task ids, script) per job array to submit for `todo`."""
    return [(off, ids, render(work, plan, s, off, ids)) for off, ids in batches(todo)]


def run_array(work: Path, plan: dict, todo: list[int], s: SlurmSettings,
              on_event: Callable[[str], None] | None = None,
              on_progress: Callable[[int], None] | None = None) -> list[str]:
    """Submit `todo` as job array(s), wait for them; returns the job ids (cancelled if interrupted)."""
    return engine.run_array(work, scripts(work, plan, s, todo), "ingest-array",
                            lambda i: (task_dir(work, i) / TASK_MANIFEST).is_file(), on_event, on_progress)
