import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from pingctl.cli.app import app

runner = CliRunner()
HEAVY = ("jax", "maxtext", "grain", "pyarrow", "duckdb", "numpy", "orjson")


def _all_commands(typer_app: typer.Typer, prefix=()):
    group = typer.main.get_group(typer_app)

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            if path:  # a group below the root (config, bench) is a command too
                yield path
            for name, sub in subs.items():
                yield from walk(sub, path + (name,))
        else:
            yield path

    yield from walk(group, prefix)


def test_startup_imports_nothing_heavy():
    code = "import sys, pingctl.cli.app; print(','.join(m for m in %r if m in sys.modules))" % (HEAVY,)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_help_lists_every_command_with_a_summary():
    # Start-up speed itself is measured in docs/benchmarks.md; the import check above guards it.
    r = runner.invoke(app, ["--help"], terminal_width=200)
    for name in ("ingest", "synth", "shard", "inspect", "config", "bench"):
        line = next(line for line in r.output.splitlines() if f" {name} " in line)
        assert len(line.split(name, 1)[1].strip(" │")) > 10, line


@pytest.mark.parametrize("path", list(_all_commands(app)), ids=" ".join)
def test_every_command_help_has_an_example(path):
    r = runner.invoke(app, [*path, "--help"], terminal_width=200)
    assert r.exit_code == 0
    assert "Example:" in r.output, path
