"""Two-sided prompts: destination records (`build-rows --by destination|both`), the loader's
triangulation contexts, and the `both` context policy of eval and sample (docs/loader.md)."""

import ipaddress
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pingctl.config import LoaderConfig
from pingctl.context import context_indices, context_pool, recent_others
from pingctl.errors import PingctlError
from pingctl.loader.pipeline import make_dataset
from pingctl.loader.sequences import FULL, NONE, PARTIAL, RecordLengths
from pingctl.loader.triangulation import Triangulation, choose_triangulation, pack_triangulation, triangulation_rows
from pingctl.records.layout import ProbeRecord
from pingctl.tokenizer import decode, validate
from tests.conftest import build_once, make_table, shared_root

SEQ = 256


# ----------------------------------------------------------------- the selection rule


def _brute(time, other, t, exclude, k, per_pair):
    keep = [i for i in range(len(time)) if time[i] < t and other[i] != exclude]
    if per_pair:
        seen: dict = {}
        kept = []
        for i in reversed(keep):
            seen[other[i]] = seen.get(other[i], 0) + 1
            if seen[other[i]] <= per_pair:
                kept.append(i)
        keep = sorted(kept)
    return keep[-k:] if k else []


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 5)), max_size=300), st.integers(0, 45),
       st.integers(-1, 5), st.integers(0, 20), st.integers(0, 3))
@settings(max_examples=200)
def test_recent_others_is_the_last_k_before_t_excluding_one_end(rows, t, exclude, k, per_pair):
    rows = sorted(rows, key=lambda r: r[0])
    time = np.array([r[0] for r in rows], np.int64)
    other = np.array([r[1] for r in rows], np.int64)
    got = recent_others(time, other, t, exclude, k, per_pair)
    assert got.tolist() == _brute(time, other, t, exclude, k, per_pair)


def _table_dict(n, rng, n_src=6, n_dst=6, prb=True):
    src = np.array([f"10.0.0.{i}" for i in rng.integers(0, n_src, n)], object)
    dst = np.array([f"20.0.0.{i}" for i in rng.integers(0, n_dst, n)], object)
    return {"src": src, "dst": dst, "event_time": rng.integers(0, 200, n).astype(np.int64),
            "rtt": rng.uniform(1, 100, n), "prb_id": (np.array([int(s.rsplit(".", 1)[1]) for s in src])
                                                      if prb else np.full(n, -1, np.int64)),
            "ip_version": np.full(n, 4, np.int64)}


@given(st.integers(0, 2**31), st.integers(0, 8), st.integers(0, 8), st.integers(0, 2))
@settings(max_examples=60)
def test_both_policy_holds_each_side_and_never_the_pair_or_a_later_packet(seed, k_src, k_dst, per_pair):
    rng = np.random.default_rng(seed)
    train, test = _table_dict(120, rng), _table_dict(10, rng)
    idx = np.arange(10)
    # the pool: the train split and the test split (a host training never saw is known by its
    # own earlier packets there); the rules below keep only earlier packets, never the pair
    pool = context_pool(test, train, "both")
    assert len(pool["src"]) == 130 and (pool["src"][120:] == test["src"]).all()
    ctxs = context_indices(pool, test, idx, k_src, "both", per_pair, k_dst)
    for i, c in zip(idx, ctxs):
        s, d, t = test["src"][i], test["dst"][i], test["event_time"][i]
        assert (pool["event_time"][c] < t).all()
        assert not ((pool["src"][c] == s) & (pool["dst"][c] == d)).any()
        assert (np.diff(pool["event_time"][c]) >= 0).all()  # oldest first
        src_side = c[pool["dst"][c] != d]
        dst_side = c[pool["dst"][c] == d]
        assert (pool["src"][src_side] == s).all() and len(src_side) <= k_src
        assert (pool["src"][dst_side] != s).all() and len(dst_side) <= k_dst
        # each side is exactly the rule's choice (the probe's rows by time, the destination's)
        mine = np.flatnonzero(pool["src"] == s)
        mine = mine[np.argsort(pool["event_time"][mine], kind="stable")]
        want_src = mine[recent_others(pool["event_time"][mine], _codes(pool["dst"][mine]), t,
                                      _code(d), k_src, per_pair)]
        assert sorted(src_side.tolist()) == sorted(want_src.tolist())
        theirs = np.flatnonzero(pool["dst"] == d)
        theirs = theirs[np.argsort(pool["event_time"][theirs], kind="stable")]
        want_dst = theirs[recent_others(pool["event_time"][theirs], _codes(pool["src"][theirs]), t,
                                        _code(s), k_dst, per_pair)]
        assert sorted(dst_side.tolist()) == sorted(want_dst.tolist())


