"""`pingctl pull` (pingctl/cli/pull_cmd.py): a run trained on Modal brought home into its run
directory, also what a blocking `train --target modal` and `--follow` do when the run ends
(docs/train.md, "Modal"). Against the small `Volume` interface (volume.py), so it runs offline too.

What comes home: config, summary, metrics, loss plot, train.log and TensorBoard events, and the
committed checkpoints asked for, each built in a hidden temp directory and renamed into place
whole: an interrupted pull leaves nothing that looks like a checkpoint. The config.yaml and
maxtext.yml are written last, with this machine's paths: a directory becomes a run directory
(`artifacts.run.is_run_dir`) only once a pull got that far.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

from pingctl.artifacts.remote import read_remote
from pingctl.artifacts.run import (CONFIG, HINTS, INPUT_WAIT, LIGHT_CACHE, LOG, LOSS_PLOT, MAXTEXT_RUN_NAME,
                                   MAXTEXT_YML, METRICS, STOPPED, SUMMARY, checkpoint_steps, checkpoints_dir,
                                   read_config, read_config_doc, write_config)
from pingctl.atomic import atomic_dir, atomic_file, write_json
from pingctl.config import Config, ModalConfig, TrainConfig
from pingctl.errors import PingctlError, UsageError
from pingctl.executor.modal.sync import MOUNT, STAGING, check_name, committed_steps, run_path
from pingctl.executor.modal.volume import ModalVolume, Volume, norm, require_credentials
from pingctl.train import metrics as M
from pingctl.train.render import render_maxtext

# what a pull brings, with what was derived here from the pulled checkpoints (the light engine's cache)
PULLED = (CONFIG, MAXTEXT_YML, LOG, METRICS, LOSS_PLOT, SUMMARY, STOPPED, INPUT_WAIT, HINTS, MAXTEXT_RUN_NAME,
          LIGHT_CACHE)


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


class _Transfer:
    """The remote run's files on the volume, and what this pull moved of them."""

    def __init__(self, volume: Volume, name: str):
        self.volume, self.base = volume, run_path(name)
        self.entries = volume.listdir(self.base, recursive=True)
        cut = len(self.base) + 1
        self.files = {e.path[cut:]: e.size for e in self.entries if not e.is_dir and e.path.startswith(self.base + "/")}
        self.moved = {"files": 0, "bytes": 0}

    def fetch(self, rel: str, dest: Path, if_changed: bool = False, whole: bool = True) -> None:
        """`whole`: through a temp file renamed into place (a file inside a checkpoint being
        built needs none: the checkpoint's directory is renamed whole)."""
        if if_changed and dest.is_file() and dest.stat().st_size == self.files[rel]:
            return
        dest.parent.mkdir(parents=True, exist_ok=True)
        if whole:
            with atomic_file(dest) as tmp:
                self.volume.download(f"{self.base}/{rel}", tmp)
        else:
            self.volume.download(f"{self.base}/{rel}", dest)
        self.moved["files"] += 1
        self.moved["bytes"] += self.files[rel]


def _wanted(have: list[int], steps: list[int] | str | None, where: str) -> list[int]:
    if steps is None:
        return have[-1:]
    if steps == "all":
        return have
    want = sorted(set(steps))
    missing = [s for s in want if s not in have]
    if missing:
        raise PingctlError(f"{where} has no committed checkpoint at step {', '.join(map(str, missing))} "
                           f"(committed: {', '.join(map(str, have)) or 'none'})")
    return want


def _check_destination(run: Path, have: list[int], where: str) -> None:
    """Refuse a directory whose checkpoints or config belong to another run."""
    stale = [s for s in checkpoint_steps(run) if s not in have and s > max(have, default=-1)]
    if stale:
        raise PingctlError(f"{run} holds checkpoint {', '.join(map(str, stale))}, newer than any on {where}: "
                           "the remote run was started over; pull it into another directory, or delete "
                           f"{checkpoints_dir(run)} first")
    if (run / CONFIG).is_file():
        try:
            target = read_config_doc(run / CONFIG).get("train", {}).get("target")
        except (PingctlError, AttributeError):
            target = None
        if target not in ("modal", None):
            raise UsageError(f"{run} holds a {target} run; pull the Modal run into its own directory")


def _pull_files(run: Path, t: _Transfer) -> None:
    """Everything but the checkpoints; a file gone from the volume goes from here too."""
    for fname in (CONFIG, MAXTEXT_YML):
        if fname in t.files:
            t.fetch(fname, run / STAGING / fname)
    for fname in (LOG, METRICS, LOSS_PLOT, SUMMARY, STOPPED, INPUT_WAIT, HINTS):
        if fname in t.files:
            t.fetch(fname, run / fname, if_changed=fname == LOG)
        else:
            (run / fname).unlink(missing_ok=True)  # a copy from an earlier pull, no longer true there
    tb = f"{MAXTEXT_RUN_NAME}/tensorboard/"
    for rel in sorted(r for r in t.files if r.startswith(tb)):
        t.fetch(rel, run / rel, if_changed=True)


