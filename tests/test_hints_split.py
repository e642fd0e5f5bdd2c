"""`pingctl hints` reading its split as address codes a batch at a time (`artifacts.split_codes`,
`eval.hints.fit_hints_split`): the same hints file, to the bit, as the code before it, which
loaded the split's addresses as Python strings (`_old_fit_hints` below is that code, kept), the
same refusals of bad rows, and no per-row Python object on the way."""

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pingctl.artifacts import split_codes
from pingctl.artifacts.split_codes import read_split_codes
from pingctl.artifacts.table import load_split
from pingctl.config import SynthConfig
from pingctl.errors import PingctlError
from pingctl.eval.baselines import Groups, column
from pingctl.eval.embedding import Embedding, pair_medians
from pingctl.eval.hints import fit_hints_split
from pingctl.loader.hints import fold_of
from pingctl.schema.arrow_strings import codes_in, vocabulary
from pingctl.synth.generate import generate
from tests.conftest import make_table


def _groups_pair_medians(a, b, rtt_ms, n_nodes: int):
    """The pairs' medians as `eval.embedding.pair_medians` took them before its sort key: by
    `Groups`, kept here as the reference."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    r = np.asarray(rtt_ms, np.float64)
    ok = (a >= 0) & (b >= 0) & (a != b) & np.isfinite(r) & (r >= 0)
    n = max(int(n_nodes), 1)
    g = Groups(np.where(ok, a * n + b, -1), np.where(ok, r, -1.0), quantiles=(0.5,), sketch=2)
    have = g.count > 0
    return g.keys[have] // n, g.keys[have] % n, g.q[0.5][have]


def _old_fit_hints(train: dict, folds: int, seed: int) -> dict:
    """The hints file's arrays as `fit_hints` made them before the split was read as codes: the
    vocabulary and codes from Python strings, the pair medians by `Groups`, the fits in turn."""
    vocab = vocabulary(column(train, "src"), column(train, "dst"))
    a, b = codes_in(column(train, "src"), vocab), codes_in(column(train, "dst"), vocab)
    n = len(vocab)
    pa_, pb_, med = _groups_pair_medians(a, b, np.asarray(train["rtt"], np.float64), n)
    pair_fold = fold_of(pa_, pb_, folds)
    fits = [Embedding(seed=seed).fit_pairs(pa_[keep], pb_[keep], med[keep], n)
            for keep in [*(pair_fold != k for k in range(folds)), slice(None)]]
    return {"x": np.stack([e.x for e in fits]), "h": np.stack([e.h for e in fits]),
            "trained": np.stack([e.trained for e in fits]), "scale": np.asarray([e.scale for e in fits]),
            "vocab": vocab.to_pylist()}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A small synth world in three files: synth's own (dictionary-encoded addresses), a table
    of IPv4 and IPv6 probes with failed packets and a probe pinging itself, and the same kind
    written with plain (not dictionary) address columns; the addresses of the three overlap."""
    d = tmp_path_factory.mktemp("hints-split")
    generate(SynthConfig(rows=20_000, probes=30, targets=40, targets_per_probe=25, seed=3), d / "gen")
    (d / "split").mkdir()
    syn = pa.concat_tables([pq.read_table(f) for f in sorted((d / "gen").glob("part-*.parquet"))])
    pq.write_table(syn, d / "split" / "a.parquet", row_group_size=3_000)
    t = make_table(6000, probes=9, targets=4, v6_every=3, seed=1)
    src = t.column("src_addr").to_pylist()
    src[10] = t.column("dst_addr")[10].as_py()  # a packet whose ends are the same address
    t = t.set_column(t.schema.get_field_index("src_addr"), "src_addr", pa.array(src, pa.string()))
    pq.write_table(t.slice(0, 3000), d / "split" / "b.parquet", row_group_size=1_000)
    pq.write_table(t.slice(3000), d / "split" / "c.parquet", use_dictionary=False)
    return d / "split"


def _table_bits(path) -> dict:
    got = np.load(path)
    return {k: got[k] for k in got.files}


def test_the_split_read_as_codes_gives_the_old_hints_file_to_the_bit(world, tmp_path, monkeypatch):
    """Batches far smaller than a file (each with its own dictionary, and plain strings in one
    file): one vocabulary in the old order, the same medians, the same six fits."""
    monkeypatch.setattr(split_codes, "BATCH_ROWS", 777)
    train = load_split(world, columns=["src_addr", "dst_addr", "rtt"], split_hint="train")
    want = _old_fit_hints(train, 3, 4)
    info = fit_hints_split(world, tmp_path / "h.npz", folds=3, seed=4, workers=1)
    got = _table_bits(tmp_path / "h.npz")
    for k in ("x", "h", "trained", "scale"):
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k
    assert info["nodes"] == len(want["vocab"]) and info["measurements"] == len(train["rtt"]) > 26_000
    codes = read_split_codes(world)
    assert codes.vocab.to_pylist() == want["vocab"]


