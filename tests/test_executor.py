"""One executor interface (pingctl.executor): an engine added by a test — one class, one
registry line, no other module touched — runs ingest's and build-rows' fan-out and takes a
training submission, through the CLI, as SLURM and Modal do."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from pingctl.artifacts.remote import read_remote, write_remote
from pingctl.cli.app import app
from pingctl.config import IngestConfig
from pingctl.errors import UsageError
from pingctl.executor import registry
from pingctl.executor.base import Executor
from pingctl.ingest.core import ingest
from pingctl.train.local import prepare_run
from tests.test_ingest_fanout import _assert_same_output, _cut


class Queue(Executor):
    """A batch system that runs each task as its own process (`python -m TASK_MODULE WORK
    INDEX`, what a cluster's task would run); task 1 fails on the first attempt of each step."""

    name = "queue"
    calls: list[tuple[str, int]] = []
    failed_once: set[str] = set()

    def run(self, step, todo, say, on_progress=None):
        for i in todo:
            type(self).calls.append((step.command, i))
            if i == 1 and step.command not in self.failed_once:
                type(self).failed_once.add(step.command)
                continue  # "killed" before it ran: the driver must name it and a rerun redo it
            proc = subprocess.run([sys.executable, "-m", step.task_module, str(step.work), str(i)],
                                  capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr
            self.jobs.append(f"q{i}")
        return {}

    def task_state(self, step, index):
        return "LOST, never started"

    def submit(self, cfg, run, *, fresh=False, dry_run=False, **options):
        run = prepare_run(cfg, run, fresh, dry_run)
        rec = write_remote(run, self.name, job_id="q-train-1", log=str(run / "train.log"))
        return {"target": self.name, "run_dir": str(run), "job_id": rec["job_id"], "show": [],
                "summary": {"job id": rec["job_id"]}}

    def status(self, run):
        rec = read_remote(run)
        return {"target": self.name, "run_dir": str(run), "job_id": rec["job_id"], "state": "QUEUED", "ok": None}


@pytest.fixture
def queue():
    Queue.calls, Queue.failed_once = [], set()
    registry.register("queue", Queue)
    yield Queue
    registry.unregister("queue")


def _cli(*args: str) -> dict:
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_a_registered_engine_runs_ingest_fanned_out_and_a_rerun_redoes_only_the_failed_task(queue, tmp_path):
    dumps = _cut(tmp_path / "dumps", 3, lines_per_piece=1000)
    out = tmp_path / "ingest"
    r = CliRunner().invoke(app, ["ingest", str(dumps), "-o", str(out), "--target", "queue"])
    assert r.exit_code == 1 and "1 of 3 task(s) did not finish" in r.output
    assert "task 1 (" in r.output and "LOST, never started" in r.output and not out.exists()
    s = _cli("ingest", str(dumps), "-o", str(out), "--target", "queue")
    assert (s["target"], s["tasks"], s["tasks_run"], s["tasks_reused"], s["jobs"]) == ("queue", 3, 1, 2, ["q1"])
    assert queue.calls == [("ingest", 0), ("ingest", 1), ("ingest", 2), ("ingest", 1)]
    ref = tmp_path / "ref"
    ingest([dumps], ref, IngestConfig(workers=1))
    _assert_same_output(out, ref)
    dry = _cli("ingest", str(dumps), "-o", str(tmp_path / "again"), "--target", "queue", "--dry-run")
    assert dry["tasks_run"] == 3 and dry["target"] == "queue"


@pytest.mark.slow
def test_a_registered_engine_runs_build_rows_fanned_out(queue, synth_rows, tmp_path):
    out = tmp_path / "rows"
    r = CliRunner().invoke(app, ["build-rows", str(synth_rows / "synth"), "-o", str(out), "--target", "queue",
                                 "--tasks", "3"])
    assert r.exit_code == 1 and "task 1:" in r.output
    s = _cli("build-rows", str(synth_rows / "synth"), "-o", str(out), "--target", "queue", "--tasks", "3")
    assert (s["tasks_run"], s["tasks_reused"]) == (1, 2)
    local = json.loads((synth_rows / "rows" / "manifest.json").read_text())
    got = json.loads((out / "manifest.json").read_text())
    assert (got["measurements"], got["probes"]) == (local["measurements"], local["probes"])


def test_a_registered_engine_takes_a_training_submission_and_reports_it(queue, synth_rows, tmp_path):
    run = tmp_path / "run"
    s = _cli("train", str(synth_rows / "rows"), "--run-dir", str(run), "--target", "queue", "--steps", "5")
    assert s["target"] == "queue" and s["job_id"] == "q-train-1"
    assert (run / "config.yaml").is_file() and read_remote(run)["target"] == "queue"
    st = _cli("train", str(run), "--status")
    assert (st["state"], st["job_id"]) == ("QUEUED", "q-train-1")


def test_an_unknown_engine_is_a_usage_error_naming_the_known_ones(tmp_path):
    with pytest.raises(UsageError, match="choose local, modal, slurm"):
        registry.get("ray")
    r = CliRunner().invoke(app, ["train", str(tmp_path), "--target", "ray"])
    assert r.exit_code == 2 and "local, modal, slurm" in r.output
