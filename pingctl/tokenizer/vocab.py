"""Token tables of the two measurement languages (see docs/tokenizer.md).

Ids are part of the trained model's contract: never renumber, only append.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

SCHEMES = ("compact", "full")


class C(IntEnum):
    """Role tokens of the `compact` scheme; bytes follow at 11..266."""

    MeasurementStart = 0
    SrcIPv4 = 1
    SrcIPv6 = 2
    DstIPv4 = 3
    DstIPv6 = 4
    TimestampAbs = 5
    TimestampDelta1 = 6
    TimestampDelta4 = 7
    RttStart = 8
    ThroughputStart = 9  # reserved: never emitted, illegal in the grammar until a throughput block exists
    Failed = 10


class F(IntEnum):
    """Role tokens of the `full` scheme; bytes follow at 10..265."""

    MeasurementStart = 0
    SrcIpStart = 1
    DestIpStart = 2
    Ipv4Start = 3
    Ipv6Start = 4
    RttStart = 5
    SizeStart = 6
    ErrorCountStart = 7
    TimestampStart = 8
    MsmIdStart = 9


@dataclass(frozen=True)
class Vocab:
    scheme: str
    roles: tuple[str, ...]
    names: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", self.roles + tuple(f"Byte{b}" for b in range(256)))

    @property
    def byte_offset(self) -> int:
        return len(self.roles)

    @property
    def size(self) -> int:
        return len(self.roles) + 256

    def byte(self, value: int) -> int:
        return self.byte_offset + value

    def is_byte(self, token: int) -> bool:
        return self.byte_offset <= token < self.size

    def name(self, token: int) -> str:
        return self.names[token] if 0 <= token < self.size else f"<invalid {token}>"

    def id(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise KeyError(f"no token {name!r} in the {self.scheme} vocabulary") from None


COMPACT = Vocab("compact", tuple(t.name for t in C))
FULL = Vocab("full", tuple(t.name for t in F))


def get_vocab(scheme: str) -> Vocab:
    if scheme == "compact":
        return COMPACT
    if scheme == "full":
        return FULL
    raise ValueError(f"unknown tokenizer scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")
