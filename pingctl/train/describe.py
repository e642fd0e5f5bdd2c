"""What a `pingctl train` run directory holds: model, data shaping, progress, checkpoints.

Read from its files only (config.yaml, metrics.jsonl, summary.json, the checkpoint
directories): no JAX, so `pingctl inspect RUN` is instant and works on a run still training.
"""

from __future__ import annotations

from pathlib import Path

from pingctl.train import metrics as M

LAST_WINDOW = 20  # train steps averaged for "train loss, last steps": one step's loss is noisy


def is_run_dir(path: Path) -> bool:
    path = Path(path)
    return path.is_dir() and (path / "config.yaml").is_file() and (path / "maxtext.yml").is_file()


def describe_run(run: Path) -> dict:
    from pingctl.infer.model import run_config, trained_with_timestamps
    from pingctl.train.local import checkpoint_steps, read_summary
    from pingctl.train.render import MAXTEXT_RUN_NAME, parameters

    run = Path(run)
    cfg = run_config(run)
    records = M.read_jsonl(run / "metrics.jsonl")
    if (run / "train.log").exists():
        # metrics.jsonl is written when an invocation ends; the log has the steps of one in progress
        records = M.merge(records, M.parse_log(run / "train.log").records)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval" and r.get("eval_loss") is not None]
    ckpt_dir = run / MAXTEXT_RUN_NAME / "checkpoints"
    committed = checkpoint_steps(run)
    present = sorted(int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit()) if ckpt_dir.is_dir() else []
    summary = read_summary(run) if (run / "summary.json").exists() else None
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
        "checkpoints": committed,
        "uncommitted_checkpoints": [s for s in present if s not in committed],
        "tensorboard": str(run / MAXTEXT_RUN_NAME / "tensorboard"),
        "loss_png": str(run / "loss.png") if (run / "loss.png").exists() else None,
    }
