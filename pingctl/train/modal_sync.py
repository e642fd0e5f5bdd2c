"""What moves between a run directory here and a Modal Volume, decided by pingctl's own code
against the small `Volume` interface (pingctl/train/modal_volume.py), so it runs offline too.

Layout on the volume (mounted at /data in the container):

    rows/<name>/train/, rows/<name>/eval/   the rows (manifest.json and the files it lists)
    rows/<name>/uploaded.json               sha256 and size of every row file uploaded
    runs/<name>/                            the run directory the container trains in
    jax_cache/                              XLA's compilation cache, shared by all runs

`<name>` is the run's remote name: `--name`, else the run directory's own name plus a short
hash of its absolute path, so two run directories never share a remote run.

Uploads: the rows manifest lists the files of a rows directory (it records the sha256 of the
*inputs* build-rows read, not of its own files), so each listed file is hashed here and
compared with uploaded.json and the volume's listing: only files missing there, of another
size, or of another sha256 go up, files no longer listed are removed, and uploaded.json is
replaced only once the files it describes are on the volume.

Pull: config, summary, metrics, loss plot, train.log and TensorBoard events come home, and the
committed checkpoints asked for, each built in a hidden temp directory and renamed into place
whole: an interrupted pull leaves nothing that looks like a checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pingctl.artifacts.records import destination_rows, read_manifest
from pingctl.artifacts.run import (COMMITTED, CONFIG, HINTS, INPUT_WAIT, LIGHT_CACHE, LOG, LOSS_PLOT, MAXTEXT_RUN_NAME,
                                   MAXTEXT_YML, METRICS, STOPPED, SUMMARY, checkpoint_steps, checkpoints_dir,
                                   read_config, read_config_doc, write_config)
from pingctl.atomic import MANIFEST, atomic_dir, atomic_file, write_json
from pingctl.config import Config, TrainConfig
from pingctl.errors import PingctlError, UsageError
from pingctl.train import metrics as M
from pingctl.train.local import prepare_run
from pingctl.train.modal_volume import Volume, norm
from pingctl.train.render import render_maxtext

MOUNT = "/data"
UPLOADED = "uploaded.json"
STAGING = "modal"  # RUN/modal/: the config and MaxText yml exactly as the container runs them
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_HASH_CHUNK = 1 << 20


def rows_path(name: str, split: str | None = None) -> str:
    return f"rows/{name}" + (f"/{split}" if split else "")


def run_path(name: str) -> str:
    return f"runs/{name}"


def default_name(run: Path | str) -> str:
    """The run directory's name and 8 hex digits of its absolute path's sha256: `runs/train`
    of two projects are two remote runs, and the name still says which directory it is."""
    where = Path(run).resolve()
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", where.name).strip("-._")[:48] or "run"
    return f"{stem}-{hashlib.sha256(str(where).encode()).hexdigest()[:8]}"


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise UsageError(f"--name {name!r}: use letters, digits, '.', '_' and '-' (at most 100, starting with a "
                         "letter or digit); it names a directory on the Modal volume")
    return name


def remote_config(cfg: Config, name: str, mount: str = MOUNT) -> Config:
    """The config the container trains with: the volume's paths, a GPU, target modal."""
    t = cfg.train
    update = {
        "train_rows": f"{mount}/{rows_path(name, 'train')}",
        "eval_rows": f"{mount}/{rows_path(name, 'eval')}" if t.eval_rows else None,
        "run_dir": f"{mount}/{run_path(name)}",
        "hardware": "gpu",
        "target": "modal",
        "jax_cache_dir": f"{mount}/jax_cache",
    }
    cfg = cfg.model_copy(update={"train": t.model_copy(update=update)})
    if cfg.loader.hints_file:  # uploaded beside the rows (plan_upload)
        cfg = cfg.model_copy(update={"loader": cfg.loader.model_copy(
            update={"hints_file": f"{mount}/{rows_path(name)}/{HINTS}"})})
    return cfg


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


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class UploadPlan:
    name: str
    upload: list[tuple[Path, str]] = field(default_factory=list)  # (local file, volume path)
    kept: list[str] = field(default_factory=list)  # already on the volume, same size and sha256
    remove: list[str] = field(default_factory=list)  # on the volume, listed by no manifest now
    record: dict[str, dict] = field(default_factory=dict)  # uploaded.json once the plan is applied

    @property
    def bytes_up(self) -> int:
        return sum(self.record[v]["bytes"] for _, v in self.upload)

    def describe(self) -> dict:
        return {"upload": len(self.upload), "upload_bytes": self.bytes_up, "already_there": len(self.kept),
                "remove": len(self.remove)}


def _rows_splits(cfg: Config) -> list[tuple[str, Path]]:
    t = cfg.train
    return [("train", Path(t.train_rows))] + ([("eval", Path(t.eval_rows))] if t.eval_rows else [])


