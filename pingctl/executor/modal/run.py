"""`pingctl train --target modal` from the submitting machine: submit, `--status`, `--follow`
(docs/train.md, "Modal"); the pull that ends a blocking or followed run, and `pingctl pull`: pull.py.

A submission:
 1. the same checks as a local run (rows, config), then the remote name: `--name`, the name an
    earlier submission of this run directory recorded, else one derived from the directory
    (sync.default_name);
 2. `--fresh` deletes the remote run and its rows; otherwise the volume's checkpoints must be
    resumable by this config (the local target's own checks, sync.check_remote_resume);
 3. only the row files missing or changed on the volume go up (sync.plan_upload);
 4. the function (app.py) is spawned in an ephemeral app (`app.run(detach=...)`),
    the call recorded in RUN/remote.json (pingctl.artifacts.remote); `--detach` returns here,
    otherwise the call's logs stream while it trains and the run is pulled home when it ends.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

from pingctl.artifacts.remote import read_remote, write_remote
from pingctl.artifacts.run import CONFIG, LOG, SUMMARY, checkpoint_steps, is_run_dir, run_config, write_config
from pingctl.atomic import atomic_file
from pingctl.config import Config
from pingctl.errors import PingctlError, UsageError
from pingctl.executor.modal.app import build_app, describe
from pingctl.executor.modal.pull import clear_pulled, pull
from pingctl.executor.modal.sync import (STAGING, apply_upload, check_name, check_remote_resume, committed_steps,
                                         default_name, delete_remote, plan_upload, remote_config, run_path)
from pingctl.executor.modal.volume import ModalVolume, Volume, modal_errors, require_credentials
from pingctl.train.local import check_inputs
from pingctl.train.render import render_maxtext

TARGET = "modal"


def _modal_record(run: Path) -> dict | None:
    rec = read_remote(run) if Path(run).is_dir() else None
    return rec if rec and rec.get("target") == "modal" else None


def remote_name(run: Path, name: str | None) -> str:
    """`--name`, else the one this run directory's last submission used, else derived from it."""
    if name:
        return check_name(name)
    rec = _modal_record(run)
    if rec and isinstance(rec.get("name"), str):
        return check_name(rec["name"])
    return default_name(run)


def sync_for_launch(cfg: Config, name: str, volume: Volume, fresh: bool = False) -> dict:
    """Everything a submission does to the volume before the container starts: `--fresh`
    deletes the remote run, otherwise its checkpoints must be resumable by `cfg`; then the
    upload plan is applied. `cfg` has absolute row paths (check_inputs)."""
    deleted = delete_remote(volume, name) if fresh else []
    resumes = [] if fresh else check_remote_resume(cfg, name, volume)
    plan = plan_upload(cfg, name, volume)
    apply_upload(plan, volume)
    return {"deleted": [f"/{p}" for p in deleted], "resume_from": resumes[-1] if resumes else None,
            **plan.describe()}