def _code(addr: str) -> int:
    return int(addr.rsplit(".", 1)[1])


def _codes(addrs) -> np.ndarray:
    return np.array([_code(a) for a in addrs], np.int64)


# ----------------------------------------------------------------- loader contexts on random records


def _record(key: str, rows: np.ndarray, addr: np.ndarray) -> ProbeRecord:
    """rows: int64[n, 4] (src id, dst id, time, rtt) sorted by time; addr: uint8[m, 16] by id."""
    su, si = np.unique(rows[:, 0], return_inverse=True)
    du, di = np.unique(rows[:, 1], return_inverse=True)
    n = len(rows)
    rtt = rows[:, 3].astype(np.float64)
    return ProbeRecord(probe=key, prb_id=None, time_s=rows[:, 2].copy(), rtt_ms=np.where(rtt < 0, -1.0, rtt),
                       msm_id=np.zeros(n, np.int64), src_idx=si.astype(np.uint32), dst_idx=di.astype(np.uint32),
                       size=np.full(n, 48, np.int32), errors=np.zeros(n, np.int32), src_addr=addr[su],
                       src_v6=np.zeros(len(su), bool), dst_addr=addr[du], dst_v6=np.zeros(len(du), bool))


def _world(seed: int, n: int = 400):
    """Random measurements between 5 sources and 5 destinations (IPv4), as one probe record per
    source and one destination record per destination, and a lookup of the latter."""
    rng = np.random.default_rng(seed)
    addr = np.zeros((10, 16), np.uint8)
    addr[:, 0], addr[:, 3] = 10, np.arange(10)
    rows = np.stack([rng.integers(0, 5, n), rng.integers(5, 10, n), rng.integers(1_700_000_000, 1_700_000_600, n),
                     np.where(rng.random(n) < 0.1, -1, rng.integers(1, 300, n))], axis=1)
    rows = rows[np.lexsort((rows[:, 2],))]
    probes = {s: _record(f"src:{s}", rows[rows[:, 0] == s], addr) for s in range(5) if (rows[:, 0] == s).any()}
    dsts = {d: _record(f"dst:{d}", rows[rows[:, 1] == d], addr) for d in range(5, 10) if (rows[:, 1] == d).any()}

    def lookup(key, t):  # key: the address's 16 bytes and its family
        rec = dsts.get(key[3])
        return (rec, RecordLengths(rec, "compact", prefix=False)) if rec is not None and rec.time_s[0] < t else None

    return probes, lookup


@given(st.integers(0, 2**31), st.integers(0, 6), st.integers(0, 6), st.integers(0, 2),
       st.sampled_from([FULL, PARTIAL, NONE]))
@settings(max_examples=40)
def test_triangulation_contexts_never_hold_the_pair_or_a_later_packet(seed, k_src, k_dst, per_pair, mode):
    probes, lookup = _world(seed)
    rng = np.random.default_rng(seed)
    tri = Triangulation(1.0, k_src, k_dst, per_pair)
    mode_p = np.eye(3)[mode]
    for rec in probes.values():
        chosen = choose_triangulation(rec, rng, 2, SEQ, mode_p, "compact", tri, lookup)
        m = chosen.measurements()  # every measurement's time, timestamped or not
        has_time = m.has_time
        ends = np.cumsum([len(i) for i in chosen.plan.idx])
        assert ends[-1] == len(m) and sum(chosen.plan.length) <= 2 * SEQ
        for a, b in zip(np.r_[0, ends[:-1]], ends):
            s, d, t = m.src[b - 1, 3], m.dst[b - 1, 3], m.time_s[b - 1]
            ctx = slice(a, b - 1)
            assert (m.time_s[ctx] < t).all()  # never a later packet, timestamped or not
            assert not ((m.src[ctx, 3] == s) & (m.dst[ctx, 3] == d)).any()  # never the pair
            src_side = m.dst[ctx, 3] != d
            assert (m.src[ctx, 3][src_side] == s).all() and src_side.sum() <= k_src
            assert (m.src[ctx, 3][~src_side] != s).all() and (~src_side).sum() <= k_dst
            if mode == FULL:
                assert has_time[a:b].all() and (np.diff(m.time_s[a:b]) >= 0).all()
            if mode == NONE:
                assert not has_time[a:b].any()


