"""The small-input paths of pingctl.schema.arrow_strings and Measurements' address text (a service
request's few rows go through Python dicts instead of Arrow arrays) agree with the Arrow
paths value for value."""

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pingctl.schema import arrow_strings as CX
from pingctl.tokenizer import Measurements
from pingctl.tokenizer import measurements as M

_WORDS = st.one_of(st.none(), st.sampled_from(["192.0.2.1", "192.0.2.2", "2001:db8::1", "10.0.0.1", ""]),
                   st.text(max_size=6))


@settings(max_examples=200, deadline=None)
@given(st.lists(_WORDS, max_size=12), st.lists(_WORDS, max_size=12), st.booleans())
def test_codes_and_vocabularies_of_a_few_strings_are_the_arrow_ones(values, others, as_numpy):
    given_ = np.array(values, dtype=object) if as_numpy else values
    arrow = pa.array(values, pa.string())  # the Arrow path, whatever the size
    assert CX.few_strings(given_) is not None and CX.few_strings(arrow) is None
    vocab = CX.vocabulary(given_, others)
    assert vocab.equals(CX.vocabulary(arrow, pa.array(others, pa.string())))
    assert CX.codes_in(given_, vocab).tolist() == CX.codes_in(arrow, vocab).tolist()
    upper = str.upper
    assert CX.codes_in(given_, vocab, transform=upper).tolist() == CX.codes_in(arrow, vocab, transform=upper).tolist()


_MEASURED = st.ip_addresses().filter(lambda a: a.version == 4 or a.ipv4_mapped is None)  # mapped ones are refused


@settings(max_examples=200, deadline=None)
@given(st.lists(_MEASURED, min_size=1, max_size=10))
def test_a_few_addresses_read_back_as_the_arrow_formatter_writes_them(addrs):
    m = Measurements.from_fields([str(a) for a in addrs], [str(a) for a in reversed(addrs)], [1.0] * len(addrs))
    assert m.src_text() == M.format_addresses(m.src, m.src_v6).to_pylist() == [str(a) for a in addrs]
    assert m.dst_text() == M.format_addresses(m.dst, m.dst_v6).to_pylist()
