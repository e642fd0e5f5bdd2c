"""The Python API (`pingctl.api`, docs/api.md): the manual's examples run, every method gives
the numbers `pingctl sample` gives for the same question, and refuses what it refuses."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.errors import PingctlError, UsageError

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()
FIGURES = ("p_fail", "mean_ms", "p_over_ceiling", "trimmed_mean_ms", "p5_ms", "p25_ms", "p50_ms", "p75_ms", "p95_ms")


def _cli(*args) -> dict:
    r = runner.invoke(app, ["sample", *map(str, args), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def m(tiny_run):
    from pingctl import Model

    return Model.load(tiny_run)


@pytest.fixture(autouse=True)
def one_load(request, monkeypatch):
    """Each load of the fixture run here (the CLI's, the manual's) gets the model this module
    loaded: what the comparisons check is the path from a question to its numbers, CLI against
    API; loading itself is tests/test_sample.py's (a load is seconds of MaxText start-up)."""
    if "m" not in request.fixturenames:
        return
    tiny_run = request.getfixturevalue("tiny_run")  # asked for here only: a test without a model stays fast
    from pingctl.infer.model import LoadedModel

    m = request.getfixturevalue("m")
    real = LoadedModel.load.__func__

    def load(cls, run_dir, step=None, hardware=None, batch=32, engine=None):
        if Path(run_dir).resolve() == Path(tiny_run).resolve() and step is None and hardware is None \
                and engine in (None, m.loaded.engine):
            return m.loaded
        return real(cls, run_dir, step, hardware, batch, engine)

    monkeypatch.setattr(LoadedModel, "load", classmethod(load))


@pytest.fixture(scope="module")
def history(synth_rows, pair, tmp_path_factory):
    """A context file: 20 measurements of the pair's source, after 20 of other sources."""
    t = pq.read_table(synth_rows / "synth" / "part-00000.parquet")
    mine = t.filter(pc.equal(t.column("src_addr"), pair[0])).slice(0, 20)
    others = t.filter(pc.not_equal(t.column("src_addr"), pair[0])).slice(0, 20)
    f = tmp_path_factory.mktemp("api") / "history.parquet"
    pq.write_table(pa.concat_tables([others, mine]), f)
    times = mine.column("event_time").cast(pa.int64()).to_numpy() // 10**6
    return f, int(np.unique(times)[2])  # a time with a few of the source's measurements before it


