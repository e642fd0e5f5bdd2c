"""The import layers of docs/architecture.md, as `.importlinter` states them: a cycle between
files or packages, or an import from a higher layer, fails here."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    # --no-cache: a stale cache from another tree must not answer for this one
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, capture_output=True, text=True,
                          env={"PATH": str(LINT.parent) + ":/usr/bin:/bin", "PYTHONPATH": str(cwd)})


def test_the_layer_and_cycle_contracts_hold():
    r = _lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ", 0 broken" in r.stdout, r.stdout
    text = " ".join(r.stdout.split())  # lint-imports wraps long contract names
    for contract in ("Layers: cli > ", "No import cycle between files or packages", "Engines: one module each",
                     "Inference engines: one subpackage each", "Inference engines: below the questions",
                     "Public API: serve and the answering commands"):
        assert contract in text, f"contract {contract!r} is not in .importlinter"
        rest = text[text.index(contract):]
        assert rest.find("KEPT") != -1 and (rest.find("BROKEN") == -1 or rest.find("KEPT") < rest.find("BROKEN")), contract


@pytest.mark.parametrize("module, line", [
    # an upward import: the schema layer reaching into training
    ("pingctl/schema/columns.py", "from pingctl.train import presets  # noqa: F401"),
    # a file cycle inside one package: two context-free siblings importing each other
    ("pingctl/tokenizer/rtt_codec.py", "from pingctl.tokenizer import vocab  # noqa: F401"),
    # one engine reaching into another: an engine must stand alone in its module
    ("pingctl/executor/local.py", "from pingctl.executor import slurm  # noqa: F401"),
    # one inference engine borrowing another's decoder
    ("pingctl/infer/engines/numpy/net.py", "from pingctl.infer.engines.jax import net as _jax  # noqa: F401,E402"),
    # an inference engine reaching up into the questions
    ("pingctl/infer/engines/jax/kv.py", "from pingctl.infer import queries  # noqa: F401,E402"),
    # the service reaching past the public API into the engine
    ("pingctl/serve/schemas.py", "from pingctl.infer import questions  # noqa: F401,E402"),
    # an answering command doing the same, lazily inside a function as the CLI imports
    ("pingctl/cli/score_cmd.py", "def _engine():\n    from pingctl.infer import score  # noqa: F401"),
])
def test_the_contracts_catch_a_violation(tmp_path, module, line):
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "pingctl", tree / "pingctl", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tree / ".importlinter")
    if "rtt_codec" in module:  # make the cycle: vocab must import rtt_codec for it to close
        vocab = tree / "pingctl/tokenizer/vocab.py"
        if "rtt_codec" not in vocab.read_text():
            vocab.write_text(vocab.read_text() + "\nfrom pingctl.tokenizer import rtt_codec  # noqa: E402,F401\n")
    target = tree / module
    target.write_text(target.read_text() + f"\n{line}\n")
    r = _lint(tree)
    assert r.returncode != 0, r.stdout
    assert "BROKEN" in r.stdout or "broken" in r.stdout
