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
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from pingctl.errors import PingctlError, UsageError
from pingctl.api import arguments as ARG
from pingctl.api import checks as Q
from pingctl.api import checks as QS
from pingctl.api.checks import CONTEXT_ROWS_MAX, AddressError, clean_address
from pingctl.schema.columns import check_rtt
from pingctl.schema.times import MIN_TIME, max_time
from pingctl.tokenizer.rtt_codec import MAX_MS

# ----------------------------------------------------------------- bounds
#
# The bounds keep a request's time to seconds on a CPU and its memory to megabytes. An /rtt
# request takes turns with others on the model's worker a batch at a time (batcher); a
# /complete, /search or /score request holds it for its whole run. An RTT question at the
# quantiles costs one first-byte pass and a few dozen second-byte sequences: 1,024 pairs are
# 32 batches of 32, a few seconds for `tiny` without context; MAX_WORK bounds them with it.
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
# What one /rtt request may ask of the model's worker (`rtt_work`): each pair costs 1 plus the
# context rows its prompt can hold (at most seq_len / WORK_TOKENS_PER_ROW: the rest are only
# read to pick from), times EXACT_WORK when exact. Turns are fair (batcher), so a large request
# no longer holds the worker while others wait; the budget bounds how long the large request
# itself takes: 1,024 pairs with full prompts of a seq_len-256 run (about 22,500), a few seconds
# to tens of seconds on a CPU; 1,024 exact pairs with full prompts (about 90,000) is past it.
MAX_WORK = 32_768
EXACT_WORK = 4  # an exact distribution computes all 65,536 codes: 2-5x the forward work, measured
# fewer tokens than a context measurement takes in a prompt (16-19 for IPv4 in the compact
# scheme, more for IPv6), so seq_len / 12 bounds the measurements a prompt holds from above
WORK_TOKENS_PER_ROW = 12
MAX_TEXT = 64  # characters of an address, pattern or time (the longest IPv6 text is 45)
# A probe id lands in the canonical table's int64 `prb_id` column (and NumPy int64 arrays on the
# way): a larger one is refused here by name instead of overflowing there (a 500).
MAX_PRB_ID = 2**63 - 1
MAX_SEED = 2**63 - 1  # a NumPy generator's seed, kept within int64 like every other integer

Text = Annotated[StrictStr, Field(max_length=MAX_TEXT)]
# Times are parsed by `parse_when`, which bounds Unix seconds to +-1e15 (no int64 overflow later)
Time = Annotated[StrictInt | StrictFloat | StrictStr | None,
                 Field(description="When: ISO 8601 text (naive = UTC) or Unix seconds; null or absent: no time "
                                   "in the prompt", examples=["2024-01-31T12:00:00Z"])]
# JSON numbers: an int is a float too; text ("20") and booleans are refused (strict)
Number = StrictFloat | StrictInt


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
    """`Model.rtt(time=...)`'s check (and so `sample --time`'s): "" or blanks are refused, not
    read as "no time"."""
    try:
        return ARG.when(value, name)
    except UsageError as e:
        raise ValueError(str(e)) from None


# a whole address, canonical; a time as Unix seconds: one validator each, wherever a body has one
Address = Annotated[Text, AfterValidator(_whole)]
Seconds = Annotated[Time, AfterValidator(_seconds)]


class OverBudget(PingctlError):
    """A request asking more of the model than one request may (`MAX_WORK`): HTTP 413."""

    kind = "over_budget"


def family(address: str) -> int:
    return 6 if ":" in address else 4


class _Body(BaseModel):
    # a misspelt field ("tiem") is refused by name instead of silently asking another question
    model_config = ConfigDict(extra="forbid")


class Pair(_Body):
    """One RTT question: a source, a destination, and when (None: no time in the prompt)."""

    src: Address = Field(description="Source: a whole IPv4 or IPv6 address (the probe's)", examples=["193.0.0.1"])
    dst: Address = Field(description="Destination: a whole address of the source's family", examples=["8.8.8.8"])
    time: Seconds = None

    @model_validator(mode="after")
    def _one_family(self):
        if family(self.src) != family(self.dst):
            raise ValueError(f"src is IPv{family(self.src)} but dst is IPv{family(self.dst)}: a measurement has one family")
        return self


