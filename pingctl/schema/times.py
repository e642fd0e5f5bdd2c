"""Times as users and tables give them: parsing, bounds and display (all UTC)."""

from __future__ import annotations

import datetime as dt
import re
import time
from typing import Any

from pingctl.errors import PingctlError

# RIPE Atlas started in 2010; anything before 2000 or in the future is a unit or clock bug.
MIN_TIME = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)
FUTURE_SLACK = dt.timedelta(days=1)


def utc_text(seconds: float | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """Unix seconds as UTC text for people; seconds as such where datetime cannot hold them
    (a generated or mistyped time past year 9999)."""
    if seconds is None:
        return "-"
    try:
        return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime(fmt)
    except (ValueError, OverflowError, OSError):
        return f"{seconds} (Unix s)"

# |timestamp| in seconds at or past this is far outside any valid time, and ts * 1e6 could
# overflow to inf (round() then raises): such floats are rejected before they are scaled.
TS_ABS_MAX_S = 1e15
# ASCII only: float() and int() also take other scripts' digits ('١٢' is 12) and isdigit() '²'
_UNIX_SECONDS_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_NON_FINITE_RE = re.compile(r"[+-]?(nan|inf|infinity)", re.I)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def parse_when(value: Any, what: str, error: type[PingctlError] = PingctlError) -> int | None:
    """A time as users give it (ISO 8601, naive = UTC; or Unix seconds) -> Unix microseconds.
    The one parser behind ingest's --since/--until and the --time of tokenize and sample."""
    if value is None or value == "":
        return None
    if isinstance(value, dt.datetime):
        when = value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
        return (when - _EPOCH) // dt.timedelta(microseconds=1)
    text = str(value).strip()
    if _UNIX_SECONDS_RE.fullmatch(text) or _NON_FINITE_RE.fullmatch(text):
        secs = float(text)
        if not -TS_ABS_MAX_S < secs < TS_ABS_MAX_S:  # also NaN
            raise error(f"{what} {value!r}: not a valid time (Unix seconds must be finite and within "
                        f"+-{TS_ABS_MAX_S:.0e})")
        return int(text) * 1_000_000 if text.lstrip("+-").isdigit() else round(secs * 1_000_000)
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise error(f"{what} {value!r}: expected ISO 8601 (e.g. 2024-01-31T12:00:00Z) or Unix seconds") from None
    return parse_when(when, what, error)


# The largest valid RTT: the RTT codec's largest code (pingctl.tokenizer.rtt_codec.MAX_MS,
# 2047 * 2**31 us, about 50.9 days; kept equal by a test, not imported, so that importing


def max_time() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc) + FUTURE_SLACK


def generated_time_range() -> tuple[int, int]:
    """Unix seconds a generator (synth, `sample --n`) may emit: MIN_TIME to now. The day of
    clock slack a measured row is allowed past now (FUTURE_SLACK) is not for generators."""
    return int(MIN_TIME.timestamp()), int(time.time())
