"""A `pingctl export` model directory (docs/export.md): one trained model, self-contained, that
loads without its run directory.

    config.json        what the model is: the MaxText keys that shape the network, vocabulary,
                       prompt shaping, the pingctl config it was trained with, its source
    model.safetensors  the parameters (no optimizer state), one tensor per nnx weight, as trained
    README.md          the model card
    calibration.json   a `pingctl eval` recalibration map (only when one was exported)

Tensor names are the weight's path in the nnx state joined by dots (`decoder.layers.mlp.wi.kernel`);
with MaxText's scanned layers, a layer weight is one tensor holding every layer (along MaxText's
param_scan_axis, axis 1).

Read from its files only (no JAX), as a run directory is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from pingctl.atomic import atomic_dir
from pingctl.config import Config
from pingctl.errors import PingctlError

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
CARD = "README.md"
CALIBRATION = "calibration.json"
FORMAT = "pingctl.model-export"
# Raised when a reader of an older version could misread a newer directory (a key changes
# meaning or a file is added that a load must not ignore); added keys alone keep it.
FORMAT_VERSION = 1
REQUIRED = ("format", "format_version", "pingctl_version", "source", "architecture", "vocab", "tokenizer", "loader",
            "weights", "pingctl_config")


def is_export_dir(path: Path | str) -> bool:
    """The one rule for "this is an export": a directory holding its config and its weights
    (what they hold is checked when read, so a damaged one is named, not mistaken)."""
    path = Path(path)
    return path.is_dir() and (path / CONFIG).is_file() and (path / WEIGHTS).is_file()


def weights_path(export: Path | str) -> Path:
    return Path(export) / WEIGHTS


def read_config(export: Path | str) -> dict:
    """config.json, checked enough for every reader: the format, its version, every section."""
    f = Path(export) / CONFIG
    try:
        config = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise PingctlError(f"{f}: not readable as JSON ({e})") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        found = config.get("format") if isinstance(config, dict) else None
        raise PingctlError(f"{f}: not a `pingctl export` model (field format is {found!r}, expected {FORMAT!r})")
    version = config.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise PingctlError(f"{f}: format_version {version!r}, written by a newer pingctl "
                           f"({config.get('pingctl_version')}); this one reads up to {FORMAT_VERSION}: upgrade pingctl")
    missing = [k for k in REQUIRED if k not in config]
    if missing:
        raise PingctlError(f"{f}: a damaged export (missing {', '.join(missing)}); export the run again")
    return config


def pingctl_config(export: Path | str) -> Config:
    """The resolved config the exported model was trained with (what `run_config` is for a run)."""
    raw = read_config(export)["pingctl_config"]
    try:
        return Config.model_validate(raw)
    except ValueError as e:  # pydantic's ValidationError
        first = str(e).strip().splitlines()[0][:200]
        raise PingctlError(f"{Path(export) / CONFIG}: field pingctl_config is not a pingctl config ({first})") from None


def source_steps(config: dict) -> list[int]:
    return [int(s) for s in config["source"]["steps"]]


def source_run(path: Path | str) -> Path:
    """The run a model directory's weights come from: an export's source run, a run itself
    (a calibration map fitted on a run also fits its export)."""
    path = Path(path)
    if is_export_dir(path):
        return Path(read_config(path)["source"]["run"])
    return path


def maxtext_yaml(config: dict, output_dir: Path) -> str:
    """The maxtext.yml MaxText builds this model from: its base config, the export's
    network keys, and a scratch `output_dir` (an export has no run directory to write into)."""
    doc = {"base_config": "base.yml", "run_name": "export", "base_output_directory": str(output_dir),
           **config["architecture"]["maxtext"]}
    return ("# MaxText config rendered by pingctl from an export's config.json (architecture.maxtext)\n"
            + yaml.safe_dump(doc, sort_keys=False))


def write(out: Path, config: dict, tensors: dict, card: str, calibration: dict | None = None) -> Path:
    """The whole directory, atomically: a reader never finds config.json without its weights.
    `tensors`: name -> NumPy array, written in name order (a deterministic file)."""
    from safetensors.numpy import save_file

    out = Path(out)
    with atomic_dir(out) as tmp:
        save_file({k: tensors[k] for k in sorted(tensors)}, str(tmp / WEIGHTS),
                  metadata={"format": FORMAT, "format_version": str(FORMAT_VERSION)})
        # safetensors creates its file 0600; the export is shared as the other files are (umask)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp / WEIGHTS, 0o666 & ~mask)
        if calibration is not None:
            (tmp / CALIBRATION).write_text(json.dumps(calibration, indent=2, sort_keys=True) + "\n")
        (tmp / CARD).write_text(card)
        (tmp / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


def read_tensors(export: Path | str) -> dict:
    """name -> NumPy array; a damaged file is an error naming it."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    f = weights_path(export)
    try:
        return load_file(str(f))
    except (SafetensorError, OSError, ValueError, TypeError) as e:
        raise PingctlError(f"{f}: not a readable safetensors file ({str(e).strip()[:200]}); "
                           "export the run again") from None


def files(export: Path | str) -> list[dict]:
    """[{name, bytes}] of the files an export holds."""
    export = Path(export)
    return [{"name": n, "bytes": (export / n).stat().st_size} for n in (CONFIG, WEIGHTS, CARD, CALIBRATION)
            if (export / n).is_file()]
