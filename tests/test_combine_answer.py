"""Which predictor answers (docs/sample.md, "Which predictor answers"): a combination.json beside
the session's tiny run, written with chosen weights, reaches `sample` (a pair and --pairs),
`Model.rtt`/`rtt_many`, `serve` (a real server on 127.0.0.1) and `score`, and they agree."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pingctl.infer import combine as CB

T0 = 1_704_067_200  # 2024-01-01T00:00:00Z
RTTS = [21.0, 19.0, 40.0, 18.5, 20.0, 22.0]  # the pair's own packets in the context: median 20.5 ms
QUERY_T = T0 + 3600


def _table(src: str, dst: str, rtts: list[float], prb: int = 7001):
    """The pair's packets a minute apart from T0, as canonical rows of one probe."""
    n = len(rtts)
    return pa.table({
        "msm_id": pa.array([1001] * n, pa.int64()),
        "event_time": pa.array([dt.datetime.fromtimestamp(T0 + 60 * k, dt.UTC) for k in range(n)],
                               pa.timestamp("us", tz="UTC")),
        "src_addr": [src] * n, "dst_addr": [dst] * n, "ip_version": pa.array([4] * n, pa.int64()),
        "rtt": pa.array(rtts, pa.float64()), "size": pa.array([48] * n, pa.int64()),
        "packet_error_count": pa.array([0] * n, pa.int64()), "prb_id": pa.array([prb] * n, pa.int64())})


@pytest.fixture(scope="module")
def setup(tiny_run, pair, tmp_path_factory):
    """A copy of the tiny run (its combination.json rewritten per test) and a context table of
    the pair's own packets before the question's time."""
    d = tmp_path_factory.mktemp("combine")
    run = d / "run"
    shutil.copytree(tiny_run, run)
    ctx = d / "context.parquet"
    pq.write_table(_table(*pair, RTTS), ctx)
    return run, ctx


# a recalibration map that moves mass to the upper tail: an answer path that skipped it would differ
SKEWED = tuple(float(x) for x in np.linspace(0.0, 1.0, len(CB.RECAL_LEVELS)) ** 1.7)


def write_combination(run: Path, weight: float, steps=None, crps=(5.0, 4.0, 3.0), path: Path | None = None,
                      recal: tuple | None = None) -> Path:
    """A combination fitted (as far as the answers can tell) for `run` on `probe` prompts: its
    `time` regime pools the model with the pair median at `weight` (then `recal`'s map, if any)."""
    from pingctl.artifacts.run import checkpoint_steps, run_config

    model, classical, combined = crps
    fit = CB.RegimeFit("pair_median", weight, 0.2, 100, {"model": model, "classical": classical,
                                                          "combined": combined}, recal)
    meta = {"run": str(run.resolve()), "steps": steps or [checkpoint_steps(run)[-1]], "context_policy": "probe",
            "context_measurements": 16,
            "context_per_pair": run_config(run).loader.max_per_pair, "hint": None}
    return CB.Combination({"time": fit}, meta).write(path or run / CB.COMBINATION)


def _ask(model, pair, ctx, **kw):
    return model.rtt(*pair, time=QUERY_T, context=ctx, **kw)


