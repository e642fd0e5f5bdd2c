"""Small measuring helpers for `pingctl bench` (no timing assertions live in tests)."""

from __future__ import annotations

import os
import resource
import sys
import time
from contextlib import contextmanager

from pingctl.errors import PingctlError
from pingctl.processes import die_with_us


def peak_rss_mb(children: bool = False) -> float:
    """Peak resident set size of this process (or of its waited-for children), MB."""
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    return resource.getrusage(who).ru_maxrss / 1024.0  # Linux reports KiB


@contextmanager
def timer():
    box = {"s": 0.0}
    t0 = time.perf_counter()
    try:
        yield box
    finally:
        box["s"] = time.perf_counter() - t0


def run_measured(args: list[str]) -> tuple[dict, float, float]:
    """Run `python -m pingctl ARGS --json` in a child; return (its JSON, seconds, peak RSS MB).

    A child process gives the command's own peak memory (wait4 rusage), untouched by
    whatever the benchmark itself allocated. Output goes through temp files so waiting
    on the child can never block on a full pipe.
    """
    import json
    import subprocess
    import tempfile

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        # the measured command dies with the bench (kill -9 included): it holds the memory
        # of a whole pipeline step, and an orphan would go on computing for nobody
        proc = subprocess.Popen([sys.executable, "-m", "pingctl", *args, "--json"], stdout=out, stderr=err,
                                preexec_fn=die_with_us())
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise PingctlError(f"benchmark step `pingctl {args[0]}` failed: {err.read().decode()[-800:]}")
        return json.loads(out.read()), elapsed, usage.ru_maxrss / 1024.0