class PairIn(_Body):
    """One pair of a batch as sent: its types are checked with the body (a wrong type is a 422
    for the whole request); its values (`Pair`'s checks) pair by pair, a bad pair set aside with
    its reason while the others are answered."""

    src: Text | None = Field(None, description="Source: a whole IPv4 or IPv6 address", examples=["193.0.0.1"])
    dst: Text | None = Field(None, description="Destination: a whole address of the source's family",
                             examples=["8.8.8.8"])
    time: Time = None


class ContextRow(_Body):
    """An earlier measurement of a probe, as a canonical row holds it: `rtt` in ms, -1 for a
    failed packet; `prb_id` names the probe (its rows then count for every address it has)."""

    src: Address = Field(description="Source address of the measurement (the probe's)")
    dst: Address = Field(description="Destination address of the measurement")
    time: Annotated[StrictInt | StrictFloat | StrictStr,
                    Field(description="When it was measured: ISO 8601 or Unix seconds, 2000-01-01 .. now")]
    rtt: Number = Field(description="Round-trip time in ms; -1 = the packet failed", examples=[23.4])
    prb_id: StrictInt | None = Field(None, ge=0, le=MAX_PRB_ID,
                                     description="The RIPE Atlas probe id (0 .. 2**63-1); its rows then count for "
                                                 "every address the probe has")

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
    context_per_pair: StrictInt | None = Field(
        None, ge=0, le=MAX_CONTEXT_ROWS,
        description="At most this many context measurements per (src, dst) pair (default: as the run was "
                    "trained; 0 = no cap)")


class RttRequest(_WithContext):
    """One pair (`src`, `dst`, `time`) or many (`pairs`)."""

    src: Address | None = Field(None, description="One pair's source: a whole IPv4 or IPv6 address",
                                examples=["193.0.0.1"])
    dst: Address | None = Field(None, description="One pair's destination: a whole address of src's family",
                                examples=["8.8.8.8"])
    time: Seconds = None
    pairs: list[PairIn] | None = Field(
        None, min_length=1, max_length=MAX_PAIRS,
        description=f"Many pairs (instead of src/dst/time), at most {MAX_PAIRS:,}: each answered in order; a pair "
                    "whose values fail the checks is listed in `rejected` with its reason, the others answered")
    exact: StrictBool | None = Field(
        None, description="true: every one of the 65,536 codes (the means exact too; ~5x the forward work); false: "
                          "exact at P(failure) and the quantiles, the means approximate (inside the first-byte "
                          "bins nothing is read in). "
                          "Default: as `pingctl sample` answers the same form: true for one pair (`sample --src "
                          "--dst`), false for many (`sample --pairs`)")
    answer: Literal["model", "combined", "classical"] | None = Field(
        None, description="Which predictor answers (`pingctl sample --answer`): model; combined, the model pooled with "
                          "the classical estimate of each pair's regime as the run's combination.json weighs them; "
                          "classical, that estimate alone. Default: as the service was started (combined where the "
                          "combination fits and was better than the model on val, else model). Each answer's "
                          "`answered_by` says which answered and why")

    @model_validator(mode="after")
    def _one_form(self):
        single = [n for n in ("src", "dst", "time") if getattr(self, n) is not None]
        if self.pairs is not None and single:
            raise ValueError(f"{', '.join(single)} and pairs: give one pair (src, dst, time) or pairs, not both")
        if self.pairs is None and self.src is not None and self.dst is not None \
                and family(self.src) != family(self.dst):
            raise ValueError(f"src is IPv{family(self.src)} but dst is IPv{family(self.dst)}: a measurement has one family")
        if self.exact is None:
            # `pingctl sample --src --dst` computes every code, `--pairs` reads where it prints:
            # the same question gets the same numbers from both
            self.exact = self.pairs is None
        return self

    def missing(self) -> list[str]:
        """The fields a one-pair request lacks (the body names neither form completely)."""
        if self.pairs is not None:
            return []
        return [n for n in ("src", "dst") if getattr(self, n) is None]

    def questions(self) -> tuple[list[tuple[int, Pair]], list[dict]]:
        """([(index in the body, pair)] of the pairs that pass `Pair`'s checks; the others as
        {index, field, reason, message})"""
        if self.pairs is None:
            return [(0, Pair.model_construct(src=self.src, dst=self.dst, time=self.time))], []
        good, bad = [], []
        for i, p in enumerate(self.pairs):
            try:
                good.append((i, Pair.model_validate(p.model_dump(exclude_none=True))))
            except ValueError as e:  # pydantic's ValidationError: the first problem names the field
                first = e.errors()[0]
                where = ".".join(str(x) for x in first.get("loc", ()))
                field = f"pairs[{i}]" + (f".{where}" if where else "")
                msg = str(first.get("msg", "")).removeprefix("Value error, ")
                if first.get("type") == "missing":
                    msg = "Field required"
                bad.append({"index": i, "field": field, "reason": first.get("type", "value_error"),
                            "message": f"{field}: {msg}"})
        return good, bad


