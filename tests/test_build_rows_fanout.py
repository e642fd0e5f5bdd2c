"""`pingctl build-rows --target slurm|modal` (docs/rows.md, "Fanned out"): tasks by hash
partition of the probes, on a real SLURM job array (tests/slurm_cluster.py; two of its tasks
checked to have built at the same time) and on the Modal path with a local directory standing
in for the volume, equal in content to a local build: the same records, byte for byte, for
every probe and destination (the files holding them differ: one set per task)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.config import LoaderConfig, SynthConfig
from pingctl.errors import PingctlError
from pingctl.executor import fanout as driver
from pingctl.executor.slurm import engine as fslurm
from pingctl.executor.modal.engine import DirBoundary, ModalExecutor, ModalSettings
from pingctl.executor.slurm.engine import SlurmExecutor, SlurmSettings
from pingctl.loader.pipeline import make_dataset
from pingctl.records.build import build_rows
from pingctl.records.fanout.work import PART, read_plan, run_task, task_dir, task_states, work_dir
from pingctl.records.fanout.step import BuildRowsFanout
from pingctl.records.layout import decode
from pingctl.synth.generate import generate
from tests.conftest import build_once, shared_root


# small records, so that long histories are cut into several parts on both sides
MB, DST_MB = 0.05, 0.02
SIZES = {"max_row_mb": MB, "dst_max_row_mb": DST_MB}


def dir_boundary(root: Path, fail=None) -> DirBoundary:
    return DirBoundary(root, fail)


def fanout(inputs, out, target, *, dry_run=False, slurm_settings=None, boundary=None, **plan) -> dict:
    """build-rows' step run by the driver on the engine `target`, as `pingctl build-rows --target` does."""
    step = BuildRowsFanout.plan(inputs, out, **plan)
    if target == "slurm":
        executor = SlurmExecutor(slurm_settings or SlurmSettings(job_name="pingctl-build-rows"))
    else:
        executor = ModalExecutor(ModalSettings(app_name="pingctl-build-rows"), boundary)
    return driver.run(step, executor, dry_run=dry_run)


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> Path:
    """A small synthetic split and its local build-rows --by both (the reference)."""
    def build(d: Path) -> None:
        generate(SynthConfig(rows=20_000, probes=14, targets=8, targets_per_probe=4, step=600, seed=5), d / "synth")
        build_rows([d / "synth"], d / "local", by="both", **SIZES)

    return build_once(shared_root(tmp_path_factory) / "rows-fanout", build)


def _records(rows: Path) -> dict[str, list[bytes]]:
    """Probe (or destination) key -> its records' bytes, in part order: what the loader sees,
    whatever the files and record ids."""
    from array_record.python import array_record_module

    manifest = json.loads((rows / "manifest.json").read_text())
    by_key: dict[str, list[tuple[int, bytes]]] = defaultdict(list)
    for name in manifest["files"]:
        reader = array_record_module.ArrayRecordReader(str(rows / name))
        for blob in reader.read_all():
            rec = decode(blob)
            by_key[rec.probe].append((rec.part, blob))
        reader.close()
    return {k: [b for _, b in sorted(v)] for k, v in by_key.items()}


def _by_index(rows: Path) -> dict[str, list[tuple[int, bytes]]]:
    """Destination address -> (first time, record bytes) through the manifest's index."""
    from array_record.python import array_record_module

    manifest = json.loads((rows / "manifest.json").read_text())
    blobs = []
    for name in manifest["files"]:
        reader = array_record_module.ArrayRecordReader(str(rows / name))
        blobs += reader.read_all()
        reader.close()
    return {a: [(t, blobs[rid]) for rid, t in entries] for a, entries in manifest["index"].items()}


TOTALS = ("records", "measurements", "rows_read", "rows_rejected", "rejects_by_reason", "start", "end",
          "layout_version", "max_measurements_per_record", "max_row_mb", "by")


