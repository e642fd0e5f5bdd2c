"""`pingctl export`: a trained run's model as a self-contained directory (docs/export.md).

The weights are restored as `pingctl sample` restores them (`LoadedModel.load`: one checkpoint,
or several averaged), so an export answers exactly as its run did. The layout is
`pingctl.artifacts.export`'s; here are its contents: which MaxText keys shape the network,
what else a prompt needs, and the model card.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from pingctl import __version__
from pingctl.artifacts import eval_output
from pingctl.artifacts import export as EX
from pingctl.artifacts.records import read_manifest
from pingctl.artifacts.run import (CONFIG, HINTS, METRICS, RUN_ONLY_KEYS, checkpoint_items, has_summary, model_dir_kind,
                                   read_config_doc, read_maxtext_doc, read_summary, resolve_steps, run_config)
from pingctl.atomic import check_replaceable
from pingctl.errors import PingctlError, UsageError
from pingctl.infer import calibration as CAL
from pingctl.infer.model import LoadedModel, steps_label, trained_with_timestamps
from pingctl.tokenizer import get_vocab
from pingctl.tokenizer.rtt_codec import MAX_MS
from pingctl.train import metrics as M
from pingctl.train.presets import architecture
from pingctl.train.render import parameters

LOSS_POINTS = 10  # rows of the model card's loss table
# Network keys whose MaxText default (base.yml) a Hugging Face config states outright
MAXTEXT_DEFAULTS = ("normalization_layer_epsilon", "rope_max_timescale", "logits_via_embedding", "weight_dtype")


def export_model(run: Path | str, out: Path | str, step: int | Sequence[int] | None = None,
                 calibration: Path | None = None, eval_report: Path | None = None, force: bool = False,
                 progress: Callable[[str], None] = lambda _what: None) -> dict:
    """Write `out`, an export of `run` at `step` (default: the latest; several: averaged).
    `calibration`: a calibration.json fitted on this run and step(s), copied in (default: none).
    `eval_report`: a `pingctl eval` output for the model card (default: an eval output beside
    the run, of this run and step(s), if there is one). Returns the summary `--json` prints."""
    run, out = Path(run).resolve(), Path(out)
    kind = model_dir_kind(run)
    if kind == "export":
        raise UsageError(f"{run} is an export already; export its run ({EX.source_run(run)})")
    if kind is None:
        raise PingctlError(f"{run}: not a `pingctl train` run directory (no config.yaml / maxtext.yml)")
    cfg = run_config(run)
    steps = resolve_steps(run, step)
    where = out.resolve()
    if where == run or run in where.parents or where in run.parents:
        # replacing (with --force) a part of the run could take its checkpoints; an export lives apart
        raise UsageError(f"-o {out}: inside or around the run {run}; write the export outside it")
    if not EX.is_export_dir(out):  # an earlier export may be replaced, anything else only with --force
        check_replaceable(out, force, inputs=[run / CONFIG])
    cal = None
    if calibration is not None:
        cal = CAL.load(calibration)
        CAL.check_fits(cal, run, steps)
    report_path, report = _eval_report(run, steps, eval_report)

    t0 = time.perf_counter()
    progress(f"restoring {steps_label(steps)}")
    model = LoadedModel.load(run, steps, hardware="cpu", batch=1)
    tensors = model.weights()
    net = network_keys(run)
    config = {
        "format": EX.FORMAT,
        "format_version": EX.FORMAT_VERSION,
        "pingctl_version": __version__,
        # from the run, not the clock: exporting the same run again writes the same bytes
        "created": checkpoint_time(run, steps),
        "source": {"run": str(run), "steps": list(steps), "step": steps[-1]},
        "architecture": {"preset": cfg.model.preset, "overrides": dict(cfg.model.overrides or {}),
                         "parameters": parameters(cfg), **architecture(cfg.model.preset, cfg.model.overrides),
                         "maxtext": net},
        "vocab": {"size": get_vocab(cfg.tokenizer.scheme).size, "scheme": cfg.tokenizer.scheme},
        "tokenizer": {"scheme": cfg.tokenizer.scheme},
        "loader": {"seq_len": cfg.loader.seq_len, "max_per_pair": cfg.loader.max_per_pair,
                   "result_last": cfg.loader.result_last, "mode_weights": list(cfg.loader.mode_weights),
                   "timestamps": trained_with_timestamps(cfg.loader.mode_weights)},
        "weights": {"file": EX.WEIGHTS, "tensors": len(tensors),
                    "elements": int(sum(a.size for a in tensors.values())),
                    "dtypes": sorted({a.dtype.name for a in tensors.values()})},
        "calibration": EX.CALIBRATION if cal is not None else None,
        "eval_report": str(report_path) if report_path else None,
        # run_config's source for an export: the config exactly as config.yaml holds it
        "pingctl_config": read_config_doc(run / CONFIG),
        # what Hugging Face tooling reads (AutoConfig's model_type, hidden_size, ...): copies of the above
        **EX.hf_fields({**_maxtext_defaults(MAXTEXT_DEFAULTS), **net}),
    }
    progress(f"writing {out}")
    card = model_card(run, config, cfg, report)
    hints = run / HINTS if (run / HINTS).is_file() else None
    EX.write(out, config, tensors, card, cal.to_json() if cal is not None else None, hints)
    files = EX.files(out)
    return {"out": str(out), "run": str(run), "steps": list(steps), "step": steps[-1], "preset": cfg.model.preset,
            "parameters": config["architecture"]["parameters"], "tensors": len(tensors),
            "dtypes": config["weights"]["dtypes"], "calibration": cal.path if cal is not None else None,
            "eval_report": config["eval_report"], "files": files, "bytes": sum(f["bytes"] for f in files),
            "seconds": round(time.perf_counter() - t0, 2)}


def checkpoint_time(run: Path, steps: Sequence[int]) -> str | None:
    """When the newest of `steps` was committed (UTC), as Orbax recorded it in the checkpoint
    (the directory's time where it did not): a copy of the run keeps it."""
    times = []
    for s in steps:
        d = checkpoint_items(run, s).parent
        try:
            ns = json.loads((d / "_CHECKPOINT_METADATA").read_text())["commit_timestamp_nsecs"]
            times.append(int(ns) / 1e9)
        except (OSError, ValueError, KeyError, TypeError):
            try:
                times.append(d.stat().st_mtime)
            except OSError:
                pass
    if not times:
        return None
    return dt.datetime.fromtimestamp(max(times), dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _maxtext_defaults(keys: Sequence[str]) -> dict:
    """MaxText's own values (its base.yml) of `keys`: what the network has where the run's
    maxtext.yml sets nothing. Empty where MaxText is not installed."""
    import importlib.util

    spec = importlib.util.find_spec("maxtext")
    for where in (spec.submodule_search_locations or []) if spec else []:
        f = Path(where) / "configs" / "base.yml"
        if f.is_file():
            doc = yaml.safe_load(f.read_text()) or {}
            return {k: doc[k] for k in keys if k in doc}
    return {}


def network_keys(run: Path) -> dict:
    """The run's maxtext.yml without its run-only keys: what MaxText needs to build the network."""
    return {k: v for k, v in read_maxtext_doc(run).items() if k not in RUN_ONLY_KEYS}


def _eval_report(run: Path, steps: list[int], given: Path | None) -> tuple[Path | None, dict | None]:
    """The eval report the model card quotes: the one given, else the newest eval output beside
    the run that evaluated this run at these steps (None where there is none)."""
    if given is not None:
        if not eval_output.is_eval_output(given):
            raise UsageError(f"--eval-report {given}: not a `pingctl eval` output (no report.json)")
        return eval_output.read_report(given)
    found = []
    for d in run.parent.iterdir() if run.parent.is_dir() else []:
        if d == run or not eval_output.is_eval_output(d):
            continue
        try:
            f, report = eval_output.read_report(d)
            same = (Path(report["inputs"]["run"]).resolve() == run
                    and list(report["predictors"]["model"]["info"]["steps"]) == list(steps))
        except (PingctlError, KeyError, TypeError, ValueError):
            continue  # a damaged or foreign report beside the run is not this model's
        if same:
            found.append((f.stat().st_mtime, f, report))
    if not found:
        return None, None
    _, f, report = max(found, key=lambda t: t[0])
    return f, report


# ----------------------------------------------------------------- the model card

# The card is shared with the model: it names the run and its inputs by their last path parts
# (`rows/train`), never by the exporting machine's absolute paths.
LICENSE = "apache-2.0"  # pingctl's own; the measurements a model learnt from keep their own terms
TAGS = ["pingctl", "network-latency", "rtt", "ping", "ripe-atlas", "maxtext", "jax"]
ROW_KEYS = (("records", "records (training contexts' sources: one probe's measurements each)"),
            ("measurements", "measurements"), ("probes", "probes"), ("rows_read", "rows read"),
            ("rows_rejected", "rows rejected"), ("start", "first measurement"), ("end", "last measurement"))
# The eval table's columns, as the front matter's metrics name them
EVAL_METRICS = (("median_rel_err", "median_relative_error", "median relative error"),
                ("p90_rel_err", "p90_relative_error", "90th percentile relative error"),
                ("mae_ms", "mae_ms", "mean absolute error (ms)"),
                ("cov50", "coverage_50", "coverage of the 50% interval"),
                ("cov90", "coverage_90", "coverage of the 90% interval"))


def shown_path(p) -> str:
    """A path as the card shows it: its last two parts (`rows/train`)."""
    return "/".join(Path(str(p)).parts[-2:]).lstrip("/") if p else "-"


def _rows_manifest(rows: str | None) -> dict | None:
    try:
        return read_manifest(rows) if rows else None
    except PingctlError:
        return None


def _rows_summary(rows: str | None) -> str:
    if not rows:
        return "- rows: not recorded in the run's config\n"
    m = _rows_manifest(rows)
    if m is None:
        return f"- rows: `{shown_path(rows)}` (not readable from the machine that exported this model)\n"
    lines = [f"- rows: `{shown_path(rows)}`, built by pingctl {m.get('pingctl_version', '?')}"]
    lines += [f"- {label}: {_num(m[k])}" for k, label in ROW_KEYS if m.get(k) is not None]
    return "\n".join(lines) + "\n"


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def front_matter(run: Path, config: dict, cfg, report: dict | None) -> str:
    """The card's YAML front matter, as model hubs read it: license, tags, library, what it was
    trained on, and the eval headline (the `model` row of the eval report) when there is one."""
    a, src = config["architecture"], config["source"]
    m = _rows_manifest(cfg.train.train_rows) or {}
    data = {"description": "probe-centric rows of ping measurements (`pingctl build-rows`)",
            "rows": shown_path(cfg.train.train_rows) if cfg.train.train_rows else None,
            **{k: m[k] for k, _ in ROW_KEYS if m.get(k) is not None}}
    doc = {"library_name": "pingctl", "license": LICENSE, "tags": TAGS,
           "pingctl": {"format": EX.FORMAT, "format_version": EX.FORMAT_VERSION, "run": run.name,
                       "steps": list(src["steps"]), "preset": a["preset"], "parameters": a["parameters"],
                       "scheme": config["vocab"]["scheme"], "training_data": data}}
    row = next((r for r in (report or {}).get("rows", []) if isinstance(r, dict) and r.get("predictor") == "model"),
               None)
    metrics = [(kind, name, float(row[key])) for key, kind, name in EVAL_METRICS if row and _finite(row.get(key))]
    if metrics:
        doc["metrics"] = [kind for kind, _, _ in metrics]
        doc["model-index"] = [{"name": run.name, "results": [{
            "task": {"type": "rtt-prediction", "name": "RTT distribution of a (probe, destination) pair"},
            "dataset": {"name": shown_path((report.get("inputs") or {}).get("test")), "type": "ping-measurements",
                        "split": "test"},
            "metrics": [{"type": kind, "name": name, "value": round(v, 6)} for kind, name, v in metrics]}]}]
    return "---\n" + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True) + "---\n\n"


def _num(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.4g}"
    return str(v)


def _loss_table(run: Path) -> str:
    try:
        records = M.read_jsonl(run / METRICS) if (run / METRICS).exists() else []
    except PingctlError:
        records = []
    train = [r for r in records if r.get("kind") == "train" and r.get("loss") is not None]
    evals = {r["step"]: r["eval_loss"] for r in records if r.get("kind") == "eval" and r.get("eval_loss") is not None}
    if not train:
        return "No loss history (metrics.jsonl) in the run.\n"
    idx = sorted({round(i * (len(train) - 1) / (LOSS_POINTS - 1)) for i in range(LOSS_POINTS)})
    lines = ["| step | train loss (nats/token) | eval loss |", "|---:|---:|---:|"]
    for i in idx:
        r = train[i]
        ev = evals.get(r["step"])
        lines.append(f"| {r['step']:,} | {r['loss']:.4f} | {'-' if ev is None else f'{ev:.4f}'} |")
    if evals:
        best = min(evals, key=evals.get)
        lines.append(f"\nEval loss: last {evals[max(evals)]:.4f} (step {max(evals):,}), "
                     f"best {evals[best]:.4f} (step {best:,}).")
    return "\n".join(lines) + "\n"


def _eval_table(report: dict | None, path) -> str:
    if report is None:
        return ("No eval report given (`--eval-report`) or found beside the run for these steps. "
                "`pingctl eval` measures the model against the baselines on held-out packets.\n")
    def pct(v) -> str:
        return "-" if v is None else f"{v:.1%}"

    lines = [f"From `{shown_path(path)}`: {report.get('queries', '?')} held-out packets of "
             f"`{shown_path(report['inputs'].get('test'))}`.", "",
             "| predictor | median rel err | p90 rel err | MAE ms | cov50 | cov90 |", "|---|---:|---:|---:|---:|---:|"]
    for r in report.get("rows", []):
        mae = r.get("mae_ms")
        lines.append(f"| {r.get('predictor')} | {pct(r.get('median_rel_err'))} | {pct(r.get('p90_rel_err'))} | "
                     f"{'-' if mae is None else f'{mae:.1f}'} | {pct(r.get('cov50'))} | {pct(r.get('cov90'))} |")
    return "\n".join(lines) + "\n"


def model_card(run: Path, config: dict, cfg, report: dict | None) -> str:
    a, ld, src = config["architecture"], config["loader"], config["source"]
    summary = read_summary(run) if has_summary(run) else {}
    overrides = ", ".join(f"`{k}={json.dumps(v)}`" for k, v in a["overrides"].items()) or "none"
    cal = ("`calibration.json`: the recalibration map `pingctl eval` fitted on held-out packets of this run "
           "and step(s); `pingctl sample EXPORT --src A --dst B --calibration EXPORT/calibration.json` applies it."
           if config["calibration"] else "No calibration map exported (`pingctl export --calibration FILE` adds one).")
    elapsed = summary.get("elapsed_s")
    return front_matter(run, config, cfg, report) + f"""# pingctl model: {run.name}, {steps_label(src['steps'])}

A generative Transformer over RIPE Atlas-style ping measurements, exported by pingctl
{config['pingctl_version']} from the run `{run.name}` ({steps_label(src['steps'])}).
It answers RTT distributions, address completions, inverse searches and whole measurement
streams: `pingctl sample THIS_DIR --src A --dst B`, or `LoadedModel.load("THIS_DIR")` in Python.

## Files

| file | what |
|---|---|
| `config.json` | the network (MaxText keys), vocabulary, prompt shaping, the pingctl config it was trained with, source |
| `model.safetensors` | {config['weights']['tensors']} tensors, {config['weights']['elements']:,} parameters, {', '.join(config['weights']['dtypes'])} |
| `README.md` | this card |
{"| `calibration.json` | the recalibration map |" + chr(10) if config['calibration'] else ""}
## Model

- preset `{a['preset']}`: {a['layers']} layers, model width {a['emb_dim']}, {a['heads']} heads of {a['head_dim']}, MLP {a['mlp_dim']} ({', '.join(a['mlp_activations'])}), compute dtype {a['dtype']}; {a['parameters']:,} parameters
- overrides: {overrides}
- vocabulary: {config['vocab']['size']} tokens, `{config['vocab']['scheme']}` scheme
- prompts: context of {ld['seq_len']} tokens; {f"at most {ld['max_per_pair']} measurements of a pair" if ld['max_per_pair'] else "no cap on the measurements of a pair"} in a context; RTT block placed last for {ld['result_last']:.0%} of training measurements (the rest in random order); timestamps {'yes' if ld['timestamps'] else 'no'} (loader mode weights full/partial/none {ld['mode_weights']})

## Data

{_rows_summary(cfg.train.train_rows)}- eval rows: {f"`{shown_path(cfg.train.eval_rows)}`" if cfg.train.eval_rows else "none"}

## Training

- {cfg.train.steps:,} steps configured, last step {_num(summary.get('last_step'))}, batch {cfg.loader.batch_size} x {cfg.loader.seq_len} tokens, learning rate {cfg.train.learning_rate:g}, on {cfg.train.hardware}{f", {elapsed / 60:.1f} min" if elapsed else ""}
- final train loss {_num(summary.get('final_loss'))}, final eval loss {_num(summary.get('final_eval_loss'))}

{_loss_table(run)}
## Evaluation

{_eval_table(report, config.get('eval_report'))}
## Calibration

{cal}

## Limits

- It knows the addresses, pairs and times of its training rows; elsewhere it guesses from address
  structure alone. `pingctl eval` on held-out pairs or probes says how well.
- RTTs are coded up to {MAX_MS:,.0f} ms; a prompt holds at most {ld['seq_len']} tokens of context.
- {"It was trained without timestamps: questions with a time are refused." if not ld['timestamps'] else "Times outside the training period are extrapolation."}
- An export is the weights and what shapes a prompt: the training rows and checkpoints stay with the run.
"""
