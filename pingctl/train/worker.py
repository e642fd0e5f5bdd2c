"""The training process: MaxText's own train loop with pingctl's Grain loader plugged in.

Run as `python -m pingctl.train.worker RUN_DIR` (the `train` command does this, as do the
SLURM and Modal targets). It reads RUN_DIR/config.yaml (pingctl) and RUN_DIR/maxtext.yml
(rendered MaxText config) and never modifies MaxText: MaxText looks its grain iterator
factories up as module globals at call time, so assigning ours before `main` is enough.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import sys
import time
from pathlib import Path

from pingctl.artifacts.run import CONFIG, MAXTEXT_YML, clear_input_wait, write_input_wait, write_stopped
from pingctl.config import load_config
from pingctl.errors import PingctlError
from pingctl.loader.pipeline import make_dataset
from pingctl.train.metrics import WARMUP_STEPS
from pingctl.train.render import attention_kernel
from pingctl.processes import die_with_parent
from pingctl.train.xla import jax_env


COORDINATOR_PORTS = (61440, 4096)  # JAX's own choice under SLURM: 61440 + job id % 4096


def _first_host(nodelist: str) -> str:
    """The first host of a SLURM hostlist ("gpu[003-004,010],login1" -> "gpu003"; also with
    several bracket groups, "r[1-2]n[07-08]" -> "r1n07"), as `scontrol show hostnames | head -1`
    gives it, without needing scontrol on the compute node."""
    depth, end = 0, len(nodelist)
    for i, ch in enumerate(nodelist):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            end = i
            break
    return re.sub(r"\[([^\],-]+)[^\]]*\]", r"\1", nodelist[:end])


def slurm_distributed(environ=os.environ) -> dict | None:
    """`jax.distributed.initialize`'s arguments for a task of a multi-task SLURM job step (what
    `srun` starts: one worker per node), or None for a single process (the batch script itself,
    where the SLURM_STEP_* variables are unset, or a one-task step).

    The first node of the step coordinates, on a port derived from the job id (JAX's own rule,
    so two jobs whose first node is the same machine do not collide); every task's GPUs are its
    own: all the node's GPUs that SLURM made visible to it."""
    nodelist = environ.get("SLURM_STEP_NODELIST")
    tasks = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS")
    if not nodelist or not tasks or int(tasks) <= 1 or "SLURM_PROCID" not in environ:
        return None
    base, span = COORDINATOR_PORTS
    port = base + int(environ.get("SLURM_JOB_ID", "0")) % span
    # "deactivate": JAX's own SLURM detection would also pin each process to the one GPU of its
    # SLURM_LOCALID (one process per GPU); here one process per node drives all the node's GPUs
    return {"coordinator_address": f"{_first_host(nodelist)}:{port}", "num_processes": int(tasks),
            "process_id": int(environ["SLURM_PROCID"]), "cluster_detection_method": "deactivate"}


# What `pingctl train --processes N` (pingctl.train.local) gives each of its N workers: the one
# process that coordinates (host:port), how many processes, and which one this is.
COORDINATOR_ENV, PROCESSES_ENV, PROCESS_ID_ENV = "PINGCTL_COORDINATOR", "PINGCTL_PROCESSES", "PINGCTL_PROCESS_ID"


def distributed(environ=os.environ) -> dict | None:
    """`jax.distributed.initialize`'s arguments for this worker: from the local launcher's
    variables (`--processes N`), else from srun's (`slurm_distributed`); None for one process."""
    count = int(environ.get(PROCESSES_ENV) or 1)
    if count <= 1:
        return slurm_distributed(environ)
    return {"coordinator_address": environ[COORDINATOR_ENV], "num_processes": count,
            "process_id": int(environ[PROCESS_ID_ENV]), "cluster_detection_method": "deactivate"}


def _job_devices() -> tuple[int, str]:
    """(devices of the whole job, their platform), joining the JAX distributed system first.

    The batch size MaxText takes is per device, and counting the devices initialises JAX's
    backends, after which `jax.distributed.initialize` refuses to run: so each process of a
    multi-process run (a task of a multi-node SLURM job, or one of `--processes N`) joins here,
    before anything counts, and MaxText finds the system initialised and goes on.
    """
    import jax

    args = distributed()
    if args and not jax.distributed.is_initialized():
        print(f"pingctl: joining JAX's distributed runtime as process {args['process_id']} of "
              f"{args['num_processes']} (coordinator {args['coordinator_address']})", flush=True)
        jax.distributed.initialize(**args, initialization_timeout=300)  # MaxText's default timeout
    return jax.device_count(), jax.devices()[0].platform


