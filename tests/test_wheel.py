"""pingctl installs as an ordinary package: a wheel built from a copy of the source tree, put
in a fresh virtual environment outside the tree, runs its commands and renders SLURM and Modal
runs that name no path of the source tree.

Nothing is downloaded: the wheel is built without build isolation (this environment's
setuptools), installed with --no-deps, and the fresh environment sees the heavy dependencies
through a .pth line naming this environment's site-packages. Python adds such a line to
sys.path as a plain directory without processing the .pth files inside it, so the editable
install of the source checkout found there stays invisible.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.tolerance import model_log_tol, prob_tol

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
SKIP = {".venv", ".git", "runs", "out", "__pycache__", ".pytest_cache", ".hypothesis"}


def _source_files() -> list[str]:
    """The tree's files as a checkout has them (tracked or new, not ignored), else a walk."""
    if (REPO / ".git").exists() and shutil.which("git"):
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=REPO, capture_output=True, check=True).stdout.decode()
        return sorted(f for f in set(out.split("\0")) if f and (REPO / f).is_file())
    files = []
    for root, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP and not d.endswith(".egg-info")]
        files += [str(Path(root, n).relative_to(REPO)) for n in names]
    return sorted(files)


def _env(venv: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV"}}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["JAX_PLATFORMS"] = "cpu"
    return env


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory) -> Path:
    """pingctl's wheel, built from a copy of the source tree."""
    base = tmp_path_factory.mktemp("wheel")
    assert not base.resolve().is_relative_to(REPO.resolve())
    src = base / "src"
    for f in _source_files():
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, src / f)
    wheels = base / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "--quiet", "-w", str(wheels), str(src)], check=True, capture_output=True)
    (wheel,) = wheels.glob("pingctl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"pingctl/templates/maxtext.yml.j2", "pingctl/templates/sbatch.sh.j2", "pingctl/data/cities.csv"} <= set(names)
    assert not [n for n in names if n.split("/")[0] in {"tests", "templates", "scripts", "docs"}]
    return wheel


def _venv_with(wheel: Path, venv: Path, deps) -> Path:
    """A fresh venv at `venv` holding only pingctl's wheel, its dependencies seen through a .pth
    file pointing at `deps` (nothing downloaded): its site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                    "--quiet", str(wheel)], check=True, capture_output=True)
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "pingctl-test-deps.pth").write_text(str(deps) + "\n")
    return site


@pytest.fixture(scope="module")
def installed(tmp_path_factory, built_wheel):
    """(venv, work dir, env): pingctl's wheel in a fresh venv, and an empty dir to run it in."""
    base = tmp_path_factory.mktemp("installed")
    wheel = built_wheel
    venv = base / "venv"
    site = _venv_with(wheel, venv, sysconfig.get_paths()["purelib"])
    work = base / "work"
    work.mkdir()
    return venv, site, work, _env(venv)


def _run(installed, *args, ok=True):
    venv, _, work, env = installed
    exe = args[0] if args[0] == "python" else "pingctl"
    argv = [str(venv / "bin" / exe), *(args[1:] if exe == "python" else args)]
    r = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    if ok:
        assert r.returncode == 0, f"{argv}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def test_the_wheel_installs_and_renders_runs_without_the_source_tree(installed):
    venv, site, work, _ = installed
    repo = {str(REPO), str(REPO.resolve())}
    probe = (
        "import importlib.metadata as m, importlib.resources as r, json, pingctl; "
        "print(json.dumps({'file': pingctl.__file__, 'dist': str(m.distribution('pingctl').locate_file('')), "
        "'template': r.files('pingctl').joinpath('templates/sbatch.sh.j2').is_file()}))"
    )
    where = json.loads(_run(installed, "python", "-c", probe).stdout)
    assert Path(where["file"]).resolve().is_relative_to(site.resolve()), where
    assert Path(where["dist"]).resolve() == site.resolve() and where["template"], where

    assert _run(installed, "--version").stdout.strip().endswith(__import__("pingctl").__version__)
    _run(installed, "config", "init", "my.yaml")
    assert (work / "my.yaml").is_file()

    # The smallest world worth training on, made by the installed pingctl (its data files included).
    _run(installed, "synth", "-o", "synth", "--rows", "3000", "--probes", "6", "--targets", "4",
         "--targets-per-probe", "3", "--seed", "1")
    _run(installed, "build-rows", "synth", "-o", "rows")

    r = _run(installed, "train", "rows", "--run-dir", "slurm-run", "--target", "slurm", "--dry-run", "-c", "my.yaml")
    script = (work / "slurm-run" / "train.sbatch").read_text()
    maxtext = (work / "slurm-run" / "maxtext.yml").read_text()
    assert f"source {venv}/bin/activate" in script and f"cd {(work / 'slurm-run').resolve()}" in script
    assert "python -m pingctl.executor.slurm.job" in script and "export JAX_PLATFORMS=cpu" in script
    # one CPU process: MaxText must not try to join a distributed system it has no launcher for
    assert "skip_jax_distributed_system: true" in maxtext.splitlines()
    for text in (script, maxtext, r.stdout):
        assert not [p for p in repo if p in text], text

    r = _run(installed, "train", "rows", "--run-dir", "modal-run", "--target", "modal", "--dry-run", "-c", "my.yaml",
             "--json")
    res = json.loads(r.stdout)
    assert res["run_dir"] == f"/data/runs/{res['name']}" and res["name"].startswith("modal-run-")
    assert str(site.resolve() / "pingctl") in res["modal"]["source"] and "jax[cuda12]" in res["modal"]["image"]
    staged = (work / "modal-run" / "modal" / "maxtext.yml").read_text() + (work / "modal-run" / "modal" / "config.yaml").read_text()
    for text in (staged, r.stdout):
        assert not [p for p in repo if p in text], text


# ----------------------------------------------------------------- the answering install

HEAVY = ("maxtext", "tokamax", "xprof", "flax", "orbax")


def _closure(requirements: list[str], extras: set[str]) -> dict:
    """name -> installed distribution of every requirement (with the given extras) and, in
    turn, of theirs: what `pip install` of those requirements would bring."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: dict = {}
    stack = [r for r in map(Requirement, requirements)
             if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras | {""})]
    while stack:
        req = stack.pop()
        name = canonicalize_name(req.name)
        dist, had = seen.get(name, (None, None))
        want = set(req.extras) | (had or set())
        if had is not None and want == had:
            continue
        dist = dist or metadata.distribution(req.name)
        seen[name] = (dist, want)
        for r in map(Requirement, dist.requires or []):
            if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in want | {""}):
                stack.append(r)
    return {k: d for k, (d, _) in seen.items()}


def _requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist lines, checked to offer the `infer` extra."""
    import email

    meta = email.message_from_bytes(zipfile.ZipFile(wheel).read(
        next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA"))))
    assert "infer" in meta.get_all("Provides-Extra")
    return meta.get_all("Requires-Dist")


def _install_view(wheel: Path, base: Path, dists: dict):
    """(venv, work dir, env, MB): the wheel in a fresh venv at base/venv that sees only `dists`
    (symlinked from this environment), and their size on disk."""
    view = base / "deps"
    view.mkdir()
    size = 0
    for d in dists.values():
        for f in d.files or []:
            top = Path(f).parts[0]
            src = Path(d.locate_file(top))
            if top in ("..", "bin") or not src.exists():
                continue
            if not (view / top).exists():
                (view / top).symlink_to(src)
            try:
                size += Path(d.locate_file(f)).stat().st_size
            except OSError:
                pass
    small = base / "venv"
    _venv_with(wheel, small, view)
    work = base / "work"
    work.mkdir()
    return small, work, _env(small), size / 1e6


@pytest.fixture(scope="module")
def answering(tmp_path_factory, built_wheel):
    """(venv, work dir, env, MB, distributions): the wheel in a fresh venv that sees only the
    distributions `pip install 'pingctl[infer]'` would bring (symlinked from this environment),
    and their size on disk."""
    dists = _closure(_requirements(built_wheel), {"infer"})
    return (*_install_view(built_wheel, tmp_path_factory.mktemp("answering"), dists), sorted(dists))


@pytest.fixture(scope="module")
def base_install(tmp_path_factory, built_wheel):
    """As `answering`, for `pip install pingctl`: the base dependencies alone, no JAX."""
    dists = _closure(_requirements(built_wheel), set())
    return (*_install_view(built_wheel, tmp_path_factory.mktemp("base"), dists), sorted(dists))


@pytest.fixture(scope="module")
def tiny_export(tiny_run, tmp_path_factory):
    from typer.testing import CliRunner

    from pingctl.cli.app import app

    export = tmp_path_factory.mktemp("export") / "tiny"
    r = CliRunner().invoke(app, ["export", str(tiny_run), "-o", str(export)])
    assert r.exit_code == 0, r.output
    return export


def _sample_json(export: Path, pair, *, venv: Path | None = None, work: Path | None = None, env=None) -> dict:
    """`pingctl sample EXPORT --src A --dst B --json` here (in-process) or in the venv given."""
    args = ["sample", str(export), "--src", pair[0], "--dst", pair[1], "--json"]
    if venv is None:
        from typer.testing import CliRunner

        from pingctl.cli.app import app

        r = CliRunner().invoke(app, args, env={"PINGCTL_ENGINE": "light"})
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)
    r = subprocess.run([str(venv / "bin" / "pingctl"), *args], cwd=work, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def _p_fail_tol(export: Path, pair, p_fail: float) -> float:
    """float32's bound on P(failure) between two engines or installs (tests/tolerance.py): the
    ratio of two log-probabilities' exponentials (failure against RttStart)."""
    import numpy as np

    from pingctl.infer import queries as Q
    from pingctl.infer.model import LoadedModel

    prompt = np.append(Q.query_prefix(*pair, None, np.zeros(0, np.int32), None), Q.C.RttStart).astype(np.int32)
    return prob_tol([p_fail], 2 * model_log_tol(LoadedModel.load(export, engine="numpy"), [prompt]))


def test_the_answering_install_answers_without_maxtext(answering, tiny_export, pair):
    """`pip install 'pingctl[infer]'`, then `pingctl sample EXPORT --src A --dst B`: the light
    engine answers with what the main environment answers, and MaxText's stack is absent."""
    venv, work, env, mb, dists = answering
    assert not set(dists) & {"maxtext", "tokamax", "xprof", "flax", "orbax-checkpoint"}, dists
    assert {"jax", "jaxlib", "safetensors", "fastapi"} <= set(dists)
    print(f"answering install: {len(dists)} distributions, {mb:.0f} MB")  # docs/benchmarks.md
    want = _sample_json(tiny_export, pair)
    py = str(venv / "bin" / "python")
    probe = subprocess.run([py, "-c", "import importlib.util as u; print([m for m in %r if u.find_spec(m)])"
                            % (HEAVY,)], cwd=work, env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "[]", probe.stdout
    got = _sample_json(tiny_export, pair, venv=venv, work=work, env=env)
    assert got["engine"] == "light" and got["p50_ms"] == want["p50_ms"]
    assert got["p_fail"] == pytest.approx(want["p_fail"], abs=_p_fail_tol(tiny_export, pair, want["p_fail"]))


def test_the_base_install_answers_without_jax(base_install, tiny_export, pair, synth_rows):
    """`pip install pingctl` (no extra), then `pingctl sample EXPORT`: the NumPy engine answers,
    chosen because JAX is absent, with the light engine's answer; nothing of JAX or MaxText is
    installed or imported, the install is at most 400 MB (the issue's goal), and a command
    needing an extra says which in one line."""
    venv, work, env, mb, dists = base_install
    assert not set(dists) & {"jax", "jaxlib", "scipy", "maxtext", "grain", "array-record"}, dists
    print(f"base install: {len(dists)} distributions, {mb:.0f} MB")  # docs/benchmarks.md
    assert mb <= 400
    want = _sample_json(tiny_export, pair)
    code = ("import json, sys; from pingctl.cli import main; sys.argv = ['pingctl', 'sample', %r, '--src', %r, "
            "'--dst', %r, '--json']\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(json.dumps(sorted({k.split('.')[0] for k in sys.modules} & {'jax', 'jaxlib', 'maxtext', 'scipy'})),"
            " file=sys.stderr)" % (str(tiny_export), *pair))
    r = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=work, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stderr.strip().splitlines()[-1]) == []
    got = json.loads(r.stdout)
    assert got["engine"] == "numpy" and got["p50_ms"] == want["p50_ms"]
    assert got["p_fail"] == pytest.approx(want["p_fail"], abs=_p_fail_tol(tiny_export, pair, want["p_fail"]))
    r = subprocess.run([str(venv / "bin" / "pingctl"), "build-rows", str(synth_rows / "synth"), "-o", "rows"],
                       cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "needs the [data] extra" in r.stderr and not (work / "rows").exists()


def _without_extra(venv: Path, work: Path, env, wheel: Path, command: str, args: list[str]) -> None:
    """`pingctl ARGS` in `venv` refuses in one line on stderr, naming the extra `command` needs
    and the pip command that adds it to this install (the wheel it was installed from), and
    leaves its output (`out` in `work`) uncreated."""
    from pingctl.errors import COMMAND_NEEDS

    extra = COMMAND_NEEDS[command][0]
    r = subprocess.run([str(venv / "bin" / "pingctl"), *args], cwd=work, env=env, capture_output=True, text=True,
                       timeout=300)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1 and len(lines) == 1 and r.stdout == "", (args, r.stdout, r.stderr[-3000:])
    assert lines[0].startswith(f"error: pingctl {command} needs the [{extra}] extra"), lines
    assert lines[0].endswith(f"pip install 'pingctl[{extra}] @ {wheel.as_uri()}'"), lines
    assert not (work / "out").exists(), args


def test_each_command_without_its_extra_says_which_before_writing_anything(base_install, built_wheel):
    """`pip install pingctl` (no extra): every command that needs one says, in one line, which
    extra and the pip command that adds it, and writes nothing (fetch once named the module
    `ripe`; train needed three tries to learn it wanted [train], and left a run directory)."""
    venv, work, env, _, _ = base_install
    (work / "in").mkdir(exist_ok=True)
    cases = {
        "fetch": ["fetch", "1", "--start", "2024-01-01", "--stop", "2024-01-02", "-o", "out"],
        "ingest": ["ingest", "in", "-o", "out"],
        "build-rows": ["build-rows", "in", "-o", "out"],
        "train": ["train", "in", "--run-dir", "out", "--steps", "2"],
        "train --target modal": ["train", "in", "--run-dir", "out", "--target", "modal", "--dry-run"],
        "pull": ["pull", "out"],
        "eval": ["eval", "in", "--train", "in", "--test", "in", "-o", "out"],
        "sample --plot": ["sample", "in", "--src", "1.2.3.4", "--dst", "5.6.7.8", "--plot", "out"],
    }
    for command, args in cases.items():
        _without_extra(venv, work, env, built_wheel, command, args)
    r = subprocess.run([str(venv / "bin" / "pingctl"), "fetch", "1", "--start", "2024-01-01", "--stop", "2024-01-02",
                        "-o", "out"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert "(ripe-atlas-cousteau, orjson)" in r.stderr, r.stderr


@pytest.fixture(scope="module")
def data_install(tmp_path_factory, built_wheel):
    """As `base_install`, for `pip install 'pingctl[data]'`."""
    dists = _closure(_requirements(built_wheel), {"data"})
    return (*_install_view(built_wheel, tmp_path_factory.mktemp("data"), dists), sorted(dists))


def test_train_with_the_data_extra_only_names_train_before_making_a_run(data_install, built_wheel):
    """With `[data]` (Grain, ArrayRecord), train once started its worker, which died on `No module
    named 'jax'` beside a new run directory: now it names [train] first."""
    venv, work, env, _, dists = data_install
    assert "grain" in dists and "jax" not in dists
    (work / "in").mkdir(exist_ok=True)
    _without_extra(venv, work, env, built_wheel, "train", ["train", "in", "--run-dir", "out", "--steps", "2"])


@pytest.fixture(scope="module")
def plot_install(tmp_path_factory, built_wheel):
    """As `base_install`, for `pip install 'pingctl[plot]'`."""
    dists = _closure(_requirements(built_wheel), {"plot"})
    return (*_install_view(built_wheel, tmp_path_factory.mktemp("plot"), dists), sorted(dists))


def test_the_plot_extra_draws_without_jax(plot_install, tiny_export, pair):
    """`pip install 'pingctl[plot]'`: matplotlib alone (it once took [infer], 600 MB of JAX)
    draws `sample --plot` on the NumPy engine."""
    venv, work, env, mb, dists = plot_install
    assert "matplotlib" in dists and not set(dists) & {"jax", "jaxlib", "scipy", "scoringrules"}, dists
    print(f"plot install: {len(dists)} distributions, {mb:.0f} MB")
    r = subprocess.run([str(venv / "bin" / "pingctl"), "sample", str(tiny_export), "--src", pair[0], "--dst", pair[1],
                        "--plot", "d.png", "--json"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["engine"] == "numpy" and (work / "d.png").read_bytes()[:4] == b"\x89PNG"


def test_the_readme_installs_what_exists(built_wheel):
    """pingctl is not on PyPI: the README's install section builds the wheel, and each extra it
    names is one the wheel offers."""
    import email

    readme = (REPO / "README.md").read_text()
    section = readme.split("### Installing", 1)[1].split("\n## ", 1)[0]
    meta = email.message_from_bytes(zipfile.ZipFile(built_wheel).read(
        next(n for n in zipfile.ZipFile(built_wheel).namelist() if n.endswith(".dist-info/METADATA"))))
    offered = set(meta.get_all("Provides-Extra"))
    named = set(re.findall(r"pingctl\[(\w+)\]", section))
    assert named and named <= offered, (named, offered)
    assert "python -m build" in section or "pip wheel" in section
    assert not re.search(r"pip install '?pingctl(\[\w+\])?'?\s*(#|$)", section, re.M), "pingctl is not on PyPI"


def test_the_extras_split_keeps_train_and_the_modal_images_whole(built_wheel, monkeypatch):
    """`[train]` (what ./run installs) holds every optional dependency of the other extras, and
    the Modal images still get what their steps import: a fanned-out step (ingest, build-rows)
    the base and `[data]`, training all of `[train]`."""
    from packaging.requirements import Requirement

    from pingctl.executor.modal import image as modal_image

    reqs = _requirements(built_wheel)
    by_extra: dict = {}
    for r in map(Requirement, reqs):
        extra = next((e for e in ("data", "infer", "plot", "hub", "train", "dev") if r.marker and r.marker.evaluate({"extra": e})),
                     "")
        by_extra.setdefault(extra, set()).add(r.name.lower())
    assert by_extra["data"] and by_extra["infer"] and not by_extra[""] & {"jax", "grain", "scoringrules", "maxtext"}
    assert by_extra["data"] | by_extra["infer"] | by_extra["plot"] | by_extra["hub"] <= by_extra["train"]
    assert by_extra["plot"] == {"matplotlib"} and by_extra["hub"] == {"huggingface-hub"}
    monkeypatch.setattr(modal_image, "_metadata_requirements", lambda: reqs)
    fanout = {Requirement(r).name.lower() for r in modal_image.base_requirements()}
    assert fanout == by_extra[""] | by_extra["data"]
    image = {Requirement(r).name.lower() for r in modal_image.image_requirements()}
    assert by_extra[""] | by_extra["train"] <= image and not image & by_extra["dev"] - by_extra["train"]
