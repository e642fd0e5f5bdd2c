"""The training process: MaxText's own train loop with pingctl's Grain loader plugged in.

Run as `python -m pingctl.train.worker RUN_DIR` (the `train` command does this, as do the
SLURM and Modal targets). It reads RUN_DIR/config.yaml (pingctl) and RUN_DIR/maxtext.yml
(rendered MaxText config) and never modifies MaxText: MaxText looks its grain iterator
factories up as module globals at call time, so assigning ours before `main` is enough.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path


def _env_before_jax(hardware: str) -> None:
    # MaxText points XLA_FLAGS at a dump directory unless it is already non-empty.
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_enable_fast_math=false" if hardware == "cpu" else " ")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if hardware == "cpu":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _iterator(rows_dir: str, loader_cfg, scheme: str, train: bool, config, mesh, process_indices):
    import jax
    from maxtext.input_pipeline.multihost_dataloading import MultiHostDataLoadIterator

    from pingctl.loader.pipeline import make_dataset

    shard_count = len(process_indices)
    shard_index = process_indices.index(jax.process_index())
    total = config.global_batch_size_to_load if train else config.global_batch_size_to_load_eval
    cfg = loader_cfg.model_copy(update={"seq_len": int(config.max_target_length)})
    ds = make_dataset(
        rows_dir, cfg, scheme, train=train, shard_index=shard_index, shard_count=shard_count,
        batch_size=int(total) // shard_count,
    )
    # MaxText's exit-time cleanup asserts the iterator has a parent: end with a trivial map.
    return MultiHostDataLoadIterator(ds.map(lambda batch: batch), mesh)


def _die_with_parent() -> None:
    """If `pingctl train` is killed (even kill -9), the worker must not train on alone."""
    parent = os.environ.get("PINGCTL_PARENT_PID")
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != int(parent):  # the parent died before prctl took effect
        os._exit(1)


def main(run_dir: str) -> None:
    from pingctl.config import load_config

    _die_with_parent()
    run = Path(run_dir).resolve()
    cfg = load_config(run / "config.yaml")
    _env_before_jax(cfg.train.hardware)

    import jax
    from absl import app
    from maxtext.input_pipeline import input_pipeline_interface as ipi
    from maxtext.trainers.pre_train import train

    scheme = cfg.tokenizer.scheme
    ipi.make_grain_train_iterator = functools.partial(_iterator, cfg.train.train_rows, cfg.loader, scheme, True)
    eval_rows = cfg.train.eval_rows or cfg.train.train_rows
    ipi.make_grain_eval_iterator = functools.partial(_iterator, eval_rows, cfg.loader, scheme, False)

    devices = jax.device_count()
    if cfg.loader.batch_size % devices:
        sys.exit(f"loader.batch_size={cfg.loader.batch_size} is not divisible by the {devices} devices")
    argv = [
        "pingctl-train",
        str(run / "maxtext.yml"),
        f"per_device_batch_size={cfg.loader.batch_size / devices}",
    ]
    app.run(train.main, argv=argv)


if __name__ == "__main__":
    main(sys.argv[1])