def submit(cfg: Config, run: Path, fresh: bool = False, dry_run: bool = False, detach: bool = False,
           name: str | None = None) -> dict:
    cfg, _ = check_inputs(cfg)
    if cfg.train.wandb and not cfg.train.modal.wandb_secret:
        raise PingctlError("train.wandb is on but train.modal.wandb_secret is not set: the container would have no WANDB_API_KEY")
    run = Path(run)
    if run.exists() and not run.is_dir():
        raise UsageError(f"--run-dir {run} is a file; give a directory")
    if is_run_dir(run) and run_config(run).train.target != "modal":
        raise UsageError(f"{run} holds a {run_config(run).train.target} run; give the Modal run its own --run-dir")
    name = remote_name(run, name)
    rc = remote_config(cfg, name)
    staging = run / STAGING
    staging.mkdir(parents=True, exist_ok=True)
    write_config(staging / CONFIG, rc)
    maxtext = render_maxtext(rc, Path(rc.train.run_dir))
    with atomic_file(staging / "maxtext.yml") as tmp:
        tmp.write_text(maxtext)
    info = describe(cfg, name)
    result = {
        "target": "modal",
        "dry_run": dry_run,
        "name": name,
        "run_dir": rc.train.run_dir,
        "staging": str(staging),
        "modal": info,
        "show": [("Modal app", "\n".join(f"{k}: {v}" for k, v in info.items())), ("maxtext.yml", maxtext)]
        if dry_run
        else [],
        "summary": {**info, "submitted": "no (--dry-run)" if dry_run else "yes"},
    }
    if dry_run:
        return result
    require_credentials()
    import modal

    m = cfg.train.modal
    _refuse_if_running(run, name)
    volume = ModalVolume(m.volume, create=True)
    synced = sync_for_launch(cfg, name, volume, fresh)
    if fresh:
        synced["cleared_here"] = clear_pulled(run)
    result["upload"] = synced
    result["summary"]["uploaded"] = (f"{synced['upload']} files ({synced['upload_bytes']:,} bytes), "
                                     f"{synced['already_there']} already there")
    if synced["deleted"]:
        result["summary"]["deleted first (--fresh)"] = ", ".join(synced["deleted"])
    app, fn, _, _ = build_app(cfg, name)
    local = {"train_rows": cfg.train.train_rows, "eval_rows": cfg.train.eval_rows, "hints_file": cfg.loader.hints_file,
             "jax_cache_dir": cfg.train.jax_cache_dir}
    with modal_errors(m.volume), modal.enable_output(), app.run(detach=detach):
        call = fn.spawn(rc.model_dump(mode="json"))
        record = write_remote(run, "modal", name=name, volume=m.volume, app=m.app_name, app_id=app.app_id,
                              call_id=call.object_id, remote_run_dir=rc.train.run_dir, detached=detach, local=local)
        result["remote"] = record
        if detach:
            result["summary"]["detached"] = (f"call {call.object_id}; `pingctl train {run} --status` / --follow, "
                                             f"then `pingctl pull {run}`")
            return result
        state, outcome, error = _outcome(call, wait=True)
    return _finish(run, volume, name, local, state, outcome, error, result)


def _refuse_if_running(run: Path, name: str) -> None:
    """Two containers training one run directory would overwrite each other's checkpoints."""
    import modal

    rec = _modal_record(run)
    if not rec or rec.get("name") != name or not isinstance(rec.get("call_id"), str):
        return
    with modal_errors(rec.get("volume")):
        state, _, _ = _outcome(modal.FunctionCall.from_id(rec["call_id"]))
    if state == "running":
        raise PingctlError(f"{run} is still training on Modal (call {rec['call_id']}): follow it with "
                           f"`pingctl train {run} --follow`, or wait until --status says it ended")


def _finish(run: Path, volume: Volume, name: str, local: dict, state: str, outcome: dict | None, error: str | None,
            result: dict) -> dict:
    """A blocking run has ended: bring it home, then report (a failure after its log is here)."""
    try:
        pulled = pull(run, volume, name, local=local)
    except PingctlError as e:
        if state == "succeeded":
            raise
        pulled = {"error": str(e)}
    result["pull"] = pulled
    # "ended": Modal no longer keeps the result; a summary.json on the volume says it finished
    ok = state == "succeeded" or (state == "ended" and pulled.get("summary"))
    if not ok:
        where = f"; its log: {run / LOG}" if (run / LOG).exists() else ""
        raise PingctlError(f"training on Modal {state}: {error or 'no result'}{where}")
    train = (outcome or {}).get("summary") or {}
    result["train"] = train
    result["summary"]["steps this run"] = f"{train.get('first_step_this_run')} .. {train.get('last_step')}"
    result["summary"]["final loss"] = train.get("final_loss")
    result["summary"]["pulled"] = f"{run} (checkpoints {', '.join(map(str, pulled['checkpoints'])) or '-'})"
    return result


def _require_record(run: Path) -> dict:
    rec = read_remote(run)
    if rec is None:
        raise PingctlError(f"{run}: no remote.json, so nothing was submitted from this run directory "
                           "(`pingctl train ROWS --run-dir RUN --target modal`)")
    if rec.get("target") != "modal":
        raise PingctlError(f"{run}/remote.json: a {rec.get('target')} run, not a Modal one")
    missing = [k for k in ("name", "volume", "call_id") if not isinstance(rec.get(k), str)]
    if missing:
        raise PingctlError(f"{run}/remote.json: no {', '.join(missing)}; submit the run again")
    return rec


