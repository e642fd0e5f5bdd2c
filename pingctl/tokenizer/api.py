"""One interface over both schemes: `Tokenizer(scheme)` or the module-level functions."""

from __future__ import annotations

import numpy as np

from pingctl.tokenizer import compact, full
from pingctl.tokenizer.decode import Decoded, decode
from pingctl.tokenizer.grammar import GrammarState, allowed_next, validate
from pingctl.tokenizer.layout import Encoded
from pingctl.tokenizer.measurements import Measurements
from pingctl.tokenizer.vocab import Vocab, get_vocab

_SCHEMES = {"compact": compact, "full": full}


def _module(scheme: str):
    get_vocab(scheme)  # uniform error for unknown names
    return _SCHEMES[scheme]


def encode(
    m: Measurements,
    scheme: str = "compact",
    *,
    rng: np.random.Generator | None = None,
    order=None,
    context_starts=None,
) -> Encoded:
    """Tokens of a batch of measurements.

    rng: a seeded Generator draws an independent uniform block order per measurement (the
    loader re-draws every epoch); None with order=None gives the canonical order.
    order: a fixed order (block names or indices, `blocks(scheme)`), or an [n, k] array such
    as `Encoded.order` of an earlier call, reproduces an order exactly.
    context_starts: measurement indices where a new context (packed sequence) begins; the
    compact scheme restarts its timestamp delta chain there. None = the batch is one context.
    """
    return _module(scheme).encode(m, rng=rng, order=order, context_starts=context_starts)


def measurement_lengths(m: Measurements, scheme: str = "compact", context_starts=None) -> np.ndarray:
    """Tokens per measurement (int64[n]) exactly as `encode` would produce them, without encoding."""
    return _module(scheme).measurement_lengths(m, context_starts)


def blocks(scheme: str = "compact") -> tuple[str, ...]:
    """Block names in canonical order: what `order` indices and `Encoded.order` refer to."""
    return _module(scheme).BLOCKS


class Tokenizer:
    """The measurement language chosen in the config (`tokenizer.scheme`)."""

    def __init__(self, scheme: str = "compact") -> None:
        _module(scheme)
        self.scheme = scheme

    @classmethod
    def from_config(cls, cfg) -> "Tokenizer":
        """From a `Config` or its `TokenizerConfig` section."""
        section = getattr(cfg, "tokenizer", cfg)
        return cls(section.scheme)

    @property
    def vocab(self) -> Vocab:
        return get_vocab(self.scheme)

    @property
    def vocab_size(self) -> int:
        return self.vocab.size

    @property
    def blocks(self) -> tuple[str, ...]:
        return blocks(self.scheme)

    def encode(self, m: Measurements, *, rng=None, order=None, context_starts=None) -> Encoded:
        return encode(m, self.scheme, rng=rng, order=order, context_starts=context_starts)

    def lengths(self, m: Measurements, context_starts=None) -> np.ndarray:
        return measurement_lengths(m, self.scheme, context_starts)

    def decode(self, tokens) -> Decoded:
        return decode(tokens, self.scheme)

    def grammar(self) -> GrammarState:
        return GrammarState(self.scheme)

    def allowed_next(self, prefix) -> np.ndarray:
        return allowed_next(prefix, self.scheme)

    def validate(self, tokens, prefix: bool = False):
        return validate(tokens, self.scheme, prefix)

    def __repr__(self) -> str:
        return f"Tokenizer({self.scheme!r}, vocab_size={self.vocab_size})"
