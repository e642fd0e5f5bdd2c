"""`Measurements`: the columnar batch both schemes encode from and decode to.

Addresses are 16-byte rows (IPv4 in the first 4 bytes, the rest zero) plus a v6 flag, so
encoding is pure array work. `from_arrow` parses canonical string addresses once per
distinct string; `to_arrow(parsed=True)` / `from_arrow` of that layout round-trip the
parsed columns without any string work (what `build-rows` stores for the loader).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np

from pingctl.errors import PingctlError
from pingctl.schema.addresses import IPV4_RE, packed_address
from pingctl.schema.arrow_strings import SMALL  # below it, a Python loop beats building Arrow arrays
from pingctl.schema.columns import arrow_schema

MAX_EVENT_TIME_S = (2**63 - 1) // 1_000_000  # the largest Unix second a timestamp[us] holds


class MeasurementError(PingctlError, ValueError):
    """Input the tokenizer cannot represent (bad address, NaN RTT, mixed families ...)."""


PARSED_COLUMNS = ("src", "src_v6", "dst", "dst_v6", "rtt_ms", "time_s", "has_time", "size", "errors", "msm_id")


def parsed_schema():
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("src", pa.binary(16), nullable=False),
            pa.field("src_v6", pa.bool_(), nullable=False),
            pa.field("dst", pa.binary(16), nullable=False),
            pa.field("dst_v6", pa.bool_(), nullable=False),
            pa.field("rtt_ms", pa.float64(), nullable=False),
            pa.field("time_s", pa.int64(), nullable=False),
            pa.field("has_time", pa.bool_(), nullable=False),
            pa.field("size", pa.int64(), nullable=False),
            pa.field("errors", pa.int64(), nullable=False),
            pa.field("msm_id", pa.int64(), nullable=False),
        ]
    )


@dataclass(eq=False)
class Measurements:
    src: np.ndarray  # uint8[n, 16]
    src_v6: np.ndarray  # bool[n]
    dst: np.ndarray  # uint8[n, 16]
    dst_v6: np.ndarray  # bool[n]
    rtt_ms: np.ndarray  # float64[n], -1.0 = failed
    time_s: np.ndarray  # int64[n], Unix seconds
    has_time: np.ndarray  # bool[n]; compact encodes a timestamp only where set
    size: np.ndarray  # int64[n]
    errors: np.ndarray  # int64[n]
    msm_id: np.ndarray  # int64[n]

    def __post_init__(self) -> None:
        self.src = _addr_matrix(self.src, "src")
        self.dst = _addr_matrix(self.dst, "dst")
        n = len(self.src)
        for name, dtype in (
            ("src_v6", np.bool_), ("dst_v6", np.bool_), ("rtt_ms", np.float64), ("time_s", np.int64),
            ("has_time", np.bool_), ("size", np.int64), ("errors", np.int64), ("msm_id", np.int64),
        ):
            arr = np.asarray(getattr(self, name), dtype=dtype)
            if arr.ndim == 0:
                arr = np.full(n, arr, dtype)
            if arr.shape != (n,):
                raise ValueError(f"Measurements.{name} has shape {arr.shape}, expected ({n},)")
            setattr(self, name, arr)
        if len(self.dst) != n:
            raise ValueError(f"Measurements.dst has {len(self.dst)} rows, src has {n}")

    # ------------------------------------------------------------ construction

    @classmethod
    def empty(cls, n: int = 0) -> "Measurements":
        z = np.zeros(n, np.int64)
        return cls(
            np.zeros((n, 16), np.uint8), np.zeros(n, bool), np.zeros((n, 16), np.uint8), np.zeros(n, bool),
            np.zeros(n), z, np.zeros(n, bool), z, z, z,
        )

    @classmethod
    def from_fields(
        cls,
        src: Sequence[str],
        dst: Sequence[str],
        rtt_ms: Sequence[float],
        time_s: Sequence[int | None] | None = None,
        size: Sequence[int] | int = 0,
        errors: Sequence[int] | int = 0,
        msm_id: Sequence[int] | int = 0,
    ) -> "Measurements":
        """From Python values (address strings; time None = no timestamp). Raises PingctlError."""
        s, s6 = parse_address_list(list(src), "src")
        d, d6 = parse_address_list(list(dst), "dst")
        n = len(s)
        if time_s is None:
            t, has = np.zeros(n, np.int64), np.zeros(n, bool)
        else:
            has = np.array([v is not None for v in time_s], bool)
            t = np.array([0 if v is None else int(v) for v in time_s], np.int64)
        return cls(s, s6, d, d6, np.asarray(rtt_ms, np.float64), t, has, size, errors, msm_id)

    @classmethod
    def from_arrow(cls, table) -> "Measurements":
        """From a canonical table (string addresses) or a parsed one (`parsed_schema`).

        Canonical: src_addr, dst_addr and rtt are required; event_time (any timestamp unit,
        or integer Unix seconds; null = no timestamp), size, packet_error_count and msm_id
        default to absent/0. Times are floored to whole seconds.
        """
        import pyarrow as pa

        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        names = set(table.column_names)
        if {"src", "dst", "src_v6", "dst_v6"} <= names:
            return cls._from_parsed(table)
        missing = [c for c in ("src_addr", "dst_addr", "rtt") if c not in names]
        if missing:
            raise MeasurementError(f"measurement table lacks column(s) {', '.join(missing)}")
        n = table.num_rows
        src, src_v6 = parse_addresses(table.column("src_addr"), "src_addr")
        dst, dst_v6 = parse_addresses(table.column("dst_addr"), "dst_addr")
        rtt = _float_column(table.column("rtt"), "rtt")
        if "event_time" in names:
            time_s, has_time = event_seconds(table.column("event_time"))
        else:
            time_s, has_time = np.zeros(n, np.int64), np.zeros(n, bool)
        ints = {
            k: _int_column(table.column(c), c) if c in names else np.zeros(n, np.int64)
            for k, c in (("size", "size"), ("errors", "packet_error_count"), ("msm_id", "msm_id"))
        }
        return cls(src, src_v6, dst, dst_v6, rtt, time_s, has_time, **ints)

    @classmethod
    def _from_parsed(cls, table) -> "Measurements":
        cols = {}
        for name in PARSED_COLUMNS:
            if name not in table.column_names:
                raise MeasurementError(f"parsed measurement table lacks column {name}")
            col = table.column(name).combine_chunks()
            if col.null_count:
                raise MeasurementError(f"parsed measurement column {name} has nulls")
            if name in ("src", "dst"):
                buf = col.buffers()[1]
                cols[name] = np.frombuffer(buf, np.uint8, count=16 * len(col), offset=16 * col.offset).reshape(-1, 16)
            else:
                cols[name] = col.to_numpy(zero_copy_only=False)
        return cls(**cols)

    def unrepresentable_times(self) -> np.ndarray:
        """Timestamped measurements whose time does not fit a microsecond timestamp (int64)."""
        return self.has_time & ((self.time_s > MAX_EVENT_TIME_S) | (self.time_s < -MAX_EVENT_TIME_S))

    def to_arrow(self, parsed: bool = False):
        """Canonical columns (string addresses; event_time null where has_time is false), or
        with parsed=True the `parsed_schema` layout."""
        import pyarrow as pa

        if parsed:
            n = len(self)
            cols = []
            for f in parsed_schema():
                v = getattr(self, f.name)
                if f.name in ("src", "dst"):
                    buf = pa.py_buffer(np.ascontiguousarray(v).tobytes())
                    cols.append(pa.Array.from_buffers(pa.binary(16), n, [None, buf]))
                else:
                    cols.append(pa.array(v, f.type))
            return pa.Table.from_arrays(cols, schema=parsed_schema())

        # A decoded TimestampAbs is any int64 of seconds; microseconds would wrap past
        # +-292,000 years, so such times are null here (callers count them: unrepresentable_times).
        fits = self.has_time & ~self.unrepresentable_times()
        ts = pa.array(np.where(fits, self.time_s, 0) * 1_000_000, pa.int64(), mask=~fits).cast(
            pa.timestamp("us", tz="UTC"))
        cols = {
            "msm_id": pa.array(self.msm_id, pa.int64()),
            "event_time": ts,
            "src_addr": format_addresses(self.src, self.src_v6),
            "dst_addr": format_addresses(self.dst, self.dst_v6),
            "ip_version": pa.array(np.where(self.src_v6, 6, 4), pa.int64()),
            "rtt": pa.array(self.rtt_ms, pa.float64()),
            "size": pa.array(self.size, pa.int64()),
            "packet_error_count": pa.array(self.errors, pa.int64()),
        }
        schema = pa.schema([f.with_nullable(True) if f.name == "event_time" else f for f in arrow_schema()])
        # the optional columns (prb_id, ttl, ...) are facts a parsed measurement does not carry
        cols.update({f.name: pa.nulls(len(self), f.type) for f in schema if f.name not in cols})
        return pa.table([cols[f.name] for f in schema], schema=schema)

    # ------------------------------------------------------------ array-like

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, idx) -> "Measurements":
        if isinstance(idx, (int, np.integer)):
            idx = [idx]
        return Measurements(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})

    take = __getitem__

    @staticmethod
    def concat(parts: Iterable["Measurements"]) -> "Measurements":
        parts = list(parts)
        if not parts:
            return Measurements.empty()
        names = [f.name for f in fields(Measurements)]
        return Measurements(**{k: np.concatenate([getattr(p, k) for p in parts]) for k in names})

    @property
    def failed(self) -> np.ndarray:
        return self.rtt_ms < 0

    def src_text(self) -> list[str]:
        return address_texts(self.src, self.src_v6)

    def dst_text(self) -> list[str]:
        return address_texts(self.dst, self.dst_v6)

    def differences(self, other: "Measurements", rtt_tol_ms: np.ndarray | float = 0.0,
                    columns: Sequence[str] | None = None) -> list[str]:
        """Names of columns that differ (rtt within `rtt_tol_ms`; time only where has_time)."""
        if len(self) != len(other):
            return ["length"]
        out = []
        for name in columns or [f.name for f in fields(self)]:
            a, b = getattr(self, name), getattr(other, name)
            if name == "rtt_ms":
                same = np.all((a == b) | (np.abs(a - b) <= rtt_tol_ms) & (a >= 0) & (b >= 0))
            elif name == "time_s":
                same = np.array_equal(np.where(self.has_time, a, 0), np.where(other.has_time, b, 0))
            elif name in ("src", "dst"):
                # IPv4 rows only carry their first 4 bytes.
                v6 = getattr(self, name + "_v6")[:, None]
                width = np.where(v6, 16, 4) > np.arange(16)
                same = np.array_equal(np.where(width, a, 0), np.where(width, b, 0))
            else:
                same = np.array_equal(a, b)
            if not same:
                out.append(name)
        return out


# ---------------------------------------------------------------- addresses


def _addr_matrix(a, name: str) -> np.ndarray:
    a = np.asarray(a, dtype=np.uint8)
    if a.ndim != 2 or a.shape[1] != 16:
        raise ValueError(f"Measurements.{name} must be uint8[n, 16], got shape {a.shape}")
    return a


def _parse_unique(uniq) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bytes, v6 flags and validity for distinct strings: IPv4 vectorised, the rest via ipaddress."""
    import pyarrow as pa
    import pyarrow.compute as pc

    u = len(uniq)
    out = np.zeros((u, 16), np.uint8)
    v6 = np.zeros(u, bool)
    ok = np.zeros(u, bool)
    is4 = pc.fill_null(pc.match_substring_regex(uniq, IPV4_RE), False).to_numpy(zero_copy_only=False)
    if is4.any():
        quads = pc.list_flatten(pc.split_pattern(uniq.filter(pa.array(is4)), "."))
        out[is4, :4] = pc.cast(quads, pa.uint8()).to_numpy(zero_copy_only=False).reshape(-1, 4)
        ok[is4] = True
    rest = np.flatnonzero(~is4)
    if rest.size:
        parsed = [packed_address(t) if t is not None else None for t in uniq.take(pa.array(rest)).to_pylist()]
        good = np.array([p is not None for p in parsed], bool)
        idx = rest[good]
        found = [p for p in parsed if p is not None]
        if found:
            out[idx] = np.frombuffer(b"".join(p[0] for p in found), np.uint8).reshape(-1, 16)
            v6[idx] = [p[1] for p in found]
            ok[idx] = True
    return out, v6, ok




