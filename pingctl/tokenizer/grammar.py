"""The grammar of a context as an incremental state machine (for constrained sampling) and a
validator.

`GrammarState.step` is O(1) and `mask()` returns a cached read-only bool[vocab] array, so a
sampler can afford one per generated token. The rules (docs/tokenizer.md, "Grammar"):

- a context is empty or starts with MeasurementStart; each measurement is MeasurementStart
  followed by blocks in any order, each block kind at most once;
- required: src, dst, result (compact; the timestamp is optional) / all seven blocks (full);
- a measurement may end (next MeasurementStart, or end of context) only when complete;
- src and dst have the same address family (Atlas pings are single-family, and the
  canonical table rejects mixed rows);
- compact: TimestampDelta1/Delta4 only after an earlier timestamp in the context;
  ThroughputStart is reserved and never legal;
- compact: an RTT's first byte is one of `rtt_codec.POSSIBLE_FIRST_BYTES` (a canonical code
  at most the ceiling, what `token_codes` emits).
"""

from __future__ import annotations

import numpy as np

from pingctl.tokenizer import compact
from pingctl.tokenizer.decode import DecodeError, decode
from pingctl.tokenizer.rtt_codec import POSSIBLE_FIRST_BYTES
from pingctl.tokenizer.spec import SchemeSpec, get_spec

_START, _BETWEEN, _FAMILY, _BYTES = range(4)


class GrammarError(ValueError):
    pass


class GrammarState:
    """Incremental parser: `step(token)` advances (GrammarError if illegal), `mask()` is the
    set of legal next tokens, `can_end` says whether the context may stop here."""

    __slots__ = ("spec", "phase", "seen", "fam", "has_ref", "remaining", "block", "position")
    _masks: dict = {}

    def __init__(self, scheme: str = "compact") -> None:
        self.spec: SchemeSpec = get_spec(scheme)
        self.phase = _START
        self.seen = 0  # bitmask of blocks in the current measurement
        self.fam = -1  # address family fixed by the first address block, -1 = not yet
        self.has_ref = False
        self.remaining = 0
        self.block = -1
        self.position = 0

    @property
    def scheme(self) -> str:
        return self.spec.scheme

    @property
    def can_end(self) -> bool:
        return self.phase == _START or (self.phase == _BETWEEN and self._complete())

    def _complete(self) -> bool:
        req = self.spec.required_mask
        return self.seen & req == req

    def copy(self) -> "GrammarState":
        new = GrammarState.__new__(GrammarState)
        for s in self.__slots__:
            setattr(new, s, getattr(self, s))
        return new

    def mask(self) -> np.ndarray:
        key = (self.spec.scheme, self.phase, self.seen if self.phase == _BETWEEN else 0,
               self.fam, self.has_ref, self.block if self.phase == _FAMILY else -1)
        if self.phase == _BYTES:
            key = (self.spec.scheme, _BYTES, self._rtt_first_byte())
        m = self._masks.get(key)
        if m is None:
            m = self._compute_mask()
            m.flags.writeable = False
            self._masks[key] = m
        return m

    def allowed(self) -> list[int]:
        return np.flatnonzero(self.mask()).tolist()

    def _rtt_first_byte(self) -> bool:
        return self.spec.scheme == "compact" and self.block == compact.RESULT and self.remaining == 2

    def _compute_mask(self) -> np.ndarray:
        spec, v = self.spec, self.spec.vocab
        m = np.zeros(v.size, bool)
        if self.phase == _BYTES:
            m[v.byte_offset :] = POSSIBLE_FIRST_BYTES if self._rtt_first_byte() else True
            return m
        if self.phase == _FAMILY:
            for t in range(v.size):
                if spec.family_payload[t] >= 0 and self._family_ok(spec.family_variant[t]):
                    m[t] = True
            return m
        m[0] = self.phase == _START or self._complete()
        if self.phase == _START:
            return m
        for t in range(1, v.byte_offset):
            b = spec.role_block[t]
            if b < 0 or self.seen >> b & 1:
                continue
            if t in spec.delta_roles and not self.has_ref:
                continue
            if b in (spec.src, spec.dst) and spec.role_payload[t] >= 0 and not self._family_ok(spec.role_variant[t]):
                continue
            m[t] = True
        return m

    def _family_ok(self, variant: int) -> bool:
        return self.fam < 0 or self.fam == variant

    def step(self, token: int) -> None:
        token = int(token)
        if not (0 <= token < self.spec.vocab.size and self.mask()[token]):
            raise GrammarError(
                f"{self.spec.vocab.name(token)} (id {token}) is not allowed at position {self.position}"
            )
        spec = self.spec
        self.position += 1
        if self.phase == _BYTES:
            self.remaining -= 1
            if self.remaining == 0:
                self.phase = _BETWEEN
            return
        if self.phase == _FAMILY:
            self.fam = int(spec.family_variant[token])
            self._payload(int(spec.family_payload[token]))
            return
        if token == 0:
            self.phase, self.seen, self.fam = _BETWEEN, 0, -1
            return
        b = int(spec.role_block[token])
        self.seen |= 1 << b
        self.block = b
        if b == spec.time:
            self.has_ref = True
        p = int(spec.role_payload[token])
        if p == -2:
            self.phase = _FAMILY
            return
        if b in (spec.src, spec.dst):
            self.fam = int(spec.role_variant[token])
        self._payload(p)

    def _payload(self, n: int) -> None:
        self.remaining = n
        self.phase = _BYTES if n else _BETWEEN

    def feed(self, tokens) -> "GrammarState":
        for t in tokens:
            self.step(t)
        return self


def allowed_next(prefix, scheme: str = "compact") -> np.ndarray:
    """bool[vocab] of the tokens that may follow `prefix` (GrammarError if the prefix is illegal)."""
    return GrammarState(scheme).feed(prefix).mask()


def validate(tokens, scheme: str = "compact", prefix: bool = False) -> list[DecodeError]:
    """Every grammar violation in `tokens` (empty list = valid). With prefix=True the stream may
    stop inside its last measurement (a context being generated)."""
    d = decode(tokens, scheme)
    errors = d.errors
    if prefix and errors:
        n = len(tokens)
        last = errors[-1]
        if last.end == n and last.kind in ("truncated", "missing_field"):
            errors = errors[:-1]
    return errors
