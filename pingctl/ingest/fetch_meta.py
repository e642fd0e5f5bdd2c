"""What `pingctl fetch` asks the RIPE Atlas API before the results: each measurement's
description (its type, address family and life: /api/v2/measurements/ID/), the probes a filter
selects (/api/v2/probes/?asn_v4=...), and the times and probe ids users give as ripe-atlas-tools
users do ("now", "7 days ago", `--probe 6090,33194`, a file of ids, `-`)."""

from __future__ import annotations

import ipaddress
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, TextIO
from urllib.parse import parse_qsl, urlsplit

from pingctl.errors import UsageError
from pingctl.ingest.fetch_http import Api, FetchError, get_json, refusal, utc
from pingctl.schema.times import parse_duration, parse_when

MEASUREMENT_PATH = "/api/v2/measurements/{}/"
PROBES_PATH = "/api/v2/probes/"
PROBES_PAGE = 500  # the most the API gives in one page
# pages of probes followed for one filter: the whole network is about 60,000 probes (120 pages)
MAX_PROBE_PAGES = 400
_AGO = re.compile(r"(.+?)\s+ago")
_IDS = re.compile(r"[0-9]+(\s*,\s*[0-9]+)*\s*,?")  # ripe-atlas-tools' comma list ("6090,33194")


# -- times ----------------------------------------------------------------------------------------


def parse_time(text: str, option: str, now: int) -> int:
    """A time option -> Unix seconds: `now`, a time before now ("7 days ago", "2h ago"), ISO 8601
    (naive = UTC) or Unix seconds."""
    t = text.strip().lower()
    if not t:
        raise UsageError(f"{option} is empty: give ISO 8601, Unix seconds, now or a time ago such as '7 days ago'")
    if t == "now":
        return now
    ago = _AGO.fullmatch(t)
    if ago:
        when = now - parse_duration(ago[1], option, UsageError, bare_seconds=True)
        if when < 0:
            raise UsageError(f"{option} {text!r}: before 1970")
        return when
    try:
        return parse_when(text, option, UsageError) // 1_000_000
    except UsageError as e:
        raise UsageError(f"{e}; or now, or a time ago such as '7 days ago'") from None


# -- the measurement --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """The fields of /api/v2/measurements/ID/ fetch reads."""

    id: int
    type: str
    af: int
    start: int  # start_time, Unix seconds
    stop: int | None  # stop_time; None while it runs
    status: str

    def life(self) -> str:
        f = "%Y-%m-%d %H:%M UTC"
        end = utc(self.stop).strftime(f) if self.stop is not None else f"now ({self.status or 'ongoing'})"
        return f"{utc(self.start).strftime(f)} to {end}"

    def span(self, start: int | None, stop: int | None, now: int) -> tuple[int, int]:
        """The times to fetch: [start, stop), each defaulting to the measurement's own, within
        its life and never past now (a window planned past now would be recorded as done,
        empty). Empty (start >= stop) when the window lies outside its life."""
        end = now if self.stop is None else min(self.stop + 1, now)  # stop_time is inclusive
        return (self.start if start is None else max(start, self.start)), (end if stop is None else min(stop, end))

    def record(self) -> dict:
        return {"type": self.type, "af": self.af, "start": utc(self.start),
                "stop": None if self.stop is None else utc(self.stop), "status": self.status}


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def measurement_info(api: Api, msm_id: int, sleep: Callable[[float], None] = time.sleep,
                     on_retry: Callable[[str], None] | None = None) -> Measurement:
    """Measurement `msm_id`'s description; FetchError naming what is wrong (404, 403, an answer
    that is not a measurement's)."""
    where = f"measurement {msm_id}, its description"
    doc = get_json(api, MEASUREMENT_PATH.format(msm_id), {}, where, "a measurement",
                   lambda status, detail: refusal(msm_id, status, detail, api), sleep, on_retry)
    status = doc.get("status")
    name = status.get("name") if isinstance(status, dict) else None
    fields = {"id": doc.get("id"), "type": doc.get("type"), "af": doc.get("af"), "start": doc.get("start_time"),
              "stop": doc.get("stop_time"), "status": name if isinstance(name, str) else ""}
    wrong = ("id" if fields["id"] != msm_id else
             "type" if not isinstance(fields["type"], str) else
             "af" if fields["af"] not in (4, 6) else
             "start_time" if not _whole(fields["start"]) else
             "stop_time" if not (fields["stop"] is None or _whole(fields["stop"])) else None)
    if wrong:
        raise FetchError(f"{where} from {api.base}: its {wrong} is not what the RIPE Atlas API sends "
                         "(id, type, af 4 or 6, start_time and stop_time in Unix seconds)")
    return Measurement(**fields)


