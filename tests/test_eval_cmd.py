"""`pingctl eval` end to end on a tiny trained model (the numbers themselves are in the report)."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app
from tests.tolerance import assert_probs_close, assert_within, model_log_tol

runner = CliRunner()


def test_eval_reports_model_and_every_baseline(tiny_run, time_split, synth_rows, tmp_path):
    r = runner.invoke(app, [
        "eval", str(tiny_run), "--train", str(time_split / "train"), "--test", str(time_split / "test"),
        "--truth", str(synth_rows / "synth"), "--queries", "12", "--context", "4", "-o", str(tmp_path), "--json",
    ])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["order"][0] == "model"
    assert {"model", "global_median", "pair_median", "prefix_median", "vivaldi", "context_median"} <= set(rep["predictors"])
    assert rep["predictors"]["model"]["info"]["context_policy"] == "probe"
    assert rep["predictors"]["model"]["info"]["context_per_pair"] == 0  # as the run was trained
    assert rep["predictors"]["model"]["info"]["device"] == "cpu"
    m = rep["predictors"]["model"]
    assert m["slices"]["all"]["n"] > 0 and np.isfinite(m["slices"]["all"]["median_rel_err"])
    assert 0 <= m["failure"]["brier"] <= 1 if m.get("failure") else True
    assert rep["nll"]["bits_per_token"] > 0 and rep["nll"]["measurements"] == 12
    assert rep["noise_floor"]["overall"]["median_rel_err"] < rep["predictors"]["global_median"]["slices"]["all"]["median_rel_err"]
    comp = rep["comparisons"]["model"]
    assert set(comp) == set(rep["order"]) - {"model"}
    v = comp["vivaldi"]
    assert v["diff"] == pytest.approx(m["slices"]["all"]["median_rel_err"] - rep["predictors"]["vivaldi"]["slices"]["all"]["median_rel_err"])
    assert 0 < v["groups"] <= v["n"] <= 12 and v["ci_low"] <= v["ci_high"] and 0 <= v["share_a_better"] <= 1
    assert v["verdict"] == ("better" if v["ci_high"] < 0 else "worse" if v["ci_low"] > 0 else "tie")
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert on_disk["queries"] == 12
    # the model's passes were kept while it ran, for a rerun after an interruption; gone once it finished
    assert on_disk["resumed"] == {"asks": 0, "packets": 0} and not (tmp_path / ".resume").exists()
    # 12 packets are too few to fit a recalibration: none written, and the report says why
    assert rep["calibration"]["fitted"] is None and "at least 30" in rep["calibration"]["reason"]
    assert not (tmp_path / "calibration.json").exists()
    # `pingctl inspect` of the output prints the same table and verdict from report.json
    shown = runner.invoke(app, ["inspect", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert [next(i for i, line in enumerate(lines) if line.startswith(n + " ")) for n in rep["order"]] == sorted(
        next(i for i, line in enumerate(lines) if line.startswith(n + " ")) for n in rep["order"])
    assert "verdict: the model" in shown.output and "report: " in shown.output
    assert json.loads(runner.invoke(app, ["inspect", str(tmp_path / "report.json"), "--json"]).stdout)["kind"] == "eval"
    for p in rep["plots"].values():
        assert open(p, "rb").read(4) == b"\x89PNG"


def test_eval_cold_policy_hides_the_pair(tiny_run, synth_rows, tmp_path):
    from pingctl.config import ShardConfig
    from pingctl.shard import shard
    from pingctl.artifacts.run import checkpoint_steps

    pairs = tmp_path / "pairsplit"
    shard([synth_rows / "synth"], pairs, ShardConfig(strategy="pair"))
    have = checkpoint_steps(tiny_run)
    first, last = have[0], have[-1]
    # an earlier probe-policy eval in the same directory drew a context_median plot
    (tmp_path / "ev").mkdir()
    (tmp_path / "ev" / "scatter_context_median.png").write_bytes(b"old")
    (tmp_path / "ev" / "notes.txt").write_text("mine")
    r = runner.invoke(app, [
        "eval", str(tiny_run), "--train", str(pairs / "train"), "--test", str(pairs / "test"),
        "--set", "eval.queries=6", "--context", "4", "--context-policy", "cold", "--context-per-pair", "1",
        "--step", f"{last},{first}", "-o", str(tmp_path / "ev"), "--json",
    ])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    info = rep["predictors"]["model"]["info"]
    assert info["steps"] == [first, last] and info["step"] == last  # their weights averaged
    assert info["context_policy"] == "cold" and info["context_sizes"]["mean"] > 0
    assert info["context_per_pair"] == 1
    assert "context_median" not in rep["predictors"]
    assert not (tmp_path / "ev" / "scatter_context_median.png").exists()  # not left as if this eval's
    assert (tmp_path / "ev" / "notes.txt").read_text() == "mine" and (tmp_path / "ev" / "scatter_model.png").exists()
    # every test pair is unseen in training, so the pair median can only fall back
    assert rep["slices"]["unseen_pair"]["n"] == 6
    bad = runner.invoke(app, ["eval", str(tiny_run), "--train", str(pairs / "train"), "--test", str(pairs / "test"),
                              "--context-policy", "oracle"])
    assert bad.exit_code != 0 and "Traceback" not in bad.output
    assert "command-line options" in bad.output and "context_policy = 'oracle'" in bad.output
    assert "'probe', 'cold', 'none', 'both', 'pair' or 'fair'" in bad.output
    neg = runner.invoke(app, ["eval", str(tiny_run), "--train", str(pairs / "train"), "--test", str(pairs / "test"),
                              "--context-per-pair", "-1"])
    assert neg.exit_code != 0 and "context_per_pair = -1" in neg.output and "Traceback" not in neg.output
    bad_step = runner.invoke(app, ["eval", str(tiny_run), "--train", str(pairs / "train"), "--test",
                                   str(pairs / "test"), "--step", "best"])
    assert bad_step.exit_code != 0 and "--step 'best'" in bad_step.output and "Traceback" not in bad_step.output


def test_eval_bad_inputs_are_clear(tiny_run, time_split, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    r = runner.invoke(app, ["eval", str(tmp_path), "--train", str(tmp_path), "--test", str(tmp_path)])
    assert r.exit_code != 0 and "Traceback" not in r.output
    t = pq.read_table(next((time_split / "test").glob("*.parquet")))
    pq.write_table(t.slice(0, 0), tmp_path / "empty.parquet")
    nulls = t.slice(0, 5).set_column(t.schema.get_field_index("rtt"), "rtt", pa.nulls(5, pa.float64()))
    pq.write_table(nulls, tmp_path / "nulls.parquet")
    (tmp_path / "afile").write_text("x")
    train, test = str(time_split / "train"), str(time_split / "test")
    for args, msg in (
        (["--train", str(tmp_path / "empty.parquet"), "--test", test], "no train rows"),
        (["--train", train, "--test", str(tmp_path / "empty.parquet")], "no test rows"),
        (["--train", train, "--test", str(tmp_path / "nulls.parquet")], "nulls.parquet: column rtt has 5 null"),
        (["--train", train, "--test", test, "-o", str(tmp_path / "afile" / "ev")], "cannot create the report"),
        (["--train", train, "--test", test, "--queries", "0"], "--queries"),
        (["--train", train, "--test", test, "--context", "-1"], "--context"),
    ):
        out = [] if "-o" in args else ["-o", str(tmp_path / "ev")]
        r = runner.invoke(app, ["eval", str(tiny_run), *args, *out])
        assert r.exit_code != 0 and msg in r.output and "Traceback" not in r.output, (args, r.output)
        assert not (tmp_path / "ev").exists()  # a failed eval leaves no report directory


def test_teacher_forced_pass_equals_separate_passes(tiny_run, time_split):
    from pingctl.context import context_indices, context_pool
    from pingctl.eval.model import prompts, teacher_forced
    from pingctl.artifacts.table import load_split
    from pingctl.infer import queries as Q
    from pingctl.infer.model import LoadedModel

    model = LoadedModel.load(tiny_run)
    test = load_split(time_split / "test")
    rtt = np.asarray(test["rtt"])
    idx = np.concatenate([np.flatnonzero(rtt >= 0)[:5], np.flatnonzero(rtt < 0)[:2]])
    pool = context_pool(test, None, "probe")
    ps, fulls = prompts(model, test, idx, pool, context_indices(pool, test, idx, 4, "probe"))
    (p_fail, p1), known, scores = teacher_forced(model, ps, fulls)
    ref_fail, ref_p1 = Q.first_pass(model, ps)
    # one pass over whole sequences against passes over their prompts: other shapes, other sums;
    # a probability here is a ratio of two log-probabilities' exponentials
    tol = model_log_tol(model, fulls, tiny_run)
    assert_probs_close(p_fail, ref_fail, 2 * tol, "p_fail")
    assert_probs_close(p1, ref_p1, 2 * tol, "first byte")
    assert len(known) == int((rtt[idx] >= 0).sum())  # one second-byte row per successful packet
    for (k, b), row in known.items():
        ref = Q.bytes_distribution(model.next_log_probs([np.concatenate([ps[k], [Q.C.RttStart, Q.BYTE0 + b]])])[0])
        assert_probs_close(row, ref, 2 * tol, "second byte")
    assert_within(np.concatenate(scores), np.concatenate(model.score(fulls)), tol, "scores")


def test_verdict_line_names_what_the_model_beats_ties_and_loses_to(capsys):
    from pingctl.cli.eval_cmd import _print_comparisons

    def c(diff, lo, hi, verdict):
        return {"diff": diff, "ci_low": lo, "ci_high": hi, "verdict": verdict, "share_a_better": 0.5,
                "level": 0.95, "n_boot": 100, "groups": 9}

    _print_comparisons({"global_median": c(-0.2, -0.3, -0.1, "better"), "vivaldi": c(-0.01, -0.03, 0.02, "tie"),
                        "pair_median": c(0.1, 0.05, 0.2, "worse")})
    out = capsys.readouterr().out
    assert "verdict: the model beats global_median; ties vivaldi (the interval holds 0); loses to pair_median" in out


def test_results_table_keeps_every_name_and_figure_whole_at_80_columns():
    """CI logs and piped output are 80 columns wide: prefix_median and pair_median must not
    both print as 'p…', and no figure may be cut."""
    from rich.console import Console

    from pingctl.cli.eval_cmd import results_table

    names = ["model", "global_median", "prefix_median", "pair_median", "vivaldi", "context_median", "noise_floor"]
    rows = [{"predictor": n, "median_rel_err": 0.4131, "p90_rel_err": 15.956, "mae_ms": 37245.25, "cov50": 0.524,
             "cov90": 0.952, "auc": 0.798, "fallback_share": 1.0} for n in names]
    report = {"queries": 48, "rows": rows, "predictors": {"model": {"info": {"steps": [299]}}}}
    con = Console(width=80, record=True, file=open("/dev/null", "w"))
    con.print(results_table(report, "runs/atlas/splits/test", "probe"))
    text = con.export_text()
    assert "…" not in text
    for n in names:
        assert f"\n{n} " in text
    for figure in ("41.3%", "1595.6%", "37,245.2", "52.4%", "95.2%", "0.798", "100.0%"):
        assert figure in text


def test_inspect_eval_refuses_what_is_not_a_report(tmp_path):
    d = tmp_path / "ev"
    d.mkdir()
    (d / "report.json").write_text("{not json")
    r = runner.invoke(app, ["inspect", str(d)])
    assert r.exit_code == 1 and "not a readable eval report" in r.output and "Traceback" not in r.output
    (d / "report.json").write_text(json.dumps({"rows": []}))
    r = runner.invoke(app, ["inspect", str(d)])
    assert r.exit_code == 1 and "missing comparisons" in r.output
    (d / "report.json").write_text(json.dumps([1, 2]))
    r = runner.invoke(app, ["inspect", str(d / "report.json")])
    assert r.exit_code == 1 and "not a `pingctl eval` report" in r.output
    damaged = {"rows": [], "comparisons": {}, "nll": {}, "queries": 1, "predictors": {"model": {"info": {}}},
               "inputs": {}}
    (d / "report.json").write_text(json.dumps(damaged))
    r = runner.invoke(app, ["inspect", str(d)])
    assert r.exit_code == 1 and "a damaged eval report" in r.output and "internal error" not in r.output
    assert "┃" not in r.output and "│" not in r.output  # no half table before the message


def test_eval_refuses_bad_splits_and_seeds_before_the_model_loads(tiny_run, tmp_path):
    """A NaN RTT or an address the prompt builder cannot parse is named with its file and row
    while the splits load; the run has no checkpoint, so a later check would say so instead."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.conftest import make_table

    t = make_table(200)
    pq.write_table(t, tmp_path / "train.parquet")
    rtt = t.column("rtt").to_numpy().copy()
    rtt[[7, 9]] = np.nan
    pq.write_table(t.set_column(t.schema.get_field_index("rtt"), "rtt", pa.array(rtt)), tmp_path / "nan.parquet")
    dst = t.column("dst_addr").to_pylist()
    dst[11] = "8.8.8.888"
    pq.write_table(t.set_column(t.schema.get_field_index("dst_addr"), "dst_addr", pa.array(dst)),
                   tmp_path / "badaddr.parquet")
    rtt[[7, 9]] = t.column("rtt").to_numpy()[[7, 9]]
    rtt[13] = -5.0  # read as a failure before
    rtt[15] = 1e300  # scored as an RTT before
    pq.write_table(t.set_column(t.schema.get_field_index("rtt"), "rtt", pa.array(rtt)), tmp_path / "negrtt.parquet")
    (tmp_path / "no-ckpt").mkdir()
    for name in ("config.yaml", "maxtext.yml"):
        shutil.copy(tiny_run / name, tmp_path / "no-ckpt" / name)
    base = ["eval", str(tmp_path / "no-ckpt"), "--train", str(tmp_path / "train.parquet"), "-o", str(tmp_path / "ev")]
    for args, msg, code in (
        (["--test", str(tmp_path / "nan.parquet")],
         "nan.parquet: column rtt has 2 NaN value(s), the first in row 7", 1),
        (["--test", str(tmp_path / "badaddr.parquet")],
         "badaddr.parquet: column dst_addr has 1 invalid IP address(es) ('8.8.8.888'), the first in row 11", 1),
        (["--test", str(tmp_path / "negrtt.parquet")],
         "bad_rtt: 2 row(s) (rtt is not a number", 1),
        (["--test", str(tmp_path / "negrtt.parquet")], "negrtt.parquet row 13", 1),
        (["--test", str(tmp_path / "negrtt.parquet")], "through `pingctl shard`", 1),
        (["--test", str(tmp_path / "train.parquet"), "--seed", "-1"], "--seed", 2),
        (["--test", str(tmp_path / "train.parquet"), "--set", "eval.seed=-1"], "eval.seed = -1", 2),
        (["--test", str(tmp_path / "train.parquet"), "--hardware", "tpu"], "--hardware 'tpu': expected one of", 2),
    ):
        r = runner.invoke(app, [*base, *args])
        text = " ".join(r.output.split())  # the message may wrap
        assert r.exit_code == code and msg in text and "Traceback" not in r.output, (args, r.output)
        assert not (tmp_path / "ev").exists()


