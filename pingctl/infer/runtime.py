"""The process an answer runs in: the engine, JAX's environment, the hardware asked for, and
the MaxText config every MaxText-engine path (plain forward passes, the key-value-cache engine)
builds."""

from __future__ import annotations

import importlib.util
import logging
import os
import warnings
from pathlib import Path

from pingctl.artifacts.run import MAXTEXT_YML
from pingctl.errors import EXTRA_OF, PingctlError, UsageError, install_line
from pingctl.train.xla import jax_env

HARDWARE = ("cpu", "gpu")
# the package each engine needs beyond the base install (its extra: errors.EXTRA_OF)
_ENGINE_NEEDS = {"light": "jax", "maxtext": "maxtext"}


def default_engine() -> str:
    """The engine an answer runs on when none is asked for: the JAX engine (`light`: compiled,
    fused passes) where JAX is installed, else the NumPy one, which the base install has."""
    return "light" if importlib.util.find_spec("jax") is not None else "numpy"


def require_engine(engine: str, what: str = "--engine") -> None:
    """An engine asked for by name whose package this install lacks: one line naming the extra,
    before anything slow (an ImportError deep in a load would be a traceback)."""
    need = _ENGINE_NEEDS.get(engine)
    if need is not None and importlib.util.find_spec(need) is None:
        raise PingctlError(f"{what} {engine}: {need} is not installed; {install_line(EXTRA_OF[need])}, "
                           "or leave the engine out to answer with NumPy")


def check_hardware(hardware: str | None) -> str | None:
    """`--hardware` as typed (None: as the run was trained), checked before anything slow."""
    if hardware is not None and hardware not in HARDWARE:
        raise UsageError(f"--hardware {hardware!r}: expected one of {', '.join(HARDWARE)}")
    return hardware


def prepare_env(hardware: str, forced: bool = False) -> None:
    """JAX's environment for answering (before JAX is imported), quiet: MaxText logs its whole
    config at INFO, and a query's output should be the answer."""
    jax_env(hardware, forced)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:  # absl comes with MaxText and Orbax; the light engine's install may not have it
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:
        pass
    logging.getLogger().setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=DeprecationWarning)


def require_gpu(jax) -> None:
    """`--hardware gpu` on a machine without one: JAX would quietly run on the CPU instead,
    tens of times slower than the user planned for."""
    try:
        platforms = sorted({d.platform for d in jax.devices()})
    except RuntimeError as e:  # e.g. JAX_PLATFORMS=cuda without a working CUDA plugin
        raise PingctlError(f"--hardware gpu: JAX cannot start a GPU backend here ({str(e).splitlines()[0][:200]})") from None
    if "gpu" not in platforms:
        raise PingctlError(f"--hardware gpu: JAX finds no GPU on this machine (devices: {', '.join(platforms)}); "
                           "install a CUDA-enabled jax, or ask on the CPU with --hardware cpu")


def inference_config(run: Path, items: Path | None, hardware: str, batch: int, *extra: str):
    """The MaxText config every inference path builds from a run's `maxtext.yml` (plain forward
    passes and the key-value-cache engine), plus `extra` key=value overrides. `items` None: no
    checkpoint to restore (an export's weights are assigned after the model is built)."""
    from maxtext.configs import pyconfig

    return pyconfig.initialize([
        "", str(run / MAXTEXT_YML), *([f"load_parameters_path={items}"] if items else []), f"hardware={hardware}",
        "skip_jax_distributed_system=true", "enable_checkpointing=false", f"per_device_batch_size={batch}",
        # the kernel does not change the weights: a run trained with flash on a GPU is asked on
        # a CPU too, where MaxText's flash means TPU kernels
        "enable_tensorboard=false", "attention=dot_product", *extra,
    ])
