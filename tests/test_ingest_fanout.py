"""`pingctl ingest --target slurm|modal`: one task per input file, then one merge.

The shared RIPE Atlas samples are cut into 4 files (zstd, gzip, plain, bzip2) and ingested as a
real SLURM job array (tests/slurm_cluster.py; its tasks run two at a time, and the test checks
by SLURM's times and the tasks' own that two did ingest at once) and through the Modal path
with a local directory standing in for the volume; both must give the output a local ingest
gives, byte for byte. A task
that fails is redone by the rerun, and only it; the merge refuses a part that is not what its
task wrote.
"""

from __future__ import annotations

import bz2
import gzip
import itertools
import json
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import zstandard
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.config import IngestConfig
from pingctl.errors import PingctlError, UsageError
from pingctl.executor import fanout as driver
from pingctl.executor.slurm import engine as fslurm
from pingctl.executor.modal.engine import DirBoundary, ModalExecutor, ModalSettings, remote_name
from pingctl.executor.slurm.engine import SlurmExecutor, SlurmSettings
from pingctl.ingest.core import ingest
from pingctl.ingest.fanout.step import IngestFanout
from pingctl.ingest.fanout.task import main as task_main
from pingctl.ingest.fanout.work import (TASK_MANIFEST, make_plan, merge, run_task, task_dir, task_states, work_dir,
                                        write_plan)
from pingctl.ingest.parse import Options
from tests.conftest import RIPE_DIR, make_table

CUTS = 4


def fanout(inputs, out, cfg, target, *, force=False, dry_run=False, slurm_settings=None, modal_settings=None,
           boundary=None, on_event=None) -> dict:
    """The ingest's step run by the driver on the engine `target`, as `pingctl ingest --target` does."""
    step = IngestFanout.plan(inputs, out, cfg, force, engine=target)
    if target == "slurm":
        executor = SlurmExecutor(slurm_settings or SlurmSettings(job_name="pingctl-ingest"))
    else:
        executor = ModalExecutor(modal_settings or ModalSettings(app_name="pingctl-ingest"), boundary)
    return driver.run(step, executor, dry_run=dry_run, on_event=on_event)


