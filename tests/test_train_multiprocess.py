"""Two JAX processes train the model one process trains: `pingctl train --processes 2` on this
machine's CPUs, the path a multi-node SLURM job takes from `jax.distributed` on (each process
joins in pingctl.train.worker.distributed, reads every second element of the one shuffled order,
and loads half of every global batch).

The slow tests compare a one-process run with a two-process run of the same seed and global
batch. With one row per loader element and no window shuffle (the settings below) the two
layouts' global batches hold the same rows, so they train the same model up to the order of
float32 sums; with several rows per element or a window shuffle each process packs and mixes
its own elements, and the batches differ by design (docs/train.md, "On N nodes of M GPUs")."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.config import LoaderConfig
from pingctl.loader.pipeline import make_dataset
from pingctl.train import local
from pingctl.train import metrics as M
from pingctl.train.worker import TRACE_ROWS_ENV, distributed, moved_state

BATCH = 8
STEPS = 10
# one row per element and no window shuffle: the layouts' global batches hold the same rows
SAME_BATCHES = ["--set", "loader.rows_per_element=1", "--set", "loader.shuffle_window=1"]
TINY = ["--preset", "tiny", "--set", "loader.seq_len=128", "--set", f"loader.batch_size={BATCH}",
        "--set", "train.learning_rate=0.01", "--set", "train.eval_interval=-1", "--set", "train.checkpoint_period=100",
        *SAME_BATCHES]
# Float32 tolerances. The first step's loss is one mean over the batch's <= 8 x 128 target tokens:
# the two layouts sum them in another order (each process its half, then across processes), and
# reordering a float32 sum of n terms moves it by about log2(n) ulps (XLA sums in trees), ~1e-6 of
# the loss here: 1e-5 leaves a margin. Later steps carry the first step's rounding through Adam's
# updates (each bounded by the learning rate), so they may drift further: 1e-4 over ten steps.
FIRST_RTOL, LATER_RTOL = 1e-5, 1e-4
runner = CliRunner()


def _rows_cfg(**kw) -> LoaderConfig:
    return LoaderConfig(seq_len=128, batch_size=BATCH, rows_per_element=1, shuffle_window=1, workers=0, **kw)


def test_two_shards_pack_exactly_the_rows_of_the_one_process_batches(synth_rows):
    # process i of 2 loads half of each global batch: together, token for token, the batch one
    # process loads (each element keeps the RNG of its place in the one shuffled order)
    rows = synth_rows / "rows"
    one = iter(make_dataset(rows, _rows_cfg(), row_ids=True))
    two = [iter(make_dataset(rows, _rows_cfg(), shard_index=i, shard_count=2, batch_size=BATCH // 2, row_ids=True))
           for i in range(2)]
    for _ in range(3):
        whole, halves = next(one), [next(it) for it in two]
        ids = np.concatenate([h["row_ids"] for h in halves])
        assert sorted(ids) == sorted(whole["row_ids"]) and len(set(ids)) == BATCH
        at = {r: i for i, r in enumerate(whole["row_ids"].tolist())}
        order = [at[r] for r in ids.tolist()]
        for key in ("inputs", "inputs_position", "inputs_segmentation", "targets_segmentation"):
            np.testing.assert_array_equal(whole[key][order], np.concatenate([h[key] for h in halves]), err_msg=key)


def _fresh(window: bool) -> dict:
    flat = {"parent": {"next_index": 0}, "next_index_in_buffer": 0}
    return {"parent_window_start_state": flat, "window_index": 0, "pos_in_window": 0} if window else flat


def _at(next_index: int, in_buffer: int, window: bool = False) -> dict:
    flat = {"parent": {"next_index": next_index}, "next_index_in_buffer": in_buffer}
    return {"parent_window_start_state": flat, "window_index": 3, "pos_in_window": 5} if window else flat


def test_a_data_position_moves_between_process_counts_without_skipping_a_row():
    # one row per element: after 12 rows each, two processes have read elements 0..23 whole; one
    # process goes on at 24, and back to two processes, 12 each (exact, as the slow test shows)
    two = [_at(11, 1), _at(11, 1)]
    assert moved_state(two, _fresh(False), 0, 1, 1)["parent"]["next_index"] == 24
    one = [_at(23, 1)]
    assert [moved_state(one, _fresh(False), q, 2, 1)["parent"]["next_index"] for q in (0, 1)] == [12, 12]
    # elements of up to 4 rows: process 0 had read 2 rows of element 10 (its 6th), process 1
    # element 13 (its 7th) whole; element 10 is the position, so its first rows and element 13
    # are read again, and none is skipped: three processes go on at elements 10, 11, 12
    moved = [moved_state([_at(5, 2), _at(6, 4)], _fresh(False), q, 3, 4) for q in range(3)]
    assert [m["parent"]["next_index"] for m in moved] == [4, 3, 3]  # 0 + 3*4, 1 + 3*3, 2 + 3*3
    assert all(m["next_index_in_buffer"] == 0 for m in moved)
    # a window shuffle: the window's start counts, as its rows are read again; the window starts over
    w = moved_state([_at(7, 1, True)], _fresh(True), 1, 2, 1)
    assert w["parent_window_start_state"]["parent"]["next_index"] == 4 and w["pos_in_window"] == 0
    with pytest.raises(Exception, match="loader.workers"):
        moved_state([{"workers_state": {}}], _fresh(False), 0, 1, 1, "RUN/iter")


def test_the_local_launcher_and_srun_give_jax_the_same_arguments():
    local = distributed({"PINGCTL_COORDINATOR": "127.0.0.1:5000", "PINGCTL_PROCESSES": "2", "PINGCTL_PROCESS_ID": "1"})
    assert local == {"coordinator_address": "127.0.0.1:5000", "num_processes": 2, "process_id": 1,
                     "cluster_detection_method": "deactivate"}
    srun = distributed({"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "a,b", "SLURM_NTASKS": "2", "SLURM_PROCID": "1"})
    assert srun["coordinator_address"] == "a:61447" and srun["num_processes"] == 2
    assert distributed({"PINGCTL_PROCESSES": "1"}) is None and distributed({}) is None


def test_a_failed_process_ends_the_run_and_is_the_one_reported(tmp_path):
    # a process whose sibling died would wait for it in the next collective (or the join's 300 s):
    # following the workers ends when one fails, the rest are stopped, the failed one is named
    log = tmp_path / "train.log"
    log.write_text("")
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]),
             subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])]
    t0 = time.monotonic()
    try:
        local._follow(log, 0, procs, M.LogParser(), None)
        local._stop(procs)
    finally:
        for p in procs:
            p.kill()
    assert time.monotonic() - t0 < 30 and procs[0].returncode is not None
    assert local._failed(procs) == 1 and procs[1].returncode == 3


def test_processes_are_refused_off_the_local_cpu_and_with_an_uneven_batch(synth_rows, tmp_path):
    rows = str(synth_rows / "rows")
    for args in (["--target", "slurm"], ["--hardware", "gpu"]):
        r = runner.invoke(app, ["train", rows, "--run-dir", str(tmp_path / "r"), "--processes", "2", *args])
        assert r.exit_code == 2 and "train.processes" in r.output, r.output
    r = runner.invoke(app, ["train", rows, "--run-dir", str(tmp_path / "r"), "--processes", "3",
                            "--set", "loader.batch_size=8"])
    assert r.exit_code == 2 and "not divisible by train.processes 3" in r.output, r.output
    assert not (tmp_path / "r").exists()  # refused before the run directory is made


def _train(rows: Path, run: Path, trace: Path, processes: int, steps: int) -> dict:
    trace.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "pingctl", "train", str(rows), "--run-dir", str(run), "--steps", str(steps),
                        "--processes", str(processes), *TINY, "--json"], capture_output=True, text=True, timeout=900,
                       env={**os.environ, TRACE_ROWS_ENV: str(trace)})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def _losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in M.read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"}


def _batches(trace: Path, process: int) -> list[list[int]]:
    return [list(map(int, line.split())) for line in (trace / f"rows-{process}.txt").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(synth_rows, tmp_path_factory):
    """{processes: run directory}, each trained STEPS steps from the same seed, its rows traced."""
    d = tmp_path_factory.mktemp("layouts")
    return {n: (_train(synth_rows / "rows", d / f"run{n}", d / f"trace{n}", n, STEPS), d / f"run{n}", d / f"trace{n}")
            for n in (1, 2)}


@pytest.mark.slow
def test_two_processes_read_disjoint_halves_of_the_one_process_batches(runs):
    one, two = runs[1][2], runs[2][2]
    whole, halves = _batches(one, 0), [_batches(two, p) for p in (0, 1)]
    assert len(whole) == len(halves[0]) == len(halves[1]) == STEPS  # one batch a step, none read ahead
    assert all(len(b) == BATCH // 2 for h in halves for b in h)
    first, second = ({r for b in h for r in b} for h in halves)
    assert not first & second  # disjoint
    assert first | second == {r for b in whole for r in b} and len(first | second) == STEPS * BATCH  # complete
    for step in range(STEPS):  # and step by step: the same global batch
        assert sorted(halves[0][step] + halves[1][step]) == sorted(whole[step]), step
    assert (runs[2][1] / "train.1.log").read_text().count("completed step") == STEPS  # process 1 logs apart


@pytest.mark.slow
def test_two_processes_train_the_one_process_losses(runs):
    (s1, run1, _), (s2, run2, _) = runs[1], runs[2]
    one, two = _losses(run1), _losses(run2)
    assert sorted(one) == sorted(two) == list(range(STEPS))
    assert two[0] == pytest.approx(one[0], rel=FIRST_RTOL)
    for step in range(1, STEPS):
        assert two[step] == pytest.approx(one[step], rel=LATER_RTOL), step
    assert one[STEPS - 1] < one[0] - 1.0  # and it trained: the same model learning, not two constants
    assert s2["checkpoints"] == s1["checkpoints"] == [0, STEPS - 1]


@pytest.mark.slow
def test_a_checkpoint_moves_between_one_and_two_processes(runs, synth_rows, tmp_path):
    # each layout's last checkpoint goes on for one step in the other layout: the same parameters
    # and the same data position, so both read the one-process loader's next batch and agree
    rows = synth_rows / "rows"
    nxt = iter(make_dataset(rows, _rows_cfg(), row_ids=True))
    for _ in range(STEPS):
        next(nxt)
    want = sorted(next(nxt)["row_ids"].tolist())
    losses = {}
    for saved, resumed in ((2, 1), (1, 2)):
        run = tmp_path / f"from{saved}"
        shutil.copytree(runs[saved][1], run)
        s = _train(rows, run, tmp_path / f"trace{saved}to{resumed}", resumed, STEPS + 1)
        assert s["resumed_from_checkpoint"] == STEPS - 1 and s["first_step_this_run"] == s["last_step"] == STEPS
        read = [r for p in range(resumed) for b in _batches(tmp_path / f"trace{saved}to{resumed}", p) for r in b]
        assert sorted(read) == want, (saved, resumed)
        assert f"data position of {saved} process(es) moved" in (run / "train.log").read_text()
        losses[saved] = _losses(run)[STEPS]
    assert losses[2] == pytest.approx(losses[1], rel=LATER_RTOL)
