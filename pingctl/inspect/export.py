"""What a `pingctl export` model directory holds: the model, its prompts, its source, its files.

Read from config.json and the safetensors header only (no JAX, no tensor data).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from pingctl.artifacts import export as EX
from pingctl.errors import PingctlError

MAX_HEADER = 100_000_000  # safetensors' own bound on a header


def _header(f: Path) -> dict:
    """The safetensors header: {name: {dtype, shape, data_offsets}}, "__metadata__" aside."""
    try:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > MAX_HEADER:
                raise ValueError(f"a header of {n:,} bytes")
            header = json.loads(fh.read(n))
    except (OSError, struct.error, ValueError) as e:
        raise PingctlError(f"{f}: not a readable safetensors file ({e}); export the run again") from None
    if not isinstance(header, dict):
        raise PingctlError(f"{f}: not a readable safetensors file (its header is not an object)")
    header.pop("__metadata__", None)
    return header


def describe_export(export: Path) -> dict:
    export = Path(export)
    config = EX.read_config(export)
    header = _header(EX.weights_path(export))
    a, src = config["architecture"], config["source"]
    dtypes: dict[str, int] = {}
    elements = 0
    for t in header.values():
        dtypes[t["dtype"]] = dtypes.get(t["dtype"], 0) + 1
        size = 1
        for d in t["shape"]:
            size *= d
        elements += size
    files = EX.files(export)
    return {
        "kind": "export",
        "path": str(export),
        "format_version": config["format_version"],
        "pingctl_version": config["pingctl_version"],
        "created": config.get("created"),
        "source_run": src["run"],
        "steps": src["steps"],
        "preset": a["preset"],
        "parameters": a["parameters"],
        "overrides": a["overrides"],
        "scheme": config["vocab"]["scheme"],
        "vocab_size": config["vocab"]["size"],
        "seq_len": config["loader"]["seq_len"],
        "max_per_pair": config["loader"]["max_per_pair"],
        "result_last": config["loader"]["result_last"],
        "timestamps": config["loader"]["timestamps"],
        "tensors": len(header),
        "elements": elements,
        "tensor_dtypes": dtypes,
        "calibration": str(export / EX.CALIBRATION) if (export / EX.CALIBRATION).is_file() else None,
        "eval_report": config.get("eval_report"),
        "files": files,
        "bytes": sum(f["bytes"] for f in files),
    }