# -- probes -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeFilters:
    """Probes by what the API knows of them: the AS announcing their address in the
    measurement's family (any of `asns`), their country (any of `countries`), an address in
    `prefix`. Given together, a probe must match each."""

    asns: tuple[int, ...] = ()
    countries: tuple[str, ...] = ()
    prefix: str | None = None

    @classmethod
    def parse(cls, asn: str | None, country: str | None, prefix: str | None) -> ProbeFilters | None:
        """The --probe-asn, --probe-country and --probe-prefix options (None: none given)."""
        asns = tuple(dict.fromkeys(_items(asn, "--probe-asn", _asn))) if asn is not None else ()
        countries = tuple(dict.fromkeys(_items(country, "--probe-country", _country))) if country is not None else ()
        net = None
        if prefix is not None:
            try:
                net = str(ipaddress.ip_network(prefix.strip(), strict=False))
            except ValueError:
                raise UsageError(f"--probe-prefix {prefix!r}: expected an IPv4 or IPv6 prefix such as "
                                 "193.0.0.0/21 or 2001:67c:2e8::/48") from None
        filters = cls(asns, countries, net)
        return filters if filters.record() else None

    @classmethod
    def from_record(cls, r: dict | None) -> ProbeFilters | None:
        return cls(tuple(r.get("asn", ())), tuple(r.get("country", ())), r.get("prefix")) if r else None

    def record(self) -> dict:
        """As the progress file and the summary keep it (only the filters given)."""
        r = {"asn": list(self.asns), "country": list(self.countries), "prefix": self.prefix}
        return {k: v for k, v in r.items() if v}

    def params(self, af: int) -> dict:
        """The /api/v2/probes/ filters, for a measurement of address family `af`."""
        p = {}
        if self.asns:
            p[f"asn_v{af}" + ("__in" if len(self.asns) > 1 else "")] = ",".join(map(str, self.asns))
        if self.countries:
            p["country_code" + ("__in" if len(self.countries) > 1 else "")] = ",".join(self.countries)
        if self.prefix:
            p[f"prefix_v{ipaddress.ip_network(self.prefix).version}"] = self.prefix
        return p

    def describe(self) -> str:
        parts = ([f"AS {', '.join(map(str, self.asns))}"] if self.asns else []) + \
                ([f"country {', '.join(self.countries)}"] if self.countries else []) + \
                ([f"prefix {self.prefix}"] if self.prefix else [])
        return " and ".join(parts)


def _items(text: str, option: str, one: Callable[[str, str], object]) -> list:
    items = [t.strip() for t in text.split(",")]
    if not any(items):
        raise UsageError(f"{option} is empty")
    return [one(t, option) for t in items if t]


def _asn(t: str, option: str) -> int:
    t = t.upper().removeprefix("AS")
    if not t.isdigit() or not 1 <= int(t) <= 2**32 - 2:
        raise UsageError(f"{option}: {t!r} is not an AS number (1 to 4294967294, e.g. 3320 or AS3320)")
    return int(t)


def _country(t: str, option: str) -> str:
    if not re.fullmatch(r"[A-Za-z]{2}", t):
        raise UsageError(f"{option}: {t!r} is not a two-letter country code (ISO 3166-1 alpha-2, e.g. DE)")
    return t.upper()


