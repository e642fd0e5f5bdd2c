"""The measurement language: two token schemes (`compact`, `full`) behind one interface.

    from pingctl.tokenizer import Measurements, Tokenizer
    tok = Tokenizer.from_config(cfg)                   # cfg.tokenizer.scheme
    m = Measurements.from_arrow(table)                 # canonical or parsed columns
    enc = tok.encode(m, rng=np.random.default_rng(0))  # enc.tokens, enc.offsets, enc.order
    dec = tok.decode(enc.tokens)                       # dec.measurements, dec.errors
    state = tok.grammar(); state.step(t); state.mask()

See docs/tokenizer.md.
"""

from pingctl.tokenizer.api import Tokenizer, blocks, encode, measurement_lengths
from pingctl.tokenizer.decode import Decoded, DecodeError, decode
from pingctl.tokenizer.grammar import GrammarError, GrammarState, allowed_next, validate
from pingctl.tokenizer.layout import Encoded
from pingctl.tokenizer.measurements import MeasurementError, Measurements, parsed_schema
from pingctl.tokenizer.packing import pack_contexts
from pingctl.tokenizer.vocab import COMPACT, FULL, SCHEMES, C, F, Vocab, get_vocab

__all__ = [
    "C", "COMPACT", "Decoded", "DecodeError", "Encoded", "F", "FULL", "GrammarError", "GrammarState",
    "MeasurementError", "Measurements", "SCHEMES", "Tokenizer", "Vocab", "allowed_next", "blocks", "decode", "encode",
    "get_vocab", "measurement_lengths", "pack_contexts", "parsed_schema", "validate",
]