@given(st.integers(0, 2**31), st.floats(0.0, 1.0))
@settings(max_examples=25)
def test_triangulation_rows_are_grammatical_with_the_query_last_and_its_rtt_last(seed, result_last):
    probes, lookup = _world(seed)
    rng = np.random.default_rng(seed)
    tri = Triangulation(1.0, 4, 4, 1)
    for rec in probes.values():
        out = pack_triangulation(rec, rng, 2, SEQ, np.array([0.4, 0.3, 0.3]), "compact", tri, lookup, result_last)
        for r in range(2):
            seg = out.segment[r]
            assert (seg[np.argmax(seg == 0):] == 0).all() if (seg == 0).any() else True  # padding only at the end
            for k in range(1, seg.max() + 1):
                toks = out.tokens[r][seg == k]
                assert validate(toks) == []
                dec = decode(toks)
                assert _rtt_last(dec)  # the query's RTT block is its last
                q = dec.measurements[len(dec.measurements) - 1]
                assert q.src[0, 0] == 10 and q.src[0, 3] < 5 <= q.dst[0, 3]


def _rtt_last(dec) -> bool:
    """The last measurement's result block (compact block 2) starts after its other blocks."""
    b = dec.blocks[-1]
    return bool(b[2] == b.max())


# ----------------------------------------------------------------- rows and the pipeline


@pytest.fixture(scope="module")
def both_rows(tmp_path_factory):
    from pingctl.records.build import build_rows

    def build(d: Path) -> None:
        table = make_table(n=3000, probes=12, targets=7, seed=5, v6_every=9)
        d.mkdir(parents=True)
        pq.write_table(table, d / "table.parquet")
        build_rows([d / "table.parquet"], d / "both", by="both", dst_max_row_mb=0.004)  # 100 a record: parts
        build_rows([d / "table.parquet"], d / "source")
        build_rows([d / "table.parquet"], d / "dst", by="destination")

    return build_once(shared_root(tmp_path_factory) / "tri-rows", build)


def test_destination_records_and_their_index(both_rows):
    from pingctl.artifacts.records import destination_index, destination_rows, read_manifest
    from pingctl.loader.pipeline import _RecordReader
    from pingctl.records.layout import decode as decode_record

    # the index names addresses canonically, as every step reads them
    dsts = np.array([str(ipaddress.ip_address(a)) for a in
                     pq.read_table(both_rows / "table.parquet", columns=["dst_addr"]).column(0).to_pylist()])
    src_manifest = read_manifest(both_rows / "both")
    assert src_manifest["by"] == "source" and src_manifest["probes"] == 12
    dst_dir = destination_rows(both_rows / "both", src_manifest)
    assert dst_dir == both_rows / "both" / "by-destination"
    manifest = read_manifest(dst_dir)
    index = destination_index(dst_dir, manifest)
    assert sorted(index) == sorted(set(dsts)) and manifest["destinations"] == len(index)
    reader = _RecordReader([str(dst_dir / f) for f in manifest["files"]])
    seen = []
    for addr, parts in index.items():
        recs = [decode_record(reader.get(rid)) for rid, _ in parts]
        assert len(parts) == -(-(dsts == addr).sum() // 100)  # 100 measurements a record
        for (rid, t0), rec in zip(parts, recs):
            assert rec.probe == f"dst:{addr}" and rec.time_s[0] == t0 and (np.diff(rec.time_s) >= 0).all()
            assert {str(a) for a in _texts(rec.dst_addr, rec.dst_v6)} == {addr}
            seen.append(rid)
        times = np.concatenate([r.time_s for r in recs])
        assert (np.diff(times) >= 0).all() and len(times) == (dsts == addr).sum()
    assert sorted(seen) == list(range(manifest["records"]))
    # --by destination alone: the same index, its own output
    alone = read_manifest(both_rows / "dst")
    assert destination_rows(both_rows / "dst", alone) == both_rows / "dst"
    assert sorted(destination_index(both_rows / "dst", alone)) == sorted(index)
    assert destination_rows(both_rows / "source", read_manifest(both_rows / "source")) is None


def _texts(addr, v6):
    from pingctl.tokenizer.measurements import format_addresses

    return format_addresses(addr, v6).to_pylist()


def _cfg(**kw):
    base = dict(seq_len=SEQ, batch_size=4, workers=0, shuffle_window=32, triangulation_share=0.5)
    base.update(kw)
    return LoaderConfig(**base)


@pytest.mark.parametrize("share", [0.2, 0.5, 0.9])
def test_an_element_s_rows_are_all_triangulation_or_none_at_the_share(share):
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 5, 4000)
    got = np.array([triangulation_rows(rng, int(n), share) for n in sizes])
    assert ((got == 0) | (got == sizes)).all()  # all or none, per element
    assert 0 < (got == 0).sum() < len(sizes)
    sd = np.sqrt(share * (1 - share) * (sizes**2).sum()) / sizes.sum()
    assert abs(got.sum() / sizes.sum() - share) < 4 * sd  # the share of rows
    before = np.random.default_rng(5)
    after = np.random.default_rng(5)
    assert triangulation_rows(after, 4, 0.0) == 0 and after.random() == before.random()  # nothing drawn at 0


