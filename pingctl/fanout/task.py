"""The entry point every fanned-out task runs (a SLURM array task, `python -m MODULE WORK
INDEX`): the step's own `run_task` does the work; this only parses, reports and sets the exit
status the driver reads — 0 when `WORK/tasks/INDEX/` is complete; 1 with a one-line message on
stderr (the task's log) when its input cannot be read or changed since the plan, so that the
driver names the task and its log and a rerun redoes it; 2 on bad usage."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from pingctl.errors import PingctlError


def task_main(argv: list[str], module: str, run_task: Callable[[Path, int], dict],
              describe: Callable[[dict], str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        print(f"usage: python -m {module} WORK INDEX", file=sys.stderr)
        return 2
    try:
        rec = run_task(Path(argv[0]), int(argv[1]))
    except PingctlError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"task {rec['index']}: {describe(rec)}, {rec['elapsed_s']} s on {rec['host']}")
    return 0
