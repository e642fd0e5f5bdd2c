"""A `pingctl train` run directory (docs/train.md, "The run directory"):

    config.yaml     the resolved config          maxtext.yml   the rendered MaxText config
    train.log       the worker's log             metrics.jsonl loss/throughput per step
    loss.png        loss curves                  summary.json  the final summary
    stopped.json    train.max_minutes ended it   maxtext/      checkpoints/, tensorboard/

Read from its files only (no JAX), so anything here works on a run still training.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import yaml

from pingctl.artifacts import export
from pingctl.atomic import atomic_file, write_json
from pingctl.config import Config
from pingctl.errors import PingctlError, UsageError

CONFIG = "config.yaml"
MAXTEXT_YML = "maxtext.yml"
LOG = "train.log"
METRICS = "metrics.jsonl"
LOSS_PLOT = "loss.png"
SUMMARY = "summary.json"
STOPPED = "stopped.json"  # the worker writes it when train.max_minutes ended the run
INPUT_WAIT = "input_wait.json"  # the worker writes it: how long its train steps waited for their batches
# `train` copies loader.hints_file here: the estimates its answers' prompts carry; an export
# keeps it under the same name, so `infer.hints.run_hints` reads either
HINTS = export.HINTS
MAXTEXT_RUN_NAME = "maxtext"  # MaxText writes <run_dir>/maxtext/{checkpoints,tensorboard}
COMMITTED = "commit_success.txt"  # Orbax's marker of a checkpoint written whole
LIGHT_CACHE = ".light"  # the light engine's weights, converted from the checkpoints (pingctl.infer.engines.weights)


# Keys of a run's maxtext.yml about the run, not the network: where it wrote, its data, its
# optimizer and schedule, checkpoints and logging, and the kernel and memory trade-offs inference
# sets itself. Every other key (the architecture, dtypes, model.overrides) goes into config.json.
RUN_ONLY_KEYS = frozenset({
    "base_config", "run_name", "base_output_directory", "hardware", "steps", "per_device_batch_size", "attention",
    "remat_policy", "learning_rate", "warmup_steps_fraction", "learning_rate_final_fraction", "dataset_type",
    "grain_train_files", "grain_eval_files", "grain_worker_count", "eval_interval", "eval_steps",
    "enable_checkpointing", "async_checkpointing", "checkpoint_period", "save_checkpoint_on_completion",
    "enable_tensorboard", "log_period", "metrics_file", "jax_cache_dir", "skip_jax_distributed_system",
    "enable_wandb", "wandb_project_name", "wandb_run_name",
})

def checkpoints_dir(run: Path | str) -> Path:
    return Path(run) / MAXTEXT_RUN_NAME / "checkpoints"


def tensorboard_dir(run: Path | str) -> Path:
    return Path(run) / MAXTEXT_RUN_NAME / "tensorboard"


def checkpoint_items(run: Path | str, step: int) -> Path:
    """Where a checkpoint's parameters (and optimizer state) lie."""
    return checkpoints_dir(run) / str(step) / "items"


def is_run_dir(path: Path | str) -> bool:
    """The one rule for "this is a run": `sample`, `eval`, `inspect` and `train`'s resume take
    a directory that holds both configs `pingctl train` writes before anything else."""
    path = Path(path)
    return path.is_dir() and (path / CONFIG).is_file() and (path / MAXTEXT_YML).is_file()


def has_run_traces(path: Path | str) -> bool:
    """Whether anything a run writes is there (`--fresh` may delete such a directory, even
    one a crash left half-written; never a directory with none)."""
    path = Path(path)
    return any((path / name).exists() for name in (CONFIG, MAXTEXT_YML, MAXTEXT_RUN_NAME))


def model_dir_kind(path: Path | str) -> str | None:
    """The one rule for a directory a model loads from: "run" (`pingctl train`'s), "export"
    (`pingctl export`'s, pingctl.artifacts.export) or None."""
    if is_run_dir(path):
        return "run"
    if export.is_export_dir(path):
        return "export"
    return None


