"""What `pingctl serve` answers (docs/serve.md): one pydantic model per route's 200 and the
error shape every other status carries, so /openapi.json types every response and a client can
be generated from it. A float the model cannot give (a mean where no mass is) is null."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Ms = Annotated[float | None, Field(description="milliseconds (null where the distribution has no mass there)")]


class _Out(BaseModel):
    # the answers are built as dicts by `answers`; a key the model does not name is dropped
    model_config = ConfigDict(extra="ignore")


# ----------------------------------------------------------------- errors


class ErrorInfo(_Out):
    kind: str = Field(description="usage (a field of the request, or a body that is not JSON), too_large, "
                                  "over_budget, overloaded, warming, shutting_down, unauthorized, not_found, method_not_allowed, "
                                  "internal, or a PingctlError's kind")
    message: str = Field(description="What is wrong, naming the field first (`pairs[3].src: ...`)")


class ErrorBody(_Out):
    """Every non-200 answer of the application: `{"error": {"kind", "message"}}`; a 422 adds
    FastAPI-style `detail` (loc, msg, type per problem)."""

    error: ErrorInfo = Field(description="What kind of error, and the message naming the field")
    detail: list[dict] | str | None = Field(None, description="422: each problem as {loc, msg, type}")


ERRORS = {
    400: "A question the run cannot answer (a PingctlError)",
    401: "The service has an API key and the request did not present it (`Authorization: Bearer KEY` or "
         "`X-API-Key: KEY`): unauthorized",
    413: "The body is larger than the service's bound (too_large: by Content-Length, or while it streams in), "
         "or the request asks the model for more work than one request may (over_budget)",
    422: "A field fails its checks (named first in `error.message`), or the body is not JSON (line and column)",
    500: "An internal failure of this request; the service goes on answering the next",
    503: "The service is warming up (compiling its batch shapes) or its queue is full (retry after Retry-After), "
         "or it is shutting down and the request did not finish within the drain deadline (shutting_down)",
}


def errors(*codes: int) -> dict:
    """The `responses=` of a route: the error shape under each code it may answer."""
    return {c: {"model": ErrorBody, "description": ERRORS[c]} for c in codes}


# ----------------------------------------------------------------- /rtt


class AnsweredBy(_Out):
    predictor: Literal["model", "combined", "classical"] = Field(description="The predictor that answered")
    regime: str | None = Field(description="The question's regime: time (the prompt holds packets of the pair), "
                                           "pair, probe or target (which ends the run's hints know); null: not told")
    why: str = Field(description="Why this predictor answered, in words")


class Summary(_Out):
    p_fail: float | None = Field(description="P(the packet fails)")
    mean_ms: Ms = Field(description="Mean RTT of the successes up to the 60 s ceiling, ms")
    p_over_ceiling: float | None = Field(description="P(RTT > the 60 s ceiling | success)")
    trimmed_mean_ms: Ms = Field(description="Mean of the central 90% of the successes, ms")
    p5_ms: Ms = Field(description="5th percentile of the RTT given success, ms")
    p25_ms: Ms = Field(description="25th percentile, ms")
    p50_ms: Ms = Field(description="Median, ms")
    p75_ms: Ms = Field(description="75th percentile, ms")
    p95_ms: Ms = Field(description="95th percentile, ms")
    context_measurements: int = Field(description="Context measurements the prompt held")
    answered_by: AnsweredBy = Field(description="Which predictor answered, in which regime, and why")


class _RttHead(_Out):
    run: str = Field(description="The run (or export) answering")
    step: int = Field(description="Its checkpoint step (the last of averaged steps)")
    steps: list[int] = Field(description="Every step whose weights were averaged")
    exact: bool = Field(description="Whether every code was computed (the request's `exact`, or its form's default: "
                                    "true for one pair, false for many)")
    calibration: str | None = Field(description="The calibration map applied, if any")
    combination: str | None = Field(None, description="The combination.json the answers may pool with, if any")
    context_rows: int | None = Field(None, description="Context rows the request sent (when it sent some)")
    context_per_pair: int | None = Field(None, description="The cap on one (src, dst) pair's context measurements")


class RttOne(_RttHead, Summary):
    """One pair's distribution (the one-pair form)."""

    mode: Literal["distribution"] = Field(description="The one-pair form's answer")
    src: str = Field(description="Source address, canonical")
    dst: str = Field(description="Destination address, canonical")
    time: int | None = Field(description="The question's time, Unix seconds (null: none)")


class Prediction(Summary):
    index: int = Field(description="The pair's position in the request's `pairs`")
    src: str = Field(description="Source address, canonical")
    dst: str = Field(description="Destination address, canonical")
    time: int | None = Field(description="The pair's time, Unix seconds (null: none)")


class Rejected(_Out):
    index: int = Field(description="The pair's position in the request's `pairs`")
    field: str = Field(description="The field at fault, e.g. pairs[3].src")
    reason: str = Field(description="A short code: missing, value_error, ...")
    message: str = Field(description="Why it was set aside, naming the field")


