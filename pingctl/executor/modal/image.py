"""The image of `train --target modal` (and of the fanned-out steps): pingctl's requirements
for its pip layer, read from the installed distribution's metadata (or pyproject.toml beside a
source tree), with `jax[cuda12]` for `jax[cpu]` when training; the `pingctl` package itself is
added from wherever this interpreter imports it (`Image.add_local_python_source`), templates and
data included."""

from __future__ import annotations

import re
from pathlib import Path

import pingctl
from pingctl.errors import PingctlError

GPU_JAX = "jax[cuda12]"  # replaces the train extra's jax[cpu], at the same version
XPROF = "xprof==2.24.2"  # installed without its dependencies, as ./run does (MaxText imports it via tokamax)
EXTRA = "train"
FANOUT_EXTRA = "data"  # ingest and build-rows, what a fanned-out step runs, need it beyond the base install
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
    extras = project.get("optional-dependencies", {})
    return [*project["dependencies"], *(f'{r}; extra == "{name}"' for name in (EXTRA, FANOUT_EXTRA)
                                        for r in extras.get(name, []))]


def _is_extra(marker: str, name: str) -> bool:
    return re.sub(r"\s+", "", marker.replace("'", '"')) == f'extra=="{name}"'


def base_requirements() -> list[str]:
    """pingctl's requirements and its `data` extra: what a fanned-out step's tasks need."""
    return [spec for spec, marker in map(_split_requirement, _metadata_requirements())
            if not marker or _is_extra(marker, FANOUT_EXTRA)]


def image_requirements() -> list[str]:
    """What the image's pip layer installs: pingctl's own requirements and its `train` extra,
    with jax's `cpu` extra swapped for `cuda12` (same version pin)."""
    out = []
    for req in _metadata_requirements():
        spec, marker = _split_requirement(req)
        if marker and not _is_extra(marker, EXTRA):
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




def base_image(requirements: list[str]):
    """debian_slim Python 3.12 with `requirements`, then pingctl itself: last, added when a
    container starts (no rebuild when only pingctl's code changed), under /root, which is on
    the function's sys.path. Built offline."""
    import modal

    return (modal.Image.debian_slim(python_version="3.12").pip_install(*requirements)
            .env({"PYTHONUNBUFFERED": "1"}))


def with_source(image):
    return image.add_local_python_source("pingctl", ignore=_SOURCE_IGNORE)
