"""One task of a fanned-out ingest, as a SLURM array task runs it:

    python -m pingctl.ingest.fanout.task WORK INDEX

(exit status and messages: `pingctl.fanout.task`)."""

from __future__ import annotations

import sys

from pingctl.fanout.task import task_main
from pingctl.ingest.fanout.work import run_task


def _describe(rec: dict) -> str:
    c = rec["counts"]
    return (f"{rec['path']}: {c['records']} results read, {c['rows']} rows, "
            f"{sum(c['rejected'].values())} rejected")


def main(argv: list[str] | None = None) -> int:
    return task_main(sys.argv[1:] if argv is None else argv, "pingctl.ingest.fanout.task", run_task, _describe)


if __name__ == "__main__":
    sys.exit(main())
