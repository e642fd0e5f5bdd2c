"""Rendering run files from Jinja2 templates in `templates/` (MaxText config, sbatch)."""

from __future__ import annotations

from pathlib import Path

import yaml

from pingctl import __version__
from pingctl.config import Config
from pingctl.errors import PingctlError
from pingctl.train.presets import PRESETS, param_count

PROJECT_DIR = Path(__file__).resolve().parents[2]
TEMPLATES = PROJECT_DIR / "templates"
MAXTEXT_RUN_NAME = "maxtext"  # MaxText writes <run_dir>/maxtext/{checkpoints,tensorboard}


def env():
    import jinja2

    if not TEMPLATES.is_dir():
        raise PingctlError(f"templates not found at {TEMPLATES} (pingctl must run from its source tree)")
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def vocab_size(cfg: Config) -> int:
    from pingctl.tokenizer import get_vocab

    return get_vocab(cfg.tokenizer.scheme).size


def maxtext_values(cfg: Config, run_dir: Path) -> dict:
    t = cfg.train
    run_dir = Path(run_dir).resolve()
    rows_file = lambda d: str(Path(d).resolve() / "manifest.json") if d else ""  # noqa: E731
    return {
        "version": __version__,
        "run_name": MAXTEXT_RUN_NAME,
        "preset": cfg.model.preset,
        "output_dir": str(run_dir),
        "hardware": t.hardware,
        "steps": t.steps,
        "vocab_size": vocab_size(cfg),
        "model": PRESETS[cfg.model.preset],
        "seq_len": cfg.loader.seq_len,
        "per_device_batch_size": cfg.loader.batch_size,  # divided by the device count at run time
        "attention": t.attention,
        "learning_rate": t.learning_rate,
        "warmup_fraction": t.warmup_fraction,
        "train_rows": rows_file(t.train_rows),
        "eval_rows": rows_file(t.eval_rows or t.train_rows),
        "eval_interval": t.eval_interval if t.eval_rows else -1,
        "eval_steps": t.eval_steps,
        "checkpoint_period": t.checkpoint_period,
        "log_period": t.log_period,
        "jax_cache_dir": str(Path(t.jax_cache_dir).expanduser()),
        "skip_distributed": t.hardware == "cpu" and t.target == "local",
        "overrides": cfg.model.overrides,
        "wandb": t.wandb,
        "wandb_project": t.wandb_project,
        "wandb_run": run_dir.name,
    }


def render_maxtext(cfg: Config, run_dir: Path) -> str:
    text = env().get_template("maxtext.yml.j2").render(**maxtext_values(cfg, run_dir))
    yaml.safe_load(text)  # a template bug must fail here, not inside MaxText
    return text


def parameters(cfg: Config) -> int:
    return param_count(PRESETS[cfg.model.preset], vocab_size(cfg))
