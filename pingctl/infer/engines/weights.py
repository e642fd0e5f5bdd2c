"""Named weights for the JAX and NumPy engines: an export's safetensors, or a run's Orbax checkpoint
converted once and cached beside it.

A run's checkpoint (`checkpoints/STEP/items`, written by MaxText through Orbax) holds the
parameters under `params/params/...` beside the optimizer state; the parameters alone are read
with Orbax directly (no MaxText: its import is what made an answer take 10-35 s) and written to
`RUN/.light/STEP.safetensors`, named as `pingctl export` names them (the nnx state path joined
by dots, `pingctl.artifacts.export`). Later loads read that file: a few milliseconds. The cache
records the checkpoint it came from (the size and modification time of each of its files), so
a checkpoint rewritten or damaged under the same step is converted again, and a copied run
(its files' times kept) reuses it. A run directory
that cannot be written (read-only storage) is converted in memory at each load instead.

The cache belongs to the run: `pingctl train` never reads it, deleting it costs one conversion.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import numpy as np

from pingctl.artifacts import export as EX
from pingctl.artifacts.run import COMMITTED, LIGHT_CACHE, checkpoint_items, checkpoint_steps
from pingctl.atomic import atomic_file
from pingctl.errors import PingctlError, install_line
from pingctl.infer.engines.arch import Arch, check_weights, maxtext_keys
from pingctl.infer.engines.base import Source

CACHE_DIR = LIGHT_CACHE  # the run directory's layout is pingctl.artifacts.run's
_PREFIX = ("params", "params")  # where MaxText's TrainState keeps the model's parameters


def cache_path(run: Path, step: int) -> Path:
    return Path(run) / CACHE_DIR / f"{step}.safetensors"


def _stamp(items: Path) -> str:
    """What the cache was converted from: every file of the checkpoint, by relative path,
    size and modification time (a copied run keeps them, a rewritten or damaged checkpoint
    does not), and Orbax's commit marker."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted([*items.rglob("*"), items.parent / COMMITTED]):
        try:
            st = f.stat()
        except OSError:
            continue
        if f.is_file():
            h.update(f"{f.relative_to(items.parent)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def export_tensors(export: Path) -> dict[str, np.ndarray]:
    return EX.read_tensors(export)


def run_tensors(run: Path, step: int) -> dict[str, np.ndarray]:
    """The parameters of checkpoint `step` of `run`, by name (converted and cached on first use)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file, save_file

    items = checkpoint_items(run, step)
    stamp = _stamp(items)
    cached = cache_path(run, step)
    if cached.is_file():
        try:
            from safetensors import safe_open

            with safe_open(str(cached), framework="numpy") as f:
                same = (f.metadata() or {}).get("source") == stamp
            if same:
                return _finite(load_file(str(cached)), run, step)
        except (SafetensorError, OSError, ValueError):
            pass  # damaged or foreign: converted again below
    tensors = _finite(convert(items, checkpoint_steps(run)), run, step)
    try:
        cached.parent.mkdir(exist_ok=True)
        with atomic_file(cached) as tmp:
            save_file(tensors, str(tmp), metadata={"source": stamp, "format": "pingctl.light-cache"})
            mask = os.umask(0)  # safetensors creates its file 0600; the cache is shared as the run is
            os.umask(mask)
            os.chmod(tmp, 0o666 & ~mask)
    except (OSError, PingctlError) as e:
        print(f"note: {cached}: cannot cache the converted checkpoint ({e}); converting at each load",
              file=sys.stderr)
    return tensors


def _finite(tensors: dict[str, np.ndarray], run: Path, step: int) -> dict[str, np.ndarray]:
    """A diverged run checkpoints NaN weights, which would answer NaN probabilities as answers."""
    EX.check_finite(tensors, f"{run} (checkpoint {step})",
                    "the run diverged at or before this step; pick an earlier one with --step")
    return tensors


def convert(items: Path, steps: list[int] = ()) -> dict[str, np.ndarray]:
    """The parameters of an Orbax checkpoint's items, read with Orbax alone (partial restore:
    the optimizer state is not read). `steps`: the run's checkpoints, named by an error."""
    try:
        import orbax.checkpoint as ocp
    except ImportError:
        raise PingctlError(
            f"{items.parent}: reading a run's checkpoint the first time needs orbax-checkpoint "
            f"({install_line('train')}); or answer from an export of the run (`pingctl export`)") from None
    import contextlib
    import io
    import logging

    import jax

    # Orbax logs a missing step-metadata file at WARNING for every MaxText checkpoint
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            ckptr = ocp.PyTreeCheckpointer()
            meta = ckptr.metadata(items)
            tree = getattr(meta, "item_metadata", meta)
            tree = getattr(tree, "tree", tree)
            params = tree
            for k in _PREFIX:
                params = params[k]
            args = jax.tree.map(lambda _m: ocp.RestoreArgs(restore_type=np.ndarray), params)
            restored = ckptr.restore(items, args=ocp.args.PyTreeRestore(
                item={_PREFIX[0]: {_PREFIX[1]: params}}, restore_args={_PREFIX[0]: {_PREFIX[1]: args}},
                partial_restore=True))
    except Exception as e:  # noqa: BLE001 - Orbax/TensorStore raise many types for a damaged checkpoint
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise PingctlError(f"{items.parent}: cannot restore this checkpoint ({type(e).__name__}: {first}); it may "
                           f"be damaged; pick another with --step (checkpoints: {', '.join(map(str, steps))})") from None
    finally:
        absl.setLevel(level)
    out: dict[str, np.ndarray] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(restored[_PREFIX[0]][_PREFIX[1]])[0]:
        parts = [str(getattr(p, "key", getattr(p, "idx", p))) for p in path]
        out[".".join(parts)] = np.ascontiguousarray(np.asarray(leaf))
    return dict(sorted(out.items()))


