"""`pingctl export`: a trained run's model as a self-contained directory (docs/export.md).

The weights are restored as `pingctl sample` restores them (`LoadedModel.load`: one checkpoint,
or several averaged), so an export answers exactly as its run did. The layout is
`pingctl.artifacts.export`'s; here are its contents: which MaxText keys shape the network,
what else a prompt needs, and the model card (pingctl/templates/model_card.md.j2). An export is
made to be shared: no absolute path of this machine goes into it (`EX.shareable`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from pingctl import __version__
from pingctl.artifacts import eval_output
from pingctl.artifacts import export as EX
from pingctl.artifacts.records import read_manifest
from pingctl.artifacts.run import (CONFIG, METRICS, RUN_ONLY_KEYS, checkpoint_items, has_summary, model_dir_kind,
                                   hints_path, read_config_doc, read_maxtext_doc, read_summary, resolve_steps, run_config)
from pingctl.atomic import check_replaceable
from pingctl.errors import PingctlError, UsageError
from pingctl.infer import calibration as CAL
from pingctl.infer import combine as CB
from pingctl.infer.model import LoadedModel, steps_label, trained_with_timestamps
from pingctl.tokenizer import get_vocab
from pingctl.tokenizer.rtt_codec import MAX_MS
from pingctl.train import metrics as M
from pingctl.train.presets import architecture
from pingctl.train.render import parameters

LOSS_POINTS = 10  # rows of the model card's loss table


def export_model(run: Path | str, out: Path | str, step: int | Sequence[int] | None = None,
                 calibration: Path | None = None, eval_report: Path | None = None, force: bool = False,
                 progress: Callable[[str], None] = lambda _what: None, repo_id: str | None = None,
                 combination: Path | None = None) -> dict:
    """Write `out`, an export of `run` at `step` (default: the latest; several: averaged).
    `calibration`: a calibration.json fitted on this run and step(s), copied in (default: none).
    `eval_report`: a `pingctl eval` output for the model card (default: an eval output beside
    the run, of this run and step(s), if there is one). `repo_id`: the Hugging Face Hub repo it
    is for (`--push-to-hub`), which the card names it by. `combination`: the combination.json
    copied in, fitted for this run and step(s) (default: the run's own where it fits). Returns
    the summary `--json` prints."""
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
    comb, comb_note = _combination(run, steps, combination)
    # before the restore: a run trained with hints that lost its copy is refused, never exported without
    hints = hints_path(run)

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
        "source": {"run": EX.shown_path(run), "steps": list(steps), "step": steps[-1]},
        "architecture": {"preset": cfg.model.preset, "overrides": dict(cfg.model.overrides or {}),
                         "parameters": parameters(cfg), **architecture(cfg.model.preset, cfg.model.overrides),
                         "maxtext": net},
        "vocab": {"size": get_vocab(cfg.tokenizer.scheme).size, "scheme": cfg.tokenizer.scheme},
        "tokenizer": {"scheme": cfg.tokenizer.scheme},
        "loader": {"seq_len": cfg.loader.seq_len, "max_per_pair": cfg.loader.max_per_pair,
                   "result_last": cfg.loader.result_last, "mode_weights": list(cfg.loader.mode_weights),
                   "timestamps": trained_with_timestamps(cfg.loader.mode_weights),
                   "relative_target": cfg.loader.relative_target},
        "weights": {"file": EX.WEIGHTS, "tensors": len(tensors),
                    "elements": int(sum(a.size for a in tensors.values())),
                    "dtypes": sorted({a.dtype.name for a in tensors.values()})},
        "calibration": EX.CALIBRATION if cal is not None else None,
        "combination": EX.COMBINATION if comb is not None else None,
        "eval_report": EX.shown_path(report_path) if report_path else None,
        # run_config's source for an export: the config as config.yaml holds it, its paths cut
        "pingctl_config": EX.shareable_config(read_config_doc(run / CONFIG)),
        # what Hugging Face tooling reads (AutoConfig's model_type, hidden_size, ...): copies of the above
        **EX.hf_fields({**EX.MAXTEXT_DEFAULTS, **net}),
    }
    config = EX.shareable(config)  # what else may hold a path: MaxText keys given as overrides
    progress(f"writing {out}")
    card = model_card(run, config, cfg, report, repo_id)
    shared = None if comb is None else {**EX.shareable(comb.to_json()), "run": config["source"]["run"]}
    EX.write(out, config, tensors, card, _shareable_calibration(cal, config), hints, shared)
    files = EX.files(out)
    return {"out": str(out), "run": str(run), "steps": list(steps), "step": steps[-1], "preset": cfg.model.preset,
            "parameters": config["architecture"]["parameters"], "tensors": len(tensors),
            "dtypes": config["weights"]["dtypes"], "calibration": cal.path if cal is not None else None,
            "combination": comb.path if comb is not None else None, "combination_note": comb_note,
            "eval_report": config["eval_report"], "files": files, "bytes": sum(f["bytes"] for f in files),
            "seconds": round(time.perf_counter() - t0, 2)}


def _combination(run: Path, steps, path: Path | None):
    """(the combination an export carries, why none where the run has one that does not fit):
    `path` must fit this run and step(s); the run's own is copied where it does."""
    if path is not None:
        comb = CB.load(path, "--combination")
        if why := CB.mismatch(comb, run, steps):
            raise UsageError(f"--combination: {why}; fit one for this checkpoint (`pingctl eval RUN --regimes SPLITS`)")
        return comb, None
    own = run / CB.COMBINATION
    if not own.is_file():
        return None, None
    comb = CB.load(own, "")
    why = CB.mismatch(comb, run, steps)
    return (None, f"{why}: not copied") if why else (comb, None)


def _shareable_calibration(cal, config: dict) -> dict | None:
    """The map as the export carries it: its run named as the export names its source (what
    `EX.fitted_for` compares), its other paths (the split it was fitted on) cut."""
    if cal is None:
        return None
    return {**EX.shareable(cal.to_json()), "run": config["source"]["run"]}


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
# The Hub task: the model forecasts the next measurement of a (probe, destination) series from the
# measurements before it, as a distribution (and generates whole series); no Hub task fits better
PIPELINE_TAG = "time-series-forecasting"
CARD_TEMPLATE = "model_card.md.j2"
ROW_KEYS = (("records", "records (training contexts' sources: one probe's measurements each)"),
            ("measurements", "measurements"), ("probes", "probes"), ("rows_read", "rows read"),
            ("rows_rejected", "rows rejected"), ("start", "first measurement"), ("end", "last measurement"))
# The eval table's columns, as the front matter's metrics name them
EVAL_METRICS = (("median_rel_err", "median_relative_error", "median relative error"),
                ("p90_rel_err", "p90_relative_error", "90th percentile relative error"),
                ("mae_ms", "mae_ms", "mean absolute error (ms)"),
                ("cov50", "coverage_50", "coverage of the 50% interval"),
                ("cov90", "coverage_90", "coverage of the 90% interval"))
# Where measurements come from, by the `kind` of the table manifest that made them -> the id the
# card's `datasets` and model-index give them, and how the card names them
ORIGINS = {"pingctl-ingest": "ripe-atlas", "pingctl synth": "pingctl-synth"}
DATASETS = {"ripe-atlas": "RIPE Atlas ping measurements",
            "pingctl-synth": "synthetic ping measurements (pingctl synth)", "ping-measurements": "ping measurements"}
UNKNOWN_ORIGIN = "ping-measurements"
_MANIFEST = "manifest.json"


def data_origin(path) -> str | None:
    """Where the measurements under `path` (rows, a split, a table) came from: a key of DATASETS,
    followed back through the manifests (rows -> the split or table they were built from -> the
    shard's inputs -> ingest's or synth's output); None where the chain is not readable on this
    machine, or it leads to more than one origin."""
    found, todo, seen = set(), [Path(str(path))] if path else [], set()
    for _ in range(4):  # rows -> split -> shard -> table, at most
        nxt = []
        for p in todo[:64]:  # a table of many parts names one directory many times: its first few tell
            got = _manifest_near(p, seen)
            if got is None:
                continue
            doc, where = got
            if doc.get("kind") in ORIGINS:
                found.add(ORIGINS[doc["kind"]])
            for src in (doc.get("sources") or []) + (doc.get("inputs") or []):
                if isinstance(src, dict) and isinstance(src.get("path"), str):
                    q = Path(src["path"])
                    if not q.exists() and isinstance(doc.get("out"), str):  # the tree moved (or was renamed) whole
                        q = where / os.path.relpath(q, doc["out"])
                    nxt.append(q)
        todo = nxt
    return found.pop() if len(found) == 1 else None


def _manifest_near(p: Path, seen: set) -> tuple[dict, Path] | None:
    """The manifest of the output `p` is (a directory) or belongs to (a part file, a split of a
    shard output), and the directory holding it: the nearest manifest.json at most two levels
    up; None if none is readable or it was read already."""
    for d in (p, p.parent, p.parent.parent) if p.suffix else (p, p.parent):
        f = d / _MANIFEST
        if f.is_file():
            if f in seen:
                return None
            seen.add(f)
            try:
                doc = json.loads(f.read_text())
            except (OSError, ValueError):
                return None
            return (doc, d) if isinstance(doc, dict) else None
    return None


def model_name(run: Path, config: dict, repo_id: str | None = None) -> str:
    """What the card calls the model: its Hub repo id where it is pushed to one, else its preset
    and run (`pingctl-tiny-demo-train`), the same for every export of the run."""
    return repo_id or f"pingctl-{config['architecture']['preset']}-{EX.shown_path(run).replace('/', '-')}"


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
        return f"- rows: `{EX.shown_path(rows)}` (not readable from the machine that exported this model)\n"
    lines = [f"- rows: `{EX.shown_path(rows)}`, built by pingctl {m.get('pingctl_version', '?')}"]
    lines += [f"- {label}: {_num(m[k])}" for k, label in ROW_KEYS if m.get(k) is not None]
    return "\n".join(lines) + "\n"


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def front_matter(run: Path, config: dict, cfg, report: dict | None, repo_id: str | None = None) -> str:
    """The card's YAML front matter, as model hubs read it: license, task, tags, library, what it
    was trained on, and the eval headline (the `model` row of the eval report) when there is one."""
    a, src = config["architecture"], config["source"]
    m = _rows_manifest(cfg.train.train_rows) or {}
    origin = data_origin(cfg.train.train_rows) or UNKNOWN_ORIGIN
    data = {"description": f"probe-centric rows of {DATASETS[origin]} (`pingctl build-rows`)",
            "rows": EX.shown_path(cfg.train.train_rows) if cfg.train.train_rows else None,
            **{k: m[k] for k, _ in ROW_KEYS if m.get(k) is not None}}
    doc = {"library_name": "pingctl", "license": LICENSE, "pipeline_tag": PIPELINE_TAG, "tags": TAGS,
           "datasets": [origin],
           "pingctl": {"format": EX.FORMAT, "format_version": EX.FORMAT_VERSION, "run": EX.shown_path(run),
                       "steps": list(src["steps"]), "preset": a["preset"], "parameters": a["parameters"],
                       "scheme": config["vocab"]["scheme"], "training_data": data}}
    row = next((r for r in (report or {}).get("rows", []) if isinstance(r, dict) and r.get("predictor") == "model"),
               None)
    metrics = [(kind, name, float(row[key])) for key, kind, name in EVAL_METRICS if row and _finite(row.get(key))]
    if metrics:
        test = (report.get("inputs") or {}).get("test")
        tested = data_origin(test) or origin
        doc["metrics"] = [kind for kind, _, _ in metrics]
        doc["model-index"] = [{"name": model_name(run, config, repo_id), "results": [{
            "task": {"type": PIPELINE_TAG, "name": "RTT distribution of a (probe, destination) pair"},
            "dataset": {"name": f"{DATASETS[tested]}, held-out split `{EX.shown_path(test)}`", "type": tested,
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

    lines = [f"From `{EX.shown_path(path)}`: {report.get('queries', '?')} held-out packets of "
             f"`{EX.shown_path(report['inputs'].get('test'))}`.", "",
             "| predictor | median rel err | p90 rel err | MAE ms | cov50 | cov90 |", "|---|---:|---:|---:|---:|---:|"]
    for r in report.get("rows", []):
        mae = r.get("mae_ms")
        lines.append(f"| {r.get('predictor')} | {pct(r.get('median_rel_err'))} | {pct(r.get('p90_rel_err'))} | "
                     f"{'-' if mae is None else f'{mae:.1f}'} | {pct(r.get('cov50'))} | {pct(r.get('cov90'))} |")
    return "\n".join(lines) + "\n"


def model_card(run: Path, config: dict, cfg, report: dict | None, repo_id: str | None = None) -> str:
    """README.md of the export: the front matter, then pingctl/templates/model_card.md.j2.
    `repo_id`: the Hub repo it is pushed to (the card's name and its loading examples)."""
    from pingctl.train.render import env

    summary = read_summary(run) if has_summary(run) else {}
    a = config["architecture"]
    elapsed = summary.get("elapsed_s")
    origin = data_origin(cfg.train.train_rows)
    values = {
        "name": model_name(run, config, repo_id), "repo_id": repo_id, "run": EX.shown_path(run),
        "steps": steps_label(config["source"]["steps"]), "version": config["pingctl_version"], "a": a,
        "loader": config["loader"], "vocab": config["vocab"], "weights": config["weights"],
        "calibration": bool(config["calibration"]), "hints": bool(cfg.loader.hints_file),
        "combination": bool(config.get("combination")),
        "overrides": ", ".join(f"`{k}={json.dumps(v)}`" for k, v in a["overrides"].items()) or "none",
        "origin": origin, "data": DATASETS[origin or UNKNOWN_ORIGIN],
        "rows_summary": _rows_summary(cfg.train.train_rows),
        "eval_rows": f"`{EX.shown_path(cfg.train.eval_rows)}`" if cfg.train.eval_rows else "none",
        "training": (f"{cfg.train.steps:,} steps configured, last step {_num(summary.get('last_step'))}, batch "
                     f"{cfg.loader.batch_size} x {cfg.loader.seq_len} tokens, learning rate "
                     f"{cfg.train.learning_rate:g}, on {cfg.train.hardware}"
                     + (f", {elapsed / 60:.1f} min" if elapsed else "")),
        "losses": (f"final train loss {_num(summary.get('final_loss'))}, final eval loss "
                   f"{_num(summary.get('final_eval_loss'))}"),
        "loss_table": _loss_table(run), "eval_table": _eval_table(report, config.get("eval_report")),
        "max_ms": f"{MAX_MS:,.0f}",
    }
    return front_matter(run, config, cfg, report, repo_id) + env().get_template(CARD_TEMPLATE).render(**values)