def parse_address_list(values: list, what: str = "address") -> tuple[np.ndarray, np.ndarray]:
    """`parse_addresses` of Python strings. A few (a question's pair, a request's context) are
    parsed one by one (`packed_address`, the rule the column path applies to what its IPv4
    pattern leaves), with its messages: most of a one-pair prompt's cost was the Arrow arrays."""
    if len(values) >= SMALL or not all(isinstance(v, str) or v is None for v in values):
        import pyarrow as pa

        return parse_addresses(pa.array(values, pa.string()), what)
    nulls = sum(v is None for v in values)
    if nulls:
        raise MeasurementError(f"{what}: {nulls} null address(es)")
    parsed = [packed_address(v) for v in values]
    if any(p is None for p in parsed):
        raise _invalid(what, list(dict.fromkeys(v for v, p in zip(values, parsed) if p is None)))
    addr = np.frombuffer(b"".join(p[0] for p in parsed), np.uint8).reshape(-1, 16).copy()
    return addr, np.array([p[1] for p in parsed], bool)


def parse_addresses(column, what: str = "address") -> tuple[np.ndarray, np.ndarray]:
    """uint8[n, 16] and v6 flags for a string column; parses each distinct string once."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if pa.types.is_dictionary(column.type):
        dictionary, indices = column.dictionary, column.indices
    else:
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            try:
                column = column.cast(pa.string())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise MeasurementError(f"{what}: column of type {column.type} is not text") from None
        enc = pc.dictionary_encode(column)
        dictionary, indices = enc.dictionary, enc.indices
    if indices.null_count:
        raise MeasurementError(f"{what}: {indices.null_count} null address(es)")
    if not (pa.types.is_string(dictionary.type) or pa.types.is_large_string(dictionary.type)):
        dictionary = dictionary.cast(pa.string())
    ub, u6, ok = _parse_unique(dictionary)
    if not ok.all():
        raise _invalid(what, dictionary.filter(pa.array(~ok)).to_pylist())
    idx = indices.to_numpy(zero_copy_only=False)
    return ub[idx], u6[idx]


def _invalid(what: str, bad: list) -> MeasurementError:
    """The refusal of distinct invalid address strings, in order of first appearance."""
    shown = ", ".join(repr(b) for b in bad[:3]) + (" ..." if len(bad) > 3 else "")
    return MeasurementError(f"{what}: {len(bad)} invalid IP address(es): {shown}")


def address_texts(addr: np.ndarray, v6: np.ndarray) -> list[str]:
    """`format_addresses` as a list; a few formatted one by one (the Arrow arrays cost more)."""
    if len(addr) >= SMALL:
        return format_addresses(addr, v6).to_pylist()
    return [_address_text(a.tobytes(), bool(f)) for a, f in zip(np.asarray(addr, np.uint8), v6)]


@lru_cache(maxsize=1 << 16)
def _address_text(raw: bytes, v6: bool) -> str:
    return str(ipaddress.IPv6Address(raw)) if v6 else f"{raw[0]}.{raw[1]}.{raw[2]}.{raw[3]}"


def format_addresses(addr: np.ndarray, v6: np.ndarray):
    """Arrow string array of canonical address text; formats each distinct address once."""
    import pyarrow as pa

    n = len(addr)
    if n == 0:
        return pa.array([], pa.string())
    key = np.ascontiguousarray(np.concatenate([addr, v6[:, None].astype(np.uint8)], axis=1)).view("V17").ravel()
    uniq, inverse = np.unique(key, return_inverse=True)
    texts = [_address_text(raw[:16], bool(raw[16])) for raw in map(bytes, uniq)]
    indices = pa.array(inverse.ravel().astype(np.int32))
    return pa.DictionaryArray.from_arrays(indices, pa.array(texts, pa.string())).dictionary_decode()


# ---------------------------------------------------------------- other columns


def _float_column(col, name: str) -> np.ndarray:
    import pyarrow as pa

    if col.null_count:
        raise MeasurementError(f"{name}: {col.null_count} null value(s)")
    try:
        return col.cast(pa.float64()).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise MeasurementError(f"{name}: column of type {col.type} is not numeric") from None


def _int_column(col, name: str) -> np.ndarray:
    import pyarrow as pa

    if col.null_count:
        raise MeasurementError(f"{name}: {col.null_count} null value(s)")
    try:
        return col.cast(pa.int64()).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise MeasurementError(f"{name}: column of type {col.type} is not an integer column") from None


_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def event_seconds(col) -> tuple[np.ndarray, np.ndarray]:
    """An event_time column (timestamps of any unit, integer or float Unix seconds) as (int64
    Unix seconds, floored; 0 where null, valid mask); `MeasurementError` for other types and
    values beyond int64 seconds. The one conversion every reader of canonical tables uses."""
    import pyarrow as pa
    import pyarrow.compute as pc

    has = pc.is_valid(col).to_numpy(zero_copy_only=False)
    if pa.types.is_timestamp(col.type):
        raw = pc.fill_null(col.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
        return np.floor_divide(raw, _PER_SECOND[col.type.unit]), has
    if pa.types.is_integer(col.type):  # exact: a float64 detour loses seconds past 2**53
        try:
            return pc.fill_null(col.cast(pa.int64()), 0).to_numpy(zero_copy_only=False), has
        except pa.ArrowInvalid:
            raise MeasurementError("event_time: Unix seconds beyond the int64 range") from None
    if pa.types.is_floating(col.type):
        raw = pc.fill_null(col.cast(pa.float64()), 0).to_numpy(zero_copy_only=False)
        if np.any(np.abs(raw[has]) >= 2.0**63) or not np.all(np.isfinite(raw[has])):
            raise MeasurementError("event_time: Unix seconds that are not finite or beyond the int64 range")
        return np.floor(raw).astype(np.int64), has
    raise MeasurementError(f"event_time: column of type {col.type} is neither a timestamp nor Unix seconds")
