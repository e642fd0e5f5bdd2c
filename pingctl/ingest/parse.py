"""RIPE Atlas ping result -> canonical rows: the per-result rules of `pingctl ingest`.

One loop over results (a loop over results is inherent in JSON); per result the scalar
columns are appended once as a tuple and the packet RTTs to one flat list (a reply's own
TTL and duplicate flag, rare, beside it with the row they belong to), and Arrow arrays are
built once per batch (`pingctl.ingest.batch`).

Every record read ends up as exactly one of: written (>= 0 rows), summary-only,
filtered (by the first filter that excludes it) or rejected (with a reason), so
`records == results_written + summary_only + filtered + rejected` always holds.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, field
from typing import Callable, Iterable

from pingctl.errors import ConfigError
from pingctl.ingest.batch import address_lookup, Batch, NONE
from pingctl.ingest.counts import new_counts, reconcile, Rejects  # noqa: F401 - reconcile: callers' entry point
from pingctl.ingest.reader import NO_EOL
from pingctl.schema.addresses import ipv4_mapped
from pingctl.schema.columns import MAX_RTT_MS, MAX_TTL
from pingctl.schema.times import max_time, MIN_TIME, parse_when, TS_ABS_MAX_S

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
US = dt.timedelta(microseconds=1)

REJECT_REASONS = {
    "bad_json": "not valid JSON (or broken JSON-array structure: rest of file skipped)",
    "truncated": "file ends early or its compressed stream is corrupt: rest of file skipped",
    "too_large": "a line/element over 64 MiB (not a result)",
    "not_an_object": "JSON value is not an object",
    "not_ping": "`type` is present and is not \"ping\"",
    "bad_msm_id": "`msm_id` missing or not a non-negative 64-bit integer",
    "bad_prb_id": "`prb_id` present but not a non-negative 64-bit integer",
    "bad_time": "`timestamp` missing, not a number, or before 2000-01-01 / in the future",
    "no_dst_addr": "no `dst_addr`/`addr`, and `dst_name`/`name` is not an IP address (e.g. DNS failure)",
    "bad_dst_addr": "`dst_addr`/`addr` is not an IP address",
    "bad_af": "`af` (old firmware: `pf`, `mode`) is not 4 or 6",
    "af_mismatch": "source or destination address family differs from `af`",
    "no_src_addr": "the chosen source field(s) are missing or empty",
    "bad_src_addr": "the chosen source address is not an IP address",
    "ipv4_mapped": "the destination or chosen source is an IPv4-mapped IPv6 address (::ffff:a.b.c.d): an IPv4 host, "
    "not an IPv6 path",
    "no_result": "no per-packet `result` list (absent without an avg/min/max summary, or not a list)",
    "bad_packet": "`result` contains an entry that is not an object",
    "bad_rtt": "an `rtt` is not a number from 0 to the RTT code's largest value (4.4e9 ms, 50.9 days)",
    "bad_size": "`size` present but not a non-negative 64-bit integer",
    "bad_ttl": f"a `ttl` (the result's, or a reply's) present but not an integer from 0 to {MAX_TTL}",
}
I64 = (1 << 63) - 1


@dataclass(frozen=True)
class Options:
    """Plain, picklable per-run settings (resolved once in the parent process)."""

    src_field: str = "auto"
    af: int = 0
    msm_ids: frozenset = frozenset()
    probe_ids: frozenset = frozenset()
    since_us: int | None = None
    until_us: int | None = None
    sample: float = 1.0
    drop_dups: bool = False
    row_group_rows: int = 262_144
    tmin_us: int = 946_684_800_000_000  # schema.MIN_TIME
    tmax_us: int = field(default_factory=lambda: _max_time_us())

    @classmethod
    def from_config(cls, cfg) -> "Options":
        since = parse_when(cfg.since, "since")
        until = parse_when(cfg.until, "until")
        if since is not None and until is not None and since >= until:
            raise ConfigError(f"since ({cfg.since}) must be before until ({cfg.until})")  # the model checks too
        return cls(
            src_field=cfg.src_field,
            af=int(cfg.af),
            msm_ids=frozenset(cfg.msm_ids),
            probe_ids=frozenset(cfg.probe_ids),
            since_us=since,
            until_us=until,
            sample=float(cfg.sample),
            drop_dups=bool(cfg.drop_dups),
            row_group_rows=int(cfg.row_group_rows),
            tmin_us=(MIN_TIME - EPOCH) // US,
            tmax_us=_max_time_us(),
        )


def _max_time_us() -> int:
    return (max_time() - EPOCH) // US


def sample_keep(msm: int, prb: int | None, ts_us: int, threshold: int) -> bool:
    """Deterministic sampling: blake2b-64 of "msm/prb/timestamp_us" below fraction * 2^64."""
    key = b"%d/%s/%d" % (msm, b"-" if prb is None else b"%d" % prb, ts_us)
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") < threshold


def _mapped(field: str, text: str, v4: str) -> str:
    """The detail of an `ipv4_mapped` reject: the field, as written, and the IPv4 host it names."""
    return f"{field} {text} is the IPv4 address {v4} in IPv6 notation"


def _packet_prefix_counts(res: list, drop_dups: bool) -> tuple[int, int, int, int]:
    """(dups, dups dropped, late, other) among the valid entries before the first bad one:
    what the main loop counted for a result it then rejected, so it can be taken back."""
    dup = late = other = 0
    for e in res:
        if type(e) is not dict:
            break
        r = e.get("rtt")
        if r is not None:
            if type(r) not in (int, float) or not (0 <= r <= MAX_RTT_MS):
                break
            if len(e) > 1:
                if not _ttl_ok(e.get("ttl")):
                    break
                if "late" in e:
                    late += 1
                if e.get("dup"):
                    dup += 1
        elif "error" in e or "x" in e:
            pass
        elif "rtt" in e:
            break
        else:
            other += 1
            if "late" in e:
                late += 1
    return dup, dup if drop_dups else 0, late, other


def _ttl_ok(ttl) -> bool:
    """A `ttl` the table takes: absent (None) or an integer in an IP header's range."""
    return ttl is None or (type(ttl) is int and 0 <= ttl <= MAX_TTL)


