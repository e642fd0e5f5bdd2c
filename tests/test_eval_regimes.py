"""`pingctl eval RUN --regimes SPLITDIR`: the tiny model on the four test sets of a regimes
split, each against the classical predictor fixed for it before testing, and the table's
figures recomputed from predictions.parquet."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.eval.regimes import MIN_VAL_HOSTS, best_candidates, describe_val, map_groups
from pingctl.prompt import Policy, PromptSpec
from tests.conftest import build_once

runner = CliRunner()


@pytest.fixture(scope="module")
def own_run(tiny_run, tmp_path_factory):
    """A copy of the tiny run: `eval --regimes` records its val-fitted combination in the run it
    evaluates, and the shared run must keep answering with the model alone for other tests."""
    import shutil

    return Path(shutil.copytree(tiny_run, tmp_path_factory.mktemp("regimes-run") / "run"))


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


def test_eval_regimes_table_matches_its_predictions(own_run, regimes_split, tmp_path):
    out = tmp_path / "ev"
    r = runner.invoke(app, ["eval", str(own_run), "--regimes", str(regimes_split), "--queries", "36",
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
        # PIT KS beside what a calibrated model shows with as many packets
        pit = np.array(d["model_pit"])[sel]
        pit = np.sort(pit[np.isfinite(pit)])
        n = len(pit)
        k = np.arange(1, n + 1)
        assert row["pit_ks"] == pytest.approx(max(np.max(k / n - pit), np.max(pit - (k - 1) / n)))
        assert 0 <= row["pit_ks_p"] <= 1 and 0 <= row["pit_ks_p_calibrated"] <= 1
        assert (row["pit_ks_p"] < 0.05) == (row["pit_ks"] > row["pit_ks_95"])
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
    assert "PIT KS, raw → recalibrated" in shown.output


def test_fair_prompts_per_regime_and_val_sets_per_regime(own_run, regimes_split, tmp_path, monkeypatch):
    """The default policy of --regimes (fair): the time regime's prompts hold the pair's own
    earlier packets, the held-out regimes' never the pair; the time regime is recalibrated on
    val/, the held-out regimes on their own val sets together; no val set shares a packet with
    any test set. Train is indexed for the prompts once, each asked split once."""
    from pingctl.artifacts.table import REGIME_VALS, regime_test_dirs, regime_val_dirs
    from pingctl.artifacts.table import load_split
    from pingctl.histories import History

    indexed = []
    of = History.of.__func__
    monkeypatch.setattr(History, "of", classmethod(lambda cls, t, a: indexed.append(len(t["rtt"])) or of(cls, t, a)))
    out = tmp_path / "fair"
    r = runner.invoke(app, ["eval", str(own_run), "--regimes", str(regimes_split), "--queries", "40",
                            "--context", "4", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    # train once; then the four val sets (time's val/ and the held-out ones) and four test sets
    assert indexed.count(len(load_split(regimes_split / "train")["rtt"])) == 1 and len(indexed) == 9, indexed
    rep = json.loads(r.stdout)
    assert rep["prompt"]["context_policy"] == "fair"
    for row in rep["table"]:
        report = rep["regimes"][row["regime"]]
        held = row["regime"] != "time"
        assert row["prompt"]["context_policy"] == ("both" if held else "pair")
        stats = report["prompt"]
        assert stats["mean_measurements"] > 0 and stats["before_query"] == 1.0
        assert stats["of_the_pair"] == (0.0 if held else 1.0)
        # recalibrated on val packets asked with its own prompts: the time regime on val/, the
        # held-out ones on their val sets together (the default, pooled)
        cal = rep["calibrations"][row["regime"]]
        fitted = json.loads(open(cal["fitted"]).read())
        assert fitted["context_policy"] == row["prompt"]["context_policy"]
        if held:
            assert row["calibrated_on"] == "val_pair+val_probe+val_target"
            assert cal["fitted"].endswith("calibration_held_out.json")
            assert fitted["fitted_on"] == [str(p.resolve()) for p in
                                           (regimes_split / "val_pair", regimes_split / "val_probe",
                                            regimes_split / "val_target")]
            assert set(cal["held_out"]) == {"pair", "probe", "target"}
            val = load_split(regime_val_dirs(regimes_split)[row["regime"]])
            assert cal["held_out"][row["regime"]]["count"] == len(
                {"pair": set(zip(val["src"], val["dst"])), "probe": set(val["src"]), "target": set(val["dst"])}
                [row["regime"]])
        else:
            assert row["calibrated_on"] == "val" and cal["fitted"].endswith("/calibration.json")
    # one pooled map: its packets are every held-out val set's (each asked once, 40 at most)
    held_cal = rep["calibrations"]["pair"]
    assert held_cal == rep["calibrations"]["probe"] == rep["calibrations"]["target"]
    assert 40 < held_cal["packets"] <= 120
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
    assert "(val_pair+val_probe+val_target)" in shown.output


def test_own_recalibration_fits_one_map_per_held_out_regime(own_run, regimes_split, tmp_path):
    """--recalibration own: each held-out regime's map on its own val set, and a map fitted on
    few held-out hosts says so (the table prints it)."""
    from pingctl.artifacts.table import load_split, regime_val_dirs

    out = tmp_path / "own"
    r = runner.invoke(app, ["eval", str(own_run), "--regimes", str(regimes_split), "--queries", "40",
                            "--context", "4", "--recalibration", "own", "--weights", "pooled", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    # --weights pooled: the held-out regimes' weight vouched for by their val sets together
    comb = json.loads((out / "combination.json").read_text())
    assert comb["weight_fitted_together"] == ["pair", "probe", "target"] and comb["weights"] == "pooled"
    held = {r: rep["combination"]["regimes"][r] for r in ("pair", "probe", "target")}
    assert len({h["weight"] for h in held.values()}) == 1
    assert all(h["crps_val"].get("vouched_with") == ["pair", "probe", "target"] for h in held.values()
               if h["crps_val"].get("units") is not None), held
    flagged = []
    for row in rep["table"]:
        regime = row["regime"]
        cal = rep["calibrations"][regime]
        if regime == "time":
            assert row["calibrated_on"] == "val" and "warning" not in cal
            continue
        assert row["calibrated_on"] == f"val_{regime}" and cal["fitted"].endswith(f"calibration_{regime}.json")
        assert json.loads(open(cal["fitted"]).read())["fitted_on"] == str((regimes_split / f"val_{regime}").resolve())
        val = load_split(regime_val_dirs(regimes_split)[regime])
        hosts = {"pair": set(zip(val["src"], val["dst"])), "probe": set(val["src"]), "target": set(val["dst"])}[regime]
        narrow = len(hosts) < MIN_VAL_HOSTS
        assert ("warning" in cal) == narrow, (regime, cal)
        if narrow:
            flagged.append(f"{regime}: recalibration: val_{regime} holds {len(hosts)}")
    assert not (out / "calibration_held_out.json").exists()
    shown = runner.invoke(app, ["inspect", str(out)])
    assert shown.exit_code == 0
    for line in flagged:
        assert line in shown.output, (line, shown.output)
    r = runner.invoke(app, ["eval", str(own_run), "--train", str(regimes_split / "train"), "--test",
                            str(regimes_split / "test_pair"), "--recalibration", "own", "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--recalibration" in r.output
    r = runner.invoke(app, ["eval", str(own_run), "--train", str(regimes_split / "train"), "--test",
                            str(regimes_split / "test_pair"), "--weights", "pooled", "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--weights" in r.output


def test_map_groups_pool_the_held_out_regimes_only_where_they_share_prompts(tmp_path):
    both = PromptSpec(Policy.BOTH, 16, context_dst=16, cap=1)
    pair = PromptSpec(Policy.PAIR, 16)
    prompts = {"time": pair, "pair": both, "probe": both, "target": both}
    vals = {"time": tmp_path / "val", **{r: tmp_path / f"val_{r}" for r in ("pair", "probe", "target")}}
    assert map_groups(vals, prompts, "pooled") == [["time"], ["pair", "probe", "target"]]
    assert map_groups(vals, prompts, "own") == [["time"], ["pair"], ["probe"], ["target"]]
    # prompts of another shape in one held-out regime: a map per prompt shape
    assert map_groups(vals, {**prompts, "target": dataclasses.replace(both, context_dst=4)}, "pooled") == \
        [["time"], ["pair"], ["probe"], ["target"]]
    # a split without per-regime val sets: regimes asked alike on val/ share a map, either way
    old = {r: tmp_path / "val" for r in vals}
    for how in ("pooled", "own"):
        assert map_groups(old, prompts, how) == [["time"], ["pair", "probe", "target"]]
        assert map_groups(old, {r: both for r in vals}, how) == [["time", "pair", "probe", "target"]]


def test_eval_regimes_refuses_other_inputs(own_run, time_split, tmp_path):
    r = runner.invoke(app, ["eval", str(own_run), "--regimes", str(time_split), "--train", str(time_split / "train")])
    assert r.exit_code == 2 and "leave out --train" in r.output
    r = runner.invoke(app, ["eval", str(own_run)])
    assert r.exit_code == 2 and "--regimes" in r.output
    r = runner.invoke(app, ["eval", str(own_run), "--regimes", str(time_split), "-o", str(tmp_path / "x")])
    assert r.exit_code == 1 and "--strategy regimes" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "x").exists()


def test_a_map_says_what_its_val_sets_hold_out_and_flags_few():
    def split(pairs):
        return {"src": np.array([a for a, _ in pairs]), "dst": np.array([b for _, b in pairs])}

    wide = split([(f"s{i}", f"d{i % 3}") for i in range(12)])
    one_dst = split([(f"s{i}", "d0") for i in range(12)])
    info = {"fitted": "m.json", "fitted_on": "val_pair+val_target"}
    describe_val(info, {"pair": wide, "target": one_dst})
    assert info["held_out"] == {"pair": {"what": "pairs", "count": 12}, "target": {"what": "destinations", "count": 1}}
    assert "warning" not in info  # 13 held-out units in all
    info = {"fitted": "m.json", "fitted_on": "val_probe+val_target"}
    describe_val(info, {"probe": split([("s0", "d0"), ("s1", "d0")]), "target": one_dst})
    assert info["warning"].startswith("val_probe+val_target hold 2 probes, 1 destination in all")
    info = {"fitted": "m.json", "fitted_on": "val_target"}
    describe_val(info, {"target": one_dst})
    assert info["warning"].startswith("val_target holds 1 destination:")
    info = {"fitted": "m.json", "fitted_on": "val"}
    describe_val(info, {"time": wide})  # the time regime holds nothing out
    assert "held_out" not in info and "warning" not in info


@pytest.mark.parametrize("n", [0, 3, 500, 2_000])
def test_a_val_sample_sampled_again_is_itself(n):
    """`_Regimes` keeps of a val set, once asked, only its seeded sample: `choose_on_val` samples
    what it is given with the same queries and seed, and must get the same packets."""
    from pingctl.eval.regimes import _sample

    for seed in (0, 7):
        idx = _sample(n, 500, seed)
        again = _sample(len(idx), 500, seed)
        assert (idx[again] == idx).all() and len(idx) == min(n, 500)


class _Passes:
    """The model's passes of an eval counted (eval.model runs one per chunk of packets), and a
    Ctrl-C before pass `stop` (None: none)."""

    def __init__(self, monkeypatch):
        import pingctl.eval.model as EM

        self.count, self.stop, real = 0, None, EM.teacher_forced_kept

        def counted(*a, **k):
            if self.count == self.stop:
                raise KeyboardInterrupt
            self.count += 1
            return real(*a, **k)

        monkeypatch.setattr(EM, "teacher_forced_kept", counted)
        monkeypatch.setattr(EM, "CHUNK", 8)  # several chunks an ask at a test's few packets

    def reset(self, stop: int | None = None) -> None:
        self.count, self.stop = 0, stop


def _without_timings(out: Path) -> dict:
    """report.json as two runs of one eval must agree on it: without its timings, `resumed`,
    and with the output directory's path as OUT."""
    timings = ("elapsed_s", "fit_s", "seconds", "time_s", "resumed")

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in timings}
        return [strip(v) for v in x] if isinstance(x, list) else x

    return strip(json.loads((out / "report.json").read_text().replace(str(out), "OUT")))