def test_verdict_without_any_comparison_says_so(capsys):
    from pingctl.cli.eval_cmd import _print_comparisons

    none = {"diff": None, "ci_low": None, "ci_high": None, "verdict": None, "share_a_better": None,
            "level": 0.95, "n_boot": 100, "groups": 0}
    _print_comparisons({"global_median": none, "vivaldi": dict(none)})
    out = capsys.readouterr().out
    assert "no comparison possible" in out and "beats none" not in out


def test_plots_without_data_draw_no_empty_legend(tmp_path):
    import warnings

    from pingctl.eval.plots import plot_calibration, plot_error_cdf

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "No artists with labels found to put in legend"
        plot_error_cdf({"model": np.full(3, np.nan)}, tmp_path / "cdf.png")
        plot_calibration({}, {}, tmp_path / "cal.png")
    assert (tmp_path / "cdf.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_checks_the_run_and_the_truth_up_front(tiny_run, time_split, tmp_path):
    train, test = str(time_split / "train"), str(time_split / "test")
    r = runner.invoke(app, ["eval", str(tmp_path), "--train", train, "--test", test, "-o", str(tmp_path / "e1")])
    assert r.exit_code == 1 and "fitting baselines" not in r.output and "Traceback" not in r.output
    other = tmp_path / "other"
    r = runner.invoke(app, ["synth", "-o", str(other), "--rows", "2000", "--probes", "5", "--targets", "3", "--seed", "7"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["eval", str(tiny_run), "--train", train, "--test", test, "--queries", "8",
                            "--truth", str(other), "-o", str(tmp_path / "e2")])
    assert r.exit_code == 1 and "knows none of the" in r.output, r.output
    r = runner.invoke(app, ["eval", str(tiny_run), "--train", train, "--test", test, "--queries", "8",
                            "--truth", str(tmp_path / "nothing"), "-o", str(tmp_path / "e3")])
    assert r.exit_code == 1 and "not a `pingctl synth` output" in r.output
