"""Hints: the embedding's cross-fitted estimate as a measurement before the query, in the loader's
triangulation contexts and in eval's `both` prompts (docs/loader.md, "Hints")."""

import io
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pingctl.config import Config
from pingctl.errors import PingctlError, UsageError
from pingctl.eval.hints import fit_hints
from pingctl.prompt import PromptSpec
from pingctl.infer.score import prompts
from pingctl.loader.hints import Hints, fold_of
from pingctl.loader.sequences import FULL, NONE, PARTIAL
from pingctl.loader.triangulation import Triangulation, choose_triangulation, pack_triangulation
from pingctl.tokenizer import decode, validate
from tests.test_triangulation import SEQ, _pingctl, _rtt_last, _world, tri_run  # noqa: F401 - a fixture


def _hints(seed: int, share: float = 1.0, folds: int = 2) -> Hints:
    """Random points for the addresses 10.0.0.0-9 of `_world` (`folds` fits and the every-pair
    one), every node placed in every fit but node 9 in fold 0."""
    rng = np.random.default_rng(seed)
    keys = np.zeros((10, 17), np.uint8)
    keys[:, 0], keys[:, 3] = 10, np.arange(10)
    trained = np.ones((folds + 1, 10), bool)
    trained[0, 9] = False
    return Hints(keys, rng.normal(0, 1, (folds + 1, 10, 3)), rng.uniform(0, 0.5, (folds + 1, 10)), trained,
                 rng.uniform(5, 50, folds + 1), share=share)


@given(st.integers(0, 2**31), st.integers(-5, 5), st.integers(-5, 5))
def test_a_pair_has_one_fold_whichever_way_round(seed, a, b):
    a, b = np.array([abs(a) + seed % 7]), np.array([abs(b)])
    assert fold_of(a, b, 5) == fold_of(b, a, 5)
    assert 0 <= fold_of(a, b, 5)[0] < 5


def test_the_folds_cut_the_pairs_evenly():
    a, b = np.meshgrid(np.arange(200), np.arange(200))
    counts = np.bincount(fold_of(a.ravel(), b.ravel(), 5), minlength=5)
    assert counts.min() > 0.9 * counts.mean()


def test_the_estimate_is_the_pair_s_fold_s_distance_and_nan_where_unplaced():
    h = _hints(0)
    a, b = np.array([0, 1, 2, 9, 9, -1, 3]), np.array([5, 6, 7, 5, 6, 5, 3])
    got = h.estimate(a, b)
    f = fold_of(np.maximum(a, 0), np.maximum(b, 0), h.folds)
    for i in range(5):
        if a[i] == 9 and f[i] == 0:
            assert np.isnan(got[i])  # node 9 has no point in fold 0
            continue
        want = h.scale[f[i]] * (np.linalg.norm(h.x[f[i], a[i]] - h.x[f[i], b[i]]) + h.h[f[i], a[i]] + h.h[f[i], b[i]])
        assert got[i] == pytest.approx(want)
    assert np.isnan(got[5]) and np.isnan(got[6])  # an unknown address; a node with itself


@given(st.integers(0, 2**31), st.integers(1, 6), st.integers(0, 6), st.sampled_from([FULL, PARTIAL, NONE]))
@settings(max_examples=40, deadline=None)
def test_a_hint_is_the_pair_s_estimate_untimed_just_before_its_query(seed, k_src, k_dst, mode):
    probes, lookup = _world(seed)
    hints = _hints(seed)
    rng = np.random.default_rng(seed)
    tri = Triangulation(1.0, k_src, k_dst, 1, hints)
    for rec in probes.values():
        chosen = choose_triangulation(rec, rng, 2, SEQ, np.eye(3)[mode], "compact", tri, lookup)
        m = chosen.measurements()
        ends = np.cumsum([len(i) for i in chosen.plan.idx])
        for a, b in zip(np.r_[0, ends[:-1]], ends):
            s, d, t = m.src[b - 1, 3], m.dst[b - 1, 3], m.time_s[b - 1]
            same = np.flatnonzero((m.src[a:b - 1, 3] == s) & (m.dst[a:b - 1, 3] == d))
            want = hints.estimate(np.array([s]), np.array([d]))[0]
            if np.isnan(want):  # no estimate, no hint: the pair never in its context
                assert len(same) == 0
                continue
            if b - a == 1:  # the room held the query alone
                continue
            assert same.tolist() == [b - 2 - a]  # exactly one, just before the query
            assert m.rtt_ms[b - 2] == pytest.approx(want) and not m.has_time[b - 2]
            assert (m.time_s[a:b - 2] < t).all()  # the sides as without hints
            if mode == FULL:
                assert m.has_time[a:b - 2].all() and m.has_time[b - 1]


