"""What a `pingctl train` run directory holds: model, data shaping, progress, checkpoints.

Read from its files only (config.yaml, the TensorBoard events, metrics.jsonl, summary.json,
the checkpoint directories): no JAX, so `pingctl inspect RUN` is quick and works on a run still
training (the worker flushes the events at every step).
"""

from __future__ import annotations

from pathlib import Path

from pingctl.artifacts import run as R
from pingctl.infer.model import trained_with_timestamps
from pingctl.train import metrics as M
from pingctl.train.render import parameters

LAST_WINDOW = 20  # train steps averaged for "train loss, last steps": one step's loss is noisy


def describe_run(run: Path) -> dict:
    run = Path(run)
    cfg = R.run_config(run)
    M.read_jsonl(run / R.METRICS)  # a damaged file is named, though the events are the source
    # metrics.jsonl is written when an invocation ends; the events also hold one in progress or killed
    records = M.run_history(run)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval" and r.get("eval_loss") is not None]
    committed = R.checkpoint_steps(run)
    present = R.present_steps(run)
    summary = R.read_summary(run) if R.has_summary(run) else None
    last = train[-1]["step"] if train else None
    tail = train[-LAST_WINDOW:]
    best = min(evals, key=lambda r: r["eval_loss"]) if evals else None
    tokens_per_step = cfg.loader.seq_len * cfg.loader.batch_size
    return {
        "kind": "run",
        "path": str(run),
        "preset": cfg.model.preset,
        "parameters": parameters(cfg),
        "overrides": dict(cfg.model.overrides or {}),
        "scheme": cfg.tokenizer.scheme,
        "seq_len": cfg.loader.seq_len,
        "batch_size": cfg.loader.batch_size,
        "learning_rate": cfg.train.learning_rate,
        "hardware": cfg.train.hardware,
        "timestamps": trained_with_timestamps(cfg.loader.mode_weights),
        "result_last": cfg.loader.result_last,
        "max_per_pair": cfg.loader.max_per_pair,
        "train_rows": cfg.train.train_rows,
        "eval_rows": cfg.train.eval_rows,
        # the estimates its triangulation contexts carried, and the copy its answers read
        "triangulation_share": cfg.loader.triangulation_share,
        "hints_file": cfg.loader.hints_file,
        "hint_share": cfg.loader.hint_share if cfg.loader.hints_file else None,
        "hints_kept": str(run / R.HINTS) if (run / R.HINTS).is_file() else None,
        "steps_configured": cfg.train.steps,
        "last_step": last,
        # packed sequence slots, padding included: what the step budget bought
        "tokens_seen": (last + 1) * tokens_per_step if last is not None else 0,
        "complete": bool(summary) and last is not None and last + 1 >= cfg.train.steps,
        "stopped_early": (summary or {}).get("stopped_early"),
        "train_loss_last": sum(r["loss"] for r in tail) / len(tail) if tail else None,
        "train_loss_window": len(tail),
        "eval_loss_last": evals[-1]["eval_loss"] if evals else None,
        "eval_step_last": evals[-1]["step"] if evals else None,
        "eval_loss_best": best["eval_loss"] if best else None,
        "eval_step_best": best["step"] if best else None,
        "generalization_gap": M.generalization_gap(records),
        "step_seconds": (summary or {}).get("step_seconds"),
        # the worker's, rewritten while it trains: a run still going shows it too
        "input_wait_s": (R.read_input_wait(run) or {}).get("steady_mean_s"),
        "checkpoints": committed,
        "uncommitted_checkpoints": [s for s in present if s not in committed],
        # STEP.orbax-checkpoint-tmp directories: a save in progress, or one a full disk or a kill cut short
        "temp_checkpoint_dirs": R.temp_checkpoint_dirs(run),
        "tensorboard": str(R.tensorboard_dir(run)),
        "loss_png": str(run / R.LOSS_PLOT) if (run / R.LOSS_PLOT).exists() else None,
    }
