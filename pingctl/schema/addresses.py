"""IP addresses: the one parser (text -> canonical text, family, 16 bytes) used by the
canonical table's checks, the tokenizer and every question a user types."""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from typing import Iterable

@lru_cache(maxsize=1 << 20)
def parse_address(text: str) -> tuple[str, int] | None:
    """(canonical text, version) or None. Canonical = `ipaddress`'s compressed lower-case form.

    Not addresses here: zone ids (fe80::1%eth0) and IPv4-mapped IPv6 addresses (`ipv4_mapped`):
    ::ffff:34.159.150.238 (also written ::ffff:229f:96ee) is an IPv4 host in IPv6 notation, and
    a path to it is an IPv4 path; taken as IPv6 it would be a question the data cannot answer,
    and rewritten as IPv4 it would change a row's ip_version silently. Every reader of
    addresses (ingest, the canonical table's check, the tokenizer, `sample`) refuses them."""
    if not isinstance(text, str) or not text or len(text) > 45:
        return None
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if getattr(ip, "scope_id", None) is not None:
        return None  # fe80::1%eth0: a zone names an interface of one host, not an address
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return None  # ::ffff:a.b.c.d: see ipv4_mapped
    return str(ip), ip.version


def ipv4_mapped(text) -> str | None:
    """The IPv4 address an IPv4-mapped IPv6 address (::ffff:0:0/96, any spelling) stands for,
    else None (also for what is not text): why `parse_address` refused it, for a reject to name."""
    if type(text) is not str or ":" not in text or len(text) > 45:
        return None
    return _ipv4_mapped(text)


@lru_cache(maxsize=1 << 16)
def _ipv4_mapped(text: str) -> str | None:
    try:
        ip = ipaddress.IPv6Address(text)
    except ValueError:
        return None
    return str(ip.ipv4_mapped) if ip.ipv4_mapped is not None and ip.scope_id is None else None


@lru_cache(maxsize=1 << 16)
def is_public(text: str) -> bool:
    """False for private, link-local, loopback, unspecified, ULA, CGN, documentation ... ranges."""
    try:
        return ipaddress.ip_address(text).is_global
    except ValueError:
        return False


def address_map(values: Iterable[str | None]):
    """Arrow table (addr, canon, version, mapped) for distinct address strings; invalid -> null
    canon and version, `mapped` true where the invalid one is IPv4-mapped (its own reject reason)."""
    import pyarrow as pa

    addrs, canons, versions, mapped = [], [], [], []
    for v in values:
        if v is None:
            continue
        parsed = parse_address(v)
        addrs.append(v)
        canons.append(parsed[0] if parsed else None)
        versions.append(parsed[1] if parsed else None)
        mapped.append(parsed is None and ipv4_mapped(v) is not None)
    return pa.table(
        {
            "addr": pa.array(addrs, pa.string()),
            "canon": pa.array(canons, pa.string()),
            "version": pa.array(versions, pa.int64()),
            "mapped": pa.array(mapped, pa.bool_()),
        }
    )


# Dotted quad with each part 0..255 and no leading zeros: exactly what `parse_address` accepts
# of IPv4, so a vectorised match over a column agrees with it string for string.
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4_RE = rf"^{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}$"


@lru_cache(maxsize=1 << 18)
def packed_address(text: str) -> tuple[bytes, bool] | None:
    """(16 bytes, is IPv6) or None, by `parse_address`'s rules: an IPv4 address fills the
    first 4 bytes, zero-padded."""
    parsed = parse_address(text)
    if parsed is None:
        return None
    return ipaddress.ip_address(parsed[0]).packed.ljust(16, b"\0"), parsed[1] == 6