def _outcome(call, wait: bool = False) -> tuple[str, dict | None, str | None]:
    """(state, what the function returned, error) of a spawned call: running, succeeded,
    failed, or ended (Modal no longer keeps the result: the volume tells the rest)."""
    import modal.exception as E

    try:
        out = call.get(timeout=None if wait else 0)
    except E.OutputExpiredError:
        return "ended", None, None
    except E.FunctionTimeoutError as e:
        return "failed", None, f"the function timed out (train.modal.timeout_s; --max-minutes ends a run in time): {e}"
    except (TimeoutError, E.TimeoutError):
        return "running", None, None
    except (E.AuthError, E.ConnectionError, E.NotFoundError):
        raise
    except Exception as e:  # noqa: BLE001 - a crash of the container, reported as the call's state
        return "failed", None, f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
    if isinstance(out, dict):
        return ("succeeded", out, None) if out.get("ok") else ("failed", out, out.get("error"))
    return "failed", None, f"the function returned {out!r:.200} (not what run_in_container returns)"


def _state(run: Path, rec: dict, call, state: str, error: str | None, volume: Volume, tail: list[str]) -> dict:
    name = rec["name"]
    remote_steps = committed_steps(volume, name)
    try:
        last = json.loads(volume.read(f"{run_path(name)}/{SUMMARY}") or b"null")
    except ValueError:
        last = None
    here = checkpoint_steps(run)
    return {
        "target": "modal",
        "run_dir": str(run),
        "job_id": rec["call_id"],
        "submitted_at": rec.get("submitted_at"),
        "state": state,
        "reason": error,
        "active": state == "running",
        "ok": state == "succeeded" or (state == "ended" and last is not None),
        "checkpoints": here,
        "last_checkpoint": remote_steps[-1] if remote_steps else None,
        # the last invocation that finished (a resumed one still running has not written its own)
        "last_step": last.get("last_step") if isinstance(last, dict) else None,
        "log": str(run / LOG) if (run / LOG).exists() else f"{volume.name}:/{run_path(name)}/{LOG}",
        "summary": f"{volume.name}:/{run_path(name)}/{SUMMARY}" if last is not None else None,
        "name": name,
        "volume": volume.name,
        "app": rec.get("app"),
        "remote_checkpoints": remote_steps,
        "pulled_checkpoints": here,
        "log_tail": "\n".join(tail) or None,
        "next": f"pingctl pull {run}" if remote_steps and remote_steps[-1] not in here else
        (f"pingctl train {run} --follow" if state == "running" else "-"),
    }


def _tail(call, n: int) -> list[str]:
    import modal.exception

    try:
        return [e.message.rstrip("\n") for e in call.logs.tail(n)]
    except modal.exception.Error:  # logs past their retention, or too many to fetch
        return []


def _call(run_dir: Path):
    """(run, remote.json, the spawned call, its state, its error) of a submitted run."""
    import modal

    run = Path(run_dir).resolve()
    rec = _require_record(run)
    require_credentials()
    with modal_errors(rec["volume"]):
        call = modal.FunctionCall.from_id(rec["call_id"])
        state, _, error = _outcome(call)
    return run, rec, call, state, error


def status(run_dir: Path) -> dict:
    """Where a Modal run stands: the call's state (running, succeeded, failed, ended: Modal no
    longer keeps its result), the checkpoints committed on the volume and those pulled here,
    the last lines of its log."""
    run, rec, call, state, error = _call(run_dir)
    with modal_errors(rec["volume"]):
        return _state(run, rec, call, state, error, ModalVolume(rec["volume"]), _tail(call, 5))


def follow(run_dir: Path, write: Callable[[str], object] | None = None, pull_after: bool = True) -> dict:
    """Stream a Modal run's logs until it ends (its last 50 lines when it already has), then
    pull it home (the latest checkpoint); returns the final `status` plus what the pull
    brought (`ok`: whether the run succeeded)."""
    if write is None:
        def write(text: str) -> None:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
            sys.stdout.flush()
    run, rec, call, state, error = _call(run_dir)
    with modal_errors(rec["volume"]):
        if state == "running":
            for entry in call.logs.stream():
                write(entry.message)
            state, _, error = _outcome(call, wait=True)
        else:
            for line in _tail(call, 50):
                write(line)
        volume = ModalVolume(rec["volume"])
    pulled = "-"
    if pull_after:
        try:
            got = pull(run, volume, rec["name"], local=rec.get("local") if isinstance(rec.get("local"), dict) else None)
            pulled = (f"{got['files']} files, {got['bytes'] / 1e6:,.1f} MB; checkpoints here: "
                      f"{', '.join(map(str, got['checkpoints'])) or '-'}")
        except PingctlError as e:
            pulled = f"failed: {e}"
    with modal_errors(rec["volume"]):
        result = _state(run, rec, call, state, error, volume, [])
    result["pull"] = pulled
    return result