def test_an_interrupted_eval_resumes_to_the_same_outputs(own_run, regimes_split, tmp_path, monkeypatch):
    """A Ctrl-C after five of the model's passes, then the same command again: the kept chunks
    are not passed through the model again, and every output equals an uninterrupted eval's to
    the bit; a finished eval leaves no OUT/.resume."""
    from pingctl.artifacts.eval_output import RESUME

    passes = _Passes(monkeypatch)
    args = ["eval", str(own_run), "--regimes", str(regimes_split), "--queries", "24", "--context", "4"]
    whole, out = tmp_path / "whole", tmp_path / "out"
    r = runner.invoke(app, [*args, "-o", str(whole), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["resumed"] == {"asks": 0, "packets": 0} and not (whole / RESUME).exists()
    every = passes.count
    assert every == 8 * 3  # eight asks (four val sets, four test sets), 24 packets each, 8 to a pass
    passes.reset(stop=5)
    r = runner.invoke(app, [*args, "-o", str(out)])
    assert r.exit_code == 130 and ".resume/ keeps the model's finished passes" in r.output, r.output
    assert len(list((out / RESUME).glob("ask-*/chunk-*.npz"))) == 5
    passes.reset()
    r = runner.invoke(app, [*args, "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "resumed: reused 40 packets' model passes from an interrupted eval" in r.output
    assert passes.count == every - 5
    assert json.loads((out / "report.json").read_text())["resumed"] == {"asks": 2, "packets": 40}
    names = sorted(p.name for p in whole.iterdir())
    assert sorted(p.name for p in out.iterdir()) == names and RESUME not in names
    for name in names:
        if name == "report.json":
            assert _without_timings(out) == _without_timings(whole)
        else:  # predictions.parquet, combination.json, the calibration maps (Table.equals: NaN != NaN)
            assert (out / name).read_bytes() == (whole / name).read_bytes(), name


def test_an_eval_with_other_settings_reuses_nothing_kept(own_run, regimes_split, tmp_path, monkeypatch):
    from pingctl.artifacts.eval_output import RESUME

    passes = _Passes(monkeypatch)
    args = ["eval", str(own_run), "--regimes", str(regimes_split), "--queries", "24", "-o", str(tmp_path / "out")]
    passes.reset(stop=2)
    assert runner.invoke(app, [*args, "--context", "4"]).exit_code == 130
    assert len(list((tmp_path / "out" / RESUME).glob("ask-0/chunk-*.npz"))) == 2
    passes.reset()
    r = runner.invoke(app, [*args, "--context", "3", "--json"])  # other prompts
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["resumed"] == {"asks": 0, "packets": 0} and passes.count == 8 * 3
    assert not (tmp_path / "out" / RESUME).exists()
