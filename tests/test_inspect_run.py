"""`pingctl inspect RUN`: a run directory described from its files (no JAX)."""

import json
import shutil

import yaml
from typer.testing import CliRunner

from pingctl.cli.app import app

runner = CliRunner()


def test_inspect_describes_a_run_and_its_state(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    summary = json.loads((run / "summary.json").read_text())
    r = runner.invoke(app, ["inspect", str(run), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    steps, seq, batch = cfg["train"]["steps"], cfg["loader"]["seq_len"], cfg["loader"]["batch_size"]
    assert d["kind"] == "run" and d["complete"] and d["last_step"] == steps - 1
    assert d["tokens_seen"] == steps * seq * batch
    assert d["checkpoints"] == summary["checkpoints"] and d["uncommitted_checkpoints"] == []
    assert d["parameters"] == summary["parameters"] and d["preset"] == summary["preset"]
    assert d["train_loss_last"] is not None and d["train_loss_window"] == min(20, steps)
    assert d["input_wait_s"] == summary["input_wait_s"] > 0  # read from the worker's file, summary or not
    # an interrupted save: the step directory is there, its commit marker is not
    last = d["checkpoints"][-1]
    (run / "maxtext" / "checkpoints" / str(last) / "commit_success.txt").unlink()
    (run / "summary.json").unlink()
    d2 = json.loads(runner.invoke(app, ["inspect", str(run), "--json"]).stdout)
    assert d2["checkpoints"] == d["checkpoints"][:-1] and d2["uncommitted_checkpoints"] == [last]
    assert not d2["complete"] and d2["input_wait_s"] == d["input_wait_s"]
    text = runner.invoke(app, ["inspect", str(run)], terminal_width=200)
    assert text.exit_code == 0 and "incomplete" in text.output and f"uncommitted, ignored: {last}" in text.output
    bad = runner.invoke(app, ["inspect", str(run), "--sample", "3"])
    assert bad.exit_code == 2 and "not of a run directory" in bad.output


def test_inspect_reads_the_metrics_from_the_tensorboard_events(tiny_run, tmp_path):
    # the events are the source (also of SLURM and Modal runs, which have no train.log here):
    # without metrics.jsonl and train.log, inspect describes the run as before
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    before = json.loads(runner.invoke(app, ["inspect", str(run), "--json"]).stdout)
    (run / "metrics.jsonl").unlink()
    (run / "train.log").unlink()
    r = runner.invoke(app, ["inspect", str(run), "--json"])
    assert r.exit_code == 0, r.output
    after = json.loads(r.stdout)
    assert after["last_step"] == before["last_step"] == 59 and after["complete"]
    assert after["train_loss_last"] == before["train_loss_last"] is not None