def _assert_same_rows(got: Path, want: Path, by: str) -> None:
    g, w = json.loads((got / "manifest.json").read_text()), json.loads((want / "manifest.json").read_text())
    assert {k: g[k] for k in TOTALS} == {k: w[k] for k in TOTALS}
    # the reference was built where build_once builds (then renamed): its paths differ, not its files
    assert [(x["bytes"], x["sha256"]) for x in g["sources"]] == [(x["bytes"], x["sha256"]) for x in w["sources"]]
    assert g.get("probes") == w.get("probes") and g.get("destination_rows") == w.get("destination_rows")
    assert [len(x) for x in g["record_measurements"]] and sum(map(sum, g["record_measurements"])) == g["measurements"]
    recs = _records(got)
    assert recs == _records(want)
    assert any(len(v) > 1 for v in recs.values())  # some histories span several records
    if by == "both":
        dg, dw = got / "by-destination", want / "by-destination"
        gm, wm = json.loads((dg / "manifest.json").read_text()), json.loads((dw / "manifest.json").read_text())
        assert {k: gm[k] for k in (*TOTALS, "destinations")} == {k: wm[k] for k in (*TOTALS, "destinations")}
        assert _records(dg) == _records(dw)
        assert _by_index(dg) == _by_index(dw)  # the index finds the same records, at the same times


def _cfg(**kw) -> LoaderConfig:
    return LoaderConfig(**{"seq_len": 256, "batch_size": 4, "workers": 0, "shuffle_window": 32, **kw})


# ---------------------------------------------------------------- a real SLURM job array


