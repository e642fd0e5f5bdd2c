"""What a submission moves from here to a Modal Volume, decided by pingctl's own code
against the small `Volume` interface (pingctl/executor/modal/volume.py), so it runs offline too.

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

What comes home from the volume, and how: pull.py.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pingctl.artifacts.records import destination_rows, read_manifest
from pingctl.artifacts.run import COMMITTED, CONFIG, HINTS, MAXTEXT_RUN_NAME, checkpoints_dir
from pingctl.atomic import MANIFEST
from pingctl.config import Config
from pingctl.errors import PingctlError, UsageError
from pingctl.executor.modal.volume import Volume
from pingctl.train.local import prepare_run

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