class RttMany(_RttHead):
    """Many pairs: each good pair answered in order, each bad one listed with its reason."""

    mode: Literal["pairs"] = Field(description="The many-pairs form's answer")
    asked: int = Field(description="Pairs in the request")
    answered: int = Field(description="Pairs answered (asked - rejected)")
    distinct: int = Field(description="Distinct questions computed (a repeated pair is computed once)")
    predictions: list[Prediction] = Field(description="One per answered pair, in the request's order")
    rejected: list[Rejected] = Field(description="The pairs set aside, with their reasons")


RttAnswer = Annotated[RttOne | RttMany, Field(discriminator="mode")]


# ----------------------------------------------------------------- /complete, /search, /score


class Completion(_Out):
    src: str = Field(description="Source address filling the src pattern")
    dst: str = Field(description="Destination address filling the dst pattern")
    probability: float | None = Field(description="P(src, dst | the patterns[, rtt]) under the model")
    log_prob: float | None = Field(description="Its natural log")


class _Answered(_Out):
    run: str = Field(description="The run (or export) answering")
    step: int = Field(description="Its checkpoint step")


class CompleteAnswer(_Answered):
    mode: Literal["complete"] = Field("complete", description="A completion's answer")
    completions: list[Completion] = Field(description="The k most probable completions, most probable first")


class Candidate(_Out):
    dst: str = Field(description="A destination address the source reaches at the RTT")
    probability: float | None = Field(description="P(dst | src, rtt) under the model")
    samples: int = Field(description="How many of the n samples drew it")


class SearchAnswer(_Answered):
    mode: Literal["inverse"] = Field("inverse", description="An inverse search's answer")
    candidates: list[Candidate] = Field(description="The k most probable destinations, most probable first")


class ScoredRow(_Out):
    model_config = ConfigDict(extra="allow")  # the canonical columns come along as they are

    src_addr: str = Field(description="Source address, canonical")
    dst_addr: str = Field(description="Destination address, canonical")
    event_time: int = Field(description="Unix seconds")
    rtt: float = Field(description="ms; -1 = failed")
    prb_id: int | None = Field(None, description="The probe id sent, if any")
    nll: float | None = Field(description="Negative log-likelihood of the measurement, nats")
    pit: float | None = Field(description="Probability integral transform of the RTT (null for a failure)")
    tail_p: float | None = Field(description="Two-sided tail probability of the RTT")
    p_fail: float | None = Field(description="P(failure) after the prompt")
    context_measurements: int = Field(description="Context measurements the prompt held")


class ScoreAnswer(_Answered):
    meta: dict = Field(description="Counts (rows read, scored, set aside) and settings, as `pingctl score` writes")
    rows: list[ScoredRow] = Field(description="One per scored measurement, in the request's order")


# ----------------------------------------------------------------- health, version, metadata


class Health(_Out):
    status: Literal["warming", "ready", "failed"] = Field(
        description="warming: compiling the batch shapes (the questions routes answer 503); ready: answering; "
                    "failed: the warm-up failed (see `warmup.error`), answering anyway")
    run: str = Field(description="The run (or export) serving, by name: its directory's name, or owner/name@commit "
                                 "of a Hub repo (no path)")
    step: int = Field(description="Its checkpoint step")
    queued: int = Field(description="RTT questions waiting for the model")
    max_batch: int = Field(description="RTT questions per gathered batch")
    max_wait_ms: float | None = Field(description="How long the worker waits for more questions once it has one; "
                                                "null: by the traffic (2-150 ms)")
    batcher: dict = Field(description="Model calls made and what they carried: batches, jobs, items, largest_batch, "
                                      "failures")
    warmup: dict = Field(description="The warm-up: calls made, seconds, error (if any)")
    uptime_s: float = Field(description="Seconds since the application was created")


class Version(_Out):
    pingctl: str = Field(description="The pingctl version serving")
    run: str = Field(description="The run (or export) serving, by name: its directory's name, or owner/name@commit "
                                 "of a Hub repo (no path)")
    step: int = Field(description="Its checkpoint step (the last of averaged steps)")
    steps: list[int] = Field(description="Every step whose weights were averaged")
    device: str = Field(description="cpu, gpu or tpu")


class Metadata(_Out):
    model_config = ConfigDict(extra="allow")  # Model.metadata's keys, as that documents them

    run: str = Field(description="The run (or export) serving, by name (no path)")
    step: int = Field(description="Its checkpoint step (the last of averaged steps)")
    steps: list[int] = Field(description="Every step whose weights were averaged")
    preset: str | None = Field(description="The model preset it was trained with (null: unknown)")
    scheme: str = Field(description="The tokenizer scheme")
    seq_len: int = Field(description="Tokens a prompt holds")
    timestamps: bool = Field(description="Whether it was trained with timestamps (a question's time is refused if not)")
    device: str = Field(description="cpu, gpu or tpu")
    serving_since: str | None = Field(description="UTC, ISO 8601")
    serve: dict = Field(description="The service's batching figures and bounds")
