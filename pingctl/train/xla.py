"""JAX/XLA environment for processes that drive MaxText (training workers, inference): set
before JAX is imported."""

from __future__ import annotations

import os

# Each value is a flag XLA's shared option parser knows on every backend, set to its default.
# It must be a real flag: XLA takes a value that does not start with "--" for a flag-file
# name and aborts the process (a blank value did exactly that on GPU).
_NEUTRAL = {"cpu": "--xla_cpu_enable_fast_math=false"}
_NEUTRAL_ACCELERATOR = "--xla_gpu_autotune_level=4"


def set_xla_flags(hardware: str) -> None:
    """Give XLA_FLAGS a harmless value unless the user set one.

    MaxText points XLA_FLAGS at an HLO dump under the system temp directory whenever it is
    empty, which fills the disk over a long run; a non-empty neutral value keeps it off.
    """
    if not os.environ.get("XLA_FLAGS", "").strip():
        os.environ["XLA_FLAGS"] = _NEUTRAL.get(hardware, _NEUTRAL_ACCELERATOR)


def jax_env(hardware: str, forced: bool = False) -> None:
    """XLA_FLAGS, TensorFlow's log level and the platform, for `hardware`. Asked for by name
    (`forced`), the CPU wins over a JAX_PLATFORMS the shell exported."""
    set_xla_flags(hardware)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if hardware == "cpu":
        if forced:
            os.environ["JAX_PLATFORMS"] = "cpu"
        else:
            os.environ.setdefault("JAX_PLATFORMS", "cpu")
