"""A model's weights as named arrays, and a MaxText model built from an export (docs/export.md).

Names are the weight's path in the nnx state joined by dots: the model MaxText builds fixes
them, so the same config always gives the same names in the same order. Weights are every
nnx Variable MaxText restores from a checkpoint: everything but the RNG state, caches,
intermediates and batch statistics (which a fresh model rebuilds, as a checkpoint load does).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np

from pingctl.artifacts import export as EX
from pingctl.artifacts.run import MAXTEXT_YML
from pingctl.errors import PingctlError
from pingctl.infer.engines.maxtext.config import inference_config


def _weights(state) -> list[tuple[str, object]]:
    """(name, nnx Variable) of every weight in `state`, by name."""
    from flax import nnx

    transient = (nnx.RngState, nnx.Cache, nnx.Intermediate, nnx.BatchStat)
    out = []
    for path, var in nnx.to_flat_state(state):
        if isinstance(var, nnx.Variable) and not isinstance(var, transient):
            parts = [str(getattr(p, "key", p)) for p in path]
            if any("." in p for p in parts):  # the dot joins the path: one inside a part would be ambiguous
                raise PingctlError(f"weight path {parts} has a '.' in a part; it cannot be named uniquely")
            out.append((".".join(parts), var))
    return sorted(out, key=lambda kv: kv[0])


def named_arrays(state) -> dict[str, np.ndarray]:
    """name -> NumPy array (dtype as in the state: bfloat16 stays bfloat16)."""
    return {name: np.asarray(var.get_value()) for name, var in _weights(state)}


def assign(state, tensors: dict, source: Path):
    """Put `tensors` into the weights of a freshly built model's `state`, each checked first:
    the same names, shapes and dtypes, or an error naming the first that differs."""
    import jax

    weights = _weights(state)
    have = {name for name, _ in weights}
    where = f"{source}: tensor"
    for name, var in weights:
        if name not in tensors:
            raise PingctlError(f"{where} {name} is missing: the model config.json describes has {len(weights)} "
                               f"weights, this file {len(tensors)} tensors; export the run again")
        want, got = var.get_value(), tensors[name]
        if tuple(got.shape) != tuple(want.shape):
            raise PingctlError(f"{where} {name} has shape {list(got.shape)}, the model config.json describes "
                               f"{list(want.shape)}; export the run again")
        if np.dtype(got.dtype) != np.dtype(want.dtype):
            raise PingctlError(f"{where} {name} is {np.dtype(got.dtype).name}, the model config.json describes "
                               f"{np.dtype(want.dtype).name}; export the run again")
    extra = sorted(set(tensors) - have)
    if extra:
        raise PingctlError(f"{where} {extra[0]} is not a weight of the model config.json describes "
                           f"({len(extra)} such); export the run again")
    for name, var in weights:
        var.set_value(jax.device_put(tensors[name], var.get_value().sharding))
    return state


def build_exported(export: Path, hardware: str):
    """(mt config, mesh, graphdef, state): the model config.json describes, with the export's
    weights. MaxText needs a maxtext.yml and an output directory, so both are scratch files
    for as long as the model is being built."""
    from flax import nnx
    from maxtext.utils import model_creation_utils

    config = EX.read_config(export)
    tensors = EX.read_tensors(export)
    scratch = Path(tempfile.mkdtemp(prefix="pingctl-export-"))
    try:
        (scratch / MAXTEXT_YML).write_text(EX.maxtext_yaml(config, scratch))
        mt = inference_config(scratch, None, hardware, batch=1)
        # no load_parameters_path: the weights are freshly initialised, then replaced below
        model, mesh = model_creation_utils.from_pretrained(mt)
        graphdef, state = nnx.split(model)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return mt, mesh, graphdef, assign(state, tensors, EX.weights_path(export))