def test_share_zero_gives_the_plain_rows_and_a_share_adds_triangulation(both_rows):
    plain = iter(make_dataset(both_rows / "source", _cfg(triangulation_share=0.0)))
    off = iter(make_dataset(both_rows / "both", _cfg(triangulation_share=0.0)))
    for _ in range(3):
        assert np.array_equal(next(plain)["inputs"], next(off)["inputs"])
    on = iter(make_dataset(both_rows / "both", _cfg(triangulation_share=1.0)))
    b = next(on)
    # every context of a triangulation row ends with a query whose RTT comes last
    for r in range(len(b["inputs"])):
        seg = b["inputs_segmentation"][r]
        for k in range(1, seg.max() + 1):
            assert _rtt_last(decode(b["inputs"][r][seg == k]))


def test_iterator_state_restores_the_same_batches(both_rows):
    it = iter(make_dataset(both_rows / "both", _cfg()))
    for _ in range(4):
        next(it)
    state = it.get_state()
    expected = [next(it)["inputs"] for _ in range(3)]
    fresh = iter(make_dataset(both_rows / "both", _cfg()))  # new readers, an empty record cache
    fresh.set_state(state)
    assert all(np.array_equal(next(fresh)["inputs"], e) for e in expected)
    again = iter(make_dataset(both_rows / "both", _cfg()))
    first = [next(again)["inputs"] for _ in range(2)]
    other_seed = iter(make_dataset(both_rows / "both", _cfg(seed=9)))
    assert not all(np.array_equal(next(other_seed)["inputs"], f) for f in first)


def test_triangulation_needs_destination_records(both_rows):
    from pingctl.loader.pipeline import check_triangulation

    with pytest.raises(PingctlError, match="--by both"):
        make_dataset(both_rows / "source", _cfg())
    with pytest.raises(PingctlError, match="--by both"):
        check_triangulation(both_rows / "source", _cfg())
    check_triangulation(both_rows / "source", _cfg(triangulation_share=0.0))
    check_triangulation(both_rows / "both", _cfg())
    with pytest.raises(PingctlError, match="probe rows"):
        make_dataset(both_rows / "dst", _cfg())
    with pytest.raises(Exception, match="triangulation_k_src or triangulation_k_dst"):
        LoaderConfig(triangulation_share=0.5, triangulation_k_src=0, triangulation_k_dst=0)


# ----------------------------------------------------------------- end to end: rows, train, eval, sample


def _pingctl(*args, ok=True):
    proc = subprocess.run([sys.executable, "-m", "pingctl", *map(str, args)], capture_output=True, text=True)
    if ok:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="session")
def tri_run(time_split):
    """Both-ways rows of the synthetic time split and a tiny model trained a few steps on them with
    half of its rows triangulation contexts (`build-rows --by both`, loader.triangulation_share)."""
    pytest.importorskip("maxtext")

    def build(d: Path) -> None:
        for split in ("train", "val"):
            _pingctl("build-rows", time_split / split, "-o", d / "rows" / split, "--by", "both", "--json")
        _pingctl("train", d / "rows" / "train", "--eval", d / "rows" / "val", "--run-dir", d / "run", "--steps", 6,
                 "--set", f"loader.seq_len={SEQ}", "--set", "loader.batch_size=8", "--set", "train.eval_interval=3",
                 "--set", "train.eval_steps=2", "--set", "train.checkpoint_period=100",
                 "--set", "loader.triangulation_share=0.5", "--set", "loader.triangulation_k_src=6",
                 "--set", "loader.triangulation_k_dst=6", "--json")

    return build_once(time_split / "tri", build) / "run"