@pytest.mark.slow  # a real SLURM (the slurm_cluster fixture marks it too)
def test_slurm_job_array_equals_local_and_a_rerun_redoes_only_the_killed_task(slurm_cluster, split, tmp_path,
                                                                               monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
    out = tmp_path / "rows"
    # array task 2 is killed (SIGKILL, as by the OOM killer) before it builds anything, after
    # tasks 0 and 1 started side by side on the node's two CPUs
    s = SlurmSettings(cpus_per_task=1, mem="1G", time="00:10:00",
                      setup='if [ "$SLURM_ARRAY_TASK_ID" = 2 ]; then kill -9 $$; fi')
    with pytest.raises(PingctlError) as e:
        fanout([split / "synth"], out, "slurm", tasks=3, by="both", memory_limit="512MB", slurm_settings=s, **SIZES)
    msg = str(e.value)
    assert "1 of 3 task(s) did not finish" in msg and "task 2:" in msg and "FAILED" in msg, msg
    assert not out.exists()
    work = work_dir(out)
    assert [i for i, why in task_states(work, read_plan(work)).items() if why] == [2]
    first_job = fslurm.earlier_jobs(work)[0]["id"]
    # two tasks ran, and built, at the same time: SLURM's start and end times and the tasks' own
    slurm_cluster.assert_ran_at_once(first_job, {i: task_dir(work, i) / PART for i in (0, 1)})

    r = CliRunner().invoke(app, ["build-rows", str(split / "synth"), "-o", str(out), "--by", "both", "--target",
                                 "slurm", "--tasks", "3", "--memory-limit", "512MB", "--max-row-mb", str(MB), "--dst-max-row-mb", str(DST_MB), "--cpus-per-task", "1", "--mem",
                                 "1G", "--time-limit", "00:10:00", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert (summary["tasks"], summary["tasks_run"], summary["tasks_reused"]) == (3, 1, 2)
    (job,) = summary["jobs"]
    assert job != first_job
    ran = slurm_cluster.run("scontrol", "-o", "show", "job", job).stdout
    assert sorted(w.split("=")[1] for w in ran.split() if w.startswith("ArrayTaskId=")) == ["2"]
    assert not work.exists()
    _assert_same_rows(out, split / "local", "both")
    # the loader reads the fanned-out rows, triangulation contexts included
    batch = next(iter(make_dataset(out, _cfg(triangulation_share=1.0))))
    assert batch["inputs"].shape == (4, 256) and batch["inputs"].any()


# ---------------------------------------------------------------- Modal, a directory for the volume


def test_modal_map_equals_local_and_a_failed_call_is_redone_alone(split, tmp_path):
    ref = tmp_path / "local-source"
    build_rows([split / "synth"], ref, **SIZES)
    out = tmp_path / "rows"
    crash = dir_boundary(tmp_path / "volume", fail=lambda i: RuntimeError("container lost") if i == 2 else None)
    with pytest.raises(PingctlError, match=r"1 of 4 task\(s\) did not finish(.|\n)*task 2: RuntimeError: container lost"):
        fanout([split / "synth"], out, "modal", tasks=4, boundary=crash, **SIZES)
    assert crash.calls == [0, 1, 2, 3] and not out.exists()
    dry = fanout([split / "synth"], out, "modal", tasks=4, dry_run=True, **SIZES)
    assert (dry["tasks_run"], dry["tasks_reused"]) == (1, 3) and "build_rows_task" in dry["modal"]["function"]
    again = dir_boundary(tmp_path / "volume")
    summary = fanout([split / "synth"], out, "modal", tasks=4, boundary=again, **SIZES)
    assert again.calls == [2] and (summary["tasks_run"], summary["tasks_reused"]) == (1, 3)
    assert not (tmp_path / "volume" / "build-rows").exists() or not any((tmp_path / "volume" / "build-rows").iterdir())
    _assert_same_rows(out, ref, "source")
    assert next(iter(make_dataset(out, _cfg())))["inputs"].any()


def test_destination_records_alone_equal_local(split, tmp_path):
    ref = tmp_path / "local-dst"
    build_rows([split / "synth"], ref, by="destination", **SIZES)
    out = tmp_path / "rows"
    fanout([split / "synth"], out, "modal", tasks=2, by="destination", boundary=dir_boundary(tmp_path / "volume"),
           **SIZES)
    _assert_same_rows(out, ref, "destination")
    assert _by_index(out) == _by_index(ref)


def test_merge_refuses_a_changed_record_file_and_the_rerun_redoes_that_task(split, tmp_path):
    out = tmp_path / "rows"
    work = work_dir(out)
    with pytest.raises(PingctlError):  # task 1 fails: the others stay in the work directory
        fanout([split / "synth"], out, "modal", tasks=2,
               boundary=dir_boundary(tmp_path / "volume", fail=lambda i: RuntimeError("x") if i == 1 else None))
    part = next(task_dir(work, 0).glob("*.arrayrecord"))
    data = part.read_bytes()
    part.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    states = task_states(work, read_plan(work))
    assert "sha256" in states[0] or "bytes" in states[0], states
    vol = dir_boundary(tmp_path / "volume")
    fanout([split / "synth"], out, "modal", tasks=2, boundary=vol)
    assert vol.calls == [0, 1]
    assert json.loads((out / "manifest.json").read_text())["measurements"] == \
        json.loads((split / "local" / "manifest.json").read_text())["measurements"]


def test_dry_run_shows_the_plan_and_writes_nothing(split, tmp_path):
    out = tmp_path / "rows"
    r = CliRunner().invoke(app, ["build-rows", str(split / "synth"), "-o", str(out), "--target", "slurm", "--tasks",
                                 "5", "--partition", "cpu", "--dry-run", "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert plan["tasks"] == plan["tasks_run"] == 5 and len(plan["plan"]) == 5
    (script,) = plan["scripts"]
    assert "#SBATCH --array=0-4" in script and "#SBATCH --partition=cpu" in script
    assert "-m pingctl.records.fanout.task" in script
    assert not out.exists() and not work_dir(out).exists()
    r = CliRunner().invoke(app, ["build-rows", str(split / "synth"), "-o", str(out), "--dry-run", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["target"] == "local" and not out.exists()
    r = CliRunner().invoke(app, ["build-rows", str(split / "synth"), "-o", str(out), "--target", "nope"])
    assert r.exit_code == 2


def test_the_task_module_runs_one_task_and_refuses_one_outside_the_plan(split, tmp_path):
    out = tmp_path / "rows"
    from pingctl.records.fanout.work import make_plan, write_plan
    from pingctl.records.fanout.task import main as task_main

    work = work_dir(out)
    write_plan(work, make_plan([split / "synth" / p.name for p in sorted((split / "synth").glob("*.parquet"))], out,
                               "source", 2, 8.0, None, "512MB", None))
    with pytest.raises(PingctlError, match="task 5 is not in"):
        run_task(work, 5)
    assert task_main([str(work), "5"]) == 1 and task_main([str(work)]) == 2
    assert task_main([str(work), "0"]) == 0 and (task_dir(work, 0) / "part.json").is_file()


def test_modal_app_builds_offline():
    pytest.importorskip("modal")
    from pingctl.executor.modal.engine import build_app

    app, fn, volume = build_app(ModalSettings(app_name="pingctl-build-rows", volume="v"), BuildRowsFanout.task_ref,
                                BuildRowsFanout.function)
    assert app.name == "pingctl-build-rows" and "build_rows_task" in str(fn) and volume is not None
