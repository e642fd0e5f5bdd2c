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
import time
from pathlib import Path


def _env_before_jax(hardware: str) -> None:
    from pingctl.train.xla import set_xla_flags

    set_xla_flags(hardware)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if hardware == "cpu":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _job_devices() -> tuple[int, str]:
    """(devices of the whole job, their platform), joining the JAX distributed system first.

    The sbatch script exports JAX_COORDINATOR_IP/PORT, NNODES and NODE_RANK for MaxText, which
    joins the nodes inside its `main`. But the batch size MaxText takes is per device, and
    counting the devices initialises JAX's backends, after which `jax.distributed.initialize`
    refuses to run, so every multi-node job would fail. Joined here with MaxText's own helper, MaxText
    finds the system initialised and goes on.
    """
    import jax

    if os.environ.get("JAX_COORDINATOR_IP") and not jax.distributed.is_initialized():
        from maxtext.utils.max_utils import initialize_jax_for_gpu

        initialize_jax_for_gpu({"jax_distributed_initialization_timeout": 300})  # MaxText's default
    return jax.device_count(), jax.devices()[0].platform


def _time_bounded(base: type, run: Path, deadline: float, minutes: float) -> type:
    """A MaxText data iterator that ends training at the first checkpoint committed after `deadline`.

    MaxText 0.2.5 saves only on its period or at the last step, and a StopIteration from the data
    iterator ends training without saving; so past the deadline we keep feeding batches until a new
    checkpoint has committed, then stop. Work lost: the steps of one commit latency, never a period.
    """
    from pingctl.atomic import write_json
    from pingctl.train.local import STOPPED_FILE, checkpoint_steps

    class TimeBounded(base):
        _seen: int | None = None

        def _stop_now(self) -> bool:
            import jax

            stop = False
            if jax.process_index() == 0 and time.time() > deadline:
                latest = max(checkpoint_steps(run), default=-1)
                if self._seen is None:
                    self._seen = latest
                elif latest > self._seen:
                    write_json(run / STOPPED_FILE, {"reason": "time limit", "max_minutes": minutes, "checkpoint": latest})
                    stop = True
            if jax.process_count() > 1:  # every host must leave the loop at the same step
                import numpy as np
                from jax.experimental import multihost_utils

                stop = bool(multihost_utils.broadcast_one_to_all(np.array(stop)))
            return stop

        def __next__(self):
            if self._stop_now():
                raise StopIteration(f"pingctl: train.max_minutes={minutes:g} reached, stopping after a committed checkpoint")
            return super().__next__()

    return TimeBounded


def _iterator(rows_dir: str, loader_cfg, scheme: str, train: bool, bound, config, mesh, process_indices):
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
    cls = _time_bounded(MultiHostDataLoadIterator, *bound) if train and bound else MultiHostDataLoadIterator
    # MaxText's exit-time cleanup asserts the iterator has a parent: end with a trivial map.
    return cls(ds.map(lambda batch: batch), mesh)


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
    minutes = cfg.train.max_minutes
    bound = (run, time.time() + 60.0 * minutes, minutes) if minutes else None
    _env_before_jax(cfg.train.hardware)
    devices, platform = _job_devices()  # before MaxText's imports, in case one touches a backend

    from absl import app
    from maxtext.input_pipeline import input_pipeline_interface as ipi
    from maxtext.trainers.pre_train import train

    scheme = cfg.tokenizer.scheme
    ipi.make_grain_train_iterator = functools.partial(_iterator, cfg.train.train_rows, cfg.loader, scheme, True, bound)
    eval_rows = cfg.train.eval_rows or cfg.train.train_rows
    ipi.make_grain_eval_iterator = functools.partial(_iterator, eval_rows, cfg.loader, scheme, False, None)

    if cfg.loader.batch_size % devices:
        sys.exit(f"loader.batch_size={cfg.loader.batch_size} is not divisible by the {devices} devices")
    argv = [
        "pingctl-train",
        str(run / "maxtext.yml"),
        f"per_device_batch_size={cfg.loader.batch_size / devices}",
    ]
    if cfg.train.attention == "auto":
        from pingctl.train.render import attention_kernel

        kernel = attention_kernel("auto", platform, devices)
        print(f"pingctl: train.attention=auto -> {kernel} ({devices} {platform} device(s))", flush=True)
        argv.append(f"attention={kernel}")
    app.run(train.main, argv=argv)


if __name__ == "__main__":
    main(sys.argv[1])