class BadTtl(ValueError):
    """A reply's `ttl` is not one `_ttl_ok` takes: its result is rejected as bad_ttl."""


_FAST = None  # (decode, UNSET) once built; False when msgspec is missing


def fast_decoder():
    """`(decode, UNSET)`: msgspec decoding of the usual shape of a ping result, or None.

    The struct types exactly the fields the rules read, with the checks that need no
    options done by msgspec in C (ids and size in 0 .. 2^63-1, `af` 4 or 6, `type` "ping"
    or absent, every `rtt` a number >= 0, `result` a list of objects). Anything else
    raises, and the record goes to the generic path (orjson + the rules), which decides
    its reject reason, so reasons and counts do not depend on which path ran. Fields the
    struct does not name are skipped unconverted (see `parse_records` for what that means).
    """
    global _FAST
    if _FAST is None:
        try:
            import msgspec
        except ImportError:  # optional speed-up: the generic path does everything alone
            _FAST = False
            return None
        from typing import Annotated, Literal

        unset, Unset, Meta = msgspec.UNSET, msgspec.UnsetType, msgspec.Meta
        Id = Annotated[int, Meta(ge=0, le=I64)]
        Ttl = Annotated[int, Meta(ge=0, le=MAX_TTL)]
        # any JSON scalar (numbers as float: out-of-range numbers raise, as in orjson);
        # used where only presence or truthiness matters
        Scalar = float | str | bool | None

        # (defstruct: this module's `from __future__ import annotations` would leave
        # class-body annotations as strings naming locals)
        Packet = msgspec.defstruct(
            "Packet",
            [
                ("rtt", Annotated[float, Meta(ge=0, le=MAX_RTT_MS)] | Unset, unset),
                ("x", Scalar | Unset, unset),
                ("error", Scalar | Unset, unset),
                ("late", Scalar | Unset, unset),
                ("dup", Scalar | Unset, unset),
                ("ttl", Ttl | Unset, unset),
            ],
            gc=False,
        )
        Result = msgspec.defstruct(
            "Result",
            [
                ("msm_id", Id),
                ("timestamp", int | float),
                ("af", Literal[4, 6]),
                ("result", list[Packet]),
                ("type", Literal["ping"] | None, None),
                ("prb_id", Id | None, None),
                ("dst_addr", str, ""),
                ("src_addr", str, ""),
                ("srcaddr", str, ""),
                ("from_", str, ""),
                ("size", Id | None, 0),
                ("ttl", Ttl, NONE),  # a null one fails here: the generic path reads it as absent
                ("dst_name", str, ""),
            ],
            rename={"from_": "from"},
            gc=False,
        )
        _FAST = (msgspec.json.Decoder(Result).decode, unset)
    return _FAST or None


