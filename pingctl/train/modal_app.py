"""`pingctl train --target modal`: the same worker, run in a Modal GPU container.

Layout on the Modal Volume (mounted at /data):
    /data/rows/<run>/train, /data/rows/<run>/eval   the rows, uploaded once per run
    /data/runs/<run>/                              run dir: config, MaxText yml, checkpoints, TensorBoard
The run's config is rewritten for those paths (and hardware=gpu) and rendered locally, so
`--dry-run` shows exactly what the container will run. Secrets (Modal token, W&B key) stay
in the environment / Modal secrets and are never written into the run directory.

The image needs no source tree: its pip layer installs pingctl's requirements (the base ones
and the `train` extra, read from the installed distribution's metadata, with `jax[cuda12]`
for `jax[cpu]`), and the `pingctl` package itself is added from wherever this interpreter
imports it (a source checkout or site-packages of an installed wheel), templates and data
included, with `Image.add_local_python_source`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pingctl import __version__
import pingctl
from pingctl.atomic import atomic_file
from pingctl.config import Config
from pingctl.errors import PingctlError
from pingctl.train.local import check_inputs
from pingctl.train.render import render_maxtext

MOUNT = "/data"
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


def remote_config(cfg: Config, name: str) -> Config:
    t = cfg.train
    update = {
        "train_rows": f"{MOUNT}/rows/{name}/train",
        "eval_rows": f"{MOUNT}/rows/{name}/eval" if t.eval_rows else None,
        "run_dir": f"{MOUNT}/runs/{name}",
        "hardware": "gpu",
        "target": "modal",
        "jax_cache_dir": f"{MOUNT}/jax_cache",
    }
    return cfg.model_copy(update={"train": t.model_copy(update=update)})


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
    def train_remote(run_dir: str) -> str:
        import os
        import subprocess
        import sys
        from pathlib import Path

        # the worker runs in the run dir: give it the directory pingctl was added under
        root = str(Path(pingctl.__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        rc = subprocess.call([sys.executable, "-m", "pingctl.train.worker", run_dir], cwd=run_dir, env=env)
        volume.commit()
        if rc:
            raise RuntimeError(f"training exited with {rc}; see the Modal logs")
        return run_dir

    return app, train_remote, volume, image


def describe(cfg: Config, name: str) -> dict:
    m = cfg.train.modal
    rc = remote_config(cfg, name)
    return {
        "app": m.app_name,
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


def launch(cfg: Config, run: Path, fresh: bool = False, dry_run: bool = False) -> dict:
    import yaml

    check_inputs(cfg)
    if cfg.train.wandb and not cfg.train.modal.wandb_secret:
        raise PingctlError("train.wandb is on but train.modal.wandb_secret is not set: the container would have no WANDB_API_KEY")
    # the resolved name: "." or "runs/x/" must not map to the volume's whole /runs
    name = Path(run).resolve().name
    rc = remote_config(cfg, name)
    staging = Path(run) / "modal"
    staging.mkdir(parents=True, exist_ok=True)
    with atomic_file(staging / "config.yaml") as tmp:
        tmp.write_text(yaml.safe_dump(rc.model_dump(mode="json"), sort_keys=False))
    maxtext = render_maxtext(rc, Path(rc.train.run_dir))
    with atomic_file(staging / "maxtext.yml") as tmp:
        tmp.write_text(maxtext)
    app, fn, volume, _ = build_app(cfg, name)
    info = describe(cfg, name)
    result = {
        "target": "modal",
        "dry_run": dry_run,
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
    if not (os.environ.get("MODAL_TOKEN_ID") or Path("~/.modal.toml").expanduser().exists()):
        raise PingctlError("no Modal credentials: set MODAL_TOKEN_ID/MODAL_TOKEN_SECRET or run `modal token new`")
    with volume.batch_upload(force=fresh) as batch:
        batch.put_directory(str(cfg.train.train_rows), f"/rows/{name}/train")
        if cfg.train.eval_rows:
            batch.put_directory(str(cfg.train.eval_rows), f"/rows/{name}/eval")
        batch.put_file(str(staging / "config.yaml"), f"/runs/{name}/config.yaml")
        batch.put_file(str(staging / "maxtext.yml"), f"/runs/{name}/maxtext.yml")
    with app.run():
        fn.remote(rc.train.run_dir)
    result["summary"]["results"] = f"Modal volume {cfg.train.modal.volume}: /runs/{name}"
    return result
