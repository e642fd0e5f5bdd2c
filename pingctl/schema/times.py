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


_DURATION_RE = re.compile(r"\s*([0-9]{1,9})\s*([a-z]*)\s*", re.I)
_UNIT_S = {**dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
           **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
           **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
           **dict.fromkeys(("d", "day", "days"), 86_400),
           **dict.fromkeys(("w", "week", "weeks"), 7 * 86_400)}
MAX_DURATION_S = 100 * 366 * 86_400  # far past any table's span; keeps microseconds within int64


def parse_duration(value: str, what: str, error: type[PingctlError] = PingctlError, bare_seconds: bool = False) -> int:
    """A duration as users give it (`15m`, `1h`, `1d`, `90s`, `2w`, "2 hours"; a bare number is
    seconds where `bare_seconds`) -> whole seconds, > 0."""
    m = _DURATION_RE.fullmatch(str(value))
    unit = (m.group(2).lower() or ("s" if bare_seconds else "")) if m else ""
    seconds = int(m.group(1)) * _UNIT_S[unit] if unit in _UNIT_S else 0
    if not 0 < seconds <= MAX_DURATION_S:
        such = "7d, 6h, 30m, 2w or 3600 (seconds)" if bare_seconds else "15m, 1h or 1d"
        raise error(f"{what} {value!r}: expected a duration such as {such} (a whole number of s, m, h, d or w, "
                    "at most 100 years)")
    return seconds


def max_time() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc) + FUTURE_SLACK


def generated_time_range() -> tuple[int, int]:
    """Unix seconds a generator (synth, `sample --n`) may emit: MIN_TIME to now. The day of
    clock slack a measured row is allowed past now (FUTURE_SLACK) is not for generators."""
    return int(MIN_TIME.timestamp()), int(time.time())