def _default_flush(batch: "Batch"):
    return lambda: batch.take_table()


def parse_records(
    blocks: Iterable[tuple],
    opts: Options,
    batch: Batch,
    rejects: Rejects,
    flush: Callable[[], None] | None = None,
    fast: bool = True,
) -> dict:
    """Run the per-result rules over `(line0, raws, bad)` blocks; rows go to `batch`.

    `flush()` must empty the batch (`batch.take_table()`) and is called whenever it holds
    >= row_group_rows rows, and once at the end. Returns the counts.

    Two paths give the same rows, counts and rejects:
      * fast (`fast=True` and msgspec importable): an ASCII line is decoded into the typed
        struct of `fast_decoder()` and, if it is written or filtered, handled with
        attribute reads and no dict. A line that does not decode into the struct, or that
        would be rejected, goes to the generic path instead, before any count is touched.
        Fields the struct does not name are skipped unconverted, so unlike orjson the fast
        path does not refuse a number beyond the float range (`1e999`) or nesting deeper
        than 1024 levels *in a field pingctl does not read*: such a line is ingested, not
        rejected as `bad_json` (non-ASCII lines always take the generic path, so invalid
        UTF-8 is still `bad_json`);
      * generic: `orjson.loads` and the rules on the dict; decides every reject reason.
    When most lines of a block miss the fast path (old firmware, other layouts) it is
    switched off for the next few blocks, so such files cost no more than before.
    """

    import orjson

    if flush is None:
        flush = _default_flush(batch)
    k = _Run(opts, batch, rejects, orjson.dumps)
    loads, JSONDecodeError = orjson.loads, orjson.JSONDecodeError
    fast_decode, UNSET = (fast_decoder() if fast else None) or (None, None)
    fast_off = 0  # blocks left with the fast path switched off
    records = 0
    for line0, raws, bad in blocks:
        if bad is not None and bad is not NO_EOL:
            records += 1
            k.reject(bad[0], line0, raws[0], detail=bad[1])
            continue
        use_fast = fast_decode is not None and not fast_off
        if fast_off:
            fast_off -= 1
        misses = 0
        for j, raw in enumerate(raws):
            if not raw:
                continue  # blank line
            if use_fast:
                try:
                    r = fast_decode(raw) if raw.isascii() else None
                except Exception:  # noqa: BLE001 - any shape or JSON error: generic path
                    r = None
                if r is not None and _fast_result(k, r, UNSET):
                    records += 1
                    continue
                misses += 1
            try:
                obj = loads(raw)
            except JSONDecodeError as e:
                if raw.strip():
                    records += 1
                    k.reject("truncated" if bad is NO_EOL else "bad_json", line0 + j, raw, detail=str(e))
                continue
            if type(obj) is dict:
                records += 1
                _generic_result(k, obj, line0 + j, raw)
            elif type(obj) is list:  # a JSON array on one line (e.g. an API page)
                for d in obj:
                    records += 1
                    _generic_result(k, d, line0 + j, None)
            else:
                records += 1
                k.reject("not_an_object", line0 + j, raw)
        if use_fast and misses * 2 > len(raws) >= 64:
            fast_off = 8  # mostly misses: leave this file to the generic path for a while
        if len(k.rtts) >= k.rgr:
            flush()
            k.bind(batch)
    flush()
    k.records = records
    return k.counts_from(batch.stats)


