"""Where the code of an engine, a fan-out and a run's hints lives (docs/architecture.md): one home
per engine, one shape per fanned-out step, one rule for a model directory's hints.

The entry points are run as the scripts run them (`python -m MODULE`, real subprocesses), since a
module that moved but is still named by its old path in a SLURM script fails only on the cluster."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pingctl.artifacts.run import CONFIG, HINTS, MAXTEXT_YML, hints_path, read_config_doc, write_config
from pingctl.config import Config
from pingctl.errors import PingctlError
from pingctl.fanout.step import task_function
from pingctl.ingest.fanout.step import IngestFanout
from pingctl.records.fanout.step import BuildRowsFanout

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "pingctl"


def _imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_only_the_modal_engine_s_home_imports_the_modal_sdk():
    """Everything that speaks to Modal (the image, the app, the container, the volume, the pull)
    is in pingctl/executor/modal/, nowhere else."""
    users = sorted(str(p.relative_to(ROOT)) for p in PKG.rglob("*.py")
                   if any(m == "modal" or m.startswith("modal.") for m in _imports_of(p)))
    assert users, "no module imports modal: the scan is broken"
    outside = [u for u in users if not u.startswith("pingctl/executor/modal/")]
    assert not outside, f"the Modal SDK imported outside pingctl/executor/modal/: {outside}"
    assert not any(p.name.startswith(("modal", "slurm")) for p in (PKG / "train").glob("*.py"))


@pytest.mark.parametrize("step", [IngestFanout, BuildRowsFanout])
def test_both_fanned_out_steps_have_one_shape(step):
    """A fanned-out step is a `fanout` subpackage of its command's package holding `step`, `task`
    and `work`, its task module `<package>.fanout.task` and its task function in `work`."""
    package = step.__module__.rsplit(".", 1)[0]
    assert package.endswith(".fanout"), step.__module__
    here = PKG.parent.joinpath(*package.split("."))
    assert {"__init__.py", "step.py", "task.py", "work.py"} <= {p.name for p in here.glob("*.py")}
    assert step.task_module == f"{package}.task"
    assert step.task_ref == f"{package}.work:run_task"
    assert callable(task_function(step.task_ref))


def _template_modules() -> set[str]:
    found = set()
    for t in (PKG / "templates").glob("*.j2"):
        found |= set(re.findall(r"python -m (pingctl(?:\.[a-z_]+)+)", t.read_text()))
    return found


@pytest.mark.parametrize("module", sorted({IngestFanout.task_module, BuildRowsFanout.task_module} | _template_modules()))
def test_each_entry_point_a_script_runs_exists_and_names_itself(module):
    """`python -m MODULE` without arguments: usage (exit 2) naming MODULE itself, never an
    ImportError (exit 1) or a usage line with a path that no longer exists."""
    r = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"usage: python -m {module} " in r.stderr, r.stderr


def test_the_training_job_entry_point_is_the_slurm_engine_s():
    assert "pingctl.executor.slurm.job" in _template_modules()


def _model_dir(tmp_path: Path, hints_file: str | None) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    cfg = Config()
    hinted = {"hints_file": hints_file, "triangulation_share": 0.5} if hints_file else {}
    cfg = cfg.model_copy(update={"loader": cfg.loader.model_copy(update=hinted)})
    write_config(run / CONFIG, cfg)
    (run / MAXTEXT_YML).write_text("run_name: run\n")
    return run


def test_hints_path_is_the_one_rule(tmp_path):
    """Trained without hints: None, even with a stray hints.npz there; trained with them: the copy
    beside the config; trained with them and the copy gone: refused, naming the file to restore."""
    run = _model_dir(tmp_path, None)
    (run / HINTS).write_bytes(b"left over")
    assert hints_path(run) is None
    shutil.rmtree(run)
    run = _model_dir(tmp_path, "/elsewhere/h.npz")
    with pytest.raises(PingctlError, match=re.escape(f"holds no {HINTS}")) as e:
        hints_path(run)
    assert str(run / HINTS) in str(e.value) and "/elsewhere/h.npz" in str(e.value)
    (run / HINTS).write_bytes(b"x")
    assert hints_path(run) == run / HINTS


@pytest.mark.slow
def test_export_refuses_a_hinted_run_that_lost_its_copy(tiny_run, tmp_path):
    """`pingctl export` of a run whose config says it trained with hints but whose hints.npz is
    gone: exit 1 naming the file, before anything is restored or written (an export of it would
    name hints it does not hold, and every answer from it would then fail)."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns(".light"))
    doc = read_config_doc(run / CONFIG)
    doc["loader"].update(hints_file=str(tmp_path / "gone.npz"), triangulation_share=0.5)
    write_config(run / CONFIG, doc)
    (run / HINTS).unlink(missing_ok=True)
    out = tmp_path / "export"
    r = subprocess.run([sys.executable, "-m", "pingctl", "export", str(run), "-o", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"holds no {HINTS}" in r.stdout + r.stderr and "Traceback" not in r.stderr
    assert not out.exists()
