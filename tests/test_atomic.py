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
