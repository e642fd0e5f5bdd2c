"""Per-scheme block tables shared by the decoder and the grammar, so the two cannot disagree.

Every token id maps to (block it starts, payload bytes that follow, variant). Lookup arrays
have one extra entry at index `vocab.size`, the sentinel that out-of-range ids map to.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from pingctl.tokenizer import compact, full
from pingctl.tokenizer.vocab import C, COMPACT, F, FULL, get_vocab, Vocab

IPV4, IPV6 = 0, 1  # variants of address blocks


@dataclass(frozen=True, eq=False)
class SchemeSpec:
    vocab: Vocab
    blocks: tuple[str, ...]
    required: tuple[int, ...]
    src: int
    dst: int
    time: int
    role_block: np.ndarray  # int64[V+1]: block started by the token, -1 if none
    role_payload: np.ndarray  # int64[V+1]: payload bytes after the header; -2 = a family token follows
    role_variant: np.ndarray  # int8[V+1]
    family_payload: np.ndarray  # int64[V+1]: bytes after Ipv4Start/Ipv6Start (full), -1 otherwise
    family_variant: np.ndarray  # int8[V+1]
    delta_roles: frozenset[int]  # tokens that need an earlier timestamp in the context

    @property
    def scheme(self) -> str:
        return self.vocab.scheme

    @property
    def required_mask(self) -> int:
        return sum(1 << b for b in self.required)


def _tables(vocab: Vocab, roles: dict[int, tuple[int, int, int]], families: dict[int, tuple[int, int]]):
    n = vocab.size + 1
    block = np.full(n, -1, np.int64)
    payload = np.zeros(n, np.int64)
    variant = np.zeros(n, np.int8)
    for t, (b, p, v) in roles.items():
        block[t], payload[t], variant[t] = b, p, v
    fam_payload = np.full(n, -1, np.int64)
    fam_variant = np.zeros(n, np.int8)
    for t, (p, v) in families.items():
        fam_payload[t], fam_variant[t] = p, v
    return block, payload, variant, fam_payload, fam_variant


@lru_cache(maxsize=None)
def get_spec(scheme: str) -> SchemeSpec:
    if scheme == "compact":
        roles = {
            C.SrcIPv4: (compact.SRC, 4, IPV4),
            C.SrcIPv6: (compact.SRC, 16, IPV6),
            C.DstIPv4: (compact.DST, 4, IPV4),
            C.DstIPv6: (compact.DST, 16, IPV6),
            C.RttStart: (compact.RESULT, 2, 0),
            C.Failed: (compact.RESULT, 0, 1),
            C.TimestampAbs: (compact.TIME, 8, compact.ABS),
            C.TimestampDelta1: (compact.TIME, 1, compact.DELTA1),
            C.TimestampDelta4: (compact.TIME, 4, compact.DELTA4),
        }
        return SchemeSpec(
            COMPACT, compact.BLOCKS, compact.REQUIRED, compact.SRC, compact.DST, compact.TIME,
            *_tables(COMPACT, roles, {}), frozenset({int(C.TimestampDelta1), int(C.TimestampDelta4)}),
        )
    if scheme == "full":
        roles = {
            F.SrcIpStart: (full.SRC, -2, 0),
            F.DestIpStart: (full.DST, -2, 0),
            F.RttStart: (full.RTT, 8, 0),
            F.SizeStart: (full.SIZE, 2, 0),
            F.ErrorCountStart: (full.ERRORS, 1, 0),
            F.TimestampStart: (full.TIME, 8, 0),
            F.MsmIdStart: (full.MSM_ID, 8, 0),
        }
        families = {F.Ipv4Start: (4, IPV4), F.Ipv6Start: (16, IPV6)}
        return SchemeSpec(
            FULL, full.BLOCKS, full.REQUIRED, full.SRC, full.DST, full.TIME,
            *_tables(FULL, roles, families), frozenset(),
        )

    get_vocab(scheme)  # raises the standard message
    raise AssertionError(scheme)


STRUCTURE = "structure"  # the field of MeasurementStart and block headers


def fields(spec: SchemeSpec) -> tuple[str, ...]:
    """Field names `token_fields` indexes: the scheme's blocks, then `structure`."""
    return (*spec.blocks, STRUCTURE)


def token_fields(tokens: np.ndarray, spec: SchemeSpec) -> np.ndarray:
    """Field index (into `fields(spec)`) of every token of packed rows, along the last axis.

    Payload tokens (bytes, and `full`'s family tokens) belong to the block of the header
    before them. MeasurementStart and headers are `structure`: predicting one is choosing
    what comes next (the field order), not a value.
    """
    ids = np.clip(tokens, 0, spec.vocab.size)
    block = spec.role_block[ids]
    header = (block >= 0) | (ids == 0)  # MeasurementStart is id 0 in both schemes
    pos = np.broadcast_to(np.arange(tokens.shape[-1]), tokens.shape)
    last = np.maximum.accumulate(np.where(header, pos, 0), axis=-1)
    owner = np.take_along_axis(block, last, axis=-1)
    return np.where(header | (owner < 0), len(spec.blocks), owner)