class _Run:
    """One `parse_records` call: the resolved options, the address cache, where rows go and the
    counters, shared by the two paths (attributes, read once per result)."""

    __slots__ = ("acache", "lookup", "aget", "c", "filtered", "rejected", "reject_add", "dumps", "msm_set", "prb_set",
                 "tmin", "tmax", "lo_ok", "hi_ok", "sampling", "threshold", "af_keep", "drop_dups", "src_mode",
                 "auto_src", "rgr", "records", "summary", "dup", "dup_drop", "late", "other", "src_from",
                 "src_private", "results_append", "rtts", "rtt_append", "ttl_at", "dup_at", "dst_name_id",
                 "dst_name_get")

    def __init__(self, opts: Options, batch: Batch, rejects: Rejects, dumps):
        self.acache, self.lookup = address_lookup(batch.addresses)
        self.dst_name_id, self.dst_name_get = batch.dst_names.id, batch.dst_names.ids.get
        self.aget = self.acache.get
        self.c = new_counts()
        self.filtered, self.rejected = self.c["filtered"], self.c["rejected"]
        self.reject_add, self.dumps = rejects.add, dumps
        self.msm_set, self.prb_set = opts.msm_ids, opts.probe_ids
        self.tmin, self.tmax = opts.tmin_us, opts.tmax_us
        since = opts.since_us if opts.since_us is not None else -(1 << 62)
        until = opts.until_us if opts.until_us is not None else 1 << 62
        self.lo_ok = max(self.tmin, since)  # lo_ok <= ts < hi_ok: valid and inside --since/--until
        self.hi_ok = min(self.tmax + 1, until)
        self.sampling = opts.sample < 1.0
        self.threshold = int(opts.sample * (1 << 64))
        self.af_keep, self.drop_dups, self.src_mode = opts.af, opts.drop_dups, opts.src_field
        self.auto_src = self.src_mode == "auto"
        self.rgr = opts.row_group_rows
        self.records = self.summary = self.dup = self.dup_drop = self.late = self.other = 0
        self.src_from = self.src_private = 0
        self.bind(batch)

    def bind(self, batch: Batch) -> None:
        """Rows go to the batch's (new, after a flush) lists."""
        self.results_append = batch.results.append
        self.rtts = batch.rtts
        self.rtt_append = self.rtts.append
        self.ttl_at, self.dup_at = batch.ttl_at, batch.dup_at

    def reject(self, reason, line, raw, d=None, detail=None) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        if raw is None:
            try:
                raw = self.dumps(d)
            except Exception:  # noqa: BLE001 - raw is best effort
                raw = repr(d)
        self.reject_add(reason, line, raw, detail)

    def counts_from(self, st: dict) -> dict:
        kept_dups = self.dup - self.dup_drop
        self.c.update(
            records=self.records,
            results_written=st["results_written"],
            empty_results=st["empty_results"],
            summary_only=self.summary,
            rows=st["rows"],
            rows_v4=st["rows_v4"],
            rows_v6=st["rows"] - st["rows_v4"],
            replies=st["rows"] - st["failed_rows"] - kept_dups,
            dups=self.dup,
            dups_dropped=self.dup_drop,
            timeouts=st["failed_rows"] - st["errors"] - self.other,
            errors=st["errors"],
            late=self.late,
            other_packets=self.other,
            src_from=self.src_from,
            src_private=self.src_private,
            first_us=st["first_us"],
            last_us=st["last_us"],
        )
        return self.c


# ---------------------------------------------------------------- the fast path


def _fast_result(k: _Run, r, UNSET) -> bool:
    """The rules on msgspec's typed struct `r`: True when the result is written or filtered
    (counted, but for the record itself: the caller's); False when it would be rejected
    (nothing counted: the generic path decides)."""
    msm = r.msm_id
    if k.msm_set and msm not in k.msm_set:
        k.filtered["msm"] += 1
        return True
    prb = r.prb_id
    if k.prb_set and prb not in k.prb_set:
        k.filtered["probe"] += 1
        return True
    ts = r.timestamp
    ts_us = (ts * 1_000_000 if type(ts) is int
             else round(ts * 1_000_000) if -TS_ABS_MAX_S < ts < TS_ABS_MAX_S
             else -1)  # out of range: the generic path rejects it
    if not (k.lo_ok <= ts_us < k.hi_ok):
        if k.tmin <= ts_us <= k.tmax:
            k.filtered["time"] += 1
            return True
        return False
    if k.sampling and not sample_keep(msm, prb, ts_us, k.threshold):
        k.filtered["sample"] += 1
        return True
    dst = r.dst_addr
    dinfo = k.aget(dst)
    if dinfo is None and dst:
        dinfo = k.lookup(dst)
    if dinfo is None:
        return False
    af = r.af
    if k.af_keep and af != k.af_keep:
        k.filtered["af"] += 1
        return True
    if dinfo[1] != af:
        return False
    sinfo = k.aget(r.src_addr) if k.auto_src else None
    if sinfo is not None and sinfo[3] == af:  # the common case: a public src_addr seen before
        src, add_from, add_priv = sinfo[4], 0, 0
    else:
        src, add_from, add_priv = _fast_source(k, r, af)
        if src is None:
            return False
    # written: nothing below can reject (msgspec checked size and every packet)
    size = r.size
    rtts, rtt_append = k.rtts, k.rtt_append
    n0 = len(rtts)
    err = 0
    for e in r.result:
        rt = e.rtt
        if rt is not UNSET:
            if e.late is not UNSET:
                k.late += 1
            if e.dup:
                k.dup += 1
                if k.drop_dups:
                    k.dup_drop += 1
                    continue
                k.dup_at.append(len(rtts))
            if e.ttl is not UNSET:
                k.ttl_at.append((len(rtts), e.ttl))
            rtt_append(rt)
        elif e.error is not UNSET:
            err += 1
            rtt_append(-1.0)
        elif e.x is not UNSET:
            rtt_append(-1.0)
        else:
            k.other += 1
            if e.late is not UNSET:
                k.late += 1
            rtt_append(-1.0)
    name_id = k.dst_name_get(r.dst_name)  # the dict's own get: a Python call per result costs more
    if name_id is None:
        name_id = k.dst_name_id(r.dst_name)
    k.results_append((msm, ts_us, src, dinfo[4], af, 0 if size is None else size, err, prb, len(rtts) - n0, r.ttl,
                      name_id))
    if add_from:
        k.src_from += 1
    if add_priv:
        k.src_private += 1
    return True


