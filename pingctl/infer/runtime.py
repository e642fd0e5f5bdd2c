"""The process an answer runs in: JAX's environment and the hardware asked for, the same for
every engine (which engine runs: pingctl.infer.engines.registry)."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

from pingctl.errors import PingctlError, UsageError
from pingctl.train.xla import jax_env

HARDWARE = ("cpu", "gpu")


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


def import_jax(cfg, asked_hardware: str | None):
    """JAX, imported once the environment is set (`prepare_env`), with the compilation cache
    training uses: a later process reuses the compiled forward shapes. An explicit `--hardware
    gpu` insists on a GPU."""
    import jax

    if asked_hardware == "gpu":
        require_gpu(jax)
    jax.config.update("jax_compilation_cache_dir", str(Path(cfg.train.jax_cache_dir).expanduser()))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return jax