def pingctl(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pingctl", *map(str, args)], capture_output=True, text=True)


def test_weight_one_is_the_model_to_the_bit_and_weight_zero_the_pair_median(setup, pair):
    from pingctl.api import Model

    run, ctx = setup
    write_combination(run, 1.0)
    plain = _ask(Model.load(run, combination=False), pair, ctx)
    assert plain.answered_by["predictor"] == "model"
    one = _ask(Model.load(run), pair, ctx)
    assert one.answered_by == {"predictor": "combined", "regime": "time", "why": one.answered_by["why"]}
    assert np.array_equal(one.probs, plain.probs) and one.p_fail == plain.p_fail

    write_combination(run, 0.0)
    zero = _ask(Model.load(run), pair, ctx)
    assert zero.answered_by["predictor"] == "combined" and "pair_median 20.5 ms" in zero.answered_by["why"]
    # the median on the model's code grid: within one code (2 bytes, ~1/2048 relative) of the estimate
    assert zero.quantile(0.5) == pytest.approx(float(np.median(RTTS)), rel=1e-3)
    assert zero.p_fail == plain.p_fail  # P(failure) stays the model's
    classical = _ask(Model.load(run, combination=False), pair, ctx, answer="model")
    assert np.array_equal(classical.probs, plain.probs)


def test_sample_api_serve_pairs_and_score_agree_under_combined(setup, pair, tmp_path):
    from pingctl.api import Model
    from pingctl.serve.app import create_app
    from pingctl.serve.server import ServerThread

    run, ctx = setup
    comb = CB.Combination.load(write_combination(run, 0.5, recal=SKEWED))
    model = Model.load(run)
    api = _ask(model, pair, ctx)
    assert api.answered_by["predictor"] == "combined" and api.answered_by["regime"] == "time"
    # the pool of the model's own answer with the pair median, through the map
    own = _ask(Model.load(run, combination=False), pair, ctx)
    np.testing.assert_allclose(api.probs, CB.pool(own, float(np.median(RTTS)), comb.regimes["time"]).probs, atol=1e-12)
    keys = ("p_fail", "mean_ms", "trimmed_mean_ms", "p5_ms", "p25_ms", "p50_ms", "p75_ms", "p95_ms")
    want = {k: api.info[k] for k in keys}

    r = pingctl("sample", run, "--src", pair[0], "--dst", pair[1], "--time", QUERY_T, "--context", ctx, "--json")
    assert r.returncode == 0, r.stderr
    cli = json.loads(r.stdout)
    assert {k: cli[k] for k in keys} == want and cli["answered_by"] == api.answered_by

    rows = [{"src": pair[0], "dst": pair[1], "time": T0 + 60 * k, "rtt": x, "prb_id": 7001} for k, x in enumerate(RTTS)]
    with ServerThread(create_app(model, warmup=False)) as srv:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
        conn.request("POST", "/rtt", json.dumps({"src": pair[0], "dst": pair[1], "time": QUERY_T, "context": rows}),
                     {"content-type": "application/json"})
        resp = conn.getresponse()
        got = json.loads(resp.read())
        conn.close()
    assert resp.status == 200, got
    assert {k: got[k] for k in keys} == want and got["answered_by"] == api.answered_by
    assert got["combination"] == "run/combination.json"  # a name, not where the server keeps it

    many = model.rtt_many([{"src": pair[0], "dst": pair[1], "time": QUERY_T}], context=ctx, exact=True)
    cols = many.columns
    assert {k: cols[k][0] for k in keys} == want
    assert cols["answered_by"] == ["combined"] and cols["regime"] == ["time"]

    # score: the query packet after the pair's own packets, read from the same pooled distribution
    x = 23.0
    table = pa.concat_tables([_table(*pair, RTTS), _table(*pair, [x])])
    table = table.set_column(1, "event_time", pa.array(
        [dt.datetime.fromtimestamp(T0 + 60 * k, dt.UTC) for k in range(len(RTTS))]
        + [dt.datetime.fromtimestamp(QUERY_T, dt.UTC)], pa.timestamp("us", tz="UTC")))
    scored = model.score(table, context=16, context_policy="probe")
    assert scored.column("answered_by").to_pylist()[-1] == "combined"
    assert scored.column("regime").to_pylist()[-1] == "time"
    from pingctl.tokenizer.rtt_codec import decode_rtt, token_codes

    xc = float(decode_rtt(token_codes(np.array([x])).astype(np.uint16))[0])
    pit = scored.column("pit").to_pylist()[-1]
    # the teacher-forced pass and the query's own pass are float32 forward passes of different lengths
    assert pit == pytest.approx(api.cdf(xc), abs=1e-5)
    raw = Model.load(run, combination=False).score(table, context=16, context_policy="probe")
    assert raw.column("pit").to_pylist()[-1] != pytest.approx(pit, abs=1e-3)  # the pool moved it


def test_without_a_fitting_combination_the_model_answers_and_says_why(setup, pair, tmp_path):
    from pingctl.api import Model

    run, ctx = setup
    (run / CB.COMBINATION).unlink(missing_ok=True)
    a = _ask(Model.load(run), pair, ctx)
    assert a.answered_by["predictor"] == "model"
    assert f"no {CB.COMBINATION}" in a.answered_by["why"] and "--regimes" in a.answered_by["why"]

    write_combination(run, 0.5, steps=[999_999])
    b = _ask(Model.load(run), pair, ctx)
    assert b.answered_by["predictor"] == "model" and "999999" in b.answered_by["why"]

    # better than the model on val is the default's condition
    write_combination(run, 0.5, crps=(3.0, 4.0, 3.5))
    c = _ask(Model.load(run), pair, ctx)
    assert c.answered_by["predictor"] == "model" and "not better" in c.answered_by["why"]
    assert _ask(Model.load(run), pair, ctx, answer="combined").answered_by["predictor"] == "combined"

    # no packet of the pair in the prompt, and no hints: no classical estimate for a pair regime
    d = Model.load(run).rtt(*pair)
    assert d.answered_by["predictor"] == "model" and d.answered_by["regime"] is None


def test_answer_combined_without_a_combination_exits_2_naming_how_to_fit_one(setup, pair):
    run, ctx = setup
    (run / CB.COMBINATION).unlink(missing_ok=True)
    r = pingctl("sample", run, "--src", pair[0], "--dst", pair[1], "--answer", "combined")
    assert r.returncode == 2, r.stderr
    assert "--answer combined" in r.stderr and "pingctl eval" in r.stderr and "--regimes" in r.stderr
    r = pingctl("sample", run, "--src", pair[0], "--dst", pair[1], "--answer", "best")
    assert r.returncode == 2 and "model, combined, classical" in r.stderr


def test_pairs_file_and_export_carry_the_answer(setup, pair, tmp_path):
    from pingctl.api import Model

    run, ctx = setup
    write_combination(run, 0.5)
    pairs = tmp_path / "pairs.csv"
    pairs.write_text(f"src,dst,time\n{pair[0]},{pair[1]},{QUERY_T}\n{pair[1]},{pair[0]},\n")
    out = tmp_path / "pred.parquet"
    r = pingctl("sample", run, "--pairs", pairs, "--context", ctx, "-o", out)
    assert r.returncode == 0, r.stderr
    t = pq.read_table(out).to_pydict()
    assert t["answered_by"] == ["combined", "model"] and t["regime"][0] == "time"
    assert "no classical estimate" in t["answered_why"][1] or "no packet" in t["answered_why"][1]
    assert "answered by" in r.stdout and "combined 1" in " ".join(r.stdout.split())

    ex = tmp_path / "export"
    r = pingctl("export", run, "-o", ex, "--json")
    assert r.returncode == 0, r.stderr
    carried = CB.load(ex / CB.COMBINATION)
    assert carried.regimes["time"].weight == 0.5 and "combination.json" in (ex / "README.md").read_text()
    a = _ask(Model.load(ex), pair, ctx)
    assert a.answered_by["predictor"] == "combined"
    assert a.quantile(0.5) == _ask(Model.load(run), pair, ctx).quantile(0.5)


@pytest.mark.parametrize("asked, matches", [(("both", True, 1, 16, True), True), (("both", True, 1, 8, True), False),
                                            (("probe", True, 1, 16, False), False)])
def test_a_per_regime_prompt_as_eval_regimes_records_it_is_the_one_answers_compare(asked, matches):
    """`eval --regimes` records each regime's prompt under meta["prompts"] (its `PromptSpec.describe`);
    an answer asked with that prompt shape matches it, another shape is named as the reason the
    model answers."""
    from pingctl.infer.predictor import prompt_keys, prompt_mismatch
    from pingctl.prompt import Policy, PromptSpec

    spec = PromptSpec(Policy.BOTH, context=16, context_dst=16, cap=1, hint=True)
    fit = CB.RegimeFit("embedding", 0.0, 0.2, 100, {"model": 5.0, "classical": 4.0, "combined": 3.0})
    comb = CB.Combination({"pair": fit}, {"prompts": {"pair": spec.describe()}}, path="c.json")
    why = prompt_mismatch(comb, "pair", prompt_keys(*asked))
    assert (why is None) == matches, why
    if not matches:
        assert "c.json was fitted with" in why and "pair regime" in why