STARTED_ENV = "PINGCTL_TRAIN_STARTED"  # when the invocation began (epoch seconds): train.max_minutes counts from it


def _agreed(flag: bool) -> bool:
    """Process 0's `flag`, on every process: a decision that ends MaxText's loop must be the same on
    all hosts, or the others would wait forever in the next step's collectives."""
    import jax

    if jax.process_count() == 1:
        return flag
    import numpy as np
    from jax.experimental import multihost_utils

    return bool(multihost_utils.broadcast_one_to_all(np.array(flag)))


class TimeBound:
    """train.max_minutes: the first train step that ends past the deadline is saved, waited for, and
    the last one the run trains (`stop_step`); RUN/stopped.json says how far past the deadline that was.

    MaxText 0.2.5 saves only on its period or at the last step, and ends its loop without saving when
    the data iterator does; so the save wraps MaxText's own per-step `maybe_save_checkpoint`
    (`save_at_deadline`) and the iterator (`_time_bounded`) ends the loop at the step after."""

    def __init__(self, run: Path, minutes: float, started: float):
        self.run, self.minutes = run, minutes
        self.deadline = started + 60.0 * minutes
        self.stop_step: int | None = None

    def passed(self) -> bool:
        return _agreed(time.time() > self.deadline)

    def stop(self, step: int, checkpoint: int | None) -> None:
        import jax

        self.stop_step = step
        if jax.process_index() == 0:
            write_stopped(self.run, self.minutes, step, checkpoint, time.time() - self.deadline)

    def save_at_deadline(self, checkpointing) -> None:
        """Wrap MaxText's `checkpointing.maybe_save_checkpoint`, which its train loop looks up at every
        step, so that the first step past the deadline also gets a checkpoint of its own."""
        save = checkpointing.maybe_save_checkpoint

        def maybe_save_checkpoint(checkpoint_manager, state, config, data_iterator, step=None):
            save(checkpoint_manager, state, config, data_iterator, step)
            # the last step is saved by MaxText itself, and a run that reaches it is not stopped early
            if step is None or self.stop_step is not None or int(step) + 1 >= config.steps or not self.passed():
                return
            if checkpoint_manager is None:  # checkpointing off: nothing to save, stop all the same
                self.stop(int(step), None)
                return
            checkpointing.wait_until_finished(checkpoint_manager)  # this step's periodic save, if it was one
            # no step: MaxText's end-of-training save of the state's step (this one), forced off the
            # period and waited for; it skips a step already saved
            save(checkpoint_manager, state, config, data_iterator)
            checkpointing.wait_until_finished(checkpoint_manager)
            # MaxText skips step 0 unless save_checkpoint_on_start: then the next step stops
            if _agreed(int(step) in checkpointing.all_steps(checkpoint_manager)):
                self.stop(int(step), int(step))

        checkpointing.maybe_save_checkpoint = maybe_save_checkpoint


def _time_bounded(base: type, bound: TimeBound) -> type:
    """A MaxText data iterator that ends training once `bound` has saved its last step: MaxText
    answers the StopIteration by leaving its loop (after flushing that step's metrics)."""

    class TimeBounded(base):
        def __next__(self):
            if bound.stop_step is not None:
                raise StopIteration(f"pingctl: train.max_minutes={bound.minutes:g} reached; step {bound.stop_step} "
                                    "was the last")
            return super().__next__()

    return TimeBounded


WAIT_WRITE_EVERY = 50  # train steps between rewrites of INPUT_WAIT (also after the first few, and at the end)


class InputWaits:
    """How long each train step waited for its batch (`_timed`), kept in RUN/INPUT_WAIT: rewritten
    every WAIT_WRITE_EVERY steps and when MaxText's loop returns, so a killed run keeps most."""

    def __init__(self, run: Path, warmup: int = WARMUP_STEPS):
        self.run, self.warmup = run, warmup
        self.waits: list[float] = []
        clear_input_wait(run)  # an earlier invocation's

    def add(self, seconds: float) -> None:
        self.waits.append(seconds)
        if len(self.waits) % WAIT_WRITE_EVERY == 0 or len(self.waits) == self.warmup + 3:
            self.write()

    def write(self) -> None:
        if self.waits:
            write_input_wait(self.run, self.waits, self.warmup)


def _timed(base: type, waits: InputWaits) -> type:
    """A MaxText data iterator that records how long each train step waited for its batch.

    MaxText's step time includes fetching the batch and handing it to the devices (the wait
    counts both). With workers the wait is the pipeline falling behind (the batch was not
    ready); without them it is the host making the batch, which overlaps the device's step
    while dispatch is asynchronous. Either way, a wait near the whole step means the input
    side, not the device, sets the pace."""

    class Timed(base):
        def __next__(self):
            t0 = time.perf_counter()
            try:
                return super().__next__()
            finally:
                waits.add(time.perf_counter() - t0)

    return Timed


