"""`CodedStrings`, the address columns `load_split` returns: object arrays of str that keep the
files' Arrow dictionary coding, which `dict_encode`, `codes_in` and `vocabulary` read in place of
the strings, with the answers they give for the plain object array; and that no array derived
from one keeps a coding that could go stale."""

import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pingctl.schema.arrow_strings import SMALL, CodedStrings, codes_in, dict_encode, vocabulary

_WORDS = st.one_of(st.sampled_from(["192.0.2.1", "192.0.2.2", "2001:db8::1", "10.0.0.1", ""]), st.text(max_size=6))


def _coded(words: list[str], picks: list[int]) -> CodedStrings:
    return CodedStrings(pa.array(words, pa.string()), np.array(picks, np.int64) % len(words))


@settings(max_examples=150, deadline=None)
@given(st.lists(_WORDS, min_size=1, max_size=8, unique=True), st.lists(st.integers(0, 7), max_size=20),
       st.integers(1, 2 * SMALL), st.lists(_WORDS, max_size=6))
def test_a_coded_column_answers_as_its_plain_object_array(words, picks, repeat, others):
    """Both the few-strings path and the Arrow path (`repeat` takes it past SMALL), with and
    without a transform, with unused dictionary entries, against another column."""
    coded = _coded(words, picks * repeat)
    plain = np.array([words[p % len(words)] for p in picks * repeat], object)
    assert coded.coding is not None and coded.tolist() == plain.tolist()
    assert np.array_equal(coded, plain) and coded.dtype == object
    upper = str.upper
    for tf in (None, upper):
        vocab = vocabulary(coded, others, transform=tf)
        assert vocab.equals(vocabulary(plain, others, transform=tf))
        assert codes_in(coded, vocab, tf).tolist() == codes_in(plain, vocab, tf).tolist()
    enc, want = dict_encode(coded), dict_encode(plain)
    assert enc.cast(pa.string()).to_pylist() == want.cast(pa.string()).to_pylist()
    # the dictionary is exactly the values held: what `vocabulary` reads
    assert sorted(enc.dictionary.to_pylist()) == sorted(set(plain.tolist()))


def test_only_the_constructed_array_keeps_its_coding():
    x = _coded(["b", "a", "c"], [0, 1, 0, 2, 1] * 20)
    assert x.coding is not None and not x.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        x[0] = "c"
    with pytest.raises(ValueError):
        x.flags.writeable = True
    derived = {"slice": x[1:], "step": x[::2], "take": x[[0, 1]], "mask": x[x == "a"], "view": x.view(),
               "copy": x.copy(), "reshape": x.reshape(10, 10), "pickled": pickle.loads(pickle.dumps(x)),
               "concatenated": np.concatenate([x, x]), "asarray": np.asarray(x), "where": np.where(x == "a", x, "z")}
    for name, d in derived.items():
        assert getattr(d, "coding", None) is None, name
    # a derived array is encoded from its own strings, never from its parent's coding
    assert dict_encode(x[:5]).cast(pa.string()).to_pylist() == ["b", "a", "b", "c", "a"]
    assert vocabulary(x[x != "c"]).to_pylist() == ["a", "b"]
    # what compares is a plain array: a mask does not pass for an address column
    assert type(x == "a") is np.ndarray and type(np.asarray(x)) is np.ndarray


def test_the_coding_is_its_own_and_checked():
    idx = np.array([0, 1, 1])
    x = CodedStrings(pa.array(["p", "q"]), idx)
    idx[:] = 0  # the caller's array changes; the column does not
    assert x.tolist() == ["p", "q", "q"] and x.coding[1].tolist() == [0, 1, 1]
    assert x[1] is x[2]  # equal strings share one object
    with pytest.raises(ValueError, match="lie in"):
        CodedStrings(pa.array(["p"]), np.array([0, 1]))
    with pytest.raises(ValueError, match="not nulls"):
        CodedStrings(pa.array(["p", None]), np.array([0]))
    empty = CodedStrings(pa.array([], pa.string()), np.zeros(0, np.int32))
    assert len(empty) == 0 and vocabulary(empty).to_pylist() == [] and dict_encode(empty).to_pylist() == []


def test_load_split_codes_every_file_into_one_dictionary(tmp_path):
    """Files with different dictionaries (one written without one), overlapping addresses:
    one coding per column, of exactly its values, equal to the strings the files hold."""
    from pingctl.artifacts.table import load_split
    from tests.conftest import make_table

    a, b = make_table(300, probes=7, targets=3, seed=1), make_table(200, probes=11, targets=5, seed=2, v6_every=4)
    pq.write_table(a, tmp_path / "a.parquet")
    pq.write_table(b, tmp_path / "b.parquet", use_dictionary=False)
    got = load_split(tmp_path)
    for key, col in (("src", "src_addr"), ("dst", "dst_addr")):
        want = a.column(col).to_pylist() + b.column(col).to_pylist()
        arr = got[key]
        assert isinstance(arr, CodedStrings) and arr.coding is not None and arr.tolist() == want
        dictionary, indices = arr.coding
        assert sorted(dictionary.to_pylist()) == sorted(set(want)) and len(indices) == len(want)
        assert vocabulary(arr).to_pylist() == sorted(set(want))
        vocab = vocabulary(got["src"], got["dst"])
        assert codes_in(arr, vocab).tolist() == codes_in(np.array(want, object), vocab).tolist()
