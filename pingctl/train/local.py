"""Local training: prepare the run directory, run the worker, follow its log.

Run directory (docs/train.md):
    config.yaml     resolved pingctl config          maxtext.yml   rendered MaxText config
    train.log       raw MaxText/absl log             metrics.jsonl train and eval records (from the events)
    train.N.log     with train.processes > 1, the log of worker process N (N >= 1; train.log is process 0's)
    loss.png        loss curves                      summary.json  the final summary
    stopped.json    only when train.max_minutes stopped this invocation early (step, overrun)
    maxtext/checkpoints/<step>/{items,iter}  Orbax params+optimizer, Grain iterator state
    maxtext/tensorboard/maxtext/events.*     TensorBoard
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from pingctl.artifacts.records import check_files, read_manifest
from pingctl.artifacts.run import (CONFIG, HINTS, LOG, LOSS_PLOT, MAXTEXT_YML, METRICS, STOPPED, SUMMARY, checkpoint_steps,
                                  has_run_traces, read_config_doc, read_input_wait, tensorboard_dir, write_config)
from pingctl.atomic import atomic_file, write_json
from pingctl.config import Config
from pingctl.errors import PingctlError, UsageError
from pingctl.loader.hints import Hints
from pingctl.loader.pipeline import check_triangulation, loss_keep_table
from pingctl.train import metrics as M
from pingctl.train.render import parameters, render_maxtext
from pingctl.train.worker import COORDINATOR_ENV, PROCESS_ID_ENV, PROCESSES_ENV, STARTED_ENV


OnRecord = Callable[[dict], None]
# Architecture keys: a checkpoint can only be resumed by the same model.
_SHAPE_KEYS = ("model", "tokenizer", "loader.seq_len")


# MaxText keys that change how the next steps train, not what a checkpoint holds: a run may
# resume with them changed (e.g. dropout switched on for the stretch past a plateau).
TRAINING_ONLY = frozenset({"enable_dropout", "dropout_rate", "adam_weight_decay", "remat_policy",
                           "gradient_clipping_threshold"})


def _shape(cfg: dict) -> dict:
    model = dict(cfg["model"])
    model["overrides"] = {k: v for k, v in (model.get("overrides") or {}).items() if k not in TRAINING_ONLY}
    return {"model": model, "tokenizer": cfg["tokenizer"], "seq_len": cfg["loader"]["seq_len"]}


def absolute_rows(cfg: Config) -> Config:
    """The worker runs inside the run directory: row paths must not be relative."""
    t = cfg.train
    update = {"train_rows": str(Path(t.train_rows).resolve()) if t.train_rows else ""}
    update["eval_rows"] = str(Path(t.eval_rows).resolve()) if t.eval_rows else None
    cfg = cfg.model_copy(update={"train": t.model_copy(update=update)})
    if cfg.loader.hints_file:
        hints = str(Path(cfg.loader.hints_file).expanduser().resolve())
        cfg = cfg.model_copy(update={"loader": cfg.loader.model_copy(update={"hints_file": hints})})
    return cfg


def check_inputs(cfg: Config) -> tuple[Config, list[Path]]:
    """What every target needs before it starts: readable, non-empty rows and a valid loss mask."""
    if not cfg.train.train_rows:
        raise UsageError("no training rows: pass ROWS (a `pingctl build-rows` output) or set train.train_rows")
    cfg = absolute_rows(cfg)
    rows = [Path(r) for r in filter(None, (cfg.train.train_rows, cfg.train.eval_rows))]
    for r in rows:
        manifest = read_manifest(r)
        if not manifest["record_measurements"]:
            raise PingctlError(f"{r}: no records to train on (the split was empty?)")
        check_files(r, manifest)
        # rows built without destination records would fail inside the worker, 25 s later
        check_triangulation(r, cfg.loader)
    loss_keep_table(cfg.loader.loss_keep, cfg.tokenizer.scheme)
    if cfg.loader.hints_file:  # read now: a bad file fails here, not in the worker's first batch
        Hints.load(cfg.loader.hints_file)
    return cfg, rows


def _check_run_dir(run: Path, rows: list[Path], fresh: bool) -> None:
    """Refuse run directories whose use would destroy or mix data: --fresh deletes the whole tree."""
    if run.exists() and not run.is_dir():
        raise UsageError(f"--run-dir {run} is a file; give a directory")
    for r in rows:
        r = r.resolve()
        if r == run or run in r.parents or r in run.parents:
            raise UsageError(f"--run-dir {run} overlaps the rows {r}; give the run its own directory")
    if fresh and run.is_dir() and any(run.iterdir()) and not has_run_traces(run):
        raise UsageError(
            f"--fresh would delete {run}, which is not a pingctl run directory (no config.yaml, "
            "maxtext.yml or checkpoints); remove it yourself or choose another --run-dir"
        )


def _diff(old, new, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new), key=str) for d in _diff(old.get(k), new.get(k), f"{prefix}{k}.")]
    return [] if old == new else [f"{prefix.rstrip('.')}: {old!r} -> {new!r}"]


def _check_resume(cfg: Config, run: Path, new: dict) -> None:
    steps = checkpoint_steps(run)
    if not steps:
        return
    old_path = run / CONFIG
    try:
        old_shape = _shape(read_config_doc(old_path))
    except (PingctlError, TypeError, KeyError, AttributeError):
        raise PingctlError(
            f"{old_path}: missing or damaged, so the checkpoints in {run} cannot be resumed safely; "
            "use --fresh to start over or choose another --run-dir"
        ) from None
    changed = _diff(old_shape, _shape(new))
    if changed:
        raise PingctlError(
            f"{run} holds checkpoints of a different model ({'; '.join(changed)}); "
            "use --fresh to start over or choose another --run-dir"
        )
    if steps[-1] + 1 >= cfg.train.steps:
        raise PingctlError(
            f"{run} is already trained to step {steps[-1] + 1} (checkpoint {steps[-1]}); "
            f"pass --steps above {steps[-1] + 1} to continue, or --fresh to start over"
        )


def prepare_run(cfg: Config, run_dir: Path, fresh: bool = False, dry_run: bool = False) -> Path:
    """Check everything, then (re)create the run: config.yaml and maxtext.yml.

    Nothing on disk changes until every check has passed, and a dry run never deletes or
    rewrites an existing run (it only fills a new, empty directory with what it would write).
    """
    run = Path(run_dir).resolve()
    cfg, rows = check_inputs(cfg)
    if cfg.train.wandb:
        if not os.environ.get("WANDB_API_KEY"):
            raise PingctlError("train.wandb is on but WANDB_API_KEY is not set in the environment")
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise PingctlError("train.wandb is on but the `wandb` package is not installed (pip install wandb)") from None
    _check_run_dir(run, rows, fresh)
    new = cfg.model_dump(mode="json")
    maxtext = render_maxtext(cfg, run)  # refuses bad overrides before anything is touched
    if not fresh:
        _check_resume(cfg, run, new)
    if dry_run and run.is_dir() and any(run.iterdir()):
        return run
    if fresh and run.exists():
        shutil.rmtree(run)
    run.mkdir(parents=True, exist_ok=True)
    write_config(run / CONFIG, new)
    with atomic_file(run / MAXTEXT_YML) as tmp:
        tmp.write_text(maxtext)
    keep_hints(cfg, run)
    return run


def keep_hints(cfg: Config, run: Path) -> None:
    """The run keeps the hints file it trains with (RUN/hints.npz): its answers read it, and the
    file the config names may change or go."""
    if cfg.loader.hints_file:
        with atomic_file(run / HINTS) as tmp:
            shutil.copyfile(cfg.loader.hints_file, tmp)
    else:
        (run / HINTS).unlink(missing_ok=True)


def worker_env(cfg: Config, started: float | None = None) -> dict:
    """`started`: when this invocation began, from which train.max_minutes counts (the worker's own
    start when None: one left in the environment by some outer invocation is not about this one)."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["PINGCTL_PARENT_PID"] = str(os.getpid())
    env.pop(STARTED_ENV, None)
    if started is not None:
        env[STARTED_ENV] = repr(started)
    if cfg.train.hardware == "cpu":
        env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def run_local(cfg: Config, run_dir: Path, fresh: bool = False, on_record: OnRecord | None = None,
              on_start: Callable[[Path], None] | None = None) -> dict:
    """`on_start(run)` is called once every pre-flight check has passed, before MaxText starts."""
    started = time.time()  # the user's time bound includes the checks and the worker's start-up
    if cfg.loader.batch_size % cfg.train.processes:
        raise UsageError(f"loader.batch_size {cfg.loader.batch_size} is not divisible by train.processes "
                         f"{cfg.train.processes}: each process loads an equal share of every batch")
    run = prepare_run(cfg, run_dir, fresh)
    if on_start:
        on_start(run)
    resumed_from = (checkpoint_steps(run) or [None])[-1]
    log_path = run / LOG
    (run / STOPPED).unlink(missing_ok=True)  # a marker from an earlier invocation is not about this one
    parser = M.LogParser()
    t0 = time.time()
    header = f"\n===== pingctl train {time.strftime('%Y-%m-%dT%H:%M:%S')} (resume from {resumed_from}) =====\n"
    logs = [log_path] + [process_log(run, i) for i in range(1, cfg.train.processes)]
    starts = []
    for path in logs:
        with open(path, "a") as log:
            log.write(header)
            starts.append(log.tell())
    start = starts[0]
    procs = _start_workers(cfg, run, logs, started)
    try:
        _follow(log_path, start, procs, parser, on_record)
    except BaseException:
        _stop(procs)
        # the steps before an interrupt belong to the run's history (from the log only where
        # the TensorBoard events cannot be read, with the lines not yet followed)
        save_metrics(cfg, run, M.parse_log(log_path, start))
        raise
    _stop(procs)  # a process whose sibling failed would wait for it in a collective
    records = save_metrics(cfg, run, parser)
    failed = _failed(procs)
    if failed is not None:
        rc, path, start = procs[failed].returncode, logs[failed], starts[failed]
        with open(path, "rb") as f:
            f.seek(start)
            this_run = f.read().decode(errors="replace")
        if (full := os.strerror(errno.ENOSPC)) in this_run:
            # the worker died of a full disk somewhere in MaxText or Orbax, and the log's last
            # lines may be a long traceback: an environment error naming the run directory
            raise OSError(errno.ENOSPC, f"{full} (the training worker; see {path})", str(run))
        tail = "".join(path.read_text(errors="replace").splitlines(True)[-15:])
        raise PingctlError(f"training failed (exit {rc}); last lines of {path}:\n{tail}")
    return finish(cfg, run, records, resumed_from, time.time() - t0, parser.stop_reason)


