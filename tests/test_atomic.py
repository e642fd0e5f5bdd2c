"""Output paths: what pingctl refuses to replace, and errors that name the path."""

import os
import stat

import pytest
from typer.testing import CliRunner

from pingctl.atomic import atomic_dir, atomic_file, check_replaceable
from pingctl.cli.app import app
from pingctl.errors import PingctlError

runner = CliRunner()


def test_special_files_are_never_replaced_even_with_force(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(PingctlError, match="not a regular file or directory"):
        check_replaceable(fifo, force=True)
    for ctx in (atomic_dir, atomic_file):
        with pytest.raises(PingctlError, match="not a regular file or directory"):
            with ctx(fifo):
                pass
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["fifo"]  # no temp sibling left behind


def test_cli_refuses_a_fifo_output_with_force(tmp_path):
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    r = runner.invoke(app, ["synth", "-o", str(fifo), "--rows", "100", "--force"])
    assert r.exit_code == 1 and "not a regular file or directory" in r.output
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_unwritable_output_locations_are_clear_errors(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(PingctlError, match="afile is a file, not a directory"):
        check_replaceable(f / "out")
    with pytest.raises(PingctlError, match="afile is a file, not a directory"):
        with atomic_file(f / "sub" / "x.json"):
            pass
    (tmp_path / "d").mkdir()
    with pytest.raises(PingctlError, match="is a directory; give a file name"):
        with atomic_file(tmp_path / "d"):
            pass
    r = runner.invoke(app, ["config", "init", str(tmp_path / "d"), "--force"])
    assert r.exit_code == 1 and "is a directory" in r.output and "internal error" not in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "d"]


@pytest.mark.parametrize("name", [".", "", "..", "/"])
def test_an_output_without_a_name_is_a_usage_error_in_every_command(tmp_path, monkeypatch, name):
    """`-o .` once ended in "PosixPath('.') has an empty name" (an internal error) after a
    `..tmp-*` directory was made beside the working directory."""
    from typer.testing import CliRunner

    from pingctl.cli.app import app
    from tests.conftest import make_table

    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    import pyarrow.parquet as pq

    pq.write_table(make_table(200), tmp_path / "in" / "t.parquet")
    for cmd in (["synth", "--rows", "1000"], ["shard", "in"], ["build-rows", "in"]):
        r = CliRunner().invoke(app, [*cmd, "-o", name])
        assert r.exit_code == 2 and "is not a valid output" in r.output, (cmd, name, r.output)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_a_manifest_json_pingctl_did_not_write_marks_nothing_as_a_pingctl_output(tmp_path):
    """Any manifest.json once counted: ingest skipped the user data beside a download tool's
    manifest, and an output command would have replaced that directory without --force."""
    import json

    from pingctl.atomic import is_pingctl_output
    from pingctl.ingest.core import resolve

    theirs = tmp_path / "data" / "sub"
    theirs.mkdir(parents=True)
    (theirs / "manifest.json").write_text(json.dumps({"downloaded_by": "atlas-tool"}))
    (theirs / "b.jsonl").write_text("{}\n")
    (tmp_path / "data" / "a.jsonl").write_text("{}\n")
    assert not is_pingctl_output(theirs)
    assert sorted(f.name for f in resolve([tmp_path / "data"])) == ["a.jsonl", "b.jsonl", "manifest.json"]
    with pytest.raises(PingctlError, match="did not write"):
        check_replaceable(theirs)
    (theirs / "manifest.json").write_text(json.dumps({"pingctl_version": "0.1.0"}))
    assert is_pingctl_output(theirs) and [f.name for f in resolve([tmp_path / "data"])] == ["a.jsonl"]


def test_a_killed_runs_temp_is_swept_by_the_next_run_and_nothing_else(tmp_path):
    """SIGKILL (or the OOM killer) runs no cleanup: its `.OUT.tmp-*` stayed forever. The next
    run on the same host removes it; a live run's, another host's, an owner-less one stay."""
    import signal
    import subprocess
    import sys

    from pingctl.atomic import _owner

    out = tmp_path / "out"
    code = ("import os, signal, sys\nfrom pathlib import Path\nfrom pingctl.atomic import atomic_dir\n"
            "with atomic_dir(Path(sys.argv[1])) as tmp:\n"
            "    (tmp / 'part.parquet').write_bytes(b'x' * 1000)\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(out)])
    assert p.wait() == -signal.SIGKILL
    (killed,) = [e for e in tmp_path.iterdir() if e.name.startswith(".out.tmp-")]
    assert str(p.pid) in killed.name and not out.exists()
    host = _owner().rsplit("-", 1)[0]
    live = tmp_path / f".out.tmp-{host}-{os.getppid()}-abc"  # a running process of this host
    other = tmp_path / f".out.tmp-otherhost-{p.pid}-abc"  # maybe running, on another node
    ownerless = tmp_path / ".out.tmp-x1y2z3"  # written before temp names carried an owner
    old = tmp_path / f".out.old-{host}-{p.pid}"  # the only complete copy while `out` is missing
    for d in (live, other, ownerless, old):
        d.mkdir()
    with atomic_dir(out) as tmp:
        (tmp / "a").write_text("done")
    assert not killed.exists() and (out / "a").read_text() == "done"
    assert live.exists() and other.exists() and ownerless.exists() and old.exists()
    with atomic_dir(out) as tmp:  # `out` exists now: a dead run's `old` sibling is garbage
        (tmp / "a").write_text("again")
    assert not old.exists() and live.exists() and (out / "a").read_text() == "again"