def resolve_probes(api: Api, filters: ProbeFilters, msm: Measurement, sleep: Callable[[float], None] = time.sleep,
                   on_retry: Callable[[str], None] | None = None) -> list[int]:
    """The ids of the probes `filters` select for measurement `msm`, from /api/v2/probes/,
    following its `next` pages on the same API (never to another host: it would get the key)."""
    where = f"measurement {msm.id}, the probes of {filters.describe()}"
    path, params = PROBES_PATH, {**filters.params(msm.af), "page_size": PROBES_PAGE}
    ids: list[int] = []
    for _ in range(MAX_PROBE_PAGES):
        page = get_json(api, path, params, where, "a page of probes",
                        lambda status, detail: f"{where}: HTTP {status} from {api.base}: the API refused the "
                                               f"probe listing ({detail})", sleep, on_retry)
        results, nxt = page.get("results"), page.get("next")
        if not (isinstance(results, list) and all(isinstance(p, dict) and _whole(p.get("id")) for p in results)):
            raise FetchError(f"{where}: a page of probes from {api.base} without a list of probes with ids")
        ids.extend(p["id"] for p in results)
        if nxt is None:
            return sorted(set(ids))
        path, params = _next_page(api, nxt, where)
    raise FetchError(f"{where}: more than {MAX_PROBE_PAGES} pages of probes from {api.base}")


def _next_page(api: Api, nxt, where: str) -> tuple[str, dict]:
    """The path and query of a `next` link, asked of --api whatever host the link names (as
    cousteau's listings do: the API writes its public host)."""
    u = urlsplit(nxt) if isinstance(nxt, str) else None
    path = u.path.removeprefix(urlsplit(api.base).path) if u else ""
    if not path.startswith(PROBES_PATH):
        raise FetchError(f"{where}: the next page of probes from {api.base} is not a page of probes")
    return path, dict(parse_qsl(u.query))


# -- probe ids as users give them ---------------------------------------------------------------


def ids_text(ids: list[int], most: int = 10) -> str:
    """Probe ids for a message: the first `most`, then how many in all."""
    return ", ".join(map(str, ids[:most])) + (f", ... ({len(ids):,} ids)" if len(ids) > most else "")


def read_probe_ids(values: Iterable[str], stdin: TextIO | None = None) -> list[int] | None:
    """The --probe values, each as ripe-atlas-tools' --probes takes it: a comma list
    ("6090,33194"), a file of probe ids or `-` (standard input): ids separated by white space
    or commas, `#` starting a comment. None: no value given."""
    values = list(values)
    if not values:
        return None
    ids: list[int] = []
    for v in values:
        t = v.strip()
        if _IDS.fullmatch(t):
            ids.extend(_positive(int(x), f"--probe {v!r}") for x in t.split(",") if x.strip())
        elif t == "-":
            ids.extend(_ids_in((stdin or sys.stdin).read(), "--probe - (standard input)"))
        else:
            ids.extend(_ids_in(_read_text(Path(v)), f"--probe {v}"))
    if not ids:
        raise UsageError(f"--probe {' '.join(values)}: no probe ids in it")
    return sorted(set(ids))


def _read_text(path: Path) -> str:
    if not path.exists():
        raise UsageError(f"--probe {path}: neither probe ids (6090,33194) nor a file of them, nor - for standard "
                         "input (no such file)")
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--probe {path}: cannot read it as text ({getattr(e, 'strerror', None) or e})") from None


def _ids_in(text: str, what: str) -> list[int]:
    ids = []
    for n, line in enumerate(text.splitlines(), 1):
        for token in line.split("#", 1)[0].replace(",", " ").split():
            if not token.isascii() or not token.isdigit():
                raise UsageError(f"{what} line {n}: {token[:40]!r} is not a probe id")
            ids.append(_positive(int(token), f"{what} line {n}"))
    return ids


def _positive(i: int, what: str) -> int:
    if not 1 <= i < 2**31:
        raise UsageError(f"{what}: {i} is not a probe id")
    return i
