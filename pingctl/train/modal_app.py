"""`pingctl train --target modal`: the same worker, run in a Modal GPU container, and the way
back: `--status`, `--follow`, `pingctl pull` (docs/train.md, "Modal").

A submission (launch):
 1. the same checks as a local run (rows, config), then the remote name: `--name`, the name an
    earlier submission of this run directory recorded, else one derived from the directory
    (modal_sync.default_name);
 2. `--fresh` deletes the remote run and its rows; otherwise the volume's checkpoints must be
    resumable by this config (the local target's own checks, modal_sync.check_remote_resume);
 3. only the row files missing or changed on the volume go up (modal_sync.plan_upload);
 4. the function is spawned in an ephemeral app (`app.run(detach=...)`), the call recorded in
    RUN/remote.json (pingctl.artifacts.remote); `--detach` returns here, otherwise the call's
    logs stream while it trains and the run is pulled home when it ends.
In the container `run_in_container` runs `run_local` on the volume (train.log, metrics.jsonl,
loss.png and summary.json are written there as on a local run) and commits the volume while
training and at the end, so `--status` and `pull` see checkpoints as they are written.

The image needs no source tree: its pip layer installs pingctl's requirements (the base ones
and the `train` extra, read from the installed distribution's metadata, with `jax[cuda12]`
for `jax[cpu]`), and the `pingctl` package itself is added from wherever this interpreter
imports it (a source checkout or site-packages of an installed wheel), templates and data
included, with `Image.add_local_python_source`. Secrets (the Modal token, a W&B key) stay in
the environment and Modal secrets; nothing here writes or prints them.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

import yaml

from pingctl import __version__
import pingctl
from pingctl.artifacts.remote import read_remote, write_remote
from pingctl.artifacts.run import LOG, SUMMARY, checkpoint_steps, is_run_dir, run_config
from pingctl.atomic import atomic_file
from pingctl.config import Config, ModalConfig
from pingctl.errors import PingctlError, UsageError
from pingctl.train.local import check_inputs, run_local
from pingctl.train.modal_sync import (MOUNT, STAGING, apply_upload, check_name, check_remote_resume, clear_pulled,
                                      committed_steps, default_name, delete_remote, plan_upload, pull, remote_config,
                                      run_path)
from pingctl.train.modal_volume import ModalVolume, Volume, modal_errors, require_credentials
from pingctl.train.render import render_maxtext

GPU_JAX = "jax[cuda12]"  # replaces the train extra's jax[cpu], at the same version
XPROF = "xprof==2.24.2"  # installed without its dependencies, as ./run does (MaxText imports it via tokamax)
EXTRA = "train"
# Everything in the package but bytecode: the templates and data/ are not .py files, which
# add_local_python_source leaves out by default.
_SOURCE_IGNORE = ["**/__pycache__", "**/*.pyc"]


def _split_requirement(req: str) -> tuple[str, str]:
    spec, _, marker = req.partition(";")
    return spec.strip(), marker.strip()


def _metadata_requirements() -> list[str]:
    """pingctl's Requires-Dist lines: from the installed distribution (a wheel or an editable
    install), else from pyproject.toml beside a source tree run without installing it."""
    from importlib import metadata

    try:
        return metadata.requires("pingctl") or []
    except metadata.PackageNotFoundError:
        pass
    import tomllib

    pyproject = Path(pingctl.__file__).resolve().parents[1] / "pyproject.toml"
    if not pyproject.is_file():
        raise PingctlError("pingctl is not installed and has no pyproject.toml beside it: cannot list its requirements")
    project = tomllib.loads(pyproject.read_text())["project"]
    extra = project.get("optional-dependencies", {}).get(EXTRA, [])
    return [*project["dependencies"], *(f'{r}; extra == "{EXTRA}"' for r in extra)]


def image_requirements() -> list[str]:
    """What the image's pip layer installs: pingctl's own requirements and its `train` extra,
    with jax's `cpu` extra swapped for `cuda12` (same version pin)."""
    out = []
    for req in _metadata_requirements():
        spec, marker = _split_requirement(req)
        if marker and re.sub(r"\s+", "", marker.replace("'", '"')) != f'extra=="{EXTRA}"':
            continue  # another extra (dev) or a marker this image does not meet
        m = re.match(r"jax(\[[^\]]*\])?(?=[\s=<>!~(]|$)", spec)
        if m:
            spec = GPU_JAX + spec[m.end():].strip()
        out.append(spec)
    if not any(r.startswith(GPU_JAX) for r in out):
        out.append(GPU_JAX)
    return out


def local_source() -> Path:
    """The `pingctl` package directory the image gets (found without importing anything new)."""
    return Path(pingctl.__file__).resolve().parent


COMMIT_EVERY_S = 120.0  # while training: checkpoints and events become visible to status and pull