def test_eval_both_policy_runs_and_reports_the_prompts_it_built(tri_run, time_split, tmp_path):
    from pingctl.artifacts.table import load_split

    proc = _pingctl("eval", tri_run, "--train", time_split / "train", "--test", time_split / "test", "--queries", 12,
                    "--context-policy", "both", "--context", 4, "--context-dst", 3, "-o", tmp_path / "ev", "--json")
    report = json.loads(proc.stdout)
    info = report["predictors"]["model"]["info"]
    assert info["context_policy"] == "both" and info["context_dst"] == 3 and info["context_per_pair"] == 1
    assert report["queries"] == 12 and np.isfinite(report["rows"][0]["median_rel_err"])
    train, test = load_split(time_split / "train"), load_split(time_split / "test")
    for ex in info["context_examples"]:
        q, ctx = ex["query"], ex["context"]
        assert ctx and all(c["time"] < q["time"] for c in ctx)
        assert not any(c["src"] == q["src"] and c["dst"] == q["dst"] for c in ctx)
        dst_side = [c for c in ctx if c["dst"] == q["dst"]]
        assert len(dst_side) <= 3 and len(ctx) - len(dst_side) <= 4
        # each context measurement is a row of the train split or an earlier one of the test split
        for c in ctx:
            hit = [(t["src"] == c["src"]) & (t["dst"] == c["dst"]) & (t["event_time"] == c["time"])
                   for t in (train, test)]
            assert hit[0].any() or hit[1].any()
    usage = _pingctl("eval", tri_run, "--train", time_split / "train", "--test", time_split / "test",
                     "--context-dst", 3, "-o", tmp_path / "ev2", ok=False)
    assert usage.returncode == 2 and "--context-policy both" in usage.stderr


def test_sample_both_policy_prints_the_context_it_asked_with(tri_run, time_split, capsys):
    test = pq.read_table(time_split / "test").slice(0, 1).to_pylist()[0]
    s, d, t = test["src_addr"], test["dst_addr"], int(test["event_time"].timestamp())
    proc = _pingctl("sample", tri_run, "--src", s, "--dst", d, "--time", t, "--context", time_split / "train",
                    "--context-policy", "both", "--context-k", 5, "--json")
    result = json.loads(proc.stdout)
    ctx = result["context"]
    assert result["context_policy"] == "both" and ctx
    assert all(c["time"] < t and not (c["src"] == s and c["dst"] == d) for c in ctx)
    dst_side = [c for c in ctx if c["dst"] == d]
    assert len(dst_side) <= 5 and len(ctx) - len(dst_side) <= 5
    assert all(c["src"] != s for c in dst_side)
    from pingctl.cli.sample_cmd import _print_triangulation

    _print_triangulation(result)  # what the command prints under the distribution
    text = capsys.readouterr().out
    assert "prompt context (both" in text and f"{len(dst_side)} of {d} from other sources" in text
    assert sum(line.split()[:1] == ["destination"] for line in text.splitlines()) == len(dst_side)
    refused = _pingctl("sample", tri_run, "--src", s, "--dst", d, "--context-policy", "both", ok=False)
    assert refused.returncode == 2 and "--context" in refused.stderr


def test_pairs_with_the_both_policy_are_the_single_pair_answers(tri_run, time_split, tmp_path):
    """`sample --pairs --context-policy both` (and `Model.rtt_many`) asks each row with the
    triangulation context `Model.rtt(..., context_policy="both")` (`sample --src --dst`) builds
    for it."""
    from pingctl import Model

    rows = pq.read_table(time_split / "test").slice(0, 3).to_pylist()
    f = tmp_path / "pairs.csv"
    f.write_text("src,dst,time\n" + "".join(f"{r['src_addr']},{r['dst_addr']},{int(r['event_time'].timestamp())}\n"
                                            for r in rows))
    out = tmp_path / "p.parquet"
    proc = _pingctl("sample", tri_run, "--pairs", f, "--context", time_split / "train", "--context-policy", "both",
                    "--context-k", 5, "-o", out, "--json")
    result = json.loads(proc.stdout)
    assert result["context_policy"] == "both" and result["context_k"] == 5 and result["answered"] == 3
    got = pq.read_table(out).to_pylist()
    m = Model.load(tri_run)
    many = m.rtt_many(f, context=time_split / "train", context_policy="both", context_k=5).table.to_pylist()
    for r, g, a in zip(rows, got, many):
        one = m.rtt(r["src_addr"], r["dst_addr"], time=int(r["event_time"].timestamp()),
                    context=time_split / "train", context_policy="both", context_k=5)
        assert g["context_measurements"] == a["context_measurements"] == len(one.info["context"]) > 0
        assert g["p50_ms"] == pytest.approx(a["p50_ms"], rel=1e-6)
        assert g["p50_ms"] == pytest.approx(one.quantile(0.5), rel=2e-3)  # --pairs reads quantiles to 1e-3 of mass
