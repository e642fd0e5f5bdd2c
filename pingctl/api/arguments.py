"""The arguments of `pingctl.api.Model`'s methods, as users give them in Python (a datetime, a
(low, high) pair, a list of dicts), turned into what the question objects take and checked
there. A refusal names the argument (`dst: ...`, `rtt '30-10': ...`), never a CLI option or a
temporary file: the CLI names its own flags."""

from __future__ import annotations

import functools
import math
import operator
import re
import tempfile
from datetime import datetime
from pathlib import Path

from pingctl.config import SampleConfig
from pingctl.errors import PingctlError, UsageError
from pingctl.infer import pairs as P
from pingctl.infer import queries as Q
from pingctl.infer import questions as QS


# A CLI option as the question objects (shared with `pingctl sample`) word their bounds: `--n`,
# `-k`, `--context-per-pair`, `--timestamps/--no-timestamps`.
_OPTION = re.compile(r"(?<![\w-])(?:--(?:no-)?([a-z][a-z0-9-]*)|-(k))(?![\w-])")


def python_name(message: str) -> str:
    """A refusal worded for the CLI, with each option named as the Python argument it is (`--n`
    -> `n`, `--context-per-pair` -> `context_per_pair`)."""
    return _OPTION.sub(lambda m: (m.group(1) or m.group(2)).replace("-", "_"), message)


def argument_names(method):
    """`Model`'s methods refuse in their own argument names, also where a shared question object
    (whose bounds `pingctl sample` enforces too) words the refusal with its CLI flag."""

    @functools.wraps(method)
    def wrapped(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except UsageError as e:
            raise UsageError(python_name(str(e))) from e

    return wrapped


def address(text, name: str, required: bool = False) -> str | None:
    if text is None and required:
        raise UsageError(f"{name}: an address is required")
    if text is not None and not isinstance(text, str):
        text = str(text)  # an ipaddress object
    return QS.address_option(text, name)


def one_family(src: str | None, dst: str | None) -> None:
    """Both sides (addresses or patterns) of one address family, the refusal naming dst."""
    fs, fd = (Q.parse_pattern(v)[0] if v else None for v in (src, dst))
    if fs and fd and fs != fd:
        raise UsageError(f"dst: {dst} is IPv{fd} but src {src} is IPv{fs}: a measurement has one family")


def time_text(value, name: str) -> str | None:
    """A time as users give it in Python (ISO text, Unix seconds, a datetime) -> the text the
    CLI's parser reads (it reads a naive time as UTC)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise UsageError(f"{name} {value!r}: give ISO 8601 text, Unix seconds or a datetime")
    return str(value)


def when(value, name: str) -> int | None:
    return QS.time_option(time_text(value, name), name)


def rtt_bounds(value) -> tuple[float, float]:
    """An RTT as a number, a (low, high) pair or the CLI's "20" / "10-30" -> (low, high) ms,
    checked by the CLI's parser."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        value = f"{value[0]}-{value[1]}"
    elif isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise UsageError(f"rtt {value!r}: give milliseconds (20), a range (10, 30) or '10-30'")
    return QS.rtt_range(str(value), "rtt")


def whole(name: str, value) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise UsageError(f"{name} {value!r}: expected a whole number") from None


def count(name: str, value, most: int, what: str) -> int:
    n = whole(name, value)
    if n < 1:
        raise UsageError(f"{name} must be at least 1, got {n}")
    if n > most:
        raise UsageError(f"{name} {n:,} is beyond the bound of {most:,}: {what}")
    return n


def sampling(**values) -> None:
    """seed, temperature, top_p checked as the config's `sample` section checks them."""
    try:
        SampleConfig(**values)
    except ValueError as e:  # pydantic's ValidationError
        errors = getattr(e, "errors", list)()
        detail = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in errors) or str(e)
        raise UsageError(f"sampling options: {detail}") from None