def _pull_checkpoint(run: Path, t: _Transfer, step: int) -> None:
    prefix = f"{MAXTEXT_RUN_NAME}/checkpoints/{step}/"
    with atomic_dir(checkpoints_dir(run) / str(step)) as tmp:
        for e in t.entries:
            rel = e.path[len(t.base) + 1:]
            if e.is_dir and rel.startswith(prefix):
                (tmp / rel[len(prefix):]).mkdir(parents=True, exist_ok=True)
        for rel in sorted(r for r in t.files if r.startswith(prefix)):
            t.fetch(rel, tmp / rel[len(prefix):], whole=False)


def _make_run_dir(run: Path, name: str, base: str, local: dict | None) -> Config | None:
    """The pulled config with this machine's paths, the summary's paths too, metrics and the loss
    plot from the pulled events; None while the volume has no config yet."""
    staged = run / STAGING / CONFIG
    if not staged.is_file():
        return None
    try:
        remote = read_config(staged)
    except PingctlError as e:
        raise PingctlError(f"pulled from /{base}: {e}") from None
    cfg = local_config(remote, run, local)
    _localize_summary(run, f"{MOUNT}/{base}", remote.train.run_dir)
    records = M.run_history(run)  # the pulled events: current even for a run still training
    if records:
        M.write_jsonl(records, run / METRICS)
        M.plot_loss(records, run / LOSS_PLOT, f"{cfg.model.preset} preset, {name}")
    # last: a directory becomes a run directory (artifacts.run.is_run_dir) once a pull got this far
    maxtext = render_maxtext(cfg, run)
    write_config(run / CONFIG, cfg)
    with atomic_file(run / MAXTEXT_YML) as tmp:
        tmp.write_text(maxtext)
    return cfg


def pull(run: Path, volume: Volume, name: str, steps: list[int] | str | None = None, local: dict | None = None,
         progress: Callable[[str], None] | None = None) -> dict:
    """Bring the remote run home into `run` (module docstring). `steps`: None for the latest
    committed checkpoint (none yet is no error), "all", or a list that must all be committed.
    `local`: this machine's rows and XLA cache, for the pulled config.yaml (local_config)."""
    run = Path(run).resolve()
    say = progress or (lambda _msg: None)
    t = _Transfer(volume, name)
    if not t.files:
        raise PingctlError(f"Modal volume {volume.name}: no run at /{t.base} (not started yet, or deleted with --fresh)")
    have = committed_steps(volume, name, t.entries)
    want = _wanted(have, steps, f"Modal volume {volume.name}: /{t.base}")
    _check_destination(run, have, f"{volume.name}:/{t.base}")
    run.mkdir(parents=True, exist_ok=True)
    _pull_files(run, t)
    local_steps = set(checkpoint_steps(run))
    pulled = []
    for step in want:
        if step not in local_steps:
            say(f"checkpoint {step}")
            _pull_checkpoint(run, t, step)
            pulled.append(step)
    cfg = _make_run_dir(run, name, t.base, local)
    return {
        "run_dir": str(run),
        "remote": f"{volume.name}:/{t.base}",
        "remote_checkpoints": have,
        "pulled_checkpoints": pulled,
        "checkpoints": checkpoint_steps(run),
        "files": t.moved["files"],
        "bytes": t.moved["bytes"],
        "summary": (run / SUMMARY).is_file(),
        "run_dir_ready": cfg is not None,
    }


def local_config(remote: Config, run: Path, local: dict | None = None) -> Config:
    """A pulled run's config.yaml: what the container trained with, with this machine's paths
    (the run directory, the rows it was submitted with, the XLA cache), so `sample`, `eval`
    and `inspect` find nothing that only exists in the container."""
    local = local or {}
    update = {
        "run_dir": str(Path(run).resolve()),
        "jax_cache_dir": local.get("jax_cache_dir") or TrainConfig.model_fields["jax_cache_dir"].default,
    }
    if local.get("train_rows"):
        update["train_rows"] = local["train_rows"]
    if remote.train.eval_rows and local.get("eval_rows"):
        update["eval_rows"] = local["eval_rows"]
    cfg = remote.model_copy(update={"train": remote.train.model_copy(update=update)})
    if remote.loader.hints_file and local.get("hints_file"):
        cfg = cfg.model_copy(update={"loader": cfg.loader.model_copy(update={"hints_file": local["hints_file"]})})
    return cfg


def clear_pulled(run: Path) -> list[str]:
    """`--fresh`: what earlier pulls brought into `run` goes with the remote run it came from
    (a later pull would otherwise mix the old run's checkpoints with the new one's)."""
    gone = []
    for name in PULLED:
        p = Path(run) / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
        else:
            continue
        gone.append(name)
    return gone


def _localize_summary(run: Path, *remote_dirs: str) -> None:
    """summary.json names the run's files by the container's paths: name this copy's."""
    path = run / SUMMARY
    if not path.is_file():
        return
    try:
        summary = json.loads(path.read_text())
    except ValueError:
        raise PingctlError(f"{path}: damaged in the pull; run `pingctl pull` again") from None
    prefixes = sorted({norm(d) for d in remote_dirs if d}, key=len, reverse=True)

    def local(v):
        if isinstance(v, str):
            for p in prefixes:
                if v.lstrip("/") == p or v.lstrip("/").startswith(p + "/"):
                    return str(run) + v.lstrip("/")[len(p):]
        return v

    write_json(path, {k: local(v) for k, v in summary.items()})