def build_app(cfg: Config, name: str):
    """The Modal app and its training function, built offline (nothing is contacted)."""
    import modal

    m = cfg.train.modal
    image = (
        modal.Image.debian_slim(python_version="3.12")
        .pip_install(*image_requirements())
        .pip_install(XPROF, extra_options="--no-deps")
        .env({"PYTHONUNBUFFERED": "1"})
        # last: added when a container starts (no rebuild when only pingctl's code changed),
        # under /root, which is on the function's sys.path
        .add_local_python_source("pingctl", ignore=_SOURCE_IGNORE)
    )
    volume = modal.Volume.from_name(m.volume, create_if_missing=True)
    secrets = [modal.Secret.from_name(m.wandb_secret)] if m.wandb_secret else []
    app = modal.App(m.app_name)

    @app.function(
        image=image,
        gpu=f"{m.gpu}:{m.gpu_count}",
        volumes={MOUNT: volume},
        timeout=m.timeout_s,
        secrets=secrets,
        serialized=True,
    )
    def train_remote(config: dict) -> dict:
        # pickled by reference: the container imports it from the pingctl added to the image
        return run_in_container(config, volume.commit)

    return app, train_remote, volume, image


def describe(cfg: Config, name: str) -> dict:
    m = cfg.train.modal
    rc = remote_config(cfg, name)
    return {
        "app": m.app_name,
        "name": name,
        "image": f"debian_slim python 3.12 + pip: {len(image_requirements())} requirements of pingctl[{EXTRA}] "
        f"{__version__} ({GPU_JAX} for jax[cpu]) + {XPROF} --no-deps",
        "source": f"{local_source()} -> /root/pingctl (added at container start)",
        "gpu": f"{m.gpu}:{m.gpu_count}",
        "volume": f"{m.volume} at {MOUNT}",
        "secrets": m.wandb_secret or "-",
        "uploads": f"{cfg.train.train_rows} -> {rc.train.train_rows}"
        + (f"; {cfg.train.eval_rows} -> {rc.train.eval_rows}" if cfg.train.eval_rows else ""),
        "command": f"python -m pingctl.train.worker {rc.train.run_dir}",
        "timeout s": m.timeout_s,
    }


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


def launch(cfg: Config, run: Path, fresh: bool = False, dry_run: bool = False, detach: bool = False,
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
    with atomic_file(staging / "config.yaml") as tmp:
        tmp.write_text(yaml.safe_dump(rc.model_dump(mode="json"), sort_keys=False))
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
    local = {"train_rows": cfg.train.train_rows, "eval_rows": cfg.train.eval_rows,
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


def status(run_dir: Path) -> dict:
    """Where a Modal run stands: the call's state (running, succeeded, failed, ended: Modal no
    longer keeps its result), the checkpoints committed on the volume and those pulled here,
    the last lines of its log."""
    import modal

    run = Path(run_dir).resolve()
    rec = _require_record(run)
    require_credentials()
    with modal_errors(rec["volume"]):
        call = modal.FunctionCall.from_id(rec["call_id"])
        state, _, error = _outcome(call)
        volume = ModalVolume(rec["volume"])
        return _state(run, rec, call, state, error, volume, _tail(call, 5))


def follow(run_dir: Path, write: Callable[[str], object] | None = None, pull_after: bool = True) -> dict:
    """Stream a Modal run's logs until it ends (its last 50 lines when it already has), then
    pull it home (the latest checkpoint); returns the final `status` plus what the pull
    brought (`ok`: whether the run succeeded)."""
    import modal

    if write is None:
        def write(text: str) -> None:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
            sys.stdout.flush()
    run = Path(run_dir).resolve()
    rec = _require_record(run)
    require_credentials()
    with modal_errors(rec["volume"]):
        call = modal.FunctionCall.from_id(rec["call_id"])
        state, _, error = _outcome(call)
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


def pull_run(run_dir: Path, steps: list[int] | str | None = None, name: str | None = None,
             volume: str | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """`pingctl pull RUN`: the remote run recorded in RUN/remote.json (or `--name`/`--volume`)."""
    run = Path(run_dir)
    rec = read_remote(run) if run.is_dir() else None
    if rec is not None and rec.get("target") != "modal":
        raise PingctlError(f"{run} was submitted to {rec.get('target')}, where it trains in this run directory: "
                           "there is nothing to pull")
    rec = rec or {}
    name = check_name(name) if name else rec.get("name")
    if not name:
        raise PingctlError(f"{run}: no remote.json (the run was not submitted from here); pass the remote run's "
                           "--name (and --volume if not the default)")
    vol_name = volume or rec.get("volume") or ModalConfig.model_fields["volume"].default
    require_credentials()
    vol = ModalVolume(vol_name)
    local = rec.get("local") if isinstance(rec.get("local"), dict) else None
    return pull(run, vol, name, steps, local=local, progress=progress)