def _fast_source(k: _Run, r, af: int) -> tuple[str | None, int, int]:
    """(source, taken from `from`, private) of struct `r`; None when the generic path must decide."""
    aget, lookup = k.aget, k.lookup
    if not k.auto_src:
        s = r.from_ if k.src_mode == "from" else (r.src_addr or r.srcaddr)
        sinfo = lookup(s)
        if sinfo is not None and sinfo[1] == af:
            return sinfo[4], 0, 0 if sinfo[2] else 1
        return None, 0, 0
    s = r.src_addr
    sinfo = aget(s)
    if sinfo is not None and sinfo[3] == af:
        return sinfo[4], 0, 0
    if sinfo is None:
        if not s:
            s = r.srcaddr
        sinfo = lookup(s)
    f = r.from_
    finfo = aget(f)
    if finfo is None:
        finfo = lookup(f)
    if sinfo is not None and sinfo[3] == af:
        return sinfo[4], 0, 0
    if finfo is not None and finfo[3] == af:
        return finfo[4], 1, 0
    if sinfo is not None and sinfo[1] == af:
        return sinfo[4], 0, 1
    if finfo is not None and finfo[1] == af:
        return finfo[4], 1, 1
    return None, 0, 0


# ---------------------------------------------------------------- the generic path


def _generic_result(k: _Run, d, line: int, raw) -> None:
    """The rules on one decoded result `d` (counted by the caller): written, summary-only,
    filtered or rejected with its reason. `raw`: the line, when `d` is all of it."""
    if type(d) is not dict:
        return k.reject("not_an_object", line, raw, d)
    t = d.get("type")
    if t != "ping" and t is not None:
        return k.reject("not_ping", line, raw, d)
    msm = d.get("msm_id")
    if type(msm) is not int or not (0 <= msm <= I64):
        return k.reject("bad_msm_id", line, raw, d)
    if k.msm_set and msm not in k.msm_set:
        k.filtered["msm"] += 1
        return None
    prb = d.get("prb_id")
    if (type(prb) is not int or not (0 <= prb <= I64)) and prb is not None:
        return k.reject("bad_prb_id", line, raw, d)
    if k.prb_set and prb not in k.prb_set:
        k.filtered["probe"] += 1
        return None
    ts = d.get("timestamp")
    if type(ts) is int:
        ts_us = ts * 1_000_000
    elif type(ts) is float and -TS_ABS_MAX_S < ts < TS_ABS_MAX_S:
        ts_us = round(ts * 1_000_000)
    else:
        return k.reject("bad_time", line, raw, d)
    if not (k.lo_ok <= ts_us < k.hi_ok):
        if not (k.tmin <= ts_us <= k.tmax):
            return k.reject("bad_time", line, raw, d)
        k.filtered["time"] += 1
        return None
    if k.sampling and not sample_keep(msm, prb, ts_us, k.threshold):
        k.filtered["sample"] += 1
        return None
    dinfo = _destination(k, d, line, raw)
    if dinfo is None:
        return None
    # address family: af (>= 4460) / pf (4400) / mode ICMP4|ICMP6 / destination
    af = d.get("af")
    if af is None:
        af = d.get("pf")
        if af is None:
            mode = d.get("mode")
            af = 4 if mode == "ICMP4" else 6 if mode == "ICMP6" else dinfo[1]
    if type(af) is not int or (af != 4 and af != 6):
        return k.reject("bad_af", line, raw, d)
    if k.af_keep and af != k.af_keep:
        k.filtered["af"] += 1
        return None
    if dinfo[1] != af:
        return k.reject("af_mismatch", line, raw, d, "dst_addr")
    res = d.get("result")
    if type(res) is not list:
        # summary-only firmware has no `result` key at all; a `result` that is
        # there but not a list ("abc", {}, null) is damage, not an old format
        if "result" not in d and ("avg" in d or "min" in d or "max" in d):
            k.summary += 1  # oldest firmware: summary only, no per-packet list
            return None
        return k.reject("no_result", line, raw, d)
    src = _auto_source(k, d, af, line, raw) if k.auto_src else _chosen_source(k, d, af, line, raw)
    if src is None:
        return None
    size = d.get("size", 0)
    if type(size) is not int or not (0 <= size <= I64):
        if size is not None:
            return k.reject("bad_size", line, raw, d)
        size = 0
    ttl = d.get("ttl")
    if not _ttl_ok(ttl):
        return k.reject("bad_ttl", line, raw, d, "ttl")
    name = d.get("dst_name")
    if not (type(name) is str and name) and not d.get("dst_addr"):
        name = d.get("name")  # the old firmware's addr/name layout (as in `_destination`)
    name_id = k.dst_name_id(name)
    _packets(k, d, res, line, raw, (msm, ts_us, src, dinfo[4], af, size, NONE if ttl is None else ttl, name_id))
    return None