def context_fields(context, context_per_pair: int | None) -> dict:
    """The question's context fields: the context is given to `answer` itself, but the
    question checks context_per_pair against it (only a path is a Path; others get a label)."""
    if context is None:
        label = None
    elif isinstance(context, (str, Path)):
        label = Path(context)
    else:
        label = Path(f"<{type(context).__name__}>")
    if context_per_pair is not None and context is None:
        raise UsageError("context_per_pair caps measurements from context; give context too")
    return {"context": label, "context_per_pair": None if context_per_pair is None else whole("context_per_pair",
                                                                                             context_per_pair)}


def write_parquet(table, path: Path) -> None:
    """An in-memory table as Parquet, for the readers files go through."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pq.write_table(table, path)
    except (pa.ArrowException, TypeError, ValueError) as e:
        raise PingctlError(f"the table cannot be written as Parquet ({e})") from None


def read_pairs(source) -> tuple[P.Pairs, str]:
    """(checked pairs, how messages name them) of a pairs file, a pyarrow Table, a list of
    dicts, or pairs already read (`pingctl.infer.pairs.Pairs`, named as they name themselves):
    an in-memory one goes through the very reader `--pairs` uses, as Parquet rows."""
    if isinstance(source, P.Pairs):
        return source, source.file
    if isinstance(source, (str, Path)):
        with _renamed(f"--pairs {Path(source)}", f"pairs {source}"):
            return P.read_pairs(Path(source)), str(source)
    if isinstance(source, list):
        label = "(a list of dicts)"
        with _renamed(f"--pairs {label}", f"pairs {label}"):
            return P.records_pairs(list_records(source), label), label
    import pyarrow as pa

    if isinstance(source, pa.RecordBatch):
        source = pa.Table.from_batches([source])
    if isinstance(source, pa.Table):
        label = "(a pyarrow Table)"
    else:
        raise UsageError(f"pairs: expected a CSV or Parquet path, a pyarrow Table or a list of dicts, "
                         f"got {type(source).__name__}")
    with tempfile.TemporaryDirectory(prefix="pingctl-pairs-") as d:
        f = Path(d) / "pairs.parquet"
        write_parquet(source, f)
        with _renamed(f"--pairs {f}", f"pairs {label}"):  # never the temporary file it was read from
            rows = P.read_pairs(f)
    rows.file = label
    for r in rows.rejects:
        r["file"] = label
    return rows, label


class _renamed:
    """The reader's refusals (which name `--pairs FILE`) re-raised naming the argument."""

    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if isinstance(e, PingctlError) and str(e).startswith(self.old):
            raise type(e)(self.new + str(e)[len(self.old):]) from None
        return False


def list_records(rows: list) -> list[tuple]:
    """A list of {src, dst[, time]} dicts (or src_addr, dst_addr, event_time) as the (src, dst,
    time) records a pairs file's rows are: the addresses as text, each time as the text the CLI
    parses (ISO 8601 or Unix seconds), None kept; read with the file's own checks, no file
    between (a service's request pays no Parquet round trip)."""
    if not rows:
        raise UsageError("pairs: the list is empty")
    if not all(isinstance(r, dict) for r in rows):
        raise UsageError("pairs: a list of pairs holds dicts like {'src': ..., 'dst': ..., 'time': ...}")
    present = {c for r in rows for c in r}
    s, d, t = P.pick_columns([c for c in (*P.SRC_COLUMNS, *P.DST_COLUMNS, *P.TIME_COLUMNS) if c in present],
                             "(a list of dicts)")

    def text(v, time: bool = False):
        if v is None:
            return None
        if time and isinstance(v, datetime):
            return v.isoformat()
        if time and isinstance(v, float) and math.isfinite(v) and v == int(v):
            return str(int(v))
        return str(v)

    return [(text(r.get(s)), text(r.get(d)), text(r.get(t), True) if t else None) for r in rows]