def _row_files(rows: Path) -> list[str]:
    """What the loader reads of a rows directory, relative to it: manifest.json, the files it
    lists, and the same of the destination records it names (`build-rows --by both`)."""
    manifest = read_manifest(rows)
    out = [MANIFEST, *manifest.get("files", [])]
    dest = destination_rows(rows, manifest)
    if dest is not None and dest != rows:
        sub = dest.relative_to(rows).as_posix()
        out += [f"{sub}/{f}" for f in (MANIFEST, *read_manifest(dest).get("files", []))]
    return out


def plan_upload(cfg: Config, name: str, volume: Volume) -> UploadPlan:
    """Which row files go up, which stay, which go away (module docstring)."""
    plan = UploadPlan(name)
    listed = {e.path: e.size for e in volume.listdir(rows_path(name), recursive=True) if not e.is_dir}
    try:
        before = json.loads(volume.read(f"{rows_path(name)}/{UPLOADED}") or b"{}")
    except ValueError:
        before = {}  # damaged: every file is then uploaded again
    before = before if isinstance(before, dict) else {}
    for split, rows in _rows_splits(cfg):
        for fname in _row_files(rows):
            local = rows / fname
            if not local.is_file():
                raise PingctlError(f"{local}: listed in {rows / MANIFEST} but missing; rebuild with `pingctl build-rows`")
            _plan_file(plan, local, f"{rows_path(name, split)}/{fname}", listed, before)
    if cfg.loader.hints_file:
        _plan_file(plan, Path(cfg.loader.hints_file), f"{rows_path(name)}/{HINTS}", listed, before)
    keep = set(plan.record) | {f"{rows_path(name)}/{UPLOADED}"}
    plan.remove = sorted(p for p in listed if p not in keep)
    return plan


def _plan_file(plan: UploadPlan, local: Path, vpath: str, listed: dict, before: dict) -> None:
    """One file into the plan: kept where the volume has it with the same size and hash, else up."""
    entry = {"sha256": sha256_file(local), "bytes": local.stat().st_size}
    plan.record[vpath] = entry
    old = before.get(vpath)
    if listed.get(vpath) == entry["bytes"] and isinstance(old, dict) and old.get("sha256") == entry["sha256"]:
        plan.kept.append(vpath)
    else:
        plan.upload.append((local, vpath))


def apply_upload(plan: UploadPlan, volume: Volume) -> None:
    """Stale files out, missing or changed ones up, then the record of what is there."""
    for p in plan.remove:
        volume.remove(p)
    volume.upload(plan.upload)
    with tempfile.TemporaryDirectory(prefix="pingctl-modal-") as d:
        rec = Path(d) / UPLOADED
        rec.write_text(json.dumps(plan.record, indent=2, sort_keys=True) + "\n")
        volume.upload([(rec, f"{rows_path(plan.name)}/{UPLOADED}")])


def delete_remote(volume: Volume, name: str) -> list[str]:
    """`--fresh`: the remote run and its rows go, checkpoints and all; what was there is returned."""
    gone = []
    for p in (run_path(name), rows_path(name)):
        if volume.listdir(p):
            volume.remove(p)
            gone.append(p)
    return gone


def committed_steps(volume: Volume, name: str, entries: list | None = None) -> list[int]:
    """Steps whose checkpoint on the volume was written whole (Orbax's marker is there)."""
    base = f"{run_path(name)}/{MAXTEXT_RUN_NAME}/checkpoints"
    if entries is None:
        entries = volume.listdir(base, recursive=True)
    steps = set()
    for e in entries:
        rel = e.path[len(base) + 1:] if e.path.startswith(base + "/") else None
        parts = rel.split("/") if rel else []
        if len(parts) == 2 and parts[0].isdigit() and parts[1] == COMMITTED and not e.is_dir:
            steps.add(int(parts[0]))
    return sorted(steps)


def check_remote_resume(cfg: Config, name: str, volume: Volume) -> list[int]:
    """The local target's own resume checks (same model, `--steps` above the last checkpoint),
    run before anything is uploaded, on a mirror of what the volume holds: its config.yaml and
    its committed checkpoints' markers. Returns those steps."""
    steps = committed_steps(volume, name)
    if not steps:
        return []
    where = f"Modal volume {volume.name}: /{run_path(name)}"
    with tempfile.TemporaryDirectory(prefix="pingctl-modal-") as d:
        mirror = Path(d) / "run"
        mirror.mkdir()
        text = volume.read(f"{run_path(name)}/{CONFIG}")
        if text is not None:
            (mirror / CONFIG).write_bytes(text)
        for s in steps:
            (checkpoints_dir(mirror) / str(s)).mkdir(parents=True)
            (checkpoints_dir(mirror) / str(s) / COMMITTED).touch()
        # the W&B key lives in a Modal secret, not necessarily in this shell's environment
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"wandb": False})})
        try:
            prepare_run(cfg, mirror, fresh=False, dry_run=True)
        except PingctlError as e:
            raise type(e)(str(e).replace(str(mirror.resolve()), where).replace("--run-dir", "--name or --run-dir")) from None
    return steps


def _download_file(volume: Volume, path: str, dest: Path) -> None:
    with atomic_file(dest) as tmp:
        volume.download(path, tmp)


