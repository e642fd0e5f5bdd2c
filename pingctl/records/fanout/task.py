"""One task of a fanned-out build-rows, as a SLURM array task runs it:

    python -m pingctl.records.fanout.task WORK INDEX

(exit status and messages: `pingctl.fanout.task`)."""

from __future__ import annotations

import sys

from pingctl.fanout.task import task_main
from pingctl.records.fanout.work import run_task


def _describe(rec: dict) -> str:
    return ", ".join(f"{w['records']} {g} records ({w['measurements']} measurements)" for g, w in rec["groups"].items())


def main(argv: list[str] | None = None) -> int:
    return task_main(sys.argv[1:] if argv is None else argv, "pingctl.records.fanout.task", run_task, _describe)


if __name__ == "__main__":
    sys.exit(main())
