"""`remote.json` in a run directory: where the run was submitted to when it trains off this
machine (a SLURM job, a Modal app), so `pingctl train RUN --status/--follow` find it again.

    {"target": "slurm", "job_id": "123", "submitted_at": "2025-01-01T00:00:00+00:00",
     "log": "/abs/run/slurm-123.out", ...}

`target` says which engine reads the rest; every other field is that engine's own. A new
submission of the same run replaces the record (the run directory, not the job, is what resumes).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from pingctl.atomic import write_json
from pingctl.errors import PingctlError

REMOTE = "remote.json"


def remote_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / REMOTE


def write_remote(run_dir: Path, target: str, **fields) -> dict:
    """Record a submission (atomically); `submitted_at` defaults to now (UTC, ISO 8601)."""
    record = {"target": target, **fields}
    record.setdefault("submitted_at", dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    write_json(remote_path(run_dir), record)
    return record


def read_remote(run_dir: Path) -> dict | None:
    """The recorded submission, or None when the run was never submitted off this machine."""
    f = remote_path(run_dir)
    try:
        text = f.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise PingctlError(f"{f}: not readable ({e.strerror})") from None
    try:
        record = json.loads(text)
    except ValueError as e:
        raise PingctlError(f"{f}: not JSON ({e}); delete it and submit the run again") from None
    if not isinstance(record, dict) or not isinstance(record.get("target"), str):
        raise PingctlError(f"{f}: no `target` field, not the record `pingctl train` writes; "
                           "delete it and submit the run again")
    return record