def test_import_pingctl_loads_nothing_heavy_until_model_is_used():
    code = ("import sys, pingctl; heavy = ('jax', 'maxtext', 'pyarrow', 'numpy', 'duckdb', 'matplotlib'); "
            "print(','.join(h for h in heavy if h in sys.modules)); print('Model' in dir(pingctl)); "
            "from pingctl import Model; import pingctl.api; print(Model is pingctl.api.Model)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["", "True", "True"]
    import pingctl

    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        pingctl.nothing  # noqa: B018


def test_the_manual_examples_run(m, tiny_run, history, tmp_path, monkeypatch):
    """Every ```python block of docs/api.md, in order, in one namespace, against the fixture
    run; the run and the context table are rebound through the manual's own variables."""
    text = (REPO / "docs" / "api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    assert blocks[0].splitlines()[0] == "from pingctl import Model"  # the notebook lines open the page
    code = "\n".join(blocks)
    for name, value in (("RUN", tiny_run), ("CONTEXT", history[0])):
        code, n = re.subn(rf'^{name} = "[^"]*"', f"{name} = {str(value)!r}", code, flags=re.MULTILINE)
        assert n == 1, f"docs/api.md no longer sets {name} in one place"
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(code, "docs/api.md", "exec"), ns)  # noqa: S102 - the manual's own examples
    # what the examples say they produce
    assert set(ns["m"].rtt("78.143.22.26", "194.255.199.229").quantiles) == {0.05, 0.25, 0.5, 0.75, 0.95}
    assert ns["info"]["preset"] == "tiny" and ns["info"]["seq_len"] == 256
    assert len(ns["draws"]) == 10_000 and (tmp_path / "rtt.png").read_bytes()[:4] == b"\x89PNG"
    assert ns["preds"].rows_read == 3 and ns["preds"].answered == 2
    assert [(r["row"], r["reason"]) for r in ns["preds"].rejects] == [(2, "bad_address")]
    seen = runner.invoke(app, ["inspect", str(tmp_path / "predictions.parquet"), "--json"])
    assert seen.exit_code == 0 and json.loads(seen.stdout)["kind"] == "predictions", seen.output
    assert len(ns["ctx"]) > 0 and ns["streams"].num_rows > 0 and "stream" in ns["streams"].column_names
    assert len(ns["found"]) <= 5 and ns["scores"].num_rows == 40


def test_rtt_gives_what_sample_prints(m, tiny_run, pair, history, tmp_path):
    from pingctl.api import Context, Rtt
    from pingctl.infer.queries import MEAN_CEILING_MS, RttDistribution

    src, dst = pair
    f, cut = history
    one = _cli(tiny_run, "--src", src, "--dst", dst, "--time", cut)
    r = m.rtt(src, dst, time=cut)
    assert isinstance(r, Rtt) and isinstance(r, RttDistribution)
    assert set(r.info) == set(one)
    for k in FIGURES:
        assert r.summary()[k] == pytest.approx(one[k], rel=1e-6), k
    assert r.quantiles == {q: pytest.approx(one[f"p{round(q * 100)}_ms"], rel=1e-6) for q in r.quantiles}
    # the mean is the CLI's: over RTT <= the ceiling, renormalised
    below = r.values_ms <= MEAN_CEILING_MS
    assert r.mean == pytest.approx((r.values_ms[below] * r.probs[below]).sum() / r.probs[below].sum())
    assert r.mean == pytest.approx(one["mean_ms"], rel=1e-6) and r.p_over() == pytest.approx(one["p_over_ceiling"])
    # an ISO time and a datetime are the same question as Unix seconds
    import datetime as dt

    when = dt.datetime.fromtimestamp(cut, dt.UTC)
    assert m.rtt(src, dst, time=when.isoformat()).time == m.rtt(src, dst, time=when.replace(tzinfo=None)).time == cut
    # a context: the source's probe's rows before the time, however the table is given
    ctx = _cli(tiny_run, "--src", src, "--dst", dst, "--time", cut, "--context", f, "--context-per-pair", 0)
    assert ctx["context_tokens"] > 0
    given = (f, pq.read_table(f), Context.load(f))
    for c in given:
        r = m.rtt(src, dst, time=cut, context=c, context_per_pair=0)
        assert r.info["context_tokens"] == ctx["context_tokens"], type(c)
        assert r.info["context_rows"]["rows_used"] == ctx["context_rows"]["rows_used"] > 0
        for k in FIGURES:
            assert r.summary()[k] == pytest.approx(ctx[k], rel=1e-6), (type(c), k)
    assert r.p_fail != pytest.approx(one["p_fail"], rel=1e-9)  # the context did change the answer


def test_rtt_draws_and_figure(m, pair, tmp_path):
    from pingctl.api import MAX_DRAWS

    r = m.rtt(*pair)
    n = 200_000
    x = r.sample(n, rng=7)
    assert np.array_equal(x, r.sample(n, rng=np.random.default_rng(7)), equal_nan=True)
    failed = np.isnan(x)
    sd = np.sqrt(r.p_fail * (1 - r.p_fail) / n)
    assert abs(failed.mean() - r.p_fail) < 5 * sd + 1e-9
    ok = x[~failed]
    assert set(np.unique(ok)) <= set(r.values_ms[r.probs > 0])
    for q in (0.05, 0.5, 0.95):  # the draws' CDF crosses q at the distribution's quantile
        v = r.quantile(q)
        assert (ok < v).mean() <= q + 0.01 and (ok <= v).mean() >= q - 0.01, q
    fig = r.plot(tmp_path / "d.png")
    assert fig.axes and (tmp_path / "d.png").read_bytes()[:4] == b"\x89PNG"
    assert r.plot() is not None and not (tmp_path / "none.png").exists()
    for bad in (0, -3, MAX_DRAWS + 1, 2.5, True):
        with pytest.raises(UsageError):
            r.sample(bad)
    for q in (-0.1, 1.5, float("nan"), "half"):
        with pytest.raises(UsageError, match="probability between 0 and 1"):
            r.quantile(q)


@pytest.fixture(scope="module")
def pairs_csv(synth_rows, pair, tmp_path_factory):
    t = pq.read_table(synth_rows / "synth" / "part-00000.parquet", columns=["src_addr", "dst_addr", "ip_version"])
    v4 = t.filter(pc.equal(t.column("ip_version"), 4))
    src = pair[0]
    dsts = sorted(set(v4.filter(pc.equal(v4.column("src_addr"), src)).column("dst_addr").to_pylist()))[:2]
    f = tmp_path_factory.mktemp("apipairs") / "pairs.csv"
    f.write_text("src,dst,time\n" + "".join(f"{src},{d},\n" for d in dsts) + "300.1.1.1,1.2.3.4,\n"
                 f"{src},{dsts[0]},1704283200\n{src},{dsts[0]},\n")
    return f, src, dsts


def test_rtt_many_writes_what_sample_pairs_writes(m, tiny_run, pairs_csv, tmp_path):
    f, src, dsts = pairs_csv
    out = tmp_path / "p.parquet"
    cli = _cli(tiny_run, "--pairs", f, "--exact", "-o", out)
    written = pq.read_table(out)
    got = m.rtt_many(f, exact=True)
    assert (got.rows_read, got.answered, got.rows_rejected) == (cli["rows_read"], cli["answered"],
                                                                 cli["rows_rejected"]) == (5, 4, 1)
    assert got.table.column_names == written.column_names and got.table.schema.equals(written.schema)
    for name in written.column_names:
        a, b = got.table.column(name).to_pylist(), written.column(name).to_pylist()
        if isinstance(a[0], float):
            assert a == pytest.approx(b, rel=1e-6), name
        else:
            assert a == b, name
    assert [(r["line"], r["reason"]) for r in got.rejects] == [(4, "bad_address")] == [
        (r["line"], r["reason"]) for r in cli["rejects"]]
    assert json.loads(got.table.schema.metadata[b"pingctl"])["exact"] is True
    # a list of dicts and a pyarrow Table: the same answers, rows numbered from 0
    rows = [{"src": src, "dst": dsts[0]}, {"src": src, "dst": "fe80::1%eth0"}, {"src": src, "dst": dsts[1],
                                                                                  "time": None}]
    for given in (rows, pa.Table.from_pylist(rows)):
        p = m.rtt_many(given, exact=True)
        assert p.table.column("row").to_pylist() == [0, 2] and [r["row"] for r in p.rejects] == [1]
        assert p.rejects[0]["reason"] == "zone_id" and p.rows_read == p.answered + p.rows_rejected == 3
        assert p.table.column("p50_ms").to_pylist() == pytest.approx(
            [written.column("p50_ms")[0].as_py(), written.column("p50_ms")[1].as_py()], rel=1e-6)
    # times as Python values: Unix seconds, ISO text and datetimes are one question
    import datetime as dt

    when = dt.datetime(2024, 1, 3, 12, tzinfo=dt.UTC)
    p = m.rtt_many([{"src": src, "dst": dsts[0], "time": t} for t in (1704283200, when.isoformat(), when,
                                                                          "yesterday")])
    assert p.table.column("time").to_pylist() == [1704283200] * 3 and p.rejects[0]["reason"] == "bad_time"
    assert len(set(p.table.column("p50_ms").to_pylist())) == 1
    # the default (exact at the quantiles) reads the same quantiles
    fast = m.rtt_many(f)
    assert fast.table.column("p50_ms").to_pylist() == pytest.approx(written.column("p50_ms").to_pylist(), rel=0.01)


def test_rtt_many_in_its_three_steps_batches_callers_apart(m, pairs_csv, history, pair):
    # two callers, one with a context: their prompts in one rtt_summaries call, each answer the
    # one rtt_many gives it alone
    f, src, dsts = pairs_csv
    ctx_file, _ = history
    a = m.rtt_prompts(f)
    b = m.rtt_prompts([{"src": pair[0], "dst": pair[1]}, {"src": pair[0], "dst": pair[1]}], context=ctx_file)
    assert len(a) == a.pairs.distinct and len(b) == 1  # a repeated question has one prompt
    assert len(b.prompts[0]) > len(a.prompts[0])  # the context is in the prompt
    sums = m.rtt_summaries(a.prompts + b.prompts)
    for asked, part, alone in ((a, sums[: len(a)], m.rtt_many(f)),
                               (b, sums[len(a):], m.rtt_many([{"src": pair[0], "dst": pair[1]}] * 2, context=ctx_file))):
        got = m.rtt_predictions(asked, part)
        assert got.table.column_names == alone.table.column_names and got.rows_read == alone.rows_read
        for name in ("p_fail", "p50_ms", "p95_ms", "trimmed_mean_ms", "context_measurements"):
            assert got.table.column(name).to_pylist() == pytest.approx(alone.table.column(name).to_pylist(),
                                                                       rel=1e-4), name
    with pytest.raises(ValueError, match="summaries for"):
        m.rtt_predictions(a, sums[:1])


def test_completions_search_and_streams_are_the_cli_s(m, tiny_run, pair):
    src, dst = pair
    a, b = dst.split(".")[:2]
    cli = _cli(tiny_run, "--src", src, "--dst", f"{a}.{b}.*.*", "--rtt", 20, "-k", 4)["completions"]
    got = m.complete(src=src, dst=f"{a}.{b}.*.*", rtt=20, k=4)
    assert [(c["src"], c["dst"]) for c in got] == [(c["src"], c["dst"]) for c in cli] and len(got) == 4
    assert [c["probability"] for c in got] == pytest.approx([c["probability"] for c in cli], rel=1e-5)
    one_sided = m.complete(dst=f"{a}.{b}.*.*", k=3)  # the source left out: any IPv4 address
    assert len(one_sided) == 3 and all(c["dst"].startswith(f"{a}.{b}.") for c in one_sided)

    cli = _cli(tiny_run, "--src", src, "--rtt", "10-40", "--n", 16, "-k", 5, "--seed", 3)["candidates"]
    got = m.search(src, (10, 40), n=16, k=5, seed=3)
    assert got == m.search(src, "10-40", n=16, k=5, seed=3)
    assert [c["dst"] for c in got] == [c["dst"] for c in cli] and [c["samples"] for c in got] == [
        c["samples"] for c in cli]
    assert [c["probability"] for c in got] == pytest.approx([c["probability"] for c in cli], rel=1e-5)

    period = ("--since", "2024-01-01T00:00:00Z", "--until", "2024-01-03T00:00:00Z")
    cli = _cli(tiny_run, "--n", 2, "--measurements", 3, "--src", src, "--seed", 1, *period)["measurements"]
    t = m.generate(2, 3, src=src, seed=1, since="2024-01-01T00:00:00Z", until=1704240000)
    assert t.num_rows == len(cli) > 0 and set(t.column("src_addr").to_pylist()) == {src}
    assert t.column("stream").to_pylist() == [r["stream"] for r in cli]
    assert t.column("dst_addr").to_pylist() == [r["dst"] for r in cli]
    assert t.column("rtt").to_pylist() == pytest.approx([r["rtt_ms"] for r in cli])
    secs = t.column("event_time").cast(pa.int64()).to_numpy() // 10**6
    assert secs.tolist() == [r["time"] for r in cli] and 1704067200 <= secs.min() and secs.max() <= 1704240000


def test_score_is_pingctl_score(m, tiny_run, history, tmp_path):
    from pingctl.infer.score import score_meta

    f, _ = history
    out = tmp_path / "s.parquet"
    # the policy named on both sides: the CLI's default and the API's need not be one
    r = runner.invoke(app, ["score", str(tiny_run), str(f), "-o", str(out), "--context", "4", "--context-policy",
                            "probe", "--json"])
    assert r.exit_code == 0, r.output
    cli = pq.read_table(out)
    got = m.score(pq.read_table(f), context=4, context_policy="probe")
    assert got.num_rows == cli.num_rows == 40 and score_meta(got)["rows_read"] == 40
    for name in ("nll", "pit", "tail_p", "p_fail", "context_measurements"):
        assert np.allclose(got.column(name).to_numpy(), cli.column(name).to_numpy(), rtol=1e-6, equal_nan=True), name
    assert got.column("context_measurements").to_numpy().max() > 0


def _refused(f) -> str:
    with pytest.raises(UsageError) as e:
        f()
    return str(e.value)


def _flagless(message: str) -> str:
    """A CLI refusal as the API words it: naming the argument, not the flag."""
    from pingctl.api.arguments import python_name

    return python_name(message)


def test_refusals_are_the_cli_s(m, pair):
    from pingctl.cli.sample_options import question_from_options
    from pingctl.infer import questions as QS

    src, dst = pair
    # the very message of the same option in the CLI, the argument named where the CLI names its flag
    for call, opts in ((lambda: m.search(src, 20, n=QS.MAX_SAMPLES + 1), {"src": src, "rtt": "20",
                                                                          "n": QS.MAX_SAMPLES + 1}),
                       (lambda: m.generate(QS.MAX_STREAMS + 1), {"n": QS.MAX_STREAMS + 1}),
                       (lambda: m.generate(1000, 2000), {"n": 1000, "measurements": 2000}),
                       (lambda: m.complete(src="8.8.*.*", k=QS.COMPLETE_BEAM + 1), {"src": "8.8.*.*",
                                                                                   "k": QS.COMPLETE_BEAM + 1}),
                       (lambda: m.search(src, "30-10"), {"src": src, "rtt": "30-10"}),
                       (lambda: m.rtt(src, dst, time="yesterday"), {"src": src, "dst": dst, "time": "yesterday"})):
        assert _refused(call) == _flagless(_refused(lambda opts=opts: question_from_options(**opts)))
    for call, words in ((lambda: m.rtt(src, "8.8.*.*"), "pattern asks for a completion"),
                        (lambda: m.rtt(src, "2001:db8::1"), "one family"),
                        (lambda: m.rtt("fe80::1%eth0", dst), "zone id"),
                        (lambda: m.rtt(src, None), "address is required"),
                        (lambda: m.rtt(src, dst, context_per_pair=2), "give context too"),
                        (lambda: m.search(src, 20, temperature=0), "temperature"),
                        (lambda: m.search(src, 20, n=2.5), "whole number"),
                        (lambda: m.generate(top_p=1.5), "top_p"),
                        (lambda: m.generate(seed=-1), "seed"),
                        (lambda: m.complete(), "give src, dst or both"),
                        (lambda: m.complete(src="8.8.*.*", rtt=(10, 30)), "one RTT"),
                        (lambda: m.rtt_many([]), "empty"),
                        (lambda: m.rtt_many(42), "expected a CSV or Parquet path"),
                        (lambda: m.rtt(src, dst, context=42), "expected a canonical table")):
        assert words in _refused(call), words
    with pytest.raises(PingctlError, match="no valid pair among 1 rows"):
        m.rtt_many([{"src": "x", "dst": "y"}])


def test_metadata_and_the_eval_report_beside_the_run(m, tiny_run, tmp_path):
    from pingctl.api import _eval_headline

    info = m.metadata()
    assert (info["run"], info["step"], info["preset"], info["scheme"]) == (str(tiny_run), m.step, "tiny", "compact")
    assert info["timestamps"] is True and info["device"] == "cpu" and info["checkpoint_time"].endswith("Z")
    assert info["training"]["last_step"] == m.step
    assert repr(m).startswith("Model(") and m.steps == (m.step,)
    # the newest report of this run among its siblings; another run's report is not its headline
    run = tmp_path / "train"
    run.mkdir()
    assert _eval_headline(run) is None
    base = {"comparisons": {}, "nll": {}, "queries": 200, "predictors": {}}
    for name, asked, err in (("eval", run, 0.2), ("other", tmp_path / "elsewhere", 0.9)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(json.dumps({
            **base, "inputs": {"run": str(asked)}, "rows": [{"predictor": "model", "median_rel_err": err}]}))
    head = _eval_headline(run)
    assert head["median_rel_err"] == {"model": 0.2} and head["report"] == str(tmp_path / "eval" / "report.json")


def test_a_calibrated_model_answers_with_the_map(m, tiny_run, pair, pairs_csv, tmp_path):
    """`Model.load(..., calibration=)` recalibrates `rtt` and `rtt_many` as `sample --calibration`
    does; an export carrying a map applies it by default; a map of another checkpoint is refused."""
    from pingctl import Model
    from pingctl.infer import calibration as CAL

    src, dst = pair
    cal_path = CAL.save(CAL.fit(np.random.default_rng(0).uniform(size=300) ** 2,
                                {"run": str(tiny_run), "steps": list(m.steps), "context_policy": "none"}),
                        tmp_path / "calibration.json")
    cal = Model.load(tiny_run, calibration=cal_path)
    assert cal.loaded is m.loaded and cal.calibration.path == str(cal_path)
    raw, got = m.rtt(src, dst), cal.rtt(src, dst)
    want = CAL.load(cal_path).apply(raw)
    assert got.quantile(0.5) == pytest.approx(want.quantile(0.5)) and got.p_fail == raw.p_fail
    assert got.quantile(0.5) != pytest.approx(raw.quantile(0.5))  # the map moved it
    assert got.info["calibration"]["path"] == str(cal_path)
    cli = _cli(tiny_run, "--src", src, "--dst", dst, "--calibration", cal_path)
    assert got.summary()["p50_ms"] == pytest.approx(cli["p50_ms"], rel=1e-6)
    many = cal.rtt_many(pairs_csv[0])
    assert json.loads(many.table.schema.metadata[b"pingctl"])["calibration"] == str(cal_path)
    raw_many = m.rtt_many(pairs_csv[0])
    assert many.table.column("p50_ms").to_pylist() != raw_many.table.column("p50_ms").to_pylist()
    assert cal.metadata()["calibration"]["path"] == str(cal_path) and m.metadata()["calibration"] is None
    assert Model.load(tiny_run, calibration=False).calibration is None
    with pytest.raises(UsageError, match="carries no calibration.json"):
        Model.load(tiny_run, calibration=True)
    other = CAL.save(CAL.fit(np.random.default_rng(1).uniform(size=300),
                             {"run": str(tiny_run), "steps": [m.step + 1000], "context_policy": "none"}),
                     tmp_path / "other.json")
    with pytest.raises(UsageError, match="fitted for step"):
        Model.load(tiny_run, calibration=other)
    # an export made with --calibration applies its map unless told not to
    out = tmp_path / "export"
    r = runner.invoke(app, ["export", str(tiny_run), "-o", str(out), "--calibration", str(cal_path)])
    assert r.exit_code == 0, r.output
    assert CAL.for_model(out, m.steps).path == str(out / "calibration.json")
    assert CAL.for_model(out, m.steps, False) is None and CAL.for_model(tiny_run, m.steps) is None


# ----------------------------------------------------------------- refusals name the argument


@pytest.fixture
def unloaded():
    """A Model whose every argument check runs before the model is touched: these refusals need
    no trained run."""
    from pingctl import Model

    return Model(None)


def test_refusals_name_the_argument_not_a_flag(unloaded):
    cases = ((lambda: unloaded.rtt("192.0.2.1", "2001:db8::1"), "dst: 2001:db8::1 is IPv6 but src 192.0.2.1 is IPv4"),
             (lambda: unloaded.complete(src="8.8.*.*", dst="2001:db8::/32"), "dst: 2001:db8::/32 is IPv6"),
             (lambda: unloaded.rtt("192.0.2.1", "192.0.2.2", time="yesterday"), "time "),
             (lambda: unloaded.search("192.0.2.1", "30-10"), "rtt '30-10': need finite"),
             (lambda: unloaded.rtt("fe80::1%eth0", "192.0.2.2"), "src "))
    for call, start in cases:
        message = _refused(call)
        assert message.startswith(start), message
        assert "--" not in message, message


def test_a_pairs_table_without_a_column_is_named_not_its_temporary_file(unloaded, tmp_path):
    with pytest.raises(PingctlError) as e:
        unloaded.rtt_many(pa.table({"src": ["192.0.2.1"], "destination": ["192.0.2.2"]}))
    message = str(e.value)
    assert message.startswith("pairs (a pyarrow Table): no dst or dst_addr column"), message
    assert "pingctl-pairs-" not in message and "--pairs" not in message and "parquet" not in message, message
    with pytest.raises(PingctlError) as e:
        unloaded.rtt_many([{"src": "192.0.2.1"}])
    assert str(e.value).startswith("pairs (a list of dicts): no dst or dst_addr column"), str(e.value)
    f = tmp_path / "pairs.csv"
    f.write_text("src,to\n192.0.2.1,192.0.2.2\n")
    with pytest.raises(PingctlError) as e:
        unloaded.rtt_many(f)
    assert str(e.value).startswith(f"pairs {f}: no dst or dst_addr column"), str(e.value)
    with pytest.raises(PingctlError, match=r"^pairs .*: no such file"):
        unloaded.rtt_many(tmp_path / "missing.csv")


def test_shared_bounds_are_reworded_as_argument_names(unloaded):
    # the question objects `pingctl sample` shares word their bounds with CLI flags; Model does not
    cases = ((lambda: unloaded.search("192.0.2.1", 20, n=10**9), "n 1,000,000,000"),
             (lambda: unloaded.generate(n=2, measurements=10**9), "measurements"),
             (lambda: unloaded.generate(since="2030-01-02", until="2030-01-01"), "since "),
             (lambda: unloaded.rtt("192.0.2.1", "192.0.2.2", context_policy="nope"), "context_policy 'nope'"))
    for call, start in cases:
        message = _refused(call)
        assert message.startswith(start), message
        assert "--" not in message, message


def test_python_name_rewrites_only_options():
    from pingctl.api.arguments import python_name

    assert python_name("--n 5 x --measurements 9 with -k 3") == "n 5 x measurements 9 with k 3"
    assert python_name("--context-per-pair caps --context") == "context_per_pair caps context"
    assert python_name("--timestamps/--no-timestamps") == "timestamps/timestamps"
    # addresses, ranges and negative numbers are left alone
    assert python_name("rtt '10-30': 2001:db8::1 -5 a-k") == "rtt '10-30': 2001:db8::1 -5 a-k"
