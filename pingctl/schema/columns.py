"""The canonical measurement table's column contract: names, types, reject reasons, the RTT rule.

Columns are exactly the seeds' eight (`SEED_COLUMNS`) plus optional nullable ones
(`OPTIONAL_COLUMNS`: `prb_id`, and since schema version 2 `ttl`, `dst_name` and `dup`).
Any Parquet file that has the eight seed columns is accepted as input, whatever version wrote
it: an optional column it lacks reads as null. `pingctl.schema.duck.canonical_query` turns it
into the canonical form and says why each bad row is bad (docs/data.md).
"""

from __future__ import annotations

import math

SEED_COLUMNS = (
    "msm_id",
    "event_time",
    "src_addr",
    "dst_addr",
    "ip_version",
    "rtt",
    "size",
    "packet_error_count",
)
OPTIONAL_COLUMNS = ("prb_id", "ttl", "dst_name", "dup")
COLUMNS = SEED_COLUMNS + OPTIONAL_COLUMNS
FAILED_RTT = -1.0
MAX_TTL = 255  # an IP header's TTL / hop limit is one byte

# Version 1: the seed columns and prb_id. Version 2 adds ttl, dst_name and dup. Every table
# pingctl writes records its version in the Parquet key-value metadata under SCHEMA_KEY; a file
# without it is version 1 (or a table from elsewhere) and reads as well as any.
SCHEMA_VERSION = 2
SCHEMA_KEY = "pingctl.schema_version"

# The largest valid RTT: the RTT codec's largest code (pingctl.tokenizer.rtt_codec.MAX_MS,
# 2047 * 2**31 us, about 50.9 days; kept equal by a test, not imported, so that importing
# this module does not import numpy). Far above any real ping; larger values are unit or
# generator bugs (1e308 ms) that would saturate the codec and wreck percentiles.
MAX_RTT_MS = 2047 * 2**31 / 1000.0

# A value that is present but does not fit its column (text that is not a number, a
# non-integral float in an integer column, a boolean, out of int64 range) gets its
# column's own reason, never `null_field`, so every reason names the column.
REJECT_REASONS = {
    "null_field": "a required column is null",
    "bad_src_addr": "src_addr is not an IP address",
    "bad_dst_addr": "dst_addr is not an IP address",
    "ipv4_mapped": "src_addr or dst_addr is an IPv4-mapped IPv6 address (::ffff:a.b.c.d): an IPv4 host, "
    "not an IPv6 path; the data records the IPv4 address itself, with ip_version 4",
    "bad_ip_version": "ip_version is not 4 or 6 (or not an integer)",
    "af_mismatch": "address family of src_addr/dst_addr differs from ip_version",
    "bad_rtt": f"rtt is not a number, not finite, above {MAX_RTT_MS:.3f} ms (the RTT codec's MAX_MS), "
    "or negative other than -1.0 (failed)",
    "bad_time": "event_time before 2000-01-01, in the future, or not a time",
    "bad_size": "size is negative or not an integer",
    "bad_error_count": "packet_error_count is negative or not an integer",
    "bad_msm_id": "msm_id is negative or not an integer",
    "bad_prb_id": "prb_id is present but negative or not an integer",
    "bad_ttl": f"ttl is present but not an integer from 0 to {MAX_TTL}",
    "bad_dup": "dup is present but not a boolean (true/false, 1/0)",
}


def arrow_schema():
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("msm_id", pa.int64(), nullable=False),
            pa.field("event_time", pa.timestamp("us", tz="UTC"), nullable=False),
            pa.field("src_addr", pa.string(), nullable=False),
            pa.field("dst_addr", pa.string(), nullable=False),
            pa.field("ip_version", pa.int64(), nullable=False),
            pa.field("rtt", pa.float64(), nullable=False),
            pa.field("size", pa.int64(), nullable=False),
            pa.field("packet_error_count", pa.int64(), nullable=False),
            pa.field("prb_id", pa.int64(), nullable=True),
            pa.field("ttl", pa.int64(), nullable=True),
            pa.field("dst_name", pa.string(), nullable=True),
            pa.field("dup", pa.bool_(), nullable=True),
        ],
        metadata={SCHEMA_KEY: str(SCHEMA_VERSION)},
    )


def check_rtt(value) -> bool:
    """The canonical table's rtt rule for one value (bad_rtt in `canonical_query` otherwise)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and ((0 <= value <= MAX_RTT_MS) or value == FAILED_RTT)
    )
