"""`pingctl train --target slurm`: the rendered script, the job, --status/--follow, requeue and
resume, against a real single-node SLURM (the `slurm_cluster` fixture; skipped with the reason
where it cannot run). Multi-node jobs cannot run here: their script and each worker's JAX
initialisation are checked from fake SLURM environments."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pingctl.artifacts.remote import read_remote, write_remote
from pingctl.artifacts.run import checkpoint_steps
from pingctl.cli.app import app
from pingctl.config import load_config
from pingctl.executor.slurm.job import worker_command
from pingctl.train.worker import slurm_distributed
from tests import test_train as T

runner = CliRunner()
# the train tests' fixtures, under the same names: built once per session (build_once) for both modules
rows = T.rows
first50 = T.first50
# what the fixture's node (2 CPUs) can give a job; the defaults (16 CPUs, 64G) would stay PENDING
SMALL_JOB = ["--set", "train.slurm.cpus_per_task=1", "--set", "train.slurm.mem=1G"]


def _pingctl(*args: str, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pingctl", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_script_requeues_appends_to_the_run_log_and_runs_the_job(rows, tmp_path):
    for nodes in (1, 3):
        run = tmp_path / f"s{nodes}"
        r = runner.invoke(app, [
            "train", str(rows[0]), "--run-dir", str(run), "--target", "slurm", "--dry-run", "--hardware", "gpu",
            "--set", f"train.slurm.nodes={nodes}", "--set", "train.slurm.partition=a100",
            "--set", "train.slurm.account=proj", "--set", "train.slurm.gpus_per_node=4",
            "--set", "train.slurm.time=02:00:00", "--json",
        ])
        assert r.exit_code == 0, r.output
        script = (run / "train.sbatch").read_text()
        assert subprocess.run(["bash", "-n", str(run / "train.sbatch")]).returncode == 0
        lines = script.splitlines()
        for line in ("#SBATCH --partition=a100", "#SBATCH --account=proj", f"#SBATCH --nodes={nodes}",
                     "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=4", "#SBATCH --time=02:00:00",
                     f"#SBATCH --output={run.resolve()}/train.log", "#SBATCH --open-mode=append", "#SBATCH --requeue",
                     f"exec python -m pingctl.executor.slurm.job {run.resolve()}"):
            assert line in lines, line
        assert not any(line.startswith("#SBATCH --error") for line in lines)  # stderr joins the one log
        mt = yaml.safe_load((run / "maxtext.yml").read_text())
        assert mt["hardware"] == "gpu" and mt["skip_jax_distributed_system"] is False
        cfg = load_config(run / "config.yaml")
        cmd = worker_command(cfg, run)
        assert cmd[-3:] == ["-m", "pingctl.train.worker", str(run)]
        assert (cmd[:5] == ["srun", "--label", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1"]) == (nodes == 3)
        assert read_remote(run) is None  # a dry run submits nothing
    r = runner.invoke(app, ["train", str(rows[0]), "--run-dir", str(tmp_path / "x"), "--target", "slurm"],
                      env={"PATH": "/nonexistent"})
    assert r.exit_code == 1 and "sbatch is not on PATH" in r.output


@pytest.mark.parametrize("env, want", [
    # a task of `srun` on three nodes: the first node coordinates, on the job's port
    ({"SLURM_JOB_ID": "4100", "SLURM_STEP_NODELIST": "gpu[003-004,010]", "SLURM_STEP_NUM_TASKS": "3",
      "SLURM_NTASKS": "3", "SLURM_PROCID": "2", "SLURM_LOCALID": "0"}, ("gpu003:61444", 3, 2)),
    ({"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "r[1-2]n[07-08],login", "SLURM_STEP_NUM_TASKS": "4",
      "SLURM_PROCID": "0"}, ("r1n07:61447", 4, 0)),
    ({"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "a,b", "SLURM_NTASKS": "2", "SLURM_PROCID": "1"}, ("a:61447", 2, 1)),
    # the batch script itself (no step variables), a one-task step, no SLURM at all: one process
    ({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "g[1-3]", "SLURM_NTASKS": "3", "SLURM_PROCID": "0"}, None),
    ({"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "g1", "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}, None),
    ({}, None),
])
def test_a_multi_node_task_joins_jax_from_srun_variables(env, want):
    got = slurm_distributed(env)
    if want is None:
        assert got is None
        return
    assert (got["coordinator_address"], got["num_processes"], got["process_id"]) == want
    # JAX's own SLURM detection would give each process only the GPU of its SLURM_LOCALID
    assert got["cluster_detection_method"] == "deactivate"


@pytest.mark.slow
def test_two_workers_join_one_jax_system_from_fake_srun_environments():
    # Two "nodes" on this machine with the variables srun sets: each worker must see both
    # processes' devices, so the per-device batch is the global batch / 2.
    port = next(p for p in range(61440 + os.getpid() % 2000, 65536) if _free(p))  # the job id gives the port
    code = ("from pingctl.train.worker import _job_devices; import jax; "
            "n, platform = _job_devices(); print(n, platform, jax.process_count(), jax.distributed.is_initialized())")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "SLURM_JOB_ID": str(port - 61440), "SLURM_STEP_NODELIST": "localhost",
           "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}
    procs = [subprocess.Popen([sys.executable, "-c", code], env={**env, "SLURM_PROCID": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        assert out.split()[-4:] == ["2", "cpu", "2", "True"], out


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_status_and_follow_need_a_submitted_run(rows, tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    r = runner.invoke(app, ["train", str(local), "--status"])
    assert r.exit_code == 1 and "nothing was submitted" in r.output and "pingctl inspect" in r.output
    r = runner.invoke(app, ["train", str(rows[0]), "--follow"])  # rows, not a run
    assert r.exit_code == 1 and "no remote.json" in r.output
    r = runner.invoke(app, ["train", "--status", "--run-dir", str(tmp_path / "missing")])
    assert r.exit_code == 1 and "no such run directory" in r.output
    # the submitting command with --status added asks about its --run-dir, not its rows
    r = runner.invoke(app, ["train", str(rows[0]), "--run-dir", str(local), "--target", "slurm", "--status"])
    assert r.exit_code == 1 and f"{local}: nothing was submitted" in r.output
    r = runner.invoke(app, ["train", str(local), "--status", "--follow"])
    assert r.exit_code == 2
    (local / "remote.json").write_text("{not json")
    r = runner.invoke(app, ["train", "--status", "--run-dir", str(local)])
    assert r.exit_code == 1 and "remote.json: not JSON" in r.output


def test_follow_ends_with_the_job_and_exits_with_its_success(slurm_cluster, tmp_path):
    c = slurm_cluster
    for name, body, rc in (("ok", "echo step one; sleep 3; echo step two", 0), ("bad", "echo doomed; exit 3", 1)):
        run = tmp_path / name
        run.mkdir()
        job = c.run("sbatch", "--parsable", f"--output={run}/train.log", "--open-mode=append", "--wrap", body).stdout
        write_remote(run, "slurm", job_id=job.strip(), log=str(run / "train.log"))
        r = _pingctl("train", str(run), "--follow", env=c.env, timeout=120)
        assert r.returncode == rc, r.stdout + r.stderr
        assert ("step one" in r.stdout and "step two" in r.stdout) if rc == 0 else "doomed" in r.stdout
        s = json.loads(_pingctl("train", str(run), "--status", "--json", env=c.env).stdout)
        assert (s["state"], s["ok"], s["active"]) == (("COMPLETED", True, False) if rc == 0 else ("FAILED", False, False))
        if rc:
            assert s["exit_code"] == "3:0" and "ended FAILED (exit code 3:0)" in r.stderr


def test_a_run_with_a_job_in_flight_is_not_submitted_twice(slurm_cluster, rows, tmp_path):
    c = slurm_cluster
    run = tmp_path / "run"
    run.mkdir()
    job = c.run("sbatch", "--parsable", "--output=/dev/null", "--wrap", "sleep 60").stdout.strip()
    write_remote(run, "slurm", job_id=job, log=str(run / "train.log"))
    r = _pingctl("train", str(rows[0]), "--run-dir", str(run), "--target", "slurm", env=c.env)
    assert r.returncode == 1 and f"SLURM job {job} is" in r.stderr and f"scancel {job}" in r.stderr
    assert not (run / "config.yaml").exists()  # refused before anything was written
    c.run("scancel", job)


def test_a_requeued_job_resumes_at_its_checkpoint_and_data_position(slurm_cluster, rows, first50, tmp_path):
    """The rendered script, submitted to a real SLURM, trains `tiny`; `scontrol requeue` after
    its first checkpoints kills it, SLURM runs it again, and it resumes there: every step's
    loss equals that of the same run never interrupted (first50)."""
    c = slurm_cluster
    ref, _ = first50
    run = tmp_path / "run"
    args = [*T._with_evals(rows, run), "--steps", "50", "--set", "train.checkpoint_period=5", "--target", "slurm",
            *SMALL_JOB]
    r = T._train(args, env=c.env)
    assert r.returncode == 0, r.stderr[-3000:]
    job = json.loads(r.stdout)["job_id"]
    rec = read_remote(run)
    assert (rec["target"], rec["job_id"], rec["log"]) == ("slurm", job, str(run.resolve() / "train.log"))

    deadline = time.time() + 300
    while 5 not in checkpoint_steps(run):
        assert c.active(job) and time.time() < deadline, (run / "train.log").read_text()[-3000:]
        time.sleep(0.1)
    c.run("scontrol", "requeue", job)
    while True:  # the first run is gone once the job waits (or runs) again as its restart
        info = c.job(job)
        if info.get("Restarts") == "1" and info["JobState"] in ("PENDING", "RUNNING"):
            break
        assert time.time() < deadline, info
        time.sleep(0.1)
    at_kill = checkpoint_steps(run)[-1]
    assert 5 <= at_kill < 49  # killed partway, not after it finished
    s = json.loads(_pingctl("train", str(run), "--status", "--json", env=c.env).stdout)
    assert s["state"] in ("PENDING", "RUNNING") and s["active"] and s["restarts"] == 1
    assert s["last_checkpoint"] == at_kill and s["steps_total"] == 50 and s["summary"] is None

    r = _pingctl("train", str(run), "--follow", env=c.env, timeout=420)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert f"restart 1; resume from {at_kill})" in r.stdout and "training complete at step 49" in r.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from_checkpoint"] == at_kill and summary["last_step"] == 49
    assert summary["slurm_job_id"] == job and summary["slurm_restarts"] == 1
    log = (run / "train.log").read_text()
    assert "stopped by SLURM (SIGTERM)" in log  # the first run's end, in the same log
    want, got = T._losses(ref), T._losses(run)  # the restart's value where both runs logged a step
    assert sorted(got) == list(range(50)) and got == want  # same batches, same updates, across the requeue
    s = json.loads(_pingctl("train", "--status", "--run-dir", str(run), "--json", env=c.env).stdout)
    assert (s["state"], s["ok"], s["last_step"], s["last_checkpoint"]) == ("COMPLETED", True, 49, 49)
    assert s["summary"] == str(run.resolve() / "summary.json")
    # a run trained on SLURM is an ordinary run directory for the local commands
    r = _pingctl("inspect", str(run), "--json", env=c.env)
    assert r.returncode == 0, r.stderr
    assert Path(run / "metrics.jsonl").exists() and Path(run / "loss.png").exists()
