from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

# Input generation time depends on the machine's load, not on the code: on CI's 2 shared cores
# (or beside a training run) Hypothesis's too_slow health check failed a metrics test that
# draws 12 small tuples. Time limits are not what these property tests check.
settings.register_profile("pingctl", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("pingctl")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
RIPE_DIR = SHARED / "data" / "ripe-atlas"


def pytest_configure(config):
    """A suite started in the background by a non-interactive shell (`cmd &`, nohup) inherits
    SIGINT ignored, and Python then never raises KeyboardInterrupt, in this process or in the
    `pingctl` children it starts: the Ctrl-C tests would fail for the launch, not the code.
    Give Ctrl-C its usual meaning here; exec resets a handled signal to default in children."""
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# Fixtures that train a model (~30 s each, built once per session by whichever worker asks first).
TRAINED = {"tiny_run", "first50", "tri_run"}
# A test that uses one of these is in the slow tier (`-m slow`; the default `./run test` deselects
# it, CI's .ci/run runs both tiers): a trained model, a real SLURM cluster. Marked here by the
# fixture, so a new test that needs one is slow without anyone remembering to mark it; tests slow
# for another reason (training in a subprocess, a Modal container's code) carry the mark themselves.
SLOW_FIXTURES = TRAINED | {"slurm_cluster"}
# Slow tests of files whose owners have not marked them yet (each trains, or fills a disk, for
# 15-200 s): the mark belongs in their file, as `@pytest.mark.slow`; listed here until it is.
SLOW_TESTS = {
    "tests/test_scripts.py::test_heldout_script_end_to_end_and_rerun",
    "tests/test_faults.py::test_train_on_a_full_disk_exits_1_and_inspect_names_the_leftover_temp_checkpoint",
    "tests/test_faults.py::test_a_full_disk_is_an_environment_error_naming_the_path",
    "tests/test_faults.py::test_a_killed_loader_takes_its_grain_workers_with_it",
}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the marks
def pytest_collection_modifyitems(config, items):
    """Mark the tests that need a slow fixture; then tests that need a trained model go last:
    pytest-xdist hands each worker a contiguous part of the list, so one worker trains while the
    other still has model-free tests to run, instead of both reaching a model test at once and
    one waiting on the other's lock."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) or item.nodeid.split("[")[0] in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: bool(TRAINED & set(getattr(item, "fixturenames", ()))))


@pytest.fixture
def ripe_files() -> list[Path]:
    files = sorted(RIPE_DIR.glob("*.jsonl.bz2"))
    if not files:
        pytest.skip("../shared/data/ripe-atlas is not present")
    return files


def make_table(n: int = 2000, probes: int = 20, targets: int = 5, seed: int = 0, v6_every: int = 0, prb: bool = True):
    """A small valid canonical table: each probe pings each target, one row per minute."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    i = np.arange(n)
    p = i % probes
    tgt = (i // probes) % targets
    v6 = (i % v6_every == 0) if v6_every else np.zeros(n, bool)
    src = np.where(v6, [f"2a00:{k:x}::1" for k in p], [f"193.0.{k}.1" for k in p])
    dst = np.where(v6, [f"2600:{k:x}::8" for k in tgt], [f"8.8.{k}.8" for k in tgt])
    t0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    rtt = rng.uniform(1, 200, n)
    rtt[rng.random(n) < 0.05] = -1.0
    cols = {
        "msm_id": (1000 + tgt).astype(np.int64),
        "event_time": pa.array([t0 + dt.timedelta(seconds=60 * int(k)) for k in i], pa.timestamp("us", tz="UTC")),
        "src_addr": src.tolist(),
        "dst_addr": dst.tolist(),
        "ip_version": np.where(v6, 6, 4).astype(np.int64),
        "rtt": rtt,
        "size": np.full(n, 48, np.int64),
        "packet_error_count": np.zeros(n, np.int64),
    }
    if prb:
        cols["prb_id"] = (10_000 + p).astype(np.int64)
    return pa.table(cols)


def shared_root(tmp_path_factory) -> Path:
    """One folder for the whole test session: with pytest-xdist each worker has its own basetemp,
    and their common parent is this session's; without it, the basetemp itself."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def build_once(path: Path, build) -> Path:
    """`build(tmp)` once per session however many workers ask: the first builds under a file lock
    into a temp sibling and renames it into place, the others wait and reuse it. A worker killed
    mid-build leaves only the temp, which the next one clears."""
    from filelock import FileLock

    with FileLock(str(path) + ".lock"):
        if not path.exists():
            tmp = path.with_name(path.name + ".partial")
            shutil.rmtree(tmp, ignore_errors=True)
            build(tmp)
            tmp.rename(path)
    return path


@pytest.fixture(scope="session")
def synth_rows(tmp_path_factory):
    """A small synthetic world -> rows (train split): shared by loader/train/sample/eval tests,
    and read-only for them (each derived output has its own build_once)."""
    from pingctl.config import SynthConfig
    from pingctl.records.build import build_rows
    from pingctl.synth.generate import generate

    def build(d: Path) -> None:
        generate(SynthConfig(rows=60_000, probes=24, targets=12, targets_per_probe=6, step=600, seed=3), d / "synth")
        build_rows([d / "synth"], d / "rows")

    return build_once(shared_root(tmp_path_factory) / "synthrows", build)


@pytest.fixture(scope="session")
def tiny_run(synth_rows):
    """A tiny model trained for a few steps on the synthetic rows (for sample/eval tests)."""
    import subprocess
    import sys

    pytest.importorskip("maxtext")

    def train(run: Path) -> None:
        proc = subprocess.run(
            [sys.executable, "-m", "pingctl", "train", str(synth_rows / "rows"), "--run-dir", str(run), "--steps", "60",
             "--set", "loader.seq_len=256", "--set", "loader.batch_size=8", "--set", "train.learning_rate=0.01",
             "--set", "train.checkpoint_period=100", "--json"],
            capture_output=True, text=True,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        # the light engine's converted checkpoints, written now (under the lock): a test that
        # copies the run never meets one being written
        from pingctl.artifacts.run import checkpoint_steps
        from pingctl.infer.engines.weights import run_tensors

        for step in checkpoint_steps(run):
            run_tensors(run, step)

    return build_once(synth_rows / "tiny-run", train)


@pytest.fixture(scope="session")
def pair(synth_rows):
    """One IPv4 (src, dst) pair of the synthetic world, to ask the tiny model about."""
    import pyarrow.parquet as pq

    t = pq.read_table(synth_rows / "synth" / "part-00000.parquet", columns=["src_addr", "dst_addr", "ip_version"])
    row = t.filter(t.column("ip_version").to_numpy() == 4).slice(0, 1).to_pylist()[0]
    return row["src_addr"], row["dst_addr"]


@pytest.fixture(scope="session")
def time_split(synth_rows):
    """The synthetic world split by time (train/val/test): for the eval tests and the train tests' rows."""
    from pingctl.config import ShardConfig
    from pingctl.shard import shard

    return build_once(synth_rows / "timesplit", lambda d: shard([synth_rows / "synth"], d, ShardConfig(strategy="time")))


@pytest.fixture(scope="session")
def ripe_table(tmp_path_factory) -> Path:
    """The shared real RIPE Atlas samples as one canonical table (`pingctl ingest`, ~15 s once
    per session; ~400k rows), read-only for its users; skipped when ../shared is absent."""
    files = sorted(RIPE_DIR.glob("*.jsonl.bz2"))
    if not files:
        pytest.skip("../shared/data/ripe-atlas is not present")
    from pingctl.config import IngestConfig
    from pingctl.ingest.core import ingest

    return build_once(shared_root(tmp_path_factory) / "ripe-table", lambda d: ingest(files, d, IngestConfig()))


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real single-node SLURM (tests/slurm_cluster.py): `.env` (os.environ plus SLURM_CONF, for
    sbatch/squeue/scontrol) and `.dir`. Private to this worker (own ports, munge key, state), so
    pytest-xdist workers never share or wait; installed with apt-get when missing (root).
    Skipped with the reason where it cannot run; with PINGCTL_REQUIRE_SLURM=1 (CI) that fails."""
    from tests import slurm_cluster as sc

    try:
        cluster = sc.start()
    except sc.Unavailable as e:
        if os.environ.get(sc.REQUIRE) == "1":
            pytest.fail(f"{sc.REQUIRE}=1 but no SLURM: {e}")
        pytest.skip(f"no SLURM on this machine: {e}")
    yield cluster
    cluster.stop()
