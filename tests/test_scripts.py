"""scripts/heldout.sh, shrunk to a smoke test: the held-out-pairs experiment runs end to end, its
test packets are all of pairs that training never saw, and a rerun skips what is done."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("maxtext")
ROOT = Path(__file__).resolve().parents[1]


def _heldout(out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PINGCTL_HELDOUT_DIR": str(out), "PINGCTL_HELDOUT_MESH": "8",
           "PINGCTL_HELDOUT_ROWS": "20000", "PINGCTL_HELDOUT_PRESET": "tiny", "PINGCTL_HELDOUT_STEPS": "6",
           "PINGCTL_HELDOUT_QUERIES": "20", "PINGCTL_BIN": str(Path(sys.executable).parent / "pingctl"),
           "PINGCTL_PYTHON": sys.executable}
    return subprocess.run(["bash", str(ROOT / "scripts" / "heldout.sh")], env=env, capture_output=True,
                          text=True, timeout=600)


def test_heldout_script_end_to_end_and_rerun(tmp_path):
    out = tmp_path / "heldout"
    first = _heldout(out)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    for stage in ("pingctl synth", "pingctl shard", "pingctl build-rows: train", "pingctl train", "pingctl eval"):
        assert stage in first.stdout

    report = json.loads((out / "eval-test" / "report.json").read_text())
    assert report["n_test"] == 20
    assert report["slices"]["unseen_pair"]["n"] == 20 and report["slices"]["seen_pair"]["n"] == 0
    assert {"model", "vivaldi", "global_median", "pair_median", "prefix_median"} <= set(report["predictors"])
    assert report["predictors"]["model"]["info"]["step"] == 5
    train_cfg = (out / "train" / "config.yaml").read_text()
    assert "adam_weight_decay: 1.0" in train_cfg and "max_per_pair: 1" in train_cfg

    second = _heldout(out)  # everything done: only the eval runs again
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "pingctl eval" in second.stdout
    assert not any(s in second.stdout for s in ("pingctl synth", "pingctl shard", "pingctl build-rows", "pingctl train"))


def test_every_pingctl_import_in_the_scripts_resolves():
    """The shell scripts run Python snippets (`python - <<'PY'`): a name they import from pingctl
    that moved breaks `./run demo` at its end, after minutes of work, with a traceback."""
    import importlib
    import re

    root = Path(__file__).resolve().parent.parent
    found = 0
    for script in sorted((root / "scripts").glob("*.sh")):
        for module, names in re.findall(r"^\s*from (pingctl[\w.]*) import ([\w, ]+)$", script.read_text(), re.M):
            mod = importlib.import_module(module)
            for name in (n.strip() for n in names.split(",")):
                found += 1
                assert hasattr(mod, name), f"{script.name}: {module} has no {name}"
    assert found, "no pingctl import found in scripts/*.sh: the pattern above no longer matches them"
