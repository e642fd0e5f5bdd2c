"""The request bodies of `pingctl serve` (docs/serve.md), checked before any work.

Each address, pattern, time and RTT passes the checks `pingctl sample` applies to its options
and to a --pairs row (`pingctl.infer.pairs.clean_address`, `pingctl.infer.questions`), so the
service refuses what the CLI refuses, with the same words; a failure names the field
(`pairs[3].src`) as FastAPI's 422 does. Every list and number a client sends is bounded here.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from pingctl.errors import UsageError
from pingctl.infer import queries as Q
from pingctl.infer import questions as QS
from pingctl.infer.pairs import CONTEXT_ROWS_MAX, AddressError, clean_address
from pingctl.schema.columns import check_rtt
from pingctl.schema.times import MIN_TIME, max_time, parse_when
from pingctl.tokenizer.rtt_codec import MAX_MS

# ----------------------------------------------------------------- bounds
#
# One request holds the model's worker for the time its questions take, and every other
# request waits behind it; the bounds keep that to seconds on a CPU and a request's memory to
# megabytes. An RTT question at the quantiles costs one first-byte pass and a few dozen
# second-byte sequences: 1,024 pairs are 32 batches of 32, a few seconds for `tiny` here.
MAX_PAIRS = 1024
# A prompt of seq_len tokens holds at most seq_len / 12 measurements; the rest of a context is
# read only to pick the probe's rows. `pingctl sample --pairs` picks from the same bound.
MAX_CONTEXT_ROWS = CONTEXT_ROWS_MAX
# An inverse search runs each sample through 4 (IPv4) or 16 (IPv6) passes: the CLI's 100,000
# (`questions.MAX_SAMPLES`) would hold the worker for minutes, so a request may ask for less.
MAX_SEARCH_SAMPLES = 4096
MAX_SCORE_ROWS = 4096  # /score: measurements scored in one request (each one teacher-forced sequence)
MAX_SCORE_CONTEXT = 1024  # /score: earlier measurements per prompt (a prompt of seq_len tokens holds fewer)
# A body of MAX_CONTEXT_ROWS context rows is ~500 KB of JSON; anything much larger is not a question.
MAX_BODY_BYTES = 2 * 1024 * 1024
# RTT pairs waiting for the worker across all requests; past it a request is answered 503 at
# once rather than queued for minutes.
MAX_QUEUED = 16 * MAX_PAIRS
MAX_TEXT = 64  # characters of an address, pattern or time (the longest IPv6 text is 45)

Text = Annotated[StrictStr, Field(max_length=MAX_TEXT)]
Time = Annotated[StrictInt | StrictFloat | StrictStr | None,
                 Field(description="ISO 8601 (naive = UTC) or Unix seconds", examples=["2024-01-31T12:00:00Z"])]


def _whole(text: str) -> str:
    """A whole address as a measurement records it (canonical text), or a ValueError naming why."""
    try:
        return clean_address(text)[0]
    except AddressError as e:
        raise ValueError(str(e)) from None


def _pattern(text: str, name: str) -> str:
    """An address or a pattern (8.8.*.*, a CIDR) as `pingctl sample --src/--dst` takes it."""
    try:
        text = QS.address_option(text, name)
        Q.parse_pattern(text)
    except UsageError as e:
        raise ValueError(str(e)) from None
    return text


def _seconds(value, name: str = "time") -> int | None:
    try:
        us = parse_when(value, name, UsageError)
    except UsageError as e:
        raise ValueError(str(e)) from None
    return None if us is None else us // 1_000_000


# a whole address, canonical; a time as Unix seconds: one validator each, wherever a body has one
Address = Annotated[Text, AfterValidator(_whole)]
Seconds = Annotated[Time, AfterValidator(_seconds)]


def family(address: str) -> int:
    return 6 if ":" in address else 4


class _Body(BaseModel):
    # a misspelt field ("tiem") is refused by name instead of silently asking another question
    model_config = ConfigDict(extra="forbid")


class Pair(_Body):
    """One RTT question: a source, a destination, and when (None: no time in the prompt)."""

    src: Address = Field(examples=["193.0.0.1"])
    dst: Address = Field(examples=["8.8.8.8"])
    time: Seconds = None

    @model_validator(mode="after")
    def _one_family(self):
        if family(self.src) != family(self.dst):
            raise ValueError(f"src is IPv{family(self.src)} but dst is IPv{family(self.dst)}: a measurement has one family")
        return self


class ContextRow(_Body):
    """An earlier measurement of a probe, as a canonical row holds it: `rtt` in ms, -1 for a
    failed packet; `prb_id` names the probe (its rows then count for every address it has)."""

    src: Address
    dst: Address
    time: Annotated[StrictInt | StrictFloat | StrictStr, Field(description="ISO 8601 or Unix seconds")]
    rtt: float = Field(description="ms; -1 = the packet failed", examples=[23.4])
    prb_id: int | None = Field(None, ge=0)

    @field_validator("time")
    @classmethod
    def _canonical_time(cls, v):
        s = _seconds(v)
        lo, hi = MIN_TIME.timestamp(), max_time().timestamp()
        if not lo <= s <= hi:
            raise ValueError(f"time {v!r}: a measurement's time lies in 2000-01-01 .. now (build-rows rejects others)")
        return s

    @field_validator("rtt")
    @classmethod
    def _rtt(cls, v):
        if not check_rtt(v):
            raise ValueError(f"rtt {v!r}: milliseconds in 0 .. {MAX_MS:,.0f}, or -1 for a failed packet")
        return v

    @model_validator(mode="after")
    def _one_family(self):
        if family(self.src) != family(self.dst):
            raise ValueError(f"src is IPv{family(self.src)} but dst is IPv{family(self.dst)}")
        return self


class _WithContext(_Body):
    context: list[ContextRow] | None = Field(
        None, max_length=MAX_CONTEXT_ROWS,
        description="Earlier measurements; each question's prompt holds those of its source's probe "
                    "(before its time), as `pingctl sample --context` picks them")
    context_per_pair: int | None = Field(
        None, ge=0, le=MAX_CONTEXT_ROWS,
        description="At most this many context measurements per (src, dst) pair (default: as the run was "
                    "trained; 0 = no cap)")


class RttRequest(_WithContext):
    """One pair (`src`, `dst`, `time`) or many (`pairs`)."""

    src: Address | None = None
    dst: Address | None = None
    time: Seconds = None
    pairs: list[Pair] | None = Field(None, min_length=1, max_length=MAX_PAIRS)
    exact: bool = Field(False, description="Every one of the 65,536 codes (the means exact too, ~5x slower); "
                                           "default: exact at P(failure) and the quantiles")

    @model_validator(mode="after")
    def _one_form(self):
        single = [n for n in ("src", "dst", "time") if getattr(self, n) is not None]
        if self.pairs is not None and single:
            raise ValueError(f"{', '.join(single)} and pairs: give one pair (src, dst, time) or pairs, not both")
        if self.pairs is None and self.src is not None and self.dst is not None \
                and family(self.src) != family(self.dst):
            raise ValueError(f"src is IPv{family(self.src)} but dst is IPv{family(self.dst)}: a measurement has one family")
        return self

    def missing(self) -> list[str]:
        """The fields a one-pair request lacks (the body names neither form completely)."""
        if self.pairs is not None:
            return []
        return [n for n in ("src", "dst") if getattr(self, n) is None]

    def questions(self) -> list[Pair]:
        if self.pairs is not None:
            return list(self.pairs)
        return [Pair.model_construct(src=self.src, dst=self.dst, time=self.time)]


class CompleteRequest(_WithContext):
    """The `k` most probable (src, dst) filling the patterns (a side left out: any address of
    the other's family), given an RTT if set: `pingctl sample --src 8.8.*.* --dst ...`."""

    src: Text | None = Field(None, examples=["193.0.*.*"])
    dst: Text | None = Field(None, examples=["8.8.8.8"])
    rtt: float | None = Field(None, ge=0, le=MAX_MS, description="ms: complete given this RTT")
    k: int = Field(QS.K, ge=1, le=QS.COMPLETE_BEAM)

    @field_validator("src", "dst")
    @classmethod
    def _address_or_pattern(cls, v, info):
        return v if v is None else _pattern(v, info.field_name)

    @model_validator(mode="after")
    def _something(self):
        if self.src is None and self.dst is None:
            raise ValueError("give src, dst or both (an address or a pattern like 8.8.*.* or 8.8.0.0/16)")
        try:
            Q.parse_pair(self.src, self.dst)
        except UsageError as e:
            raise ValueError(str(e).replace("--src", "src").replace("--dst", "dst")) from None
        return self


class SearchRequest(_WithContext):
    """Destinations `src` reaches at an RTT (ms, or a range "10-30"): `n` samples drawn at
    `temperature` (seeded), deduplicated, the `k` most probable returned."""

    src: Address = Field(examples=["193.0.0.1"])
    rtt: float | StrictStr = Field(examples=["10-30"], description="ms (20) or a range (\"10-30\")")
    n: int = Field(QS.SAMPLES, ge=1, le=MAX_SEARCH_SAMPLES)
    k: int = Field(QS.K, ge=1, le=MAX_SEARCH_SAMPLES)
    seed: int = Field(0, ge=0, le=2**63 - 1)
    temperature: float = Field(1.0, gt=0, le=100)

    @field_validator("rtt")
    @classmethod
    def _range(cls, v):
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"rtt {v!r}: need finite milliseconds")
        try:
            QS.rtt_range(str(v))
        except UsageError as e:
            raise ValueError(str(e).replace("--rtt ", "rtt ", 1)) from None
        return v

    def rtt_bounds(self) -> tuple[float, float]:
        return QS.rtt_range(str(self.rtt))


class ScoreRequest(_Body):
    """Measurements to score (`pingctl.infer.score.score_table`): each row's RTT under the model,
    its prompt holding up to `context` earlier measurements picked by `context_policy`."""

    rows: list[ContextRow] = Field(min_length=1, max_length=MAX_SCORE_ROWS)
    context: int = Field(16, ge=0, le=MAX_SCORE_CONTEXT)
    context_policy: Literal["probe", "cold", "none"] = "probe"
    limit: int | None = Field(None, ge=1, le=MAX_SCORE_ROWS)
