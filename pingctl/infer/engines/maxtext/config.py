"""The MaxText config every MaxText-engine path builds from a run's `maxtext.yml`: plain forward
passes, the key-value-cache engine, and a model built for an export's weights."""

from __future__ import annotations

from pathlib import Path

from pingctl.artifacts.run import MAXTEXT_YML


def inference_config(run: Path, items: Path | None, hardware: str, batch: int, *extra: str):
    """The MaxText config of `run` for inference, plus `extra` key=value overrides. `items` None:
    no checkpoint to restore (an export's weights are assigned after the model is built)."""
    from maxtext.configs import pyconfig

    return pyconfig.initialize([
        "", str(run / MAXTEXT_YML), *([f"load_parameters_path={items}"] if items else []), f"hardware={hardware}",
        "skip_jax_distributed_system=true", "enable_checkpointing=false", f"per_device_batch_size={batch}",
        # the kernel does not change the weights: a run trained with flash on a GPU is asked on
        # a CPU too, where MaxText's flash means TPU kernels
        "enable_tensorboard=false", "attention=dot_product", *extra,
    ])