def _destination(k: _Run, d: dict, line: int, raw):
    """The destination's address info: dst_addr (fw >= 4460) / addr (older); else an IP-literal
    name. None when rejected."""
    dst = d.get("dst_addr")
    try:
        dinfo = k.aget(dst)
    except TypeError:  # unhashable junk
        dinfo = None
    if dinfo is not None:
        return dinfo
    if dst is None or dst == "":
        dst = d.get("addr")
    if dst is None or dst == "":
        name = d.get("dst_name")
        if name is None or name == "":
            name = d.get("name")
        field_, text, missing = "dst_name", name, "no_dst_addr"
    else:
        field_, text, missing = "dst_addr", dst, "bad_dst_addr"
    dinfo = k.lookup(text)
    if dinfo is None:
        _not_an_address(k, missing, field_, text, line, raw, d)
    return dinfo


def _not_an_address(k: _Run, why: str, field_: str, text, line: int, raw, d: dict, detail: str | None = None) -> None:
    """Reject `d` for its `field_` (`text`), which is no address pingctl takes: an IPv4-mapped
    IPv6 one is named as such, anything else is `why`."""
    v4 = ipv4_mapped(text)
    if v4 is not None:
        k.reject("ipv4_mapped", line, raw, d, _mapped(field_, text, v4))
    else:
        k.reject(why, line, raw, d, detail)


def _auto_source(k: _Run, d: dict, af: int, line: int, raw) -> str | None:
    """`--src-field auto`: a public src_addr, else a public `from`, else a private src_addr, else
    `from`; None when rejected."""
    aget, lookup = k.aget, k.lookup
    s = d.get("src_addr")
    try:
        sinfo = aget(s)
    except TypeError:
        sinfo = None
    if sinfo is not None and sinfo[3] == af:
        return sinfo[4]
    if sinfo is None:  # missing, old name, not cached yet, or junk
        if s is None or s == "":
            s = d.get("srcaddr")
        sinfo = lookup(s)
    f = d.get("from")
    try:
        finfo = aget(f)
    except TypeError:
        finfo = None
    if finfo is None:
        finfo = lookup(f)
    if sinfo is not None and sinfo[3] == af:
        return sinfo[4]
    if finfo is not None and finfo[3] == af:
        k.src_from += 1
        return finfo[4]
    if sinfo is not None and sinfo[1] == af:
        k.src_private += 1
        return sinfo[4]
    if finfo is not None and finfo[1] == af:
        k.src_from += 1
        k.src_private += 1
        return finfo[4]
    detail = "src_addr/from"
    if (s is None or s == "") and (f is None or f == ""):
        why = "no_src_addr"
    elif sinfo is not None or finfo is not None:
        why = "af_mismatch"
    elif ipv4_mapped(s) or ipv4_mapped(f):
        why = "ipv4_mapped"
        detail = _mapped("src_addr", s, ipv4_mapped(s)) if ipv4_mapped(s) else _mapped("from", f, ipv4_mapped(f))
    else:
        why = "bad_src_addr"
    k.reject(why, line, raw, d, detail)
    return None