class CompleteRequest(_WithContext):
    """The `k` most probable (src, dst) filling the patterns (a side left out: any address of
    the other's family), given an RTT if set: `pingctl sample --src 8.8.*.* --dst ...`."""

    src: Text | None = Field(None, description="Source: an address or a pattern (8.8.*.*, 193.0.0.0/16); "
                                               "absent: any address of dst's family", examples=["193.0.*.*"])
    dst: Text | None = Field(None, description="Destination: an address or a pattern; absent: any address of "
                                               "src's family", examples=["8.8.8.8"])
    rtt: Number | None = Field(None, ge=0, le=MAX_MS, description="ms: complete given this RTT (absent: any)")
    k: StrictInt = Field(QS.K, ge=1, le=QS.COMPLETE_BEAM,
                         description=f"How many completions, most probable first (1 .. {QS.COMPLETE_BEAM})")

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

    src: Address = Field(description="Source: a whole IPv4 or IPv6 address", examples=["193.0.0.1"])
    rtt: Number | StrictStr = Field(examples=["10-30"], description="RTT in ms (20) or a range (\"10-30\")")
    n: StrictInt = Field(QS.SAMPLES, ge=1, le=MAX_SEARCH_SAMPLES,
                         description=f"Destinations sampled (1 .. {MAX_SEARCH_SAMPLES:,}), then deduplicated")
    k: StrictInt = Field(QS.K, ge=1, le=MAX_SEARCH_SAMPLES, description="How many candidates, most probable first")
    seed: StrictInt = Field(0, ge=0, le=MAX_SEED,
                            description="Seed of the sampling (0 .. 2**63-1): the same seed, the same answer")
    temperature: Number = Field(1.0, gt=0, le=100, description="Sampling temperature (0 < t <= 100; 1 = the model's)")

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


class ScoreRequest(_Body):
    """Measurements to score (`pingctl.infer.score.score_table`): each row's RTT under the model,
    its prompt holding up to `context` earlier measurements picked by `context_policy`."""

    rows: list[ContextRow] = Field(min_length=1, max_length=MAX_SCORE_ROWS,
                                   description=f"Measurements to score (1 .. {MAX_SCORE_ROWS:,}), canonical rows")
    context: StrictInt = Field(16, ge=0, le=MAX_SCORE_CONTEXT,
                               description="Earlier measurements of the probe (among `rows`) each prompt holds")
    context_policy: Literal["probe", "cold", "none"] = Field(
        "probe", description="probe: the probe's preceding rows; cold: none for a probe's first rows; none: no "
                             "context (as `pingctl score --context-policy`)")
    limit: StrictInt | None = Field(None, ge=1, le=MAX_SCORE_ROWS, description="Score only the first `limit` rows")


def rtt_work(body: RttRequest, seq_len: int) -> int:
    """What `body` asks of the model's worker, in the units of `MAX_WORK`: pairs x (1 + the
    context rows a prompt can hold), x EXACT_WORK when exact."""
    pairs = 1 if body.pairs is None else len(body.pairs)
    rows = min(len(body.context or ()), seq_len // WORK_TOKENS_PER_ROW)
    return pairs * (1 + rows) * (EXACT_WORK if body.exact else 1)


def check_work(body: RttRequest, seq_len: int) -> None:
    """OverBudget, saying how to ask within the budget, when `body` asks for more than MAX_WORK."""
    work = rtt_work(body, seq_len)
    if work <= MAX_WORK:
        return
    rows = min(len(body.context or ()), seq_len // WORK_TOKENS_PER_ROW)
    per_pair = (1 + rows) * (EXACT_WORK if body.exact else 1)
    how = f"{len(body.pairs or ())} pairs x (1 + {rows} context rows a prompt can hold)" + (
        f" x {EXACT_WORK} (exact)" if body.exact else "")
    raise OverBudget(f"this request asks for {work:,} units of model work ({how}); one request may ask for "
                     f"{MAX_WORK:,}: send at most {MAX_WORK // per_pair:,} pairs per request"
                     + (" (or exact false)" if body.exact else ""))
