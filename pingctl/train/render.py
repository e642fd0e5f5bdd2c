"""Rendering run files from the Jinja2 templates shipped in the package, `pingctl/templates/`
(MaxText config, sbatch): read through importlib.resources, so an installed wheel has them too."""

from __future__ import annotations

from pathlib import Path

import yaml

from pingctl import __version__
from pingctl.artifacts.run import MAXTEXT_RUN_NAME
from pingctl.atomic import MANIFEST
from pingctl.config import Config, UniqueKeyLoader
from pingctl.errors import PingctlError
from pingctl.tokenizer import get_vocab
from pingctl.train.presets import PRESETS, architecture, param_count

TEMPLATES = "templates"  # package data of `pingctl` (pyproject.toml: tool.setuptools.package-data)


def env():
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("pingctl", TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def vocab_size(cfg: Config) -> int:
    return get_vocab(cfg.tokenizer.scheme).size


def attention_kernel(requested: str, platform: str, devices: int) -> str:
    """The kernel `train.attention: auto` stands for, once the job's devices are known.

    On one GPU, MaxText's `flash` is tokamax's Pallas-Triton kernel with a causal and a segment
    mask, so packed rows stay apart exactly as with `dot_product`: on an H200 their losses over
    40 steps of `base` differed by 0.003 on average (at most 0.016), flash at twice the rate
    (docs/benchmarks.md).
    MaxText calls that kernel without a sharding rule, so a job of several devices keeps
    `dot_product`, and so does a CPU, where `flash` means TPU kernels.
    """
    if requested != "auto":
        return requested
    return "flash" if platform == "gpu" and devices == 1 else "dot_product"


def maxtext_values(cfg: Config, run_dir: Path) -> dict:
    t = cfg.train
    run_dir = Path(run_dir).resolve()
    rows_file = lambda d: str(Path(d).resolve() / MANIFEST) if d else ""  # noqa: E731
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
        "attention": t.attention if t.attention != "auto" else "dot_product",  # the worker may pick flash
        "learning_rate": t.learning_rate,
        "warmup_fraction": t.warmup_fraction,
        "train_rows": rows_file(t.train_rows),
        "eval_rows": rows_file(t.eval_rows or t.train_rows),
        "eval_interval": t.eval_interval if t.eval_rows else -1,
        "eval_steps": t.eval_steps,
        "checkpoint_period": t.checkpoint_period,
        "log_period": t.log_period,
        "jax_cache_dir": str(Path(t.jax_cache_dir).expanduser()),
        # a CPU job is one process (multi-node SLURM needs a GPU): MaxText's CPU join reads
        # JOB_INDEX & co. that only its own launchers set, so a single-node CPU sbatch job failed
        "skip_distributed": t.hardware == "cpu",
        "overrides": cfg.model.overrides,
        "wandb": t.wandb,
        "wandb_project": t.wandb_project,
        "wandb_run": run_dir.name,
    }


# MaxText keys that pingctl derives from its own config: overriding them in `model.overrides`
# would desynchronise MaxText from pingctl's loader, resume logic or inference, so the pingctl
# field is named instead.
RESERVED = {
    "run_name": "train.run_dir",
    "base_output_directory": "train.run_dir",
    "hardware": "train.hardware",
    "steps": "train.steps",
    "vocab_size": "tokenizer.scheme",
    "max_target_length": "loader.seq_len",
    "per_device_batch_size": "loader.batch_size",
    "learning_rate": "train.learning_rate",
    "warmup_steps_fraction": "train.warmup_fraction",
    "attention": "train.attention",
    "dataset_type": "the rows given to `pingctl train`",
    "grain_train_files": "the rows given to `pingctl train`",
    "grain_eval_files": "train.eval_rows (--eval)",
    "eval_interval": "train.eval_interval",
    "eval_steps": "train.eval_steps",
    "checkpoint_period": "train.checkpoint_period",
    "log_period": "train.log_period",
    "metrics_file": "the run directory's metrics.jsonl",
    "jax_cache_dir": "train.jax_cache_dir",
    "enable_wandb": "train.wandb",
}
OVERRIDES_MARK = "# Overrides (model.overrides"


def check_overrides(overrides: dict) -> None:
    bad = {k: RESERVED[k] for k in overrides if k in RESERVED}
    if bad:
        hint = "; ".join(f"{k}: set {v}" for k, v in bad.items())
        raise PingctlError(f"model.overrides may not set {', '.join(bad)} (pingctl sets it from its own config: {hint})")


def _drop_overridden(text: str, overrides: dict) -> str:
    """Comment out the template's own line for every key that `model.overrides` sets, so the
    override is the key's only definition (MaxText's loader rejects duplicate keys)."""
    head, mark, tail = text.partition(OVERRIDES_MARK)
    out = []
    for line in head.splitlines(keepends=True):
        key, sep, _ = line.partition(":")
        if sep and key in overrides:  # top-level keys only: an indented or comment line never matches
            line = f"# {line.rstrip()}  (replaced by model.overrides)\n"
        out.append(line)
    return "".join(out) + mark + tail


def render_maxtext(cfg: Config, run_dir: Path) -> str:
    overrides = cfg.model.overrides
    check_overrides(overrides)
    text = env().get_template("maxtext.yml.j2").render(**maxtext_values(cfg, run_dir))
    if overrides:
        text = _drop_overridden(text, overrides)
    # A template bug must fail here, not inside MaxText (whose loader also rejects duplicates).
    try:
        yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise PingctlError(f"rendered MaxText config is not valid: {e}") from None
    return text


def parameters(cfg: Config) -> int:
    return param_count(architecture(cfg.model.preset, cfg.model.overrides), vocab_size(cfg))