def _chosen_source(k: _Run, d: dict, af: int, line: int, raw) -> str | None:
    """`--src-field from|src_addr`: that field only; None when rejected."""
    src_mode = k.src_mode
    if src_mode == "from":
        s = d.get("from")
    else:
        s = d.get("src_addr")
        if s is None or s == "":
            s = d.get("srcaddr")
    if s is None or s == "":
        k.reject("no_src_addr", line, raw, d, src_mode)
        return None
    sinfo = k.lookup(s)
    if sinfo is None:
        _not_an_address(k, "bad_src_addr", src_mode, s, line, raw, d, src_mode)
        return None
    if sinfo[1] != af:
        k.reject("af_mismatch", line, raw, d, src_mode)
        return None
    if not sinfo[2]:
        k.src_private += 1
    return sinfo[4]


def _packets(k: _Run, d: dict, res: list, line: int, raw, head: tuple) -> None:
    """The packets of a result whose other fields passed: its RTTs appended and the result
    written (`head`: msm, time, source, destination, af, size, ttl, dst_name id), or rejected
    whole (bad_packet, bad_rtt, bad_ttl) with the rare-kind counts of the packets before the
    bad one taken back. Replies/timeouts/errors are read off the RTT column per batch; only the
    rare kinds (dup, late, other) are counted here."""
    rtts, rtt_append, drop_dups = k.rtts, k.rtt_append, k.drop_dups
    n0 = len(rtts)
    err = 0
    try:
        for e in res:
            r = e.get("rtt")  # AttributeError: not an object
            if r is not None:
                tr = type(r)
                if tr is float:
                    if not (0.0 <= r <= MAX_RTT_MS):  # also NaN and inf
                        raise ValueError
                elif tr is int:
                    if not (0 <= r <= MAX_RTT_MS):
                        raise ValueError
                    r = float(r)
                else:
                    raise ValueError
                if len(e) > 1:
                    t = e.get("ttl")
                    if not _ttl_ok(t):
                        raise BadTtl
                    if "late" in e:
                        k.late += 1
                    if e.get("dup"):
                        k.dup += 1
                        if drop_dups:
                            k.dup_drop += 1
                            continue
                        k.dup_at.append(len(rtts))
                    if t is not None:
                        k.ttl_at.append((len(rtts), t))
                rtt_append(r)
            elif "error" in e:
                err += 1
                rtt_append(-1.0)
            elif "x" in e:
                rtt_append(-1.0)
            elif "rtt" in e:  # "rtt": null
                raise ValueError
            else:  # e.g. {"late": n} without rtt, or {}: no usable RTT
                k.other += 1
                if "late" in e:
                    k.late += 1
                rtt_append(-1.0)
    except (AttributeError, ValueError) as ex:
        del rtts[n0:]
        _forget_from(k, n0)
        dup, dup_drop, late, other = _packet_prefix_counts(res, drop_dups)
        k.dup -= dup
        k.dup_drop -= dup_drop
        k.late -= late
        k.other -= other
        why = "bad_packet" if isinstance(ex, AttributeError) else "bad_ttl" if isinstance(ex, BadTtl) else "bad_rtt"
        k.reject(why, line, raw, d)
        return
    msm, ts_us, src, dst, af, size, ttl, name_id = head
    k.results_append((msm, ts_us, src, dst, af, size, err, d.get("prb_id"), len(rtts) - n0, ttl, name_id))


def _forget_from(k: _Run, n0: int) -> None:
    """Drop the TTLs and duplicate flags noted for rows from `n0` on (a result rejected midway)."""
    while k.ttl_at and k.ttl_at[-1][0] >= n0:
        k.ttl_at.pop()
    while k.dup_at and k.dup_at[-1] >= n0:
        k.dup_at.pop()
