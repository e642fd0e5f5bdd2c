"""A command that needs an extra of pyproject.toml says which, in one line, before it reads or
writes anything, and prints the pip command that adds that extra to this install (pingctl is
not on PyPI: the wheel or clone it came from). Here in-process, with the extra's modules
hidden; tests/test_wheel.py runs the same commands in fresh installs without the extras."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pingctl import errors
from pingctl.cli.app import app

runner = CliRunner()


def _hide(monkeypatch, modules) -> None:
    """Make the check see `modules` (top-level names) as not installed."""
    tops = {m.split(".")[0] for m in modules}
    real = errors._importable
    monkeypatch.setattr(errors, "_importable", lambda m: m.split(".")[0] not in tops and real(m))


CASES = {
    "train": ["train", "{x}", "--run-dir", "{out}", "--steps", "2"],
    "train --target modal": ["train", "{x}", "--run-dir", "{out}", "--target", "modal", "--dry-run"],
    "fetch": ["fetch", "1", "--start", "2024-01-01", "--stop", "2024-01-02", "-o", "{out}"],
    "ingest": ["ingest", "{x}", "-o", "{out}"],
    "build-rows": ["build-rows", "{x}", "-o", "{out}"],
    "pull": ["pull", "{out}"],
    "eval": ["eval", "{x}", "--train", "{x}", "--test", "{x}", "-o", "{out}"],
    "sample --plot": ["sample", "{x}", "--src", "1.2.3.4", "--dst", "5.6.7.8", "--plot", "{out}"],
    "export --push-to-hub": ["export", "{x}", "-o", "{out}", "--push-to-hub", "owner/name"],
}


def test_every_command_needing_an_extra_is_checked_here():
    assert set(CASES) == set(errors.COMMAND_NEEDS)


@pytest.mark.parametrize("command", sorted(CASES))
def test_a_command_without_its_extra_says_which_in_one_line_and_writes_nothing(command, tmp_path, monkeypatch):
    extra, modules = errors.COMMAND_NEEDS[command]
    _hide(monkeypatch, modules)
    (tmp_path / "x").mkdir()
    out = tmp_path / "out.png"
    args = [a.format(x=tmp_path / "x", out=out) for a in CASES[command]]
    r = runner.invoke(app, args)
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert r.exit_code == 1 and len(lines) == 1, r.output
    assert lines[0].startswith(f"error: pingctl {command} needs the [{extra}] extra"), lines
    assert "pip install " in lines[0] and f"[{extra}]" in lines[0].split("pip install ", 1)[1], lines
    assert not out.exists()
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["error"]["kind"] == "input"


def test_fetch_names_the_package_to_install_not_its_module(monkeypatch):
    _hide(monkeypatch, ["ripe"])
    with pytest.raises(errors.PingctlError, match=r"needs the \[data\] extra, which this install lacks "
                                                  r"\(ripe-atlas-cousteau\)"):
        errors.require_command("fetch")
    said = errors.missing_extra(ModuleNotFoundError("No module named 'ripe'", name="ripe.atlas.cousteau"))
    assert "needs ripe-atlas-cousteau, from the [data] extra" in said
    said = errors.missing_extra(ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib"))
    assert "needs matplotlib, from the [plot] extra" in said


class _Dist:
    def __init__(self, direct):
        self.direct = direct

    def read_text(self, name):
        assert name == "direct_url.json"
        return None if self.direct is None else json.dumps(self.direct)


@pytest.mark.parametrize("direct, line", [
    (None, "pip install 'pingctl[train]'"),
    ({"url": "file:///w/dist/pingctl-0.1.0-py3-none-any.whl", "archive_info": {}},
     "pip install 'pingctl[train] @ file:///w/dist/pingctl-0.1.0-py3-none-any.whl'"),
    ({"url": "file:///home/a%20b/pingctl", "dir_info": {"editable": True}}, "pip install -e '/home/a b/pingctl[train]'"),
    ({"url": "file:///src/pingctl", "dir_info": {}}, "pip install '/src/pingctl[train]'"),
    ({"url": "https://example.org/pingctl.git", "vcs_info": {"vcs": "git", "requested_revision": "v1",
                                                              "commit_id": "abc"}},
     "pip install 'pingctl[train] @ git+https://example.org/pingctl.git@v1'"),
])
def test_the_install_line_is_the_one_this_install_came_from(direct, line, monkeypatch):
    from importlib import metadata

    monkeypatch.setattr(metadata, "distribution", lambda name: _Dist(direct))
    assert errors.install_line("train") == line


def test_a_plot_from_python_without_matplotlib_names_the_plot_extra(monkeypatch):
    """`Model.rtt(...).plot()` draws through infer.plots: without matplotlib, the [plot] extra is
    named instead of an ImportError."""
    import numpy as np

    from pingctl.infer.plots import distribution_figure
    from pingctl.infer.queries import RttDistribution

    _hide(monkeypatch, ["matplotlib"])
    d = RttDistribution(0.1, np.arange(2, dtype=np.uint16), np.array([1.0, 2.0]), np.array([0.5, 0.5]))
    with pytest.raises(errors.PingctlError, match=r"needs the \[plot\] extra, which this install lacks \(matplotlib\)"):
        distribution_figure(d, "a -> b")