def pull(run: Path, volume: Volume, name: str, steps: list[int] | str | None = None, local: dict | None = None,
         progress: Callable[[str], None] | None = None) -> dict:
    """Bring the remote run home into `run` (module docstring). `steps`: None for the latest
    committed checkpoint (none yet is no error), "all", or a list that must all be committed.
    `local`: this machine's rows and XLA cache, for the pulled config.yaml (local_config)."""
    run = Path(run).resolve()
    say = progress or (lambda _msg: None)
    base = run_path(name)
    entries = volume.listdir(base, recursive=True)
    files = {e.path[len(base) + 1:]: e.size for e in entries if not e.is_dir and e.path.startswith(base + "/")}
    if not files:
        raise PingctlError(f"Modal volume {volume.name}: no run at /{base} (not started yet, or deleted with --fresh)")
    have = committed_steps(volume, name, entries)
    if steps is None:
        want = have[-1:]
    elif steps == "all":
        want = have
    else:
        want = sorted(set(steps))
        missing = [s for s in want if s not in have]
        if missing:
            raise PingctlError(f"Modal volume {volume.name}: /{base} has no committed checkpoint at step "
                               f"{', '.join(map(str, missing))} (committed: {', '.join(map(str, have)) or 'none'})")
    stale = [s for s in checkpoint_steps(run) if s not in have and s > max(have, default=-1)]
    if stale:
        raise PingctlError(f"{run} holds checkpoint {', '.join(map(str, stale))}, newer than any on {volume.name}:/{base}: "
                           "the remote run was started over; pull it into another directory, or delete "
                           f"{checkpoints_dir(run)} first")
    if (run / CONFIG).is_file():
        try:
            target = read_config_doc(run / CONFIG).get("train", {}).get("target")
        except (PingctlError, AttributeError):
            target = None
        if target not in ("modal", None):
            raise UsageError(f"{run} holds a {target} run; pull the Modal run into its own directory")
    run.mkdir(parents=True, exist_ok=True)
    moved = {"files": 0, "bytes": 0}

    def fetch(rel: str, dest: Path, if_changed: bool = False) -> None:
        if if_changed and dest.is_file() and dest.stat().st_size == files[rel]:
            return
        dest.parent.mkdir(parents=True, exist_ok=True)
        _download_file(volume, f"{base}/{rel}", dest)
        moved["files"] += 1
        moved["bytes"] += files[rel]

    staging = run / STAGING
    for fname in (CONFIG, MAXTEXT_YML):
        if fname in files:
            fetch(fname, staging / fname)
    for fname in (LOG, METRICS, LOSS_PLOT, SUMMARY, STOPPED, INPUT_WAIT, HINTS):
        if fname in files:
            fetch(fname, run / fname, if_changed=fname == LOG)
        else:
            (run / fname).unlink(missing_ok=True)  # a copy from an earlier pull, no longer true there
    tb = f"{MAXTEXT_RUN_NAME}/tensorboard/"
    for rel in sorted(r for r in files if r.startswith(tb)):
        fetch(rel, run / rel, if_changed=True)

    local_steps = set(checkpoint_steps(run))
    pulled = []
    for step in want:
        if step in local_steps:
            continue
        say(f"checkpoint {step}")
        prefix = f"{MAXTEXT_RUN_NAME}/checkpoints/{step}/"
        with atomic_dir(checkpoints_dir(run) / str(step)) as tmp:
            for e in entries:
                rel = e.path[len(base) + 1:]
                if e.is_dir and rel.startswith(prefix):
                    (tmp / rel[len(prefix):]).mkdir(parents=True, exist_ok=True)
            for rel in sorted(r for r in files if r.startswith(prefix)):
                dest = tmp / rel[len(prefix):]
                dest.parent.mkdir(parents=True, exist_ok=True)
                volume.download(f"{base}/{rel}", dest)
                moved["files"] += 1
                moved["bytes"] += files[rel]
        pulled.append(step)

    cfg = None
    if (staging / CONFIG).is_file():
        try:
            remote = read_config(staging / CONFIG)
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
    return {
        "run_dir": str(run),
        "remote": f"{volume.name}:/{base}",
        "remote_checkpoints": have,
        "pulled_checkpoints": pulled,
        "checkpoints": checkpoint_steps(run),
        "files": moved["files"],
        "bytes": moved["bytes"],
        "summary": (run / SUMMARY).is_file(),
        "run_dir_ready": cfg is not None,
    }


# with what was derived here from the pulled checkpoints (the light engine's cache)
PULLED = (CONFIG, MAXTEXT_YML, LOG, METRICS, LOSS_PLOT, SUMMARY, STOPPED, INPUT_WAIT, HINTS, MAXTEXT_RUN_NAME,
          LIGHT_CACHE)


def clear_pulled(run: Path) -> list[str]:
    """`--fresh`: what earlier pulls brought into `run` goes with the remote run it came from
    (a later pull would otherwise mix the old run's checkpoints with the new one's)."""
    import shutil

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