def test_a_hint_share_leaves_some_contexts_without_one():
    probes, lookup = _world(3, n=2000)
    rng = np.random.default_rng(0)
    with_hint = []
    for share in (0.0, 0.5):
        tri = Triangulation(1.0, 4, 4, 1, _hints(3, share=share))
        got = []
        for rec in probes.values():
            chosen = choose_triangulation(rec, rng, 4, SEQ, np.eye(3)[FULL], "compact", tri, lookup)
            m = chosen.measurements()
            ends = np.cumsum([len(i) for i in chosen.plan.idx])
            got += [bool(((m.src[a:b - 1, 3] == m.src[b - 1, 3]) & (m.dst[a:b - 1, 3] == m.dst[b - 1, 3])).any())
                    for a, b in zip(np.r_[0, ends[:-1]], ends) if b - a > 1]
        with_hint.append(np.mean(got))
    assert with_hint[0] == 0.0 and 0.3 < with_hint[1] < 0.7


@given(st.integers(0, 2**31), st.floats(0.0, 1.0))
@settings(max_examples=15, deadline=None)
def test_hinted_rows_are_grammatical_with_the_query_s_rtt_last(seed, result_last):
    probes, lookup = _world(seed)
    tri = Triangulation(1.0, 4, 4, 1, _hints(seed))
    rng = np.random.default_rng(seed)
    for rec in probes.values():
        out = pack_triangulation(rec, rng, 2, SEQ, np.array([0.4, 0.3, 0.3]), "compact", tri, lookup, result_last)
        for r in range(2):
            seg = out.segment[r]
            for k in range(1, seg.max() + 1):
                toks = out.tokens[r][seg == k]
                assert validate(toks) == []
                assert _rtt_last(decode(toks))


def test_a_twin_is_charged_to_its_record_s_cache_entry():
    """The record cache stays within its bytes with hints on: a twin built for a cached record
    counts against that record's entry, so an older record goes sooner."""
    from pingctl.loader.record_cache import RecordCache
    from pingctl.loader.sequences import RecordLengths
    from pingctl.records.layout import encode as encode_record

    probes, _ = _world(5, n=3000)
    recs = list(probes.values())[:3]
    raw = [encode_record(r) for r in recs]

    calls = []

    class Reader:
        def get(self, rid):
            calls.append(rid)
            return raw[rid]

    per_record = max(len(b) + RecordLengths(r, "compact").nbytes for b, r in zip(raw, recs))
    cache = RecordCache(Reader(), "compact", cache_mb=2.2 * per_record / 1e6)  # room for two records
    hints = _hints(5)
    for rid in (0, 1):
        rec, lengths = cache.get(rid)
        before = cache.held_bytes
        twin = hints.twin(rec, lengths, "compact")
        assert twin is not None and cache.held_bytes > before  # charged
    assert hints.twin(*cache.get(1), "compact") is twin  # kept with the record: built once
    # the twins pushed the two records past the budget: the older one went
    assert cache.held_bytes <= 2.2 * per_record
    cache.get(0)
    assert calls == [0, 1, 0]


def test_hints_travel_to_workers_by_pickle():
    import pickle

    h = _hints(1)
    back = pickle.loads(pickle.dumps(h))
    a, b = np.arange(5), np.arange(5, 10)
    np.testing.assert_array_equal(back.estimate(a, b), h.estimate(a, b))


def test_a_file_that_is_not_a_hints_file_is_named(tmp_path):
    bad = tmp_path / "h.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(PingctlError, match="not a hints file"):
        Hints.load(bad)


def _npz(arrays: dict) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _changed(arrays: dict, **change) -> bytes:
    """The file of `arrays` with some replaced, each by a function of the original."""
    return _npz({**arrays, **{k: f(arrays[k]) for k, f in change.items()}})


def _set(a: np.ndarray, where, value) -> np.ndarray:
    a = a.copy()
    a[where] = value
    return a


