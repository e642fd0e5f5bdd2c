"""The Modal app of `train --target modal`: its training function (GPU, volume, secrets, the
image of image.py), built offline, and its description for `--dry-run`. The function's body
is container.py; submitting, reporting and following a run: run.py; pulling it: pull.py
(docs/train.md, "Modal").

Secrets (the Modal token, a W&B key) stay in the environment and Modal secrets; nothing here
writes or prints them.
"""

from __future__ import annotations

from pingctl import __version__
from pingctl.config import Config
from pingctl.executor.modal.container import run_in_container
from pingctl.executor.modal.image import EXTRA, GPU_JAX, XPROF, base_image, image_requirements, local_source, with_source
from pingctl.executor.modal.sync import MOUNT, remote_config

def build_app(cfg: Config, name: str):
    """The Modal app and its training function, built offline (nothing is contacted)."""
    import modal

    m = cfg.train.modal
    image = with_source(base_image(image_requirements()).pip_install(XPROF, extra_options="--no-deps"))
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
    def train_remote(config: dict) -> dict:
        # pickled by reference: the container imports it from the pingctl added to the image
        return run_in_container(config, volume.commit)

    return app, train_remote, volume, image


def describe(cfg: Config, name: str) -> dict:
    m = cfg.train.modal
    rc = remote_config(cfg, name)
    return {
        "app": m.app_name,
        "name": name,
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


