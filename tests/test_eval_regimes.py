"""`pingctl eval RUN --regimes SPLITDIR`: the tiny model on the four test sets of a regimes
split, each against the classical predictor fixed for it before testing, and the table's
figures recomputed from predictions.parquet."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.eval.regimes import MIN_VAL_HOSTS, best_candidates
from tests.conftest import build_once

runner = CliRunner()


@pytest.fixture(scope="module")
def regimes_split(synth_rows):
    from pingctl.config import RegimesConfig, ShardConfig
    from pingctl.shard import shard

    cfg = ShardConfig(strategy="regimes", regimes=RegimesConfig(probe=0.2, target=0.2, pair=0.1))
    return build_once(synth_rows / "regimes", lambda d: shard([synth_rows / "synth"], d, cfg))


def test_best_is_fixed_per_regime_and_policy():
    assert best_candidates("time", "both") == ("pair_median",)
    assert best_candidates("pair", "cold") == ("embedding", "vivaldi")
    assert best_candidates("probe", "both") == best_candidates("target", "cold") == ("embedding_refit",)
    # a probe-policy prompt holds the pair's own packets: its median is the baseline to beat
    assert best_candidates("pair", "probe") == ("prompt_median",)
    assert best_candidates("time", "probe") == ("pair_median",)  # the pair's own history either way


def test_eval_regimes_table_matches_its_predictions(tiny_run, regimes_split, tmp_path):
    out = tmp_path / "ev"
    r = runner.invoke(app, ["eval", str(tiny_run), "--regimes", str(regimes_split), "--queries", "36",
                            "--context", "4", "--context-policy", "probe", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["mode"] == "regimes" and [row["regime"] for row in rep["table"]] == ["time", "pair", "probe", "target"]
    assert rep["calibration"]["fitted"]  # fitted on val, applied to every regime
    tab = pq.read_table(out / "predictions.parquet")
    meta = json.loads(tab.schema.metadata[b"pingctl"])
    assert meta["kind"] == "eval-predictions" and "model" in meta["predictors"]
    d = tab.to_pydict()
    regime = np.array(d["regime"])
    actual = np.array(d["actual_rtt"])
    for row in rep["table"]:
        name, best = row["regime"], row["best"]
        assert best == best_candidates(name, "probe")[0]
        sel = regime == name
        assert sel.sum() == row["packets"] == 36
        report = rep["regimes"][name]
        assert {"model", "model_calibrated", "pair_median", "vivaldi", "embedding", "prompt_median", "vivaldi_refit",
                "embedding_refit"} <= set(report["predictors"])
        a = actual[sel]
        ok = a > 0
        model = np.array(d["model_median"])[sel]
        base = np.array(d[f"{best}_median"])[sel]
        both = ok & np.isfinite(model) & np.isfinite(base)
        m_err = np.median(np.abs(model[both] - a[both]) / a[both])
        b_err = np.median(np.abs(base[both] - a[both]) / a[both])
        assert row["diff"] == pytest.approx(m_err - b_err)
        assert row["ratio"] == pytest.approx(row["model_median_rel_err"] / row["best_median_rel_err"])
        assert row["ci_low"] <= row["diff"] <= row["ci_high"] or row["verdict"] != "tie"
        assert row["verdict"] == ("better" if row["ci_high"] < 0 else "worse" if row["ci_low"] > 0 else "tie")
        # CRPS: the model's from its distribution (never below 0, finite where an RTT came back), a
        # point baseline's is its absolute error
        crps = np.array(d["model_crps"])[sel]
        assert np.isfinite(crps[ok]).all() and (crps[ok] >= 0).all() and np.isnan(crps[~ok]).all()
        assert row["model_crps_ms"] == pytest.approx(crps[ok].mean())
        emb = np.array(d["embedding_crps"])[sel]
        np.testing.assert_allclose(emb[ok], np.abs(np.array(d["embedding_median"])[sel][ok] - a[ok]))
        assert row["cov90"] is not None and row["cov90_calibrated"] is not None
        # median and mean CRPS; proper scores of P(failure) for every predictor that gives one
        assert row["model_median_crps_ms"] == pytest.approx(np.median(crps[ok]))
        fails = row["failure"]
        assert {"model", "pair_median", "global_median"} <= set(fails) and "embedding" not in fails
        failed = a < 0
        for name in ("model", "pair_median"):
            p = np.array(d[f"{name}_p_fail"])[sel]
            assert fails[name]["brier"] == pytest.approx(np.mean((p - failed) ** 2))
            q = np.clip(p, 1e-6, 1 - 1e-6)
            assert fails[name]["log_score"] == pytest.approx(-np.mean(np.where(failed, np.log(q), np.log(1 - q))))
    # the refit baselines place the new hosts from the prompt (here the probe's earlier packets)
    probe = rep["regimes"]["probe"]["predictors"]["embedding_refit"]["fallback"]
    assert probe["refit"] > 0.5 and rep["regimes"]["time"]["predictors"]["embedding_refit"]["fallback"]["known"] == 1.0
    # the saved report prints the same table again
    shown = runner.invoke(app, ["inspect", str(out)])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert "eval by regime" in shown.output
    for row in rep["table"]:
        i = next(i for i, x in enumerate(lines) if x.startswith(row["regime"] + " ") and row["best"] in x)
        assert f"{100 * row['model_median_rel_err']:.1f}%" in lines[i]
        assert lines[i + 1].startswith("probe 4 ")  # the prompt each row used, under its name
    assert "median CRPS ms, model vs best classical" in shown.output and "Brier" in shown.output


def test_fair_prompts_per_regime_and_val_sets_per_regime(tiny_run, regimes_split, tmp_path):
    """The default policy of --regimes (fair): the time regime's prompts hold the pair's own
    earlier packets, the held-out regimes' never the pair; each regime's recalibration is
    fitted on its own val set, which shares no packet with any test set."""
    from pingctl.artifacts.table import REGIME_VALS, regime_test_dirs, regime_val_dirs
    from pingctl.artifacts.table import load_split

    out = tmp_path / "fair"
    r = runner.invoke(app, ["eval", str(tiny_run), "--regimes", str(regimes_split), "--queries", "40",
                            "--context", "4", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["prompt"]["context_policy"] == "fair"
    flagged = []
    for row in rep["table"]:
        report = rep["regimes"][row["regime"]]
        held = row["regime"] != "time"
        assert row["prompt"]["context_policy"] == ("both" if held else "pair")
        stats = report["prompt"]
        assert stats["mean_measurements"] > 0 and stats["before_query"] == 1.0
        assert stats["of_the_pair"] == (0.0 if held else 1.0)
        # recalibrated on its own regime's val set, with its own prompts
        assert row["calibrated_on"] == ("val_" + row["regime"] if held else "val")
        cal = rep["calibrations"][row["regime"]]
        assert cal["fitted"] and json.loads(open(cal["fitted"]).read())["context_policy"] == \
            row["prompt"]["context_policy"]
        # a map fitted on few held-out hosts says so (and the table prints it)
        val = load_split(regime_val_dirs(regimes_split)[row["regime"]])
        hosts = {"time": None, "pair": set(zip(val["src"], val["dst"])), "probe": set(val["src"]),
                 "target": set(val["dst"])}[row["regime"]]
        narrow = hosts is not None and len(hosts) < MIN_VAL_HOSTS
        assert ("warning" in cal) == narrow, (row["regime"], cal)
        if narrow:
            flagged.append(f"{row['regime']}: recalibration: val_{row['regime']} holds {len(hosts)}")
    assert rep["choice"]["pair"]["chosen_on"] == "val"
    # every val set (time's val/ and each held-out regime's) is disjoint from every test set
    vals, tests = regime_val_dirs(regimes_split), regime_test_dirs(regimes_split)
    assert {p.name for p in vals.values()} == {"val", *REGIME_VALS}

    def packets(path):
        d = load_split(path)
        return set(zip(d["src"], d["dst"], d["event_time"].tolist()))

    test_packets = set().union(*(packets(p) for p in tests.values()))
    for p in vals.values():
        v = packets(p)
        assert v and not v & test_packets, p
    shown = runner.invoke(app, ["inspect", str(out)])
    assert shown.exit_code == 0 and "pair 4" in shown.output and "both 4+4" in shown.output
    for line in flagged:
        assert line in shown.output, (line, shown.output)


def test_eval_regimes_refuses_other_inputs(tiny_run, time_split, tmp_path):
    r = runner.invoke(app, ["eval", str(tiny_run), "--regimes", str(time_split), "--train", str(time_split / "train")])
    assert r.exit_code == 2 and "leave out --train" in r.output
    r = runner.invoke(app, ["eval", str(tiny_run)])
    assert r.exit_code == 2 and "--regimes" in r.output
    r = runner.invoke(app, ["eval", str(tiny_run), "--regimes", str(time_split), "-o", str(tmp_path / "x")])
    assert r.exit_code == 1 and "--strategy regimes" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "x").exists()