# What a hints file can be turned into, -> (damage(arrays, file bytes) -> bytes, what the refusal says).
# Each of them was read before as an archive error (exit 70), an IndexError (exit 70) or an estimate
# used as it came (a hint of -125.4 ms or 1.25e32 ms in the prompt, exit 0).
DAMAGES = {
    "cut short": (lambda a, raw: raw[: len(raw) // 2], "not a hints file (a damaged .npz archive"),
    "empty": (lambda a, raw: b"", "not a NumPy .npz archive: empty"),
    "garbage": (lambda a, raw: b"PK\x03\x04" + bytes(range(256)) * 4, "not a hints file (a damaged .npz archive"),
    "one array": (lambda a, raw: _npy(a["x"]), "not a NumPy .npz archive: starts with b'\\x93NUM'"),
    "a member overwritten": (lambda a, raw: raw[: len(raw) // 2] + b"\xff" * 64 + raw[len(raw) // 2 + 64:],
                             "cannot be read, the file is damaged"),
    "an array missing": (lambda a, raw: _npz({k: v for k, v in a.items() if k != "trained"}), "no array trained"),
    "unequal lengths": (lambda a, raw: _changed(a, h=lambda h: h[:, :-1]), "array h has shape"),
    "a wrong dtype": (lambda a, raw: _changed(a, trained=lambda t: t.astype(np.int8)), "array trained is int8"),
    "a short key": (lambda a, raw: _changed(a, keys=lambda k: k[:, :16]), "array keys has rows of 16 bytes"),
    "a NaN point": (lambda a, raw: _changed(a, x=lambda x: _set(x, (0, 1, 0), np.nan)),
                    "array x holds 1 non-finite values (NaN or infinity)"),
    "a negative height": (lambda a, raw: _changed(a, h=lambda h: _set(h, (-1, 0), -125.4)),
                          "array h holds 1 value(s) below 0, the first -125.4 at"),
    "a negative scale": (lambda a, raw: _changed(a, scale=lambda s: -s), "array scale holds"),
    "a huge scale": (lambda a, raw: _changed(a, scale=lambda s: _set(s, -1, 1.25e32)), "array scale puts fit"),
    "huge points": (lambda a, raw: _changed(a, x=lambda x: x * 1e12), "array x puts fit 0's estimates up to"),
    "an address twice": (lambda a, raw: _changed(a, keys=lambda k: _set(k, -1, k[0])),
                         "array keys holds address 10.0.0.0 twice"),
    "one fold": (lambda a, raw: _npz({k: v[:2] for k, v in a.items() if k != "keys"} | {"keys": a["keys"]}),
                 "array x holds 2 fit(s)"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_hints_file_is_refused_at_load_naming_the_file_and_the_array(tmp_path, damage):
    """Whatever happened to the file, `Hints.load` (train's check, the loader, every hinted
    answer) says so with the input error's exit code 1, the file and what is wrong in it; an
    intact file of the same arrays loads."""
    h = _hints(0)
    arrays = {k: getattr(h, k) for k in ("keys", "x", "h", "trained", "scale")}
    good = tmp_path / "good.npz"
    good.write_bytes(_npz(arrays))
    assert Hints.load(good).folds == 2
    make, says = DAMAGES[damage]
    bad = tmp_path / "hints.npz"
    bad.write_bytes(make(arrays, good.read_bytes()))
    with pytest.raises(PingctlError) as e:
        Hints.load(bad)
    assert e.value.exit_code == 1 and str(bad) in str(e.value) and says in str(e.value), str(e.value)
    assert f"pingctl hints SPLIT -o {bad}" in str(e.value)


# ----------------------------------------------------------------- fitting


def _table(seed: int, n: int = 3000) -> dict:
    """Measurements between 12 sources and 12 destinations at RTTs that follow points on a line."""
    rng = np.random.default_rng(seed)
    pos = rng.uniform(0, 100, 24)
    s, d = rng.integers(0, 12, n), rng.integers(12, 24, n)
    rtt = np.abs(pos[s] - pos[d]) + 5 + rng.normal(0, 0.5, n)
    addr = np.array([f"10.0.{i // 256}.{i % 256}" for i in range(24)], object)
    return {"src": addr[s], "dst": addr[d], "rtt": rtt, "event_time": np.arange(n, dtype=np.int64),
            "ip_version": np.full(n, 4, np.int64)}


def _estimates(path, table) -> np.ndarray:
    import pyarrow as pa

    from pingctl.tokenizer.measurements import parse_addresses

    h = Hints.load(path)

    def codes(col):
        a, v6 = parse_addresses(pa.array(list(col), pa.string()))
        return h.codes(a, v6)

    return h.estimate(codes(table["src"]), codes(table["dst"]))


def test_a_pair_s_estimate_does_not_depend_on_its_own_measurements(tmp_path):
    """Cross-fitting: change one pair's RTTs tenfold and its estimate stays what it was (it comes
    from the one fit that never saw the pair); other pairs' estimates move."""
    t = _table(0)
    info = fit_hints(t, tmp_path / "a.npz", folds=3)
    assert info["folds"] == 3 and info["nodes"] == 24
    s0, d0 = t["src"][0], t["dst"][0]
    pair = (t["src"] == s0) & (t["dst"] == d0)
    t2 = dict(t, rtt=np.where(pair, t["rtt"] * 10, t["rtt"]))
    fit_hints(t2, tmp_path / "b.npz", folds=3)
    a, b = _estimates(tmp_path / "a.npz", t), _estimates(tmp_path / "b.npz", t)
    assert np.isfinite(a).all()
    np.testing.assert_allclose(a[pair], b[pair])
    assert not np.allclose(a[~pair], b[~pair])
    # and it is an estimate: within a few ms on these line-like RTTs
    assert np.median(np.abs(a - t["rtt"])) < 5


def test_an_answer_s_estimate_is_the_eval_baseline_s(tmp_path):
    """Both ends known: the every-pair fit is eval's `embedding` baseline; one end new: placed
    from the prompt's measurements as `embedding_refit` places it."""
    from pingctl.eval.baselines import GlobalMedian, refit_prediction
    from pingctl.eval.embedding import Embedding

    t = _table(1)
    fit_hints(t, tmp_path / "h.npz", folds=2)
    h = Hints.load(tmp_path / "h.npz")
    base = Embedding().fit(t)
    s, d = "10.0.0.3", "10.0.0.17"
    want = base.distance(base.codes([s]), base.codes([d]))[0]
    assert h.answer(s, d) == pytest.approx(want, rel=1e-9)
    # a new destination, measured from three known sources in the prompt
    new = "10.9.9.9"
    pool = {"src": np.array(["10.0.0.1", "10.0.0.2", "10.0.0.5", "10.0.0.1"], object),
            "dst": np.array([new, new, new, "10.0.0.20"], object),
            "rtt": np.array([40.0, 55.0, 20.0, 33.0]), "event_time": np.arange(4, dtype=np.int64)}
    query = {"src": np.array([s], object), "dst": np.array([new], object), "rtt": np.array([30.0]),
             "event_time": np.array([10], np.int64), "ip_version": np.array([4])}
    got = refit_prediction(base, pool, query, [np.arange(4)], GlobalMedian().fit(t).predict(query))
    peers = list(zip(pool["src"], pool["dst"], pool["rtt"]))
    assert h.answer(s, new, peers) == pytest.approx(got.info["raw_median"][0], rel=1e-6)
    assert np.isnan(h.answer(s, new)) and np.isnan(h.answer("10.9.9.8", new, peers))


def test_the_file_keeps_each_train_pair_s_median_and_history_reads_it(tmp_path):
    """`history`: the pair's median over train (one direction: a -> b is not b -> a), NaN for a
    pair never measured, an address the fit never saw, or a file written before it kept them;
    the time regime's classical estimate of an answer takes it over the prompt's packets."""
    from pingctl.eval.embedding import pair_medians
    from pingctl.infer import combine as CB
    from pingctl.infer.predictor import classical_estimate

    t = _table(2)
    fit_hints(t, tmp_path / "h.npz", folds=2)
    h = Hints.load(tmp_path / "h.npz")
    s, d = t["src"][0], t["dst"][0]
    mine = (t["src"] == s) & (t["dst"] == d)
    assert h.history(s, d) == float(np.median(t["rtt"][mine]))
    assert np.isnan(h.history(d, s)) and np.isnan(h.history(s, "10.9.9.9"))
    # every pair, read back in bulk, is `pair_medians` of the split
    from pingctl.schema.arrow_strings import codes_in, vocabulary

    vocab = vocabulary(t["src"], t["dst"])
    pa_, pb_, med = pair_medians(codes_in(t["src"], vocab), codes_in(t["dst"], vocab), t["rtt"], len(vocab))
    names = np.asarray(vocab.to_pylist(), object)
    got = np.array([h.history(a, b) for a, b in zip(names[pa_], names[pb_])])
    assert np.array_equal(got, med)
    # the answer's time estimate: the history, where the prompt holds a few of the pair's packets
    assert classical_estimate("time", [1.0, 2.0, 3.0], h, s, d) == h.history(s, d)
    assert classical_estimate("time", [1.0, 2.0, 3.0], h, d, s) == 2.0  # no history that way round
    assert classical_estimate("time", [1.0, 2.0, 3.0], None, s, d) == 2.0
    assert CB.pair_estimate(np.array([np.nan, 7.0]), np.array([2.0, 3.0])).tolist() == [2.0, 7.0]
    # a file written before the pairs were kept loads and answers no history
    old = tmp_path / "old.npz"
    with np.load(tmp_path / "h.npz") as z:
        np.savez(old, **{k: z[k] for k in ("keys", "x", "h", "trained", "scale")})
    assert np.isnan(Hints.load(old).history(s, d))
    assert classical_estimate("time", [1.0, 2.0, 3.0], Hints.load(old), s, d) == 2.0


HISTORY_DAMAGES = {
    "half the pairs' arrays": (lambda a: {k: v for k, v in a.items() if k != "pair_median"},
                               "holds pair_a, pair_b without pair_median"),
    "a code past the nodes": (lambda a: a | {"pair_b": _set(a["pair_b"], -1, 99)}, "array pair_b holds code 99"),
    "a node paired with itself": (lambda a: a | {"pair_b": _set(a["pair_b"], 0, a["pair_a"][0])},
                                  "as both ends of pair 0"),
    "pairs out of order": (lambda a: a | {k: a[k][::-1] for k in ("pair_a", "pair_b", "pair_median")},
                           "not in strictly increasing pair order"),
    "a negative median": (lambda a: a | {"pair_median": _set(a["pair_median"], 1, -3.0)},
                          "array pair_median holds -3.0 at 1"),
    "unequal lengths": (lambda a: a | {"pair_median": a["pair_median"][:-1]}, "medians for"),
}


@pytest.mark.parametrize("damage", HISTORY_DAMAGES)
def test_a_damaged_pair_history_is_refused_at_load(tmp_path, damage):
    fit_hints(_table(3, 500), tmp_path / "h.npz", folds=2)
    with np.load(tmp_path / "h.npz") as z:
        arrays = {k: z[k] for k in z.files}
    assert len(arrays["pair_a"]) > 3
    _refused_at_load(tmp_path, *HISTORY_DAMAGES[damage], arrays)


def _refused_at_load(tmp_path, make, says, arrays):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(_npz(make(arrays)))
    with pytest.raises(PingctlError) as e:
        Hints.load(bad)
    assert e.value.exit_code == 1 and str(bad) in str(e.value) and says in str(e.value), str(e.value)


def test_fit_hints_refuses_a_single_fold(tmp_path):
    with pytest.raises(ValueError, match="at least 2"):
        fit_hints(_table(0, 100), tmp_path / "h.npz", folds=1)


# ----------------------------------------------------------------- prompts at answer time


def test_an_eval_prompt_carries_the_hint_just_before_the_query_and_changes_nothing_else():
    model = SimpleNamespace(timestamps=True, seq_len=512)
    pool = {"src": np.array(["10.0.0.1", "10.0.0.2"], object), "dst": np.array(["10.0.0.9", "10.0.0.3"], object),
            "rtt": np.array([12.0, 30.0]), "event_time": np.array([100, 200], np.int64)}
    test = {"src": np.array(["10.0.0.1"], object), "dst": np.array(["10.0.0.3"], object),
            "rtt": np.array([21.0]), "event_time": np.array([300], np.int64)}
    ctx = [np.array([0, 1])]
    plain, plain_full = prompts(model, test, np.array([0]), pool, ctx)
    hint, hint_full = prompts(model, test, np.array([0]), pool, ctx, np.array([18.5]))
    dec = decode(hint_full[0]).measurements
    assert len(dec) == 4  # two context measurements, the hint, the query
    assert dec.src_text()[2] == "10.0.0.1" and dec.dst_text()[2] == "10.0.0.3"
    assert dec.rtt_ms[2] == pytest.approx(18.5, rel=0.01) and not dec.has_time[2]
    assert dec.time_s[3] == 300 and dec.has_time[3]  # the query's delta still counts from 200
    # the hint's tokens inserted before the query, the rest as without it
    q_plain, q_hint = _first_query_token(plain_full[0]), _first_query_token(hint_full[0])
    np.testing.assert_array_equal(hint_full[0][:q_plain], plain_full[0][:q_plain])
    np.testing.assert_array_equal(hint_full[0][q_hint:], plain_full[0][q_plain:])
    np.testing.assert_array_equal(hint[0][q_hint:], plain[0][q_plain:])
    # no estimate, no hint
    none, _ = prompts(model, test, np.array([0]), pool, ctx, np.array([np.nan]))
    np.testing.assert_array_equal(none[0], plain[0])


def _first_query_token(tokens) -> int:
    from pingctl.tokenizer import C

    return int(np.flatnonzero(np.asarray(tokens) == C.MeasurementStart)[-1])


def _trained(hints_file=None, share=0.5):
    return Config.model_validate({"loader": {"hints_file": hints_file, "triangulation_share": share}})


def hinted(trained, policy, use=None) -> bool:
    return PromptSpec.from_run(trained, policy=policy, hints=use).hint


def test_prompts_carry_hints_where_the_run_learned_them():
    with_hints = _trained("h.npz")
    assert hinted(with_hints, "both") and not hinted(with_hints, "pair") and not hinted(with_hints, "both", False)
    assert not hinted(_trained(), "both")
    with pytest.raises(ValueError, match="triangulation_share 0 leaves out"):
        _trained("h.npz", share=0.0)  # a hint has no place without triangulation contexts
    with pytest.raises(UsageError, match="trained without them"):
        hinted(_trained(), "both", True)


# ----------------------------------------------------------------- end to end: hints, train, sample, eval, export


@pytest.fixture(scope="session")
def hinted_run(tri_run, time_split):
    """The triangulation fixture's rows, trained a few steps with hints fitted on its train split."""
    from tests.conftest import build_once

    rows = tri_run.parent / "rows"

    def build(d):
        _pingctl("hints", time_split / "train", "-o", d / "hints.npz", "--folds", 3, "--json")
        _pingctl("train", rows / "train", "--eval", rows / "val", "--run-dir", d / "run", "--steps", 4,
                 "--set", f"loader.seq_len={SEQ}", "--set", "loader.batch_size=8", "--set", "train.eval_interval=2",
                 "--set", "train.eval_steps=1", "--set", "train.checkpoint_period=100",
                 "--set", "loader.triangulation_share=1.0", "--set", "loader.triangulation_k_src=6",
                 "--set", "loader.triangulation_k_dst=6", "--set", f"loader.hints_file={d / 'hints.npz'}", "--json")

    return build_once(time_split / "hinted", build) / "run"


@pytest.mark.slow
def test_a_hinted_run_keeps_its_hints_and_its_answers_carry_them(hinted_run, time_split, tmp_path, capsys):
    import json

    import pyarrow.parquet as pq

    from pingctl.artifacts.run import run_config

    kept = hinted_run / "hints.npz"
    assert kept.read_bytes() == (hinted_run.parent / "hints.npz").read_bytes()
    assert Path(run_config(hinted_run).loader.hints_file).is_absolute()
    info = json.loads(_pingctl("inspect", hinted_run, "--json").stdout)
    assert info["hints_kept"] == str(kept.resolve()) and info["hint_share"] == 0.5
    row = pq.read_table(time_split / "test").slice(0, 1).to_pylist()[0]
    s, d, t = row["src_addr"], row["dst_addr"], int(row["event_time"].timestamp())
    asked = ["--src", s, "--dst", d, "--time", t, "--context", time_split / "train", "--context-policy", "both",
             "--context-k", 5, "--json"]
    result = json.loads(_pingctl("sample", hinted_run, *asked).stdout)
    ctx = result["context"]
    peers = [(c["src"], c["dst"], c["rtt_ms"]) for c in ctx[:-1]]
    want = Hints.load(kept).answer(s, d, peers)
    assert result["hint_ms"] == pytest.approx(want)
    # the hint is the prompt's last measurement before the query: the pair, untimed, the estimate
    assert ctx[-1]["src"] == s and ctx[-1]["dst"] == d and ctx[-1]["time"] is None
    assert ctx[-1]["rtt_ms"] == pytest.approx(want, rel=0.01)
    from pingctl.cli.sample_cmd import _print_triangulation

    _print_triangulation(result)  # what the command prints under the distribution
    text = capsys.readouterr().out
    assert f"then the embedding's estimate for the pair, {want:.1f} ms" in " ".join(text.split())
    assert sum(line.split()[:1] == ["hint"] for line in text.splitlines()) == 1
    # an export carries the file, and its answers the same hint
    _pingctl("export", hinted_run, "-o", tmp_path / "ex", "--json")
    assert (tmp_path / "ex" / "hints.npz").read_bytes() == kept.read_bytes()
    again = json.loads(_pingctl("sample", tmp_path / "ex", *asked).stdout)
    assert again["hint_ms"] == pytest.approx(want) and again["p50_ms"] == pytest.approx(result["p50_ms"], rel=1e-4)
    # a file of pairs (and `Model.rtt_many`) asks each row with the same hinted prompt
    from pingctl import Model

    f = tmp_path / "pairs.csv"
    f.write_text(f"src,dst,time\n{s},{d},{t}\n")
    model = Model.load(hinted_run)
    asked = model.rtt_prompts(f, context=time_split / "train", context_policy="both", context_k=5)
    prompt = asked.prompts[0]
    ctx_only = decode(prompt[: int(np.flatnonzero(prompt == 0)[-1])]).measurements  # up to the query's start
    n = len(ctx_only)
    assert ctx_only.src_text()[n - 1] == s and ctx_only.dst_text()[n - 1] == d and not ctx_only.has_time[n - 1]
    assert ctx_only.rtt_ms[n - 1] == pytest.approx(want, rel=0.01)
    many = model.rtt_many(f, context=time_split / "train", context_policy="both", context_k=5)
    assert many.table.to_pylist()[0]["p50_ms"] == pytest.approx(result["p50_ms"], rel=2e-3)
    # a probe-policy question carries none
    plain = json.loads(_pingctl("sample", hinted_run, "--src", s, "--dst", d, "--json").stdout)
    assert "hint_ms" not in plain


@pytest.mark.slow
def test_eval_asks_a_hinted_run_with_hints_unless_told_not_to(hinted_run, tri_run, time_split, tmp_path):
    import json

    import pyarrow.parquet as pq

    base = ["--train", time_split / "train", "--test", time_split / "test", "--queries", 8, "--context-policy",
            "both", "--context", 4, "--context-dst", 4, "--json"]
    got = {}
    for flag in ("--hints", "--no-hints"):
        report = json.loads(_pingctl("eval", hinted_run, *base, flag, "-o", tmp_path / flag).stdout)
        got[flag] = pq.read_table(tmp_path / flag / "predictions.parquet").column("model_median").to_pylist()
        assert report["predictors"]["model"]["info"]["context_policy"] == "both"
    assert got["--hints"] != got["--no-hints"]  # the hint is in the prompts it was asked for
    refused = _pingctl("eval", tri_run, *base, "--hints", "-o", tmp_path / "x", ok=False)
    assert refused.returncode == 2 and "trained without them" in refused.stderr
    probe = ["--train", time_split / "train", "--test", time_split / "test", "--context-policy", "probe"]
    refused = _pingctl("eval", hinted_run, *probe, "--hints", "-o", tmp_path / "y", ok=False)
    assert refused.returncode == 2 and "`both` prompts" in refused.stderr


@pytest.mark.slow
def test_a_hinted_run_with_a_damaged_hints_file_exits_1_naming_it(hinted_run, time_split, tmp_path):
    """`sample --context-policy both` of a run whose kept hints.npz was damaged: exit 1 naming
    the file and the array, no traceback, where it exited 70 or answered with the damaged
    estimate in its prompt."""
    import json
    import shutil

    import pyarrow.parquet as pq

    run = tmp_path / "run"
    shutil.copytree(hinted_run, run)
    kept = run / "hints.npz"
    raw = kept.read_bytes()
    with np.load(kept) as z:
        arrays = {k: z[k] for k in z.files}
    row = pq.read_table(time_split / "test").slice(0, 1).to_pylist()[0]
    asked = ["--src", row["src_addr"], "--dst", row["dst_addr"], "--time", int(row["event_time"].timestamp()),
             "--context", time_split / "train", "--context-policy", "both", "--context-k", 5, "--json"]
    for damage in ("cut short", "empty", "garbage", "unequal lengths", "a negative height", "a huge scale"):
        make, says = DAMAGES[damage]
        kept.write_bytes(make(arrays, raw))
        proc = _pingctl("sample", run, *asked, ok=False)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, (damage, proc.stderr[-2000:])
        error = json.loads(proc.stdout)["error"]
        assert str(kept.resolve()) in error["message"] and says in error["message"], (damage, error)
    kept.write_bytes(raw)  # the file as the run kept it answers again
    assert "hint_ms" in json.loads(_pingctl("sample", run, *asked).stdout)


# ----------------------------------------------------------------- eval's embedding from the file


def _split_dir(d: Path, seed: int = 0, files: int = 2) -> Path:
    """A train split of `files` Parquet files (their address dictionaries differ)."""
    import pyarrow.parquet as pq

    from tests.conftest import make_table

    d.mkdir(parents=True)
    for i in range(files):
        table = make_table(600, probes=12 + 3 * i, targets=5, seed=seed + i, v6_every=9)
        pq.write_table(table, d / f"part-{i}.parquet")
    return d


@pytest.fixture(scope="module")
def hinted_split(tmp_path_factory):
    from pingctl.artifacts.table import load_split
    from pingctl.eval.hints import fit_hints_split

    d = tmp_path_factory.mktemp("hinted")
    split = _split_dir(d / "train")
    fit_hints_split(split, d / "h.npz", folds=2, seed=0, workers=1)
    return d, load_split(split), Hints.load(d / "h.npz")


def test_eval_takes_the_embedding_from_a_hints_file_of_its_own_train_split(hinted_split):
    """The file's every-pair fit is `Embedding(seed).fit(train)`'s: eval reads it instead of
    fitting again, and predicts what the fit predicts, to the bit (the same inputs, the same
    arithmetic), new ends placed from the prompt included; `fit_info` names the file."""
    from pingctl.eval.baselines import GlobalMedian, refit_prediction
    from pingctl.eval.embedding import Embedding
    from pingctl.eval.registry import fit_baselines

    d, train, hints = hinted_split
    assert int(hints.fit_seed) == 0 and int(hints.fit_rows) == len(train["rtt"])
    fitted, _ = fit_baselines(train, seed=0, vivaldi_cycles=20, hints=hints)
    got, want = fitted["embedding"], Embedding(seed=0).fit(train)
    assert got.fit_info["from"] == "hints" and got.fit_info["hints"] == str(d / "h.npz")
    assert {k: v for k, v in got.fit_info.items() if k not in ("from", "hints", "final_loss")} == {
        k: v for k, v in want.fit_info.items() if k != "final_loss"}
    assert got.vocab.equals(want.vocab)
    for k in ("x", "h", "trained"):
        np.testing.assert_array_equal(getattr(got, k), getattr(want, k))
    assert got.scale == want.scale
    test = dict(train, src=np.append(train["src"][:50], ["10.9.9.9"]), dst=np.append(train["dst"][:50], ["8.8.0.8"]),
                rtt=np.append(train["rtt"][:50], 30.0), ip_version=np.append(train["ip_version"][:50], 4),
                event_time=np.append(train["event_time"][:50], 0))
    np.testing.assert_array_equal(got.predict(test).median, want.predict(test).median)
    assert np.isfinite(got.predict(test).median).all()
    pool = {"src": np.array(["10.9.9.9"] * 3, object), "dst": np.array(["8.8.0.8", "8.8.1.8", "8.8.2.8"], object),
            "rtt": np.array([20.0, 30.0, 40.0]), "event_time": np.arange(3, dtype=np.int64)}
    fallback = GlobalMedian().fit(train).predict(test)
    contexts = [np.zeros(0, np.int64)] * 50 + [np.arange(3)]
    refit = [refit_prediction(e, pool, test, contexts, fallback).median for e in (got, want)]
    np.testing.assert_array_equal(*refit)
    assert np.isfinite(refit[0][-1])


def _without(h: Hints, **change) -> Hints:
    from dataclasses import replace

    return replace(h, **change)


def _refused(d: Path, hints: Hints, train: dict) -> dict:
    """(not reused: its fit_info) for a file from elsewhere, the fit as without it."""
    from pingctl.eval.embedding import Embedding
    from pingctl.eval.hints import embedding_with_hints

    got = embedding_with_hints(Embedding(seed=0), train, hints)
    want = Embedding(seed=0).fit(train)
    np.testing.assert_array_equal(got.x, want.x)
    assert got.fit_info["from"] == "fit" and "not reused" in got.fit_info["hints"]
    return got.fit_info


def test_a_hints_file_fitted_on_anything_else_is_not_reused(hinted_split, tmp_path):
    """Another seed, another split (of the same size and addresses but other RTTs, or fewer
    rows), other settings, or a file written before files said what they were fitted on: eval
    fits the embedding itself and says why."""
    from pingctl.artifacts.table import load_split
    from pingctl.eval.hints import fit_hints_split

    d, train, hints = hinted_split
    fit_hints_split(d / "train", tmp_path / "seed1.npz", folds=2, seed=1, workers=1)
    assert "seed 1, this eval's is 0" in _refused(d, Hints.load(tmp_path / "seed1.npz"), train)["hints"]
    other = _split_dir(tmp_path / "other", seed=7)
    fit_hints_split(other, tmp_path / "other.npz", folds=2, workers=1)
    assert len(load_split(other)["rtt"]) == len(train["rtt"])
    assert "other pairs or other RTTs" in _refused(d, Hints.load(tmp_path / "other.npz"), train)["hints"]
    one = _split_dir(tmp_path / "one", files=1)
    fit_hints_split(one, tmp_path / "one.npz", folds=2, workers=1)
    assert "fitted on 600 train rows, this train split has 1,200" in _refused(d, Hints.load(tmp_path / "one.npz"),
                                                                               train)["hints"]
    settings_ = hints.fit_settings.copy()
    settings_[0] += 1
    assert "other embedding settings" in _refused(d, _without(hints, fit_settings=settings_), train)["hints"]
    keys = hints.keys.copy()
    keys[[0, 1]] = keys[[1, 0]]
    assert "other addresses" in _refused(d, _without(hints, keys=keys), train)["hints"]
    # a file written before the provenance: it loads and answers as ever, and is not reused
    old = tmp_path / "old.npz"
    with np.load(d / "h.npz") as z:
        np.savez(old, **{k: z[k] for k in z.files if not k.startswith("fit_")})
    loaded = Hints.load(old)
    assert loaded.fit_seed is None and loaded.answer("193.0.1.1", "8.8.1.8") == hints.answer("193.0.1.1", "8.8.1.8")
    assert "written before" in _refused(d, loaded, train)["hints"]


PROVENANCE_DAMAGES = {
    "part of it": (lambda a: {k: v for k, v in a.items() if k != "fit_rows"},
                   "holds fit_seed, fit_settings without fit_rows"),
    "a negative row count": (lambda a: a | {"fit_rows": np.int64(-5)}, "array fit_rows is -5"),
    "settings cut short": (lambda a: a | {"fit_settings": a["fit_settings"][:2]},
                           "array fit_settings is float64 of shape (2,)"),
    "a NaN setting": (lambda a: a | {"fit_settings": _set(a["fit_settings"], 1, np.nan)}, "finite settings"),
    "a float seed": (lambda a: a | {"fit_seed": np.float64(0)}, "array fit_seed is float64"),
}


@pytest.mark.parametrize("damage", PROVENANCE_DAMAGES)
def test_a_damaged_provenance_is_refused_at_load(hinted_split, tmp_path, damage):
    d, _, _ = hinted_split
    with np.load(d / "h.npz") as z:
        arrays = {k: z[k] for k in z.files}
    _refused_at_load(tmp_path, *PROVENANCE_DAMAGES[damage], arrays)
