"""The bookkeeping of `pingctl ingest`: the counts of a parse (what each record became), their
sum over files, the identities they must satisfy, and the rejects file's records."""

from __future__ import annotations

FILTERS = ("msm", "probe", "time", "sample", "af")


def new_counts() -> dict:
    return {
        "records": 0,
        "results_written": 0,
        "empty_results": 0,
        "summary_only": 0,
        "rows": 0,
        "rows_v4": 0,
        "rows_v6": 0,
        "replies": 0,
        "dups": 0,
        "dups_dropped": 0,
        "timeouts": 0,
        "errors": 0,
        "late": 0,
        "other_packets": 0,
        "src_from": 0,
        "src_private": 0,
        "filtered": {k: 0 for k in FILTERS},
        "rejected": {},
        "first_us": None,
        "last_us": None,
    }


def merge_counts(total: dict, part: dict) -> dict:
    for k, v in part.items():
        if k in ("filtered", "rejected"):
            for r, n in v.items():
                total[k][r] = total[k].get(r, 0) + n
        elif k == "first_us":
            if v is not None and (total[k] is None or v < total[k]):
                total[k] = v
        elif k == "last_us":
            if v is not None and (total[k] is None or v > total[k]):
                total[k] = v
        else:
            total[k] += v
    return total


class Rejects:
    """Streams reject records as JSON lines (to a file object, or keeps them in a list)."""

    RAW_MAX = 2000

    def __init__(self, file_label: str, fh=None):
        import orjson

        self.file = file_label
        self.fh = fh
        self.kept: list[dict] = []
        self._dumps = orjson.dumps

    def add(self, reason: str, line: int, raw: bytes | str | None, detail: str | None = None) -> None:
        if isinstance(raw, bytes):
            raw = raw[: self.RAW_MAX * 4].decode("utf-8", "replace")
        rec = {"file": self.file, "line": line, "reason": reason, "raw": (raw or "")[: self.RAW_MAX]}
        if detail:
            rec["detail"] = detail
        if self.fh is None:
            self.kept.append(rec)
        else:
            self.fh.write(self._dumps(rec) + b"\n")


def reconcile(c: dict) -> list[str]:
    """Problems with the bookkeeping identities (empty list = all counts add up)."""
    bad = []
    accounted = c["results_written"] + c["summary_only"] + sum(c["filtered"].values()) + sum(c["rejected"].values())
    if c["records"] != accounted:
        bad.append(f"records {c['records']} != written+summary+filtered+rejected {accounted}")
    packets = c["replies"] + c["dups"] - c["dups_dropped"] + c["timeouts"] + c["errors"] + c["other_packets"]
    if c["rows"] != packets:
        bad.append(f"rows {c['rows']} != packets {packets}")
    if c["rows_v4"] + c["rows_v6"] != c["rows"]:
        bad.append("rows_v4 + rows_v6 != rows")
    return bad
