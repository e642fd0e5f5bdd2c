"""Atomic outputs: build in a hidden sibling temp path, rename into place when complete.

An interrupted run therefore leaves only a `.NAME.tmp-*` sibling, never something that
looks like a finished output.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

from pingctl.errors import PingctlError, UsageError

MANIFEST = "manifest.json"


def _host() -> str:
    import socket

    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def _owner() -> str:
    """`HOST-PID`, written into temp names so a later run on the same host can tell a sibling
    whose process is gone (SIGKILL, the OOM killer, a power cut) from one still being built."""
    return f"{_host()}-{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: another user's live process
        return True
    return True


def sweep_stale(path: Path) -> list[Path]:
    """Remove `path`'s temp/old siblings left by killed runs of this host; returns them.

    Only names carrying this host and a PID that is not running are touched: on a cluster file
    system another node's run, or a live run here, may own the others (and names without an
    owner come from pingctl versions before it wrote one)."""
    import logging

    path = Path(path)
    # an `old` sibling is the previous output while the new one is renamed into place: killed
    # between the two renames, it is the only complete copy, so it goes only once `path` exists
    kinds = ("tmp", "old") if path.exists() else ("tmp",)
    heads = tuple(f".{path.name}.{kind}-{_host()}-" for kind in kinds)
    try:
        entries = [e for e in path.parent.iterdir() if e.name.startswith(heads)]
    except OSError:
        return []
    removed = []
    for e in entries:
        head = next(h for h in heads if e.name.startswith(h))
        pid = e.name[len(head):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        if e.is_dir() and not e.is_symlink():
            shutil.rmtree(e, ignore_errors=True)
        else:
            e.unlink(missing_ok=True)
        if not e.exists():
            removed.append(e)
            logging.getLogger("pingctl").warning("removed %s: left by a killed run (process %s on this host is gone)",
                                                 e, pid)
    return removed


def _tmp_sibling(path: Path, is_dir: bool) -> Path:
    _check_parent(path)
    sweep_stale(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        maker = tempfile.mkdtemp if is_dir else tempfile.mkstemp
        made = maker(prefix=f".{path.name}.tmp-{_owner()}-", dir=path.parent)
    except OSError as e:
        raise PingctlError(f"cannot write {path}: {e.strerror or e}") from None
    if isinstance(made, tuple):
        os.close(made[0])
        made = made[1]
    # mkdtemp/mkstemp create 0700/0600; outputs should get the usual umask permissions.
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(made, (0o777 if is_dir else 0o666) & ~mask)
    return Path(made)


def unwritable_reason(out: Path) -> str | None:
    """Why `out` could not be created, judged by its nearest existing ancestor (None: it can)."""
    anc = Path(out).absolute().parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        return f"{anc} is a file, not a directory"
    if not os.access(anc, os.W_OK | os.X_OK):
        return f"{anc} is not writable"
    return None


def _check_parent(out: Path) -> None:
    if reason := unwritable_reason(out):
        raise PingctlError(f"cannot write {out}: {reason}")


def _check_special(out: Path) -> None:
    # Replacing means rename-over: never do that to a device, FIFO or socket (e.g. -o /dev/null
    # --force as root would remove the device node), forced or not.
    if out.exists() and not (out.is_dir() or out.is_file()):
        raise PingctlError(f"{out} is not a regular file or directory (a device, FIFO or socket); "
                           "pingctl only writes into directories and regular files")


def is_pingctl_output(d: Path) -> bool:
    """Whether directory `d` is something pingctl wrote: what an output command may replace,
    and what a directory walk for inputs must not read. Judged by the MANIFEST's content (every
    output's records the pingctl version), not its name: a download tool's manifest.json
    beside user data must keep that data read and safe from replacement."""
    try:
        manifest = json.loads((Path(d) / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and "pingctl_version" in manifest


def inside_pingctl_output(path: Path) -> bool:
    """Whether `path` lies in a directory pingctl wrote (a split of a shard output, a part of
    an ingest or synth output): its rows were checked when they were written."""
    return any(is_pingctl_output(a) for a in Path(path).resolve().parents)


def check_replaceable(out: Path, force: bool = False, inputs: Iterable[Path] = ()) -> None:
    """Refuse to overwrite a directory that pingctl did not write, unless forced, and one that
    holds any of `inputs` even then: replacing it would delete the command's own input."""
    out = Path(out)
    if out.name in ("", ".."):  # '.', '', '..', '/': no sibling to build in, nothing to rename
        raise UsageError(f"-o {str(out)!r} is not a valid output: give the name of a directory to create "
                         "or replace, e.g. -o runs/out")
    _check_special(out)
    _check_parent(out)
    where = out.resolve()
    if any(where in Path(f).resolve().parents for f in inputs):
        raise UsageError(f"output {out} contains the input files; choose another output directory")
    if not out.exists() or force:
        return
    if out.is_file():
        raise UsageError(f"{out} exists and is a file; pass a directory or use --force")
    if any(out.iterdir()) and not is_pingctl_output(out):
        raise UsageError(
            f"{out} is a non-empty directory that pingctl did not write (no {MANIFEST}); "
            "choose another output or pass --force"
        )


@contextlib.contextmanager
def atomic_dir(out: Path) -> Iterator[Path]:
    """Yield a temp directory; on success it replaces `out` (old contents removed)."""
    out = Path(out)
    _check_special(out)
    tmp = _tmp_sibling(out, is_dir=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{_owner()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_file(out: Path) -> Iterator[Path]:
    """Yield a temp file path next to `out`; renamed onto `out` on success."""
    out = Path(out)
    _check_special(out)
    if out.is_dir():
        raise PingctlError(f"{out} is a directory; give a file name")
    tmp = _tmp_sibling(out, is_dir=False)
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, out)


def json_default(v: Any) -> Any:
    """Times as ISO 8601 with a Z (as ingest writes them), not Python's `str` of a datetime."""
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None and v.utcoffset() == dt.timedelta(0):
            return v.replace(tzinfo=None).isoformat() + "Z"
        return v.isoformat()
    if getattr(v, "ndim", None) == 0 and callable(getattr(v, "item", None)):  # NumPy scalars
        return v.item()
    return str(v)


def write_json(path: Path, obj) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=json_default) + "\n")
