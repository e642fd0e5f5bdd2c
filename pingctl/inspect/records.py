"""Describe a `pingctl build-rows` output (probe records in ArrayRecord files); survive (and
report) corrupt or truncated ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pingctl.errors import PingctlError
from pingctl.artifacts.records import read_manifest, record_files
from pingctl.records.layout import VERSION, RecordError, decode, to_measurements
from pingctl.tokenizer.rtt_codec import decode_rtt, encode_rtt

# RTT percentiles come from a histogram of the compact codec's 16-bit codes: exact at the
# codec's resolution (<= 1/2048 relative), constant memory, and every measurement counts the
# same (a per-record sample would overweight short records).
RTT_CODES = 1 << 16
RTT_FLUSH = 1 << 20
HIST_EDGES = (1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10**9)


_MAX_STREAK = 16


def iter_records(files: list[Path], errors: list[dict]):
    """Yield (file, index, raw bytes); unreadable files/records are appended to `errors`."""
    from array_record.python import array_record_module

    for f in files:
        try:
            reader = array_record_module.ArrayRecordReader(str(f))
            n = reader.num_records()
        except Exception as e:  # noqa: BLE001 - the C++ reader raises RuntimeError/ValueError/...
            errors.append({"file": str(f), "record": None, "error": f"cannot open: {e}"})
            continue
        streak = 0
        for i in range(n):
            try:
                raw = reader.read([i])[0]
            except Exception as e:  # noqa: BLE001
                streak += 1
                if streak > _MAX_STREAK:
                    # a truncated file fails for every later record: one entry for the rest
                    errors.append({"file": str(f), "record": i, "error": f"unreadable, and the {n - i - 1} after it not tried"})
                    break
                errors.append({"file": str(f), "record": i, "error": f"unreadable: {e}"})
                continue  # one damaged chunk must not hide the good records after it
            streak = 0
            yield f, i, raw
        try:
            reader.close()
        except Exception as e:  # noqa: BLE001 - a truncated file may only fail at close
            errors.append({"file": str(f), "record": None, "error": f"corrupt: {e}"})


def describe_rows(path: Path, sample: int = 0, tokens_per_measurement=None) -> dict:
    """Statistics over every record. `tokens_per_measurement(rec) -> int` estimates tokens."""
    files = record_files(path)
    errors: list[dict] = []
    n_meas, sizes, spans, probes = [], [], [], set()
    v4 = v6 = failures = 0
    rtt_hist = np.zeros(RTT_CODES, np.int64)
    pending: list[np.ndarray] = []
    n_pending = 0
    tokens: list[int] = []
    samples = []
    for f, i, raw in iter_records(files, errors):
        try:
            rec = decode(raw)
        except RecordError as e:
            errors.append({"file": str(f), "record": i, "error": str(e)})
            continue
        n_meas.append(rec.n)
        sizes.append(len(raw))
        probes.add(rec.probe)
        if rec.n:
            spans.append(int(rec.time_s[-1] - rec.time_s[0]))
        is6 = rec.src_v6[rec.src_idx]
        v6 += int(is6.sum())
        v4 += rec.n - int(is6.sum())
        ok = rec.rtt_ms >= 0
        failures += rec.n - int(ok.sum())
        pending.append(rec.rtt_ms[ok])
        n_pending += len(pending[-1])
        if n_pending >= RTT_FLUSH:
            _add_codes(rtt_hist, pending)
            n_pending = 0
        if tokens_per_measurement is not None:
            tokens.append(int(tokens_per_measurement(rec)))
        if len(samples) < sample:
            samples.append(_sample(rec, f, i))
    meta = _manifest(path, files, errors)
    total = int(sum(n_meas))
    if not n_meas and errors:
        raise PingctlError(
            f"{path}: no readable records; first error: {errors[0]['file']} "
            f"{'record ' + str(errors[0]['record']) if errors[0]['record'] is not None else '(whole file)'}: "
            f"{errors[0]['error']}"
        )
    _add_codes(rtt_hist, pending)
    pct = hist_percentiles(rtt_hist, (5, 50, 95, 99))
    hist = np.histogram(n_meas, bins=HIST_EDGES)[0] if n_meas else np.zeros(len(HIST_EDGES) - 1)
    return {
        "kind": "rows",
        "path": str(path),
        "files": len(files),
        "records": len(n_meas),
        "readable_records": len(n_meas),
        "errors": errors,
        "probes": len(probes),
        "measurements": total,
        "measurements_per_record": _dist(n_meas),
        "measurements_per_record_hist": {
            f"{lo}-{hi - 1}": int(c) for lo, hi, c in zip(HIST_EDGES[:-1], HIST_EDGES[1:], hist)
        },
        "record_bytes": _dist(sizes),
        "span_hours": _dist([s / 3600 for s in spans]),
        "v4_measurements": v4,
        "v6_measurements": v6,
        "failure_share": failures / total if total else 0.0,
        "rtt_ms": pct,
        "tokens_per_record": _dist(tokens) if tokens else None,
        "layout_version": meta.get("layout_version"),
        "sample": samples,
    }


def _add_codes(hist: np.ndarray, pending: list[np.ndarray]) -> None:
    if pending:
        counts = np.bincount(encode_rtt(np.concatenate(pending)))
        hist[: len(counts)] += counts
        pending.clear()


def hist_percentiles(hist: np.ndarray, qs) -> dict:
    """np.percentile's linear interpolation over the decoded values a code histogram holds."""
    n = int(hist.sum())
    if not n:
        return {}
    cum = np.cumsum(hist)
    out = {}
    for q in qs:
        pos = (n - 1) * q / 100
        lo, hi = decode_rtt(np.searchsorted(cum, [np.floor(pos), np.ceil(pos)], side="right"))
        out[f"p{q}"] = float(lo + (hi - lo) * (pos - np.floor(pos)))
    return out