def _then(main, after):
    """`main(argv)`, then `after()` however it ends (absl's `app.run` exits the process after)."""

    def run(argv):
        try:
            return main(argv)
        finally:
            after()

    return run


TRACE_ROWS_ENV = "PINGCTL_TRACE_ROWS"  # a directory: each process appends the row ids of its train batches there


def _traced_rows(directory: str, process: int):
    """A map over train batches that appends each batch's row ids, one line a batch, to
    DIRECTORY/rows-PROCESS.txt: which rows each process read. Off unless $PINGCTL_TRACE_ROWS names
    a directory (it checks the sharding; the file grows by a line a step)."""
    path = Path(directory) / f"rows-{process}.txt"

    def trace(batch: dict) -> dict:
        ids = batch.pop("row_ids")
        with open(path, "a") as f:
            f.write(" ".join(map(str, ids.tolist())) + "\n")
        return batch

    return trace


def _iterator(rows_dir: str, loader_cfg, scheme: str, train: bool, bound, waits: InputWaits | None, config, mesh,
              process_indices):
    import jax
    from maxtext.input_pipeline.multihost_dataloading import MultiHostDataLoadIterator

    shard_count = len(process_indices)
    shard_index = process_indices.index(jax.process_index())
    total = config.global_batch_size_to_load if train else config.global_batch_size_to_load_eval
    cfg = loader_cfg.model_copy(update={"seq_len": int(config.max_target_length)})
    trace = os.environ.get(TRACE_ROWS_ENV) if train else None
    ds = make_dataset(
        rows_dir, cfg, scheme, train=train, shard_index=shard_index, shard_count=shard_count,
        batch_size=int(total) // shard_count, row_ids=bool(trace),
    )
    cls = _time_bounded(MultiHostDataLoadIterator, bound) if train and bound else MultiHostDataLoadIterator
    if waits is not None:
        cls = _timed(cls, waits)
    # MaxText's exit-time cleanup asserts the iterator has a parent: end with a map.
    return cls(ds.map(_traced_rows(trace, jax.process_index()) if trace else lambda batch: batch), mesh)


def _flat_map_state(state: dict, where: str) -> dict:
    """The element position inside a loader state (pipeline.make_dataset's chain): the flat map's
    state, at the start of the current window where a window shuffle holds rows back."""
    state = state.get("parent_window_start_state", state)
    if not (isinstance(state.get("parent"), dict) and "next_index" in state["parent"] and "next_index_in_buffer" in state):
        raise PingctlError(f"{where}: a data position pingctl cannot move to another number of processes (loader "
                           "workers keep their own); resume with as many processes as saved it (moving between "
                           "counts needs loader.workers=0 in both runs)")
    return state