def run_config(run_dir: Path | str) -> Config:
    """The resolved config a model directory was trained with (cheap: no JAX): a `pingctl train`
    run's config.yaml, or the one a `pingctl export` directory embeds."""
    run = Path(run_dir).resolve()
    if model_dir_kind(run) == "export":
        return export.pingctl_config(run)
    if not (run / CONFIG).exists() or not (run / MAXTEXT_YML).exists():
        raise PingctlError(f"{run}: not a `pingctl train` run directory (no config.yaml / maxtext.yml) "
                           "nor a `pingctl export` model directory (no config.json / model.safetensors)")
    return read_config(run / CONFIG)


def hints_path(run_dir: Path | str) -> Path | None:
    """The one rule for a model directory's hints: a model trained with `loader.hints_file` (its
    config says so, a run's or an export's) carries its copy, `HINTS` in the directory, which its
    answers read; None for one trained without. A directory that should carry them and does not
    is refused here, naming the file, rather than answered without the hints it was trained with."""
    run = Path(run_dir)
    trained_with = run_config(run).loader.hints_file
    if not trained_with:
        return None
    path = run / HINTS
    if not path.is_file():
        raise PingctlError(f"{run} was trained with hints (loader.hints_file {trained_with}) but holds no "
                           f"{HINTS}, which its answers read: copy that file to {path}")
    return path


def read_config(path: Path | str) -> Config:
    """A config.yaml `pingctl train` wrote (a run's, or a copy staged or pulled beside it), validated."""
    try:
        return Config.model_validate(read_config_doc(path))
    except ValueError as e:  # pydantic's ValidationError is a ValueError
        first = str(e).strip().splitlines()[0][:200]
        raise PingctlError(f"{path}: not the config `pingctl train` wrote ({first})") from None


def read_config_doc(path: Path | str) -> dict:
    """A config.yaml as written, unvalidated (a resume compares its model's shape; an export
    embeds it as it is). PingctlError when it is missing, unreadable or not a mapping."""
    return _yaml_doc(Path(path), "the config `pingctl train` wrote")


def read_maxtext_doc(run: Path | str) -> dict:
    """A run's maxtext.yml as written."""
    return _yaml_doc(Path(run) / MAXTEXT_YML, "the MaxText config `pingctl train` wrote")


def _yaml_doc(path: Path, what: str) -> dict:
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as e:
        raise PingctlError(f"{path}: cannot read it ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise PingctlError(f"{path}: not {what} ({str(e).strip().splitlines()[0][:200]})") from None
    if not isinstance(doc, dict):
        raise PingctlError(f"{path}: not {what}")
    return doc


def write_config(path: Path | str, cfg: Config | dict) -> None:
    """config.yaml, atomically: what `read_config` reads back."""
    doc = cfg.model_dump(mode="json") if isinstance(cfg, Config) else cfg
    with atomic_file(Path(path)) as tmp:
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False))


def checkpoint_steps(run: Path | str) -> list[int]:
    """Steps whose checkpoint was written whole."""
    d = checkpoints_dir(run)
    if not d.is_dir():
        return []
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit() and (p / COMMITTED).exists())


def present_steps(run: Path | str) -> list[int]:
    """Steps with a checkpoint directory, committed or not (one being written, or cut short)."""
    d = checkpoints_dir(run)
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


ORBAX_TMP = ".orbax-checkpoint-tmp"  # Orbax writes STEP.orbax-checkpoint-tmp[-TIME], renamed to STEP when whole


def temp_checkpoint_dirs(run: Path | str) -> list[dict]:
    """Orbax's temporary checkpoint directories in a run, [{name, bytes}] by name: a save in
    progress, or one cut short (a full disk, kill -9) that nothing reads and nothing removes
    until Orbax itself cleans up; it may hold as much as a checkpoint."""
    d = checkpoints_dir(run)
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.iterdir(), key=lambda p: p.name):
        if ORBAX_TMP in p.name and p.is_dir() and not p.is_symlink():
            size = 0
            for f in p.rglob("*"):
                try:
                    size += f.lstat().st_size if f.is_file() else 0
                except OSError:  # removed while we look (a save that just finished)
                    pass
            out.append({"name": p.name, "bytes": size})
    return out