def _cut(dest: Path, pieces: int, lines_per_piece: int | None = None) -> Path:
    """The shared samples' results cut into `pieces` files of consecutive lines, as hourly dumps
    are: zstd, gzip, plain JSON lines and bzip2 in turn."""
    sources = sorted(RIPE_DIR.glob("*.jsonl.bz2"))
    if not sources:
        pytest.skip("../shared/data/ripe-atlas is not present")
    lines = []
    for f in sources:
        with bz2.open(f, "rb") as fh:
            if lines_per_piece:  # only the first lines: no need to decompress everything
                lines.extend(itertools.islice(fh, pieces * lines_per_piece - len(lines)))
            else:
                lines.extend(fh.read().splitlines(keepends=True))
    per = lines_per_piece or -(-len(lines) // pieces)
    dest.mkdir(parents=True)
    for k in range(pieces):
        data = b"".join(lines[k * per:(k + 1) * per])
        if k % 4 == 0:
            (dest / f"ping-{k:02d}.jsonl.zst").write_bytes(zstandard.ZstdCompressor(level=1).compress(data))
        elif k % 4 == 1:
            (dest / f"ping-{k:02d}.jsonl.gz").write_bytes(gzip.compress(data, compresslevel=1))
        elif k % 4 == 2:
            (dest / f"ping-{k:02d}.jsonl").write_bytes(data)
        else:  # RIPE's own format: a task decodes its blocks with indexed_bzip2 on its CPUs
            (dest / f"ping-{k:02d}.jsonl.bz2").write_bytes(bz2.compress(data, compresslevel=1))
    return dest


@pytest.fixture(scope="module")
def cut(tmp_path_factory) -> Path:
    return _cut(tmp_path_factory.mktemp("fanout") / "dumps", CUTS)


@pytest.fixture(scope="module")
def small_cut(tmp_path_factory) -> Path:
    return _cut(tmp_path_factory.mktemp("fanout-small") / "dumps", 3, lines_per_piece=1500)


@pytest.fixture(scope="module")
def local_ref(cut, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fanout-ref") / "local"
    ingest([cut], out, IngestConfig(workers=1))
    return out


def _sorted_table(out: Path):
    t = pq.read_table(sorted(out.glob("part-*.parquet")))
    keys = [(c, "ascending") for c in ("msm_id", "prb_id", "event_time", "src_addr", "dst_addr", "rtt", "size")]
    return t.sort_by(keys)


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _assert_same_output(out: Path, ref: Path) -> None:
    got, want = _manifest(out), _manifest(ref)
    assert got["counts"] == want["counts"]
    c = got["counts"]
    assert c["records"] == c["results_written"] + c["summary_only"] + c["filtered_total"] + c["rejected_total"]
    assert [i["path"] for i in got["inputs"]] == [i["path"] for i in want["inputs"]]
    assert got == want  # inputs' sha256s, parts, config: nothing differs
    assert _sorted_table(out).equals(_sorted_table(ref))
    assert (out / "rejects.jsonl").read_bytes() == (ref / "rejects.jsonl").read_bytes()
    for part in want["data_files"]:  # the parts too, byte for byte
        assert (out / part).read_bytes() == (ref / part).read_bytes(), part


# ---------------------------------------------------------------- a real SLURM job array


@pytest.mark.slow  # a real SLURM (the slurm_cluster fixture marks it too)
def test_slurm_job_array_equals_local_and_a_rerun_redoes_only_the_killed_task(slurm_cluster, cut, local_ref,
                                                                               tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
    out = tmp_path / "ingest"
    # array task 3 is killed (SIGKILL, as by the OOM killer or a node failure) before it ingests
    s = SlurmSettings(cpus_per_task=1, mem="512M", time="00:10:00",
                      setup='if [ "$SLURM_ARRAY_TASK_ID" = 3 ]; then kill -9 $$; fi')
    events: list[str] = []
    with pytest.raises(PingctlError) as e:
        fanout([cut], out, IngestConfig(), "slurm", slurm_settings=s, on_event=events.append)
    msg = str(e.value)
    assert "1 of 4 task(s) did not finish" in msg and "task 3 (" in msg and "ping-03.jsonl" in msg
    assert "FAILED" in msg and "run the same command again" in msg, msg
    assert not out.exists()  # nothing published
    work = work_dir(out)
    plan = json.loads((work / "plan.json").read_text())
    states = task_states(work, plan)
    assert [i for i, why in states.items() if why] == [3]
    first_job = fslurm.earlier_jobs(work)[0]["id"]
    # at least two tasks ran, and ingested, at the same time: SLURM's start and end times and
    # the tasks' own (the output below is then the merge of tasks that really overlapped)
    slurm_cluster.assert_ran_at_once(first_job, {i: task_dir(work, i) / TASK_MANIFEST
                                                 for i in range(CUTS) if i != 3})

    # the rerun, through the CLI: one array task, for task 3
    r = CliRunner().invoke(app, ["ingest", str(cut), "-o", str(out), "--target", "slurm", "--cpus-per-task", "1",
                                 "--mem", "512M", "--time-limit", "00:10:00", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert (summary["tasks"], summary["tasks_run"], summary["tasks_reused"]) == (CUTS, 1, CUTS - 1)
    (job,) = summary["jobs"]
    assert job != first_job
    ran = slurm_cluster.run("scontrol", "-o", "show", "job", job).stdout
    assert sorted(w.split("=")[1] for w in ran.split() if w.startswith("ArrayTaskId=")) == ["3"]
    assert not work.exists()  # merged: the work directory is gone
    _assert_same_output(out, local_ref)
    assert summary["rows"] == _manifest(local_ref)["counts"]["rows"]


def test_slurm_dry_run_prints_the_array_script_and_writes_nothing(cut, tmp_path):
    out = tmp_path / "ingest"
    r = CliRunner().invoke(app, ["ingest", str(cut), "-o", str(out), "--target", "slurm", "--dry-run", "--partition",
                                 "cpu", "--max-parallel", "3", "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert (plan["tasks"], plan["tasks_run"], plan["tasks_reused"]) == (CUTS, CUTS, 0)
    assert plan["input_bytes"] == sum(f.stat().st_size for f in cut.iterdir())
    (script,) = plan["scripts"]
    assert "#SBATCH --array=0-3%3" in script and "#SBATCH --partition=cpu" in script
    assert "-m pingctl.ingest.fanout.task" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert not out.exists() and not work_dir(out).exists()
    r = CliRunner().invoke(app, ["ingest", str(cut), "-o", str(out), "--target", "slurm", "--dry-run"])
    assert r.exit_code == 0 and "#SBATCH --array=0-3" in r.stdout and "to run" in r.stdout


def test_array_specs_and_batches_of_many_inputs(tmp_path):
    assert fslurm.array_spec([8, 0, 1, 2, 5, 7]) == "0-2,5,7-8"
    assert fslurm.array_spec([4], 2) == "4%2"
    todo = list(range(0, 2500, 3))
    groups = fslurm.batches(todo)
    assert [off for off, _ in groups] == [0, 1000, 2000]
    assert sorted(off + i for off, ids in groups for i in ids) == todo
    assert all(0 <= i < fslurm.ARRAY_MAX for _, ids in groups for i in ids)
    step = IngestFanout({"out": str(tmp_path / "o"), "tasks": []}, tmp_path / "w", tmp_path / "o")
    text = fslurm.render(step, SlurmSettings(), 1000, groups[1][1])
    assert '"$((SLURM_ARRAY_TASK_ID + 1000))"' in text and "-m pingctl.ingest.fanout.task" in text


def test_slurm_refuses_a_pipe_and_a_path_with_spaces(tmp_path):
    f = tmp_path / "a.jsonl"
    f.write_text("")
    with pytest.raises(UsageError, match="pipe or device"):
        fanout(["/dev/stdin"], tmp_path / "o", IngestConfig(), "slurm", dry_run=True)
    with pytest.raises(UsageError, match="without spaces"):
        fanout([f], tmp_path / "my out", IngestConfig(), "slurm", dry_run=True)
    r = CliRunner().invoke(app, ["ingest", str(f), "-o", str(tmp_path / "o"), "--target", "cloud"])
    assert r.exit_code == 2


# ---------------------------------------------------------------- the Modal path, volume stood in for


def test_modal_map_with_a_directory_for_the_volume_equals_local(cut, local_ref, tmp_path):
    vol = DirBoundary(tmp_path / "volume")
    out = tmp_path / "ingest"
    s = fanout([cut], out, IngestConfig(), "modal", boundary=vol)
    assert sorted(vol.calls) == list(range(CUTS)) and s["tasks_run"] == CUTS
    _assert_same_output(out, local_ref)
    # the work directory on the volume and the local one are gone once merged
    assert not (tmp_path / "volume" / "ingest" / remote_name(out)).exists() and not work_dir(out).exists()


def test_modal_failed_call_and_changed_input_are_redone_and_nothing_else(small_cut, tmp_path):
    small_cut = Path(shutil.copytree(small_cut, tmp_path / "dumps"))  # one of its files changes below
    out = tmp_path / "ingest"
    crash = DirBoundary(tmp_path / "volume", fail=lambda i: RuntimeError("container lost") if i == 1 else None)
    with pytest.raises(PingctlError, match=r"task 1 \(.*ping-01.jsonl.gz\): RuntimeError: container lost"):
        fanout([small_cut], out, IngestConfig(), "modal", boundary=crash)
    assert not out.exists()
    dry = fanout([small_cut], out, IngestConfig(), "modal", dry_run=True, modal_settings=ModalSettings())
    assert (dry["tasks_run"], dry["tasks_reused"]) == (1, 2)
    assert "ingest_task" in dry["modal"]["function"]
    # an input that changes after its task ran is redone too: its task key names its size and mtime
    plain = small_cut / "ping-02.jsonl"
    plain.write_bytes(plain.read_bytes() + plain.read_bytes().splitlines(keepends=True)[0])
    again = DirBoundary(tmp_path / "volume")
    s = fanout([small_cut], out, IngestConfig(), "modal", boundary=again)
    assert sorted(again.calls) == [1, 2] and (s["tasks_run"], s["tasks_reused"]) == (2, 1)
    ref = tmp_path / "ref"
    ingest([small_cut], ref, IngestConfig(workers=1))
    _assert_same_output(out, ref)


def test_options_changed_since_the_tasks_ran_redo_every_task(small_cut, tmp_path):
    out = tmp_path / "ingest"
    work = work_dir(out)
    files = sorted(small_cut.iterdir())
    cfg = IngestConfig()
    write_plan(work, make_plan(files, out, cfg, Options.from_config(cfg)))
    for i in range(len(files)):
        run_task(work, i)
    six = IngestConfig(af=6)
    states = task_states(work, make_plan(files, out, six, Options.from_config(six)))
    assert all(why and "another plan" in why for why in states.values())


# ---------------------------------------------------------------- the merge's checks


def _tasks_done(small_cut: Path, out: Path) -> Path:
    files = sorted(small_cut.iterdir())
    work = work_dir(out)
    cfg = IngestConfig()
    write_plan(work, make_plan(files, out, cfg, Options.from_config(cfg)))
    for i in range(len(files)):
        assert task_main([str(work), str(i)]) == 0
    return work


def _flip_a_byte(part: Path, rec: dict) -> None:
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))


def _cut_short(part: Path, rec: dict) -> None:
    part.write_bytes(part.read_bytes()[:-100])


def _other_rows_recorded_as_its_own(part: Path, rec: dict) -> None:
    # a valid canonical part with other rows, size and sha256 updated as if the task wrote it
    from pingctl.fanout.work import describe
    from pingctl.schema.parquet import to_canonical

    pq.write_table(to_canonical(make_table(100)), part)
    rec["part_file"] = describe(part)


@pytest.mark.parametrize("damage,expected", [
    (_flip_a_byte, r"part-00001.parquet: sha256 \w+\.\.\. differs"),
    (_cut_short, r"part-00001.parquet has \d+ bytes, task.json recorded \d+"),
    (_other_rows_recorded_as_its_own, r"part-00001.parquet has 100 rows, task.json counts \d+"),
])
def test_merge_refuses_a_corrupt_part_and_the_rerun_redoes_that_task(small_cut, tmp_path, damage, expected):
    out = tmp_path / "ingest"
    work = _tasks_done(small_cut, out)
    d = task_dir(work, 1)
    rec = json.loads((d / TASK_MANIFEST).read_text())
    damage(d / "part-00001.parquet", rec)
    (d / TASK_MANIFEST).write_text(json.dumps(rec))
    with pytest.raises(PingctlError, match=expected) as e:
        merge(work, out)
    assert "cannot merge" in str(e.value) and "task 1 (" in str(e.value) and "task 0" not in str(e.value)
    assert not out.exists() and (work / "plan.json").exists()
    vol = DirBoundary(tmp_path / "volume")
    s = fanout([small_cut], out, IngestConfig(), "modal", boundary=vol)
    assert vol.calls == [1] and s["tasks_reused"] == 2
    ref = tmp_path / "ref"
    ingest([small_cut], ref, IngestConfig(workers=1))
    _assert_same_output(out, ref)


def test_a_task_whose_input_went_away_fails_with_its_name(small_cut, tmp_path):
    out = tmp_path / "ingest"
    files = sorted(small_cut.iterdir())
    work = work_dir(out)
    copy = tmp_path / "gone.jsonl"
    shutil.copyfile(files[2], copy)
    cfg = IngestConfig()
    write_plan(work, make_plan([copy], out, cfg, Options.from_config(cfg)))
    copy.unlink()
    with pytest.raises(PingctlError, match="task 0 cannot read .*gone.jsonl"):
        run_task(work, 0)
    assert task_main([str(work), "0"]) == 1 and task_main([str(work)]) == 2
    assert not task_dir(work, 0).exists()


def test_modal_app_builds_offline():
    pytest.importorskip("modal")
    from pingctl.executor.modal.engine import build_app

    app, fn, volume = build_app(ModalSettings(app_name="pingctl-ingest-test", volume="v"), IngestFanout.task_ref,
                                IngestFanout.function)
    assert app.name == "pingctl-ingest-test" and fn is not None and volume is not None


def test_modal_without_credentials_or_with_a_modal_error_is_exit_1_and_writes_nothing(small_cut, tmp_path,
                                                                                       monkeypatch):
    modal = pytest.importorskip("modal")
    monkeypatch.delenv("MODAL_TOKEN_ID", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.modal.toml
    out = tmp_path / "ingest"
    r = CliRunner().invoke(app, ["ingest", str(small_cut), "-o", str(out), "--target", "modal"])
    assert r.exit_code == 1 and "no Modal credentials" in r.output
    assert not work_dir(out).exists()

    class Unknown(DirBoundary):
        def upload(self, files):
            raise modal.exception.NotFoundError("Volume 'nope' not found")

    with pytest.raises(PingctlError, match="Modal: NotFoundError: Volume 'nope' not found"):
        fanout([small_cut], out, IngestConfig(), "modal", boundary=Unknown(tmp_path / "volume"))