def average(tensor_sets) -> dict[str, np.ndarray]:
    """The running mean of several checkpoints' parameters (float leaves only; the first's
    dtype kept), as the MaxText engine averages them: at most two copies in memory."""
    mean = None
    for k, tensors in enumerate(tensor_sets, start=1):
        if mean is None:
            mean = dict(tensors)
            continue
        for name, a in mean.items():
            if np.issubdtype(a.dtype, np.floating) or a.dtype.name == "bfloat16":
                a32 = a.astype(np.float32)
                mean[name] = (a32 + (np.asarray(tensors[name], np.float32) - a32) / np.float32(k)).astype(a.dtype)
    return mean or {}



@contextlib.contextmanager
def quiet_failed_restore():
    """A damaged checkpoint makes Orbax abandon TensorStore reads mid-flight: their callbacks then
    hit a closed event loop and asyncio logs each orphaned task, pages of tracebacks around the
    one error that matters. Silence exactly those; on failure the filter stays, as we exit."""
    import logging

    log = logging.getLogger("asyncio")
    level, hook = log.level, sys.unraisablehook

    def unraisable(u):
        if isinstance(u.exc_value, RuntimeError) and "Event loop is closed" in str(u.exc_value):
            return
        hook(u)

    log.setLevel(logging.CRITICAL)
    sys.unraisablehook = unraisable
    yield
    log.setLevel(level)
    sys.unraisablehook = hook


def named(source: Source) -> tuple[Arch, dict[str, np.ndarray]]:
    """The architecture of `source` (`Unsupported` for one the decoders of pingctl's own do not
    implement, before any weight is read) and its weights by name, checked against it: an
    export's, or the mean of the run's checkpoints `source.steps` (each converted once)."""
    run, steps = source.run, source.steps
    arch = Arch.from_keys(maxtext_keys(run, source.export))
    if source.export:
        where, tensors = EX.weights_path(run), export_tensors(run)
    else:
        where = checkpoint_items(run, steps[0]).parent if len(steps) == 1 else run
        with quiet_failed_restore():
            tensors = average(run_tensors(run, s) for s in steps)
    check_weights(arch, tensors, where)
    return arch, tensors