def _dist(values) -> dict:
    if not len(values):
        return {}
    a = np.asarray(values, dtype=float)
    return {"min": float(a.min()), "p50": float(np.median(a)), "mean": float(a.mean()), "max": float(a.max())}


def _manifest(path: Path, files: list[Path], errors: list[dict]) -> dict:
    """The rows' manifest, checked as the loader checks it: rows that training would refuse
    (a damaged manifest, listed files missing, another layout) are errors here too, not a
    clean report. A single .arrayrecord file is described without its directory's manifest."""
    d = Path(path)
    if not d.is_dir():
        return {}
    try:
        meta = read_manifest(d)
    except PingctlError as e:
        errors.append({"file": str(d / "manifest.json"), "record": None, "error": str(e)})
        return {}
    listed = meta.get("files", [])
    on_disk = {f.name for f in files}
    problems = [f"lists {name}, which is missing" for name in listed if isinstance(name, str) and name not in on_disk]
    problems += [f"does not list {name}" for name in sorted(on_disk - set(map(str, listed)))] if listed else []
    if meta.get("layout_version") != VERSION:
        problems.append(f"layout version {meta.get('layout_version')!r}, this pingctl reads {VERSION}")
    errors += [{"file": str(d / "manifest.json"), "record": None, "error": p} for p in problems]
    return meta


def _sample(rec, f: Path, i: int, k: int = 5) -> dict:
    m = to_measurements(rec, np.arange(min(k, rec.n)))
    first = [
        {"time": int(t), "src": s, "dst": d, "rtt_ms": float(r), "msm_id": int(mid)}
        for t, s, d, r, mid in zip(m.time_s, m.src_text(), m.dst_text(), m.rtt_ms, m.msm_id)
    ]
    return {"file": f.name, "record": i, "probe": rec.probe, "part": rec.part, "n": rec.n, "first": first}