def moved_state(stored: list[dict], fresh: dict, index: int, count: int, rows_per_element: int, where: str = "") -> dict:
    """The loader state of process `index` of `count` that goes on where `stored` (the states of
    every process of the run that saved them, in process order) left off; `fresh`: its state
    before reading anything.

    Process p of n reads elements p, p + n, ... of one shuffled order (pipeline.make_dataset), so
    the position is the first element of that order its process had not read whole; every
    process of this run starts at its first element from there. No row is skipped: rows read
    past that element (by processes further along, or held in a window shuffle) are read again.
    With one row per element and no window shuffle the position is exact."""
    n, firsts = len(stored), []
    for p, state in enumerate(stored):
        flat = _flat_map_state(state, where)
        whole = flat["parent"]["next_index"] + (flat["next_index_in_buffer"] >= rows_per_element)
        firsts.append(p + n * whole)
    start = min(firsts)
    moved = copy.deepcopy(fresh)
    flat = _flat_map_state(moved, where)
    flat["parent"]["next_index"] = -(-(start - index) // count)  # its first element at or past `start`
    flat["next_index_in_buffer"] = 0
    return moved


def _data_position_moves(grain_utility, rows_per_element: int) -> None:
    """Let a checkpoint's data position saved by another number of processes restore here.

    MaxText restores Grain states only with as many processes as saved them (its
    `expansion_factor_real_data` assumes a loader that shards otherwise); `grain_utility.for_restore`,
    which MaxText's checkpointing looks up at each restore, becomes one that moves them
    (`moved_state`) when the counts differ."""
    restore = grain_utility.for_restore

    class Moved(grain_utility.GrainCheckpointable):
        async def load(self, directory):
            import jax

            names = {int(m[1]): f for f in directory.glob("process_*-of-*.json")
                     if (m := re.fullmatch(r"process_(\d+)-of-\d+\.json", f.name))}
            stored = [json.loads(names[p].read_text()) for p in sorted(names)]
            item = self._item
            state = moved_state(stored, item.get_state(), jax.process_index(), jax.process_count(), rows_per_element,
                                str(directory))
            print(f"pingctl: the data position of {len(stored)} process(es) moved to process {jax.process_index()} of "
                  f"{jax.process_count()}", flush=True)

            async def apply():
                item.set_state(state)

            return apply()

    def for_restore(checkpoint_manager, step, data_iterator, expansion_factor_real_data):
        import jax

        saved = len(list((checkpoint_manager.directory / str(step) / "iter").glob("process_*-of-*.json")))
        if saved == jax.process_count() or expansion_factor_real_data > 1 or isinstance(data_iterator, list):
            return restore(checkpoint_manager, step, data_iterator, expansion_factor_real_data)
        return Moved(getattr(data_iterator, "local_iterator", data_iterator))

    grain_utility.for_restore = for_restore


def _die_with_parent() -> None:
    """If `pingctl train` is killed (even kill -9), the worker must not train on alone. Only
    where the local target started it (it names its pid): under SLURM or Modal the parent is
    the job's own shell."""
    parent = os.environ.get("PINGCTL_PARENT_PID")
    if parent:
        die_with_parent(int(parent))


def _tensorboard_written_every_step() -> None:
    """MaxText's TensorBoard events reach the file system at every step, so a killed run keeps them.

    They are the run's metrics (train/metrics.py). tensorboardX hands events to a thread that
    writes them into a buffered file and flushes it every 120 s, and MaxText flushes only every
    `log_period` steps, so a kill -9 lost the steps since (and a flush could miss the events
    still queued). Here events are written as they are added, and the file is flushed after
    each write of metrics: one small append and fsync per step.
    """
    import tensorboardX.writer
    from maxtext.common import metric_logger
    from tensorboardX.event_file_writer import EventFileWriter

    class WriteThrough(EventFileWriter):
        def add_event(self, event):
            ev = getattr(self, "_ev_writer", None)
            if ev is None:  # not the tensorboardX this was written for: keep its own queue
                return super().add_event(event)
            if not getattr(self, "_closed", False):
                ev.write_event(event)

    tensorboardX.writer.EventFileWriter = WriteThrough
    write = metric_logger.MetricLogger.write_metrics_to_tensorboard

    def write_and_flush(self, metrics, step, metric_type):
        write(self, metrics, step, metric_type)
        if getattr(self, "writer", None) is not None:
            self.writer.flush()

    metric_logger.MetricLogger.write_metrics_to_tensorboard = write_and_flush


def main(run_dir: str) -> None:
    _die_with_parent()
    run = Path(run_dir).resolve()
    cfg = load_config(run / CONFIG)
    minutes = cfg.train.max_minutes
    started = float(os.environ.get(STARTED_ENV) or time.time())
    bound = TimeBound(run, minutes, started) if minutes else None
    jax_env(cfg.train.hardware)
    devices, platform = _job_devices()  # before MaxText's imports, in case one touches a backend

    import jax
    from absl import app
    from maxtext.common import checkpointing, grain_utility
    from maxtext.input_pipeline import input_pipeline_interface as ipi
    from maxtext.trainers.pre_train import train

    scheme = cfg.tokenizer.scheme
    waits = InputWaits(run) if jax.process_index() == 0 else None  # one host's waits
    ipi.make_grain_train_iterator = functools.partial(_iterator, cfg.train.train_rows, cfg.loader, scheme, True, bound,
                                                     waits)
    eval_rows = cfg.train.eval_rows or cfg.train.train_rows
    ipi.make_grain_eval_iterator = functools.partial(_iterator, eval_rows, cfg.loader, scheme, False, None, None)
    _tensorboard_written_every_step()
    _data_position_moves(grain_utility, cfg.loader.rows_per_element)
    if bound:
        bound.save_at_deadline(checkpointing)

    if cfg.loader.batch_size % devices:
        sys.exit(f"loader.batch_size={cfg.loader.batch_size} is not divisible by the {devices} devices")
    argv = [
        "pingctl-train",
        str(run / MAXTEXT_YML),
        f"per_device_batch_size={cfg.loader.batch_size / devices}",
    ]
    if cfg.train.attention == "auto":
        kernel = attention_kernel("auto", platform, devices)
        print(f"pingctl: train.attention=auto -> {kernel} ({devices} {platform} device(s))", flush=True)
        argv.append(f"attention={kernel}")
    app.run(_then(train.main, waits.write) if waits else train.main, argv=argv)


if __name__ == "__main__":
    main(sys.argv[1])
