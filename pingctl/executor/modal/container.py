"""What runs in the Modal container of `train --target modal`: `run_local` on the volume (train.log,
metrics.jsonl, loss.png and summary.json are written there as on a local run), the volume
committed while training and at the end, so `--status` and `pull` see checkpoints as they are
written, and the worker's log echoed to the call's Modal logs (which `--follow` streams)."""

from __future__ import annotations

import os
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

import pingctl
from pingctl.artifacts.run import LOG
from pingctl.config import Config
from pingctl.errors import PingctlError
from pingctl.train.local import run_local

COMMIT_EVERY_S = 120.0  # while training: checkpoints and events become visible to status and pull


def _echo_log(path: Path, start: int, stop: threading.Event) -> None:
    """Copy the worker's log, from `start`, to stdout (the call's Modal logs, which `--follow`
    streams), whole lines only, until `stop` and the end of the file."""
    while not path.exists() and not stop.is_set():
        time.sleep(0.5)
    if not path.exists():
        return
    with open(path, errors="replace") as f:
        f.seek(start)
        while True:
            pos = f.tell()
            line = f.readline()
            if line.endswith("\n") or (line and stop.is_set()):
                print(line, end="", flush=True)
            elif stop.is_set():
                return
            else:
                f.seek(pos)
                time.sleep(0.5)


def run_in_container(config: dict, commit: Callable[[], None], commit_every_s: float = COMMIT_EVERY_S) -> dict:
    """The Modal function's body: `run_local` on the volume, the same code path as a local run
    (resume checks, the worker, train.log, metrics.jsonl, loss.png, summary.json), with the
    volume committed every `commit_every_s` and at the end. Returns {ok, error, summary}: a
    failure is a value, so what reaches the submitting machine never depends on unpickling an
    exception there."""
    cfg = Config.model_validate(config)
    run = Path(cfg.train.run_dir)
    # the worker starts in the run directory: give it the directory pingctl was added under
    root = str(Path(pingctl.__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    stop = threading.Event()

    def committer() -> None:
        while not stop.wait(commit_every_s):
            try:
                commit()
            except Exception as e:  # noqa: BLE001 - the next commit retries; training goes on
                print(f"pingctl: volume commit failed ({type(e).__name__}: {e}); retrying later", flush=True)

    threads = [threading.Thread(target=committer, daemon=True)]

    def on_start(run: Path) -> None:
        log = run / LOG
        t = threading.Thread(target=_echo_log, args=(log, log.stat().st_size if log.exists() else 0, stop), daemon=True)
        t.start()
        threads.append(t)

    threads[0].start()
    try:
        out = {"ok": True, "error": None, "summary": run_local(cfg, run, on_start=on_start)}
    except PingctlError as e:
        out = {"ok": False, "error": str(e), "summary": None}
    except Exception as e:  # noqa: BLE001 - reported as a value (docstring), traceback in the logs
        traceback.print_exc()
        out = {"ok": False, "error": f"{type(e).__name__}: {e}", "summary": None}
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    try:
        commit()
    except Exception as e:  # noqa: BLE001 - Modal commits a volume again when the container exits
        print(f"pingctl: volume commit failed ({type(e).__name__}: {e})", flush=True)
    if not out["ok"]:
        print(f"pingctl: training failed: {out['error']}", flush=True)
    return out