def latest_step(run: Path | str) -> int:
    steps = checkpoint_steps(run)
    if not steps:
        raise PingctlError(f"{run}: no checkpoints (train first: `pingctl train ... --run-dir {run}`)")
    return steps[-1]


def parse_steps(text: str | None) -> list[int] | None:
    """`--step` as typed: one step, or several separated by commas (their weights are averaged)."""
    if text is None or not text.strip():
        return None
    try:
        steps = [int(t) for t in text.split(",")]
    except ValueError:
        raise UsageError(f"--step {text!r}: expected a step or steps separated by commas, e.g. 1000,1100,1200") from None
    if any(s < 0 for s in steps) or len(set(steps)) != len(steps):
        raise UsageError(f"--step {text!r}: steps must be distinct and non-negative")
    return steps


def resolve_steps(run: Path | str, step: int | Sequence[int] | None) -> list[int]:
    """The committed checkpoints a model is loaded from: the latest by default."""
    if step is None:
        return [latest_step(run)]
    steps = sorted([step] if isinstance(step, int) else step)
    have = checkpoint_steps(run)
    missing = [s for s in steps if s not in have]
    if missing:
        raise PingctlError(f"{run}: no checkpoint at step {', '.join(map(str, missing))} "
                           f"(checkpoints: {', '.join(map(str, have)) or 'none'})")
    return steps


def read_summary(run: Path | str) -> dict:
    return json.loads((Path(run) / SUMMARY).read_text())


def has_summary(run: Path | str) -> bool:
    return (Path(run) / SUMMARY).exists()


def input_wait_summary(waits: Sequence[float], warmup: int) -> dict:
    """What INPUT_WAIT holds: the seconds the train steps of one invocation waited for their
    batches, summed, and described after the first `warmup` (the first batch waits for the
    pipeline and its workers to start, as the first steps wait for compilation)."""
    import numpy as np

    steady = np.asarray(waits[warmup:] or waits[1:] or waits, float)  # the rule of train.metrics.throughput
    figures = ((steady.mean(), np.median(steady), np.quantile(steady, 0.9), steady.max()) if steady.size
               else (None,) * 4)
    return {"calls": len(waits), "warmup": min(warmup, len(waits)), "seconds_total": float(sum(waits)),
            **{f"steady_{k}_s": None if v is None else float(v)
               for k, v in zip(("mean", "median", "p90", "max"), figures)}}


def write_input_wait(run: Path | str, waits: Sequence[float], warmup: int) -> None:
    write_json(Path(run) / INPUT_WAIT, input_wait_summary(waits, warmup))


def read_input_wait(run: Path | str) -> dict | None:
    """The worker's INPUT_WAIT of the run's last invocation, or None (none written yet)."""
    path = Path(run) / INPUT_WAIT
    return json.loads(path.read_text()) if path.is_file() else None


def clear_input_wait(run: Path | str) -> None:
    (Path(run) / INPUT_WAIT).unlink(missing_ok=True)


def write_stopped(run: Path | str, minutes: float, step: int, checkpoint: int | None, overrun_s: float) -> None:
    """STOPPED: train.max_minutes ended this invocation after `step` (saved as `checkpoint`, None when
    checkpointing is off), `overrun_s` seconds past the bound once that checkpoint had committed."""
    write_json(Path(run) / STOPPED, {"reason": "time limit", "max_minutes": minutes, "step": step,
                                     "checkpoint": checkpoint, "overrun_s": round(overrun_s, 3)})


def stop_message(info: dict) -> str:
    """One line for a STOPPED record (a summary's `stopped_early`); records written before the
    overrun was kept name the checkpoint only."""
    bound = f"the {info['max_minutes']:g}-minute bound"
    over = info.get("overrun_s")
    when = f"stopped {over:.1f} s after {bound}" if over is not None else f"stopped by {bound}"
    step = info.get("step", info.get("checkpoint"))
    saved = "checkpoint saved" if info.get("checkpoint") is not None else "no checkpoint"
    return f"{when}, at step {step}, {saved}"