def process_log(run: Path, index: int) -> Path:
    """Where worker process `index` (>= 1) of a run with train.processes > 1 logs; process 0's is LOG."""
    return run / f"train.{index}.log"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_workers(cfg: Config, run: Path, logs: list[Path], started: float) -> list[subprocess.Popen]:
    """The worker, or with train.processes N > 1, N workers on this machine that join one JAX
    system as a job's N tasks would (pingctl.train.worker.distributed): process 0 coordinates on
    a free port of 127.0.0.1; each reads its own share of the rows."""
    cmd = [sys.executable, "-m", "pingctl.train.worker", str(run)]
    env = worker_env(cfg, started)
    if len(logs) > 1:
        env |= {COORDINATOR_ENV: f"127.0.0.1:{_free_port()}", PROCESSES_ENV: str(len(logs))}
    procs: list[subprocess.Popen] = []
    try:
        for i, path in enumerate(logs):
            with open(path, "a") as log:
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=run,
                                              env={**env, PROCESS_ID_ENV: str(i)} if len(logs) > 1 else env))
    except BaseException:
        _stop(procs)
        raise
    return procs


def _stop(procs: list[subprocess.Popen]) -> None:
    """Terminate the workers still running, and wait for every one."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _failed(procs: list[subprocess.Popen]) -> int | None:
    """The worker whose failure ended the run (one that failed by itself before one that `_stop`
    terminated after it), or None when all exited 0."""
    bad = [i for i, p in enumerate(procs) if p.returncode != 0]
    own = [i for i in bad if procs[i].returncode != -signal.SIGTERM]
    return (own or bad or [None])[0]


def _ended(procs: list[subprocess.Popen]) -> bool:
    """All workers ended, or one failed (the others cannot go on without it)."""
    codes = [p.poll() for p in procs]
    return all(c is not None for c in codes) or any(c not in (None, 0) for c in codes)


def finish(cfg: Config, run: Path, records: list[dict], resumed_from, elapsed: float, stop_reason: str | None = None,
           **extra) -> dict:
    """The end of a worker that exited 0, on any target: summary.json (with `extra` fields, e.g.
    the SLURM job), or a PingctlError when the run stopped short with no stop requested."""
    summary = summarize(cfg, run, records, resumed_from, elapsed) | extra
    stopped = run / STOPPED
    summary["stopped_early"] = json.loads(stopped.read_text()) if stopped.exists() else None
    last = summary["last_step"]
    if summary["stopped_early"] is None and (last is None or last + 1 < cfg.train.steps):
        # MaxText ends its step loop on a data-iterator exception and still exits 0
        at = "before its first step" if last is None else f"at step {last} of {cfg.train.steps}"
        raise PingctlError(f"training ended {at} with no stop requested (check the rows with `pingctl inspect`): "
                           f"{stop_reason or 'see ' + str(run / LOG)}")
    write_json(run / SUMMARY, summary)
    return summary


def save_metrics(cfg: Config, run: Path, parser: M.LogParser) -> list[dict]:
    """metrics.jsonl and loss.png, rebuilt from the whole run's TensorBoard events: they also
    hold the steps of an invocation that was killed (which wrote neither file); `parser`'s
    records from the log stand in only where the events cannot be read."""
    parser.finish()
    records = M.run_history(run, parser.records)
    M.write_jsonl(records, run / METRICS)
    if records:
        M.plot_loss(records, run / LOSS_PLOT, f"{cfg.model.preset} preset, {run.name}")
    return records


def _follow(path: Path, start: int, procs: list[subprocess.Popen], parser: M.LogParser,
            on_record: OnRecord | None) -> None:
    with open(path, errors="replace") as f:
        f.seek(start)
        buf = ""
        while True:
            chunk = f.read()
            if chunk:
                buf += chunk
                *lines, buf = buf.split("\n")
                for line in lines:
                    rec = parser.feed(line)
                    if rec and on_record:
                        on_record(rec)
            elif _ended(procs):
                if buf:
                    parser.feed(buf)
                return
            else:
                time.sleep(0.2)


def input_wait(run: Path, step_s: float | None) -> dict:
    """How long this invocation's train steps waited for their batches (the worker's INPUT_WAIT),
    after warm-up: seconds per step, and the share of the step that is."""
    wait = (read_input_wait(run) or {}).get("steady_mean_s")
    return {"input_wait_s": wait, "input_wait_share": wait / step_s if wait is not None and step_s else None}


def summarize(cfg: Config, run: Path, records: list[dict], resumed_from, elapsed: float) -> dict:
    # the step range, first/final losses and throughput describe this invocation: the steps after
    # the checkpoint it resumed from; `records` is the whole run's history, earlier invocations too
    mine = [r for r in records if resumed_from is None or r["step"] > resumed_from]
    train = [r for r in mine if r["kind"] == "train"]
    ev = [r for r in mine if r["kind"] == "eval"]
    tps, step_s = M.throughput(train)
    n_params = parameters(cfg)
    gap = M.generalization_gap(records)
    warnings = []
    if loss_keep_table(cfg.loader.loss_keep, cfg.tokenizer.scheme) is not None:
        # the train loss then averages a reweighted mix of fields; the eval loss does not
        gap = None
        warnings.append("loader.loss_keep reweights the train loss by field: train and eval losses are not "
                        "comparable, so no generalization gap is reported")
    if gap is not None and gap > M.GAP_WARN_NATS:
        warnings.append(f"eval loss is {gap:.2f} nats/token above the train loss of the steps before it: the model "
                        "does not carry over to the eval rows (overfitting, or unrepresentative train batches)")
    return {
        "run_dir": str(run),
        "preset": cfg.model.preset,
        "parameters": n_params,
        "steps_total": cfg.train.steps,
        "first_step_this_run": train[0]["step"] if train else None,
        "last_step": train[-1]["step"] if train else None,
        "resumed_from_checkpoint": resumed_from,
        "first_loss": train[0]["loss"] if train else None,
        "final_loss": train[-1]["loss"] if train else None,
        "first_eval_loss": ev[0]["eval_loss"] if ev else None,
        "final_eval_loss": ev[-1]["eval_loss"] if ev else None,
        "generalization_gap": gap,
        "warnings": warnings,
        "tokens_per_s_per_device": tps,
        "step_seconds": step_s,
        **input_wait(run, step_s),
        "model_flops_per_token": 6 * n_params,
        "checkpoints": checkpoint_steps(run),
        "tensorboard": str(tensorboard_dir(run)),
        "loss_png": str(run / LOSS_PLOT),
        "metrics": str(run / METRICS),
        "log": str(run / LOG),
        "elapsed_s": elapsed,
    }
