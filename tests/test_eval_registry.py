"""The baselines registry: one place that the report, `eval --regimes` and docs/eval.md read;
and eval reading its splits only through the owner of tables (artifacts.table.load_split)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pingctl.artifacts.table import REGIMES
from pingctl.eval import registry as R
from pingctl.eval.baselines import Prediction

ROOT = Path(__file__).resolve().parents[1]


def _split(n: int, seed: int) -> dict:
    """A small split dict as load_split returns it: 6 hosts, RTT by pair, a few failures."""
    rng = np.random.default_rng(seed)
    hosts = np.array([f"10.0.{i}.1" for i in range(6)], dtype=object)
    s, d = rng.integers(0, 6, n), (rng.integers(1, 6, n) + np.arange(n)) % 6
    d = np.where(d == s, (s + 1) % 6, d)
    rtt = 5.0 + 3.0 * np.abs(s - d) + rng.exponential(0.5, n)
    rtt[rng.random(n) < 0.05] = -1.0
    return {"src": hosts[s], "dst": hosts[d], "ip_version": np.full(n, 4, np.int64), "rtt": rtt,
            "event_time": np.sort(rng.integers(1_700_000_000, 1_700_100_000, n)),
            "msm_id": np.ones(n, np.int64), "size": np.full(n, 48, np.int64),
            "packet_error_count": np.zeros(n, np.int64), "prb_id": s.astype(np.int64)}


class ConstantMedian:
    """A fake baseline: predicts the mean train RTT for every packet."""

    def fit(self, train: dict) -> "ConstantMedian":
        rtt = np.asarray(train["rtt"], np.float64)
        self.value = float(rtt[rtt >= 0].mean())
        return self

    def predict(self, test: dict) -> Prediction:
        n = len(test["rtt"])
        return Prediction(np.full(n, self.value), np.zeros(n, np.int8), ("constant",))


@pytest.fixture
def fake():
    spec = R.register(R.Spec("constant_median", lambda seed, cycles: ConstantMedian(), "the train mean",
                             regimes={"time": 5, "target": -1}))
    yield spec
    R.unregister(spec.name)


def test_a_registered_baseline_is_fitted_scored_and_a_regime_candidate(fake):
    from pingctl.eval.presentation import summary_rows
    from pingctl.eval.regimes import best_candidates
    from pingctl.eval.report import baseline_table

    assert isinstance(ConstantMedian(), R.Baseline)
    train, test = _split(600, 1), _split(200, 2)
    report = baseline_table(train, test, vivaldi_cycles=20)
    assert report["order"][-1] == "constant_median"  # registry order is report order
    assert report["order"][:-1] == [n for n, s in R.REGISTRY.items() if not s.reads_prompt][:-1]
    row = next(r for r in summary_rows(report) if r["predictor"] == "constant_median")
    ok = test["rtt"] >= 0
    mean = train["rtt"][train["rtt"] >= 0].mean()
    assert row["median_rel_err"] == pytest.approx(np.median(np.abs(mean - test["rtt"][ok]) / test["rtt"][ok]))
    # a candidate after pair_median (rank 5 > 0) for time, first (rank -1) for target
    assert best_candidates("time", "cold") == ("pair_median", "constant_median")
    assert best_candidates("target", "both") == ("constant_median", "embedding_refit")
    # under the probe policy the prompt's median replaces the target regime's candidates
    assert best_candidates("target", "probe") == ("prompt_median",)
    R.unregister("constant_median")
    assert "constant_median" not in baseline_table(train, test, vivaldi_cycles=20)["order"]


def test_the_registry_refuses_what_it_cannot_serve():
    with pytest.raises(ValueError, match="unknown regime"):
        R.register(R.Spec("x", lambda s, c: ConstantMedian(), "", regimes={"space": 0}))
    with pytest.raises(ValueError, match="one of"):
        R.register(R.Spec("x", lambda s, c: ConstantMedian(), "", refit_of="vivaldi"))
    assert "x" not in R.REGISTRY
    # every regime has a baseline to be judged against, under every policy
    for regime in REGIMES:
        for policy in ("probe", "cold", "none", "both"):
            assert R.candidates(regime, policy), (regime, policy)


def test_the_defaults_follow_the_protocols():
    train, test = _split(400, 3), _split(100, 4)
    for name, b in R.default_baselines(vivaldi_cycles=20).items():
        assert isinstance(b.fit(train), R.Baseline), name
        assert (b.predict(test).p_fail is not None) == R.REGISTRY[name].predicts_failure, name
        assert isinstance(b, R.Refittable) == (name in {s.refit_of for s in R.REGISTRY.values()}), name
    for spec in R.prompt_baselines():
        assert spec.refit_of in R.REGISTRY if spec.factory is None else spec.refit_of is None


def test_the_docs_table_lists_exactly_the_registry():
    text = (ROOT / "docs" / "eval.md").read_text()
    table = text[text.index("| baseline | fitted on |"):]
    rows = []
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(line.split("|")[1])
    named = [n for cell in rows for n in re.findall(r"`([a-z0-9_]+)`", cell)]
    assert sorted(named) == sorted(R.REGISTRY) and len(named) == len(set(named))


# what opening a table looks like; anomaly.py reads a synth world's truth sidecar and a score
# output, neither of them a split
SPLIT_READING = re.compile(r"\b(read_table|resolve_inputs|refuse_whole_shard_output|read_schema|ParquetFile|"
                           r"read_parquet|pyarrow\.parquet|duckdb)\b|\.glob\(|\.rglob\(")
NOT_SPLITS = {"anomaly.py": {"read_table"}}


def test_no_module_of_eval_opens_a_split_itself():
    found = {}
    for f in sorted((ROOT / "pingctl" / "eval").glob("*.py")):
        hits = {m.group(0) for m in SPLIT_READING.finditer(f.read_text())} - NOT_SPLITS.get(f.name, set())
        if hits:
            found[f.name] = sorted(hits)
    assert found == {}, f"read splits with pingctl.artifacts.table.load_split, not {found}"
