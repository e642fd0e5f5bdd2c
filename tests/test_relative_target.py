"""`loader.relative_target`: a hinted triangulation query's RTT relative to the hint its prompt shows
(pingctl/tokenizer/relative.py; docs/loader.md, "Hints"), in the loader and in every answer."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pingctl.config import Config
from pingctl.loader.sequences import FULL, NONE, PARTIAL, RecordLengths, Shaping, choose_contexts, plan_inputs
from pingctl.loader.triangulation import Triangulation, choose_triangulation, pack_element
from pingctl.tokenizer import C, decode, validate
from pingctl.tokenizer.relative import REF_MS, has_scale, scale_of_hint, to_absolute, to_relative
from pingctl.tokenizer.rtt_codec import (CEILING_CODE, CEILING_MS, POSSIBLE_FIRST_BYTES, decode_rtt, error_bound_ms,
                                         token_codes)
from pingctl.loader.hints import Hints
from tests.test_hints import hinted_run  # noqa: F401 - a fixture
from tests.test_triangulation import _pingctl, _world, both_rows, tri_run  # noqa: F401 - fixtures

SEQ = 256
MODES = st.sampled_from([FULL, PARTIAL, NONE])
RTTS = st.one_of(st.floats(0.0, 1e7), st.sampled_from([0.0, 5e-4, 1e-9, CEILING_MS, 1e300, np.inf, np.nan, -1.0]))
SCALES = st.one_of(st.floats(1e-3, 1e6), st.sampled_from([1e-12, 4e-4, 5e-4, 1e-3, CEILING_MS, 1e12, np.inf,
                                                          np.nan, 0.0, -3.0]))


def _hints(seed: int, share: float) -> Hints:
    """Points for `_world`'s addresses 10.0.0.0-9 in two folds and the every-pair fit, every node
    placed, at scales that put estimates from under a millisecond to seconds."""
    rng = np.random.default_rng(seed + 1)
    keys = np.zeros((10, 17), np.uint8)
    keys[:, 0], keys[:, 3] = 10, np.arange(10)
    return Hints(keys, rng.normal(0, 1, (3, 10, 2)), rng.uniform(0, 0.2, (3, 10)), np.ones((3, 10), bool),
                 10.0 ** rng.uniform(-1, 3, 3), share=share)


# ----------------------------------------------------------------- the rule


def _valid(codes) -> bool:
    codes = np.asarray(codes, np.int64)
    return bool((codes <= CEILING_CODE).all() and POSSIBLE_FIRST_BYTES[codes >> 8].all())


@given(RTTS, SCALES)
@settings(max_examples=400)
def test_any_rtt_and_scale_make_a_code_a_token_stream_may_carry(rtt, hint):
    scale = scale_of_hint([hint])
    assert np.isnan(scale[0]) or scale[0] > 0
    assert _valid(token_codes(to_relative([rtt], scale)))
    assert np.isfinite(to_absolute(decode_rtt(token_codes(to_relative([rtt], scale))), scale)).all()


@given(st.floats(1e-3, 1e5), st.floats(0.01, 1e4))
@settings(max_examples=400)
def test_a_relative_rtt_round_trips_within_the_codec_s_bound(rtt, hint):
    scale = float(scale_of_hint(hint))
    rel = float(to_relative(rtt, scale))
    if rel > CEILING_MS:
        return  # clamped, as any RTT past the ceiling
    back = float(to_absolute(decode_rtt(token_codes([rel]))[0], scale))
    # the codec's bound in relative units, back in ms, and float64's rounding on top
    assert abs(back - rtt) <= float(error_bound_ms(rel)) * scale / REF_MS * (1 + 1e-12) + 1e-12 * rtt


@given(st.floats(0.0, 1e6), st.floats(0.0, 1e6), SCALES)
@settings(max_examples=400)
def test_the_relative_code_rises_with_the_rtt(a, b, hint):
    scale = scale_of_hint([hint])
    lo, hi = token_codes(to_relative(sorted((a, b)), scale))
    assert lo <= hi


def test_the_scale_is_the_hint_as_its_code_shows_it_and_none_leaves_rtts_absolute():
    hint = np.array([12.3, 150.0, 0.0, 1e-4, np.nan, -1.0, 1e9])
    got = scale_of_hint(hint)
    np.testing.assert_array_equal(got[:2], decode_rtt(token_codes(hint[:2])))  # 12.304, 150.016
    assert got[0] != 12.3
    assert np.isnan(got[2:6]).all()  # 0 ms, a code of 0 ms, no hint, a negative
    assert got[6] == CEILING_MS  # a hint past the ceiling shows the ceiling
    rtt = np.array([24.0, -1.0, np.nan, 7.0])
    scale = np.array([got[0], got[0], got[0], np.nan])
    rel = to_relative(rtt, scale)
    assert rel[0] == 24.0 * REF_MS / got[0] and rel[1] == -1.0 and np.isnan(rel[2]) and rel[3] == 7.0
    np.testing.assert_array_equal(to_absolute(np.array([100.0, 50.0]), np.array([got[1], np.nan])), [got[1], 50.0])
    assert not has_scale(None) and not has_scale(np.nan) and has_scale(1.0)


def test_relative_target_needs_hints():
    with pytest.raises(ValueError, match="relative_target"):
        Config.model_validate({"loader": {"relative_target": True, "triangulation_share": 0.5}})
    cfg = Config.model_validate({"loader": {"relative_target": True, "triangulation_share": 0.5,
                                            "hints_file": "h.npz"}})
    assert cfg.loader.relative_target and not Config().loader.relative_target


# ----------------------------------------------------------------- the loader


def _contexts(chosen):
    ends = np.cumsum([len(i) for i in chosen.plan.idx])
    return list(zip(np.r_[0, ends[:-1]], ends))


def _hinted(m, a, b) -> bool:
    """Whether context [a, b) holds a hint: its query pair just before the query."""
    return b - a > 1 and m.src[b - 2, 3] == m.src[b - 1, 3] and m.dst[b - 2, 3] == m.dst[b - 1, 3]


@given(st.integers(0, 2**31), st.integers(0, 6), st.integers(0, 6), MODES, st.sampled_from([SEQ, 48, 40, 30]))
@settings(max_examples=60, deadline=None)
def test_a_hinted_query_is_relative_to_its_hint_and_nothing_else_changes(seed, k_src, k_dst, mode, seq):
    """The same draws with and without relative_target: the same contexts, the same measurements,
    but each hinted query's RTT is to_relative(its RTT, the hint as shown); every other
    measurement (sides, hints, unhinted queries, a query whose hint a tight room cut off) as
    before. Tight rooms (`seq` down to 30 tokens) cut hints off."""
    probes, lookup = _world(seed)
    hints = _hints(seed, share=0.5)
    for rec in probes.values():
        got = {}
        for rel in (False, True):
            tri = Triangulation(1.0, max(k_src, 1), k_dst, 1, hints, rel)
            got[rel] = choose_triangulation(rec, np.random.default_rng(seed), 3, seq, np.eye(3)[mode], "compact",
                                            tri, lookup)
        a_, r_ = got[False], got[True]
        assert [i.tolist() for i in a_.plan.idx] == [i.tolist() for i in r_.plan.idx]
        ma, mr = a_.measurements(), r_.measurements()
        for f in ("src", "dst", "time_s", "has_time"):
            np.testing.assert_array_equal(getattr(ma, f), getattr(mr, f))
        want = ma.rtt_ms.copy()
        for a, b in _contexts(a_):
            if _hinted(ma, a, b):
                want[b - 1] = to_relative(ma.rtt_ms[b - 1], scale_of_hint(ma.rtt_ms[b - 2]))
        np.testing.assert_array_equal(mr.rtt_ms, want)


@given(st.integers(0, 2**31), MODES, st.floats(0.0, 1.0))
@settings(max_examples=25, deadline=None)
def test_packed_rows_carry_the_relative_code_of_every_hinted_query(seed, mode, result_last):
    """Rows as the pipeline packs them (`pack_element`: plain rows, then triangulation rows, one
    encode): with relative_target the tokens differ from the same seed's without it only in the
    two code bytes of hinted queries, which decode to token_codes(to_relative(RTT, hint shown));
    the rows stay grammatical."""
    probes, lookup = _world(seed)
    hints = _hints(seed, share=0.6)
    n_hinted = 0
    for rec in probes.values():
        rows = {}
        for rel in (False, True):
            tri = Triangulation(1.0, 4, 4, 1, hints, rel)
            rows[rel] = pack_element(rec, np.random.default_rng(seed), 1, 2, SEQ, np.eye(3)[mode], "compact",
                                     Shaping(result_last), tri, lookup, RecordLengths(rec, "compact"))
        np.testing.assert_array_equal(rows[False].segment, rows[True].segment)
        # the RTT each query had: the same draws choose the same contexts
        rng = np.random.default_rng(seed)
        plain = choose_contexts(rec, rng, 1, SEQ, np.eye(3)[mode], "compact")
        plan_inputs(rng, plain, "compact", result_last) if plain.idx else None
        chosen = choose_triangulation(rec, rng, 2, SEQ, np.eye(3)[mode], "compact",
                                      Triangulation(1.0, 4, 4, 1, hints), lookup)
        actual = iter([rec.rtt_ms[i[-1]] for i in chosen.plan.idx])
        differ = rows[False].tokens != rows[True].tokens
        for r in range(1, 3):  # the triangulation rows
            seg_a, seg_r = rows[False].segment[r], rows[True].segment[r]
            for k in range(1, seg_a.max() + 1):
                da, dr = decode(rows[False].tokens[r][seg_a == k]).measurements, \
                    decode(rows[True].tokens[r][seg_r == k]).measurements
                assert validate(rows[True].tokens[r][seg_r == k]) == []
                rtt, n = next(actual), len(da)
                if _hinted(da, 0, n) and rtt >= 0:
                    want = decode_rtt(token_codes(to_relative([rtt], scale_of_hint(da.rtt_ms[n - 2 : n - 1]))))[0]
                    assert dr.rtt_ms[n - 1] == want
                    n_hinted += 1
                    at = np.flatnonzero(seg_r == k)
                    code = at[np.flatnonzero(rows[True].tokens[r][at] == C.RttStart)[-1]] + np.array([1, 2])
                    differ[r, code] = False  # the query's code bytes (its result block comes last)
                    assert (da.rtt_ms[: n - 1] == dr.rtt_ms[: n - 1]).all()
                else:
                    assert (da.rtt_ms == dr.rtt_ms).all()
        assert not differ.any()  # the plain row and every other token as without relative_target
    # a draw with no hinted query proves nothing about the relative code: ask for another
    assume(n_hinted > 0)


# ----------------------------------------------------------------- answers: one run, relative or not


QUANTILE_KEYS = ("p5_ms", "p25_ms", "p50_ms", "p75_ms", "p95_ms")


@pytest.fixture(scope="module")
def relative_run(hinted_run, tmp_path_factory):
    """The hinted fixture run with loader.relative_target set (the weights do not care): every
    hinted answer is then read relative to its hint."""
    import shutil

    from pingctl.artifacts.run import CONFIG, read_config_doc, write_config

    run = tmp_path_factory.mktemp("relative") / "run"
    shutil.copytree(hinted_run, run)
    doc = read_config_doc(run / CONFIG)
    doc["loader"]["relative_target"] = True
    write_config(run / CONFIG, doc)
    return run


def _answers(run, s, d, t, train, pairs_file, model_cls) -> dict:
    """One hinted pair asked through `pingctl sample`, Model.rtt and Model.rtt_many (exact)."""
    import json

    asked = ["--src", s, "--dst", d, "--time", t, "--context", train, "--context-policy", "both",
             "--context-k", 5, "--json"]
    cli = json.loads(_pingctl("sample", run, *asked).stdout)
    model = model_cls.load(run)
    one = model.rtt(s, d, time=t, context=train, context_policy="both", context_k=5).summary()
    many = model.rtt_many(pairs_file, context=train, context_policy="both", context_k=5,
                          exact=True).table.to_pylist()[0]
    return {"sample": cli, "rtt": one, "rtt_many": many}


@pytest.mark.slow
def test_a_relative_run_answers_every_path_in_ms_the_absolute_answer_times_hint_over_ref(
        hinted_run, relative_run, time_split, tmp_path):
    """sample, Model.rtt, Model.rtt_many and an export of the relative run give one pair the same
    quantiles, each the unflipped run's times the hint's scale / REF_MS (to the bit: the same
    codes' probabilities, read in other units); eval's answers of the two runs differ by one
    code-valued scale per packet."""
    import pyarrow.parquet as pq

    from pingctl import Model

    row = pq.read_table(time_split / "test").slice(0, 1).to_pylist()[0]
    s, d, t = row["src_addr"], row["dst_addr"], int(row["event_time"].timestamp())
    f = tmp_path / "pairs.csv"
    f.write_text(f"src,dst,time\n{s},{d},{t}\n")
    train = time_split / "train"
    got = {name: _answers(run, s, d, t, train, f, Model) for name, run in (("abs", hinted_run), ("rel", relative_run))}
    hint = got["rel"]["sample"]["hint_ms"]
    assert hint == got["abs"]["sample"]["hint_ms"]
    scale = scale_of_hint([hint])[0]
    assert np.isfinite(scale) and scale != REF_MS
    for path in ("sample", "rtt", "rtt_many"):
        rel = np.array([got["rel"][path][k] for k in QUANTILE_KEYS])
        absolute = np.array([got["abs"][path][k] for k in QUANTILE_KEYS])
        np.testing.assert_array_equal(rel, to_absolute(absolute, scale), err_msg=path)
        np.testing.assert_array_equal(rel, [got["rel"]["sample"][k] for k in QUANTILE_KEYS], err_msg=path)
    assert got["rel"]["sample"]["p_fail"] == got["abs"]["sample"]["p_fail"]
    # an export carries the setting, and its answers are the run's
    _pingctl("export", relative_run, "-o", tmp_path / "ex", "--json")
    import json

    assert json.loads((tmp_path / "ex" / "config.json").read_text())["loader"]["relative_target"] is True
    exported = _answers(tmp_path / "ex", s, d, t, train, f, Model)["sample"]
    np.testing.assert_array_equal([exported[k] for k in QUANTILE_KEYS],
                                  [got["rel"]["sample"][k] for k in QUANTILE_KEYS])
    # config.json's copy edited alone would read answers in the wrong unit: refused, naming it
    import shutil

    shutil.copytree(tmp_path / "ex", tmp_path / "edited")
    doc = json.loads((tmp_path / "edited" / "config.json").read_text())
    doc["loader"]["relative_target"] = False
    (tmp_path / "edited" / "config.json").write_text(json.dumps(doc))
    refused = _pingctl("inspect", tmp_path / "edited", ok=False)
    assert refused.returncode == 1 and "relative_target" in refused.stderr, refused.stderr
    # eval's `both` prompts carry eval's own estimate: per packet one scale, a code's value
    base = ["--train", train, "--test", time_split / "test", "--queries", 6, "--context-policy", "both",
            "--context", 4, "--context-dst", 4, "--json"]
    cols = [f"model_{c}" for c in ("median", "p05", "p25", "p75", "p95")]
    ev = {}
    for name, run in (("abs", hinted_run), ("rel", relative_run)):
        _pingctl("eval", run, *base, "-o", tmp_path / f"ev-{name}")
        table = pq.read_table(tmp_path / f"ev-{name}" / "predictions.parquet")
        ev[name] = np.stack([table.column(c).to_numpy() for c in cols], axis=1)
    ratio = ev["rel"][:, 0] / ev["abs"][:, 0]
    hinted = ratio != 1.0  # no code is worth REF_MS exactly, so a hinted packet's ratio is never 1
    assert hinted.any()
    # the code value each hinted packet's hint showed; NaN (in ms as it was) for the others
    scales = np.where(hinted, decode_rtt(token_codes(ratio * REF_MS)), np.nan)
    np.testing.assert_allclose(scales[hinted], ratio[hinted] * REF_MS, rtol=1e-12)
    np.testing.assert_array_equal(ev["rel"], to_absolute(ev["abs"], scales[:, None]))


@pytest.mark.slow
def test_a_relative_run_answers_prompts_without_a_hint_in_ms_as_before(hinted_run, relative_run, time_split):
    """The documented fallback: a prompt without a hint (the probe policy, `pingctl score`'s
    prompts, the service's) is answered by a relative run exactly as by the same run without
    the setting; the service answers over a real HTTP server on 127.0.0.1."""
    import pyarrow.parquet as pq

    from pingctl import Model
    from pingctl.infer.model import LoadedModel
    from pingctl.serve.app import create_app
    from pingctl.serve.server import ServerThread
    from tests.test_serve import call

    test = pq.read_table(time_split / "test").slice(0, 4)
    row = test.to_pylist()[0]
    s, d, t = row["src_addr"], row["dst_addr"], int(row["event_time"].timestamp())
    want = Model.load(hinted_run).rtt(s, d, time=t).summary()
    rel = Model.load(relative_run)
    assert rel.rtt(s, d, time=t).summary() == want
    for policy in ("both", "probe"):
        a = Model.load(hinted_run).score(test, context_policy=policy)
        b = rel.score(test, context_policy=policy)
        for c in ("nll", "pit", "tail_p", "p_fail"):
            np.testing.assert_array_equal(b.column(c).to_numpy(), a.column(c).to_numpy(), err_msg=(policy, c))
    with ServerThread(create_app(LoadedModel.load(relative_run), warmup=False)) as srv:
        status, got = call(srv, "POST", "/rtt", {"src": s, "dst": d, "time": t, "exact": True})
    assert status == 200, got
    for k in (*QUANTILE_KEYS, "p_fail"):
        assert got[k] == want[k], k


# ----------------------------------------------------------------- loss_keep in triangulation rows


def test_loss_keep_masks_triangulation_rows_by_the_target_s_field(both_rows):
    """`loader.loss_keep` with triangulation contexts (docs/loader.md, "Field weights"): the same
    rows as without it, and a target counts only where its token's field is kept: result 1,
    the others 0 leaves exactly the RTT code bytes of every measurement (the result header,
    RttStart or Failed, is structure)."""
    from pingctl.config import LoaderConfig
    from pingctl.loader.pipeline import make_dataset
    from pingctl.tokenizer.spec import fields, get_spec, token_fields

    cfg = dict(seq_len=SEQ, batch_size=4, workers=0, shuffle_window=32, triangulation_share=1.0, result_last=1.0)
    keep = {"result": 1.0, "src": 0.0, "dst": 0.0, "time": 0.0, "structure": 0.0}
    plain = next(iter(make_dataset(both_rows / "both", LoaderConfig(**cfg))))
    kept = next(iter(make_dataset(both_rows / "both", LoaderConfig(**cfg, loss_keep=keep))))
    np.testing.assert_array_equal(kept["inputs"], plain["inputs"])
    spec = get_spec("compact")
    field = token_fields(kept["inputs"], spec)  # a target at t is the token at t + 1
    counts = kept["targets_segmentation"][:, :-1] > 0
    in_context = plain["targets_segmentation"][:, :-1] > 0
    is_result = field[:, 1:] == fields(spec).index("result")
    np.testing.assert_array_equal(counts, in_context & is_result)
    assert counts.any() and (in_context & ~is_result).any()
    # every context is a triangulation one: its query's code is among the counted targets
    for r in range(len(kept["inputs"])):
        seg = kept["inputs_segmentation"][r]
        for k in range(1, seg.max() + 1):
            at = np.flatnonzero(seg == k)
            if kept["inputs"][r][at[-1]] != C.Failed:  # the query's result closes its context
                assert counts[r, at[-3]] and counts[r, at[-2]]