def test_the_command_s_processes_write_the_same_file(world, tmp_path):
    """`pingctl hints --workers 2`, a real child process whose fits run in two more: the file of
    the fits made one after another in this process, array for array."""
    fit_hints_split(world, tmp_path / "one.npz", folds=3, seed=1, workers=1)
    proc = subprocess.run([sys.executable, "-m", "pingctl", "hints", str(world), "-o", str(tmp_path / "two.npz"),
                           "--folds", "3", "--seed", "1", "--workers", "2", "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = _table_bits(tmp_path / "one.npz"), _table_bits(tmp_path / "two.npz")
    assert one.keys() == two.keys() and all(np.array_equal(one[k], two[k]) for k in one)


@pytest.mark.parametrize("damage", ["null rtt", "nan rtt", "bad address", "null address"])
def test_a_bad_row_is_refused_as_load_split_refuses_it_naming_the_file_and_its_row(tmp_path, monkeypatch, damage):
    """The bad row lies in the file's fourth batch: the message names its row in the file, in
    `load_split`'s words, and `pingctl hints` exits 1 with it."""
    monkeypatch.setattr(split_codes, "BATCH_ROWS", 500)
    t = make_table(2000, seed=2)
    row = 1700
    if damage.endswith("rtt"):
        rtt = t.column("rtt").to_pylist()
        rtt[row] = None if damage == "null rtt" else float("nan")
        t = t.set_column(t.schema.get_field_index("rtt"), "rtt", pa.array(rtt, pa.float64()))
    else:
        dst = t.column("dst_addr").to_pylist()
        dst[row] = None if damage == "null address" else "8.8.8.800"
        t = t.set_column(t.schema.get_field_index("dst_addr"), "dst_addr", pa.array(dst, pa.string()))
    (tmp_path / "split").mkdir()
    pq.write_table(t, tmp_path / "split" / "part.parquet")
    with pytest.raises(PingctlError) as old:
        load_split(tmp_path / "split", columns=["src_addr", "dst_addr", "rtt"], split_hint="train")
    with pytest.raises(PingctlError) as new:
        fit_hints_split(tmp_path / "split", tmp_path / "h.npz", workers=1)
    assert str(new.value) == str(old.value) and "part.parquet" in str(new.value) and f"row {row}" in str(new.value)
    proc = subprocess.run([sys.executable, "-m", "pingctl", "hints", str(tmp_path / "split"), "-o",
                           str(tmp_path / "h.npz")], capture_output=True, text=True)
    assert proc.returncode == 1 and "part.parquet" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "h.npz").exists()


def test_the_fit_is_handed_int32_codes_never_python_strings(world, monkeypatch):
    """Bounded by construction: no split is loaded as Python strings (the reader that did so
    fails here if called), and what the medians and fits get is int32 codes and float64 RTTs,
    one each per kept row."""
    import pingctl.artifacts.table as table

    monkeypatch.setattr(table, "CodedStrings", lambda *a: pytest.fail("a split's addresses became Python strings"))
    codes = read_split_codes(world, keep=lambda a, b, r: r >= 0)
    assert codes.a.dtype == codes.b.dtype == np.int32 and codes.rtt.dtype == np.float64
    assert len(codes.a) == len(codes.rtt) == int((codes.rtt >= 0).sum()) < codes.rows
    assert codes.a.max() < len(codes.vocab) and codes.b.min() >= 0


@pytest.mark.parametrize("n_nodes", [50, 1 << 28])  # the packed uint64 sort key; the lexsort past 63 bits
def test_pair_medians_are_groups_medians_to_the_bit(n_nodes):
    """Odd and even counts, ties, pairs with one measurement, codes near the top of n_nodes,
    and rows the medians skip (a failed packet, a NaN, an unknown end, a host pinging itself)."""
    rng = np.random.default_rng(0)
    k = 20_000
    a = rng.integers(0, 50, k) + (n_nodes - 50)
    b = rng.integers(0, 50, k) + (n_nodes - 50)
    rtt = np.round(rng.gamma(2.0, 20.0, k), 1)  # rounded: many ties
    rtt[:5], rtt[5], a[6] = -1.0, np.nan, -1
    want = _groups_pair_medians(a, b, rtt, n_nodes)
    got = pair_medians(a, b, rtt, n_nodes)
    assert len(want[0]) > 1000
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)
