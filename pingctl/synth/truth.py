"""The ground-truth sidecar of a synthetic dataset, and the true conditional median RTT.

Layout under the output directory (all Parquet, zstd):
    truth/hosts.parquet    one row per host (probes and targets): address(es), prefixes, AS,
                           city and coordinates, access type and its delay/jitter/diurnal/loss
    truth/ases.parquet     one row per AS: asn, name, region, country, kind, v4 /16, v6 /32
    truth/pairs.parquet    one row per stream (src_addr, dst_addr, ip_version): every parameter
                           of the RTT model (see pingctl.synth.model)
    truth/routes.parquet   route segments per stream: [start, end) with a constant base shift
    truth/outages.parquet  per (host, ip_version) outage intervals and their kind

`truth_median_ms` evaluates the model's conditional median for arbitrary measurements, which
is what an `eval` needs for the noise floor (error of the best possible point predictor).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pingctl.atomic import MANIFEST
from pingctl.errors import PingctlError
from pingctl.schema.parquet import WRITE_OPTIONS, read_table
from pingctl.synth import model as M
from pingctl.synth.world import parse_start

TRUTH_DIR = "truth"
TABLES = ("hosts", "ases", "pairs", "routes", "outages")


def _ts(start_s: int, rel):
    import pyarrow as pa

    return pa.array((start_s + np.asarray(rel, dtype=np.int64)) * 1_000_000).view(pa.timestamp("us", tz="UTC"))


def _obj(values):
    import pyarrow as pa

    return pa.array(list(values), pa.string())


def write_truth(w, out_dir: Path) -> list[str]:
    """Write the truth tables of world `w` under out_dir/truth; returns relative paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = Path(out_dir) / TRUTH_DIR
    d.mkdir(parents=True, exist_ok=True)
    h, st, r, o = w.hosts, w.streams, w.routes, w.outages
    is_probe = h["role"] == "probe"
    hosts = pa.table(
        {
            "host_id": h["host_id"],
            "role": _obj(h["role"]),
            "prb_id": pa.array(h["prb_id"], mask=~is_probe),
            "ipv4": _obj(h["ipv4"]),
            "ipv6": _obj(h["ipv6"]),
            "v4_prefix": _obj(h["v4_prefix"]),
            "v6_prefix": _obj(h["v6_prefix"]),
            "asn": h["asn"],
            "city": _obj(h["city"]),
            "country": _obj(h["country"]),
            "region": _obj(h["region"]),
            "lat": h["lat"],
            "lon": h["lon"],
            "access": _obj(h["access"]),
            "dual_stack": h["dual_stack"],
            "utc_offset_h": h["utc_offset_h"],
            "access_ms": h["access_ms"],
            "jitter_ms": h["jitter_ms"],
            "jitter_gain": h["jitter_gain"],
            "diurnal_amp_ms": h["diurnal_amp_ms"],
            "diurnal_peak_h": h["diurnal_peak_h"],
            "loss_rate": h["loss_rate"],
        }
    )
    ases = pa.table(
        {
            "asn": w.ases["asn"],
            "name": _obj(w.ases["name"]),
            "region": _obj(w.ases["region"]),
            "country": _obj(c or None for c in w.ases["country"]),
            "kind": _obj(w.ases["kind"]),
            "v4_prefix": _obj(w.ases["v4_prefix"]),
            "v6_prefix": _obj(w.ases["v6_prefix"]),
        }
    )
    addr = np.array(w.addresses, dtype=object)
    v6 = (st["ip_version"] == 6).astype(np.int64)
    src_addr = addr[st["src"] * 2 + v6]
    dst_addr = addr[st["dst"] * 2 + v6]
    skip = {"src", "dst", "stream_id", "ip_version", "prb_id", "msm_id", "size", "via_hub"}
    pairs = {
        "stream_id": st["stream_id"],
        "src_addr": _obj(src_addr),
        "dst_addr": _obj(dst_addr),
        "ip_version": st["ip_version"],
        "prb_id": st["prb_id"],
        "msm_id": st["msm_id"],
        "size": st["size"],
        "src_host": st["src"],
        "dst_host": st["dst"],
        "src_asn": h["asn"][st["src"]],
        "dst_asn": h["asn"][st["dst"]],
        "via_hub": _obj(st["via_hub"]),
    }
    pairs.update({k: v for k, v in st.items() if k not in skip})
    rs = r["stream_id"]
    routes = pa.table(
        {
            "stream_id": rs,
            "src_addr": _obj(src_addr[rs]),
            "dst_addr": _obj(dst_addr[rs]),
            "ip_version": st["ip_version"][rs],
            "start": _ts(w.start_s, r["start_s"]),
            "end": _ts(w.start_s, r["end_s"]),
            "shift_ms": r["shift_ms"],
            "base_rtt_ms": st["base_rtt_ms"][rs] + r["shift_ms"],
        }
    )
    outages = pa.table(
        {
            "host_id": o["host_id"],
            "role": _obj(h["role"][o["host_id"]]),
            "addr": _obj(addr[o["owner"]]),
            "ip_version": o["ip_version"],
            "start": _ts(w.start_s, o["start_s"]),
            "end": _ts(w.start_s, o["end_s"]),
            "kind": _obj(o["kind"]),
        }
    )
    files = []
    for name, table in (("hosts", hosts), ("ases", ases), ("pairs", pa.table(pairs)), ("routes", routes),
                        ("outages", outages)):
        pq.write_table(table, d / f"{name}.parquet", **WRITE_OPTIONS)
        files.append(f"{TRUTH_DIR}/{name}.parquet")
    return files


@dataclass
class Truth:
    """Loaded ground truth: per-stream model parameters and route segments (NumPy)."""

    start_s: int
    duration_s: int
    pairs: dict[str, np.ndarray]
    route_key: np.ndarray
    route_shift: np.ndarray
    addr_id: dict[str, int]
    stream_by_key: np.ndarray  # sorted src_id * n_addr + dst_id
    stream_of_key: np.ndarray

    def stream_index(self, src, dst, ip_version=None) -> np.ndarray:
        """Stream id of each (src, dst[, ip_version]) measurement; -1 where unknown."""
        s = _codes(src, self.addr_id)
        d = _codes(dst, self.addr_id)
        n = len(self.addr_id)
        key = s * n + d
        pos = np.searchsorted(self.stream_by_key, key)
        pos_c = np.minimum(pos, len(self.stream_by_key) - 1)
        ok = (s >= 0) & (d >= 0) & (self.stream_by_key[pos_c] == key)
        sid = np.where(ok, self.stream_of_key[pos_c], -1)
        if ip_version is not None:
            ipv = np.asarray(ip_version, dtype=np.int64)
            sid = np.where((sid >= 0) & (self.pairs["ip_version"][np.maximum(sid, 0)] == ipv), sid, -1)
        return sid


def _codes(values, mapping: dict[str, int]) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(np.asarray(values, dtype=object))
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        enc = arr
    else:
        enc = pc.dictionary_encode(arr.cast(pa.string()))
    uniq = enc.dictionary.to_pylist()
    lut = np.array([mapping.get(u, -1) for u in uniq] + [-1], dtype=np.int64)
    idx = enc.indices.fill_null(len(uniq)).to_numpy(zero_copy_only=False).astype(np.int64)
    return lut[idx]


def load_truth(path: Path | str) -> Truth:
    """Load the truth sidecar of a `pingctl synth` output directory."""
    import json

    path = Path(path)
    if not (path / TRUTH_DIR / "pairs.parquet").exists():
        raise PingctlError(f"{path}: no {TRUTH_DIR}/pairs.parquet (not a `pingctl synth` output?)")
    manifest = json.loads((path / MANIFEST).read_text())
    cfg = manifest["config"]
    start_s = parse_start(cfg["start"])
    pt = read_table(path / TRUTH_DIR / "pairs.parquet")
    pairs = {c: pt.column(c).to_numpy(zero_copy_only=False) for c in pt.column_names}
    rt = read_table(path / TRUTH_DIR / "routes.parquet", columns=["stream_id", "start", "shift_ms"])
    r_sid = rt.column("stream_id").to_numpy()
    r_start = rt.column("start").cast("int64").to_numpy() // 1_000_000 - start_s
    addrs = sorted(set(pairs["src_addr"].tolist()) | set(pairs["dst_addr"].tolist()))
    addr_id = {a: i for i, a in enumerate(addrs)}
    n = len(addrs)
    key = np.array([addr_id[a] for a in pairs["src_addr"]], dtype=np.int64) * n + np.array(
        [addr_id[a] for a in pairs["dst_addr"]], dtype=np.int64
    )
    o = np.argsort(key, kind="stable")
    return Truth(
        start_s=start_s,
        duration_s=int(manifest["rounds"]) * int(cfg["step"]),
        pairs=pairs,
        route_key=(r_sid << 40) | r_start,
        route_shift=rt.column("shift_ms").to_numpy(),
        addr_id=addr_id,
        stream_by_key=key[o],
        stream_of_key=pairs["stream_id"][o],
    )


def _unix_seconds(event_time) -> np.ndarray:
    """Event times as float Unix seconds: Arrow timestamps, numpy datetime64, or numbers (= seconds)."""
    import pyarrow as pa

    if isinstance(event_time, (pa.Array, pa.ChunkedArray)):
        if pa.types.is_timestamp(event_time.type):
            unit = {"s": 1, "ms": 1e3, "us": 1e6, "ns": 1e9}[event_time.type.unit]
            return event_time.cast(pa.int64()).to_numpy(zero_copy_only=False) / unit
        event_time = event_time.to_numpy(zero_copy_only=False)
    arr = np.asarray(event_time)
    if np.issubdtype(arr.dtype, np.datetime64):
        return arr.astype("datetime64[us]").astype(np.int64) / 1e6
    return arr.astype(np.float64)


def truth_median_ms(truth, src, dst, ip_version, event_time) -> np.ndarray:
    """True conditional median RTT (ms) of a successful packet for each measurement.

    `truth` is a Truth or a synth output directory; src/dst are address strings (lists, NumPy
    or Arrow arrays); event_time as Arrow timestamps, datetime64 or Unix seconds. Measurements
    of unknown (src, dst, ip_version) get NaN.
    """
    if not isinstance(truth, Truth):
        truth = load_truth(truth)
    sid = truth.stream_index(src, dst, ip_version)
    t_abs = _unix_seconds(event_time)
    known = sid >= 0
    s = np.maximum(sid, 0)
    rel = np.clip(np.floor(t_abs - truth.start_s).astype(np.int64), 0, max(truth.duration_s - 1, 0))
    ridx = np.searchsorted(truth.route_key, (s << 40) | rel, side="right") - 1
    shift = truth.route_shift[np.maximum(ridx, 0)]
    p = truth.pairs
    hours = (t_abs % 86_400) / 3600.0
    med = M.median_ms(
        p["base_rtt_ms"][s],
        shift,
        p["diurnal_amp_src_ms"][s],
        p["diurnal_amp_dst_ms"][s],
        p["jitter_gain_src"][s],
        p["jitter_gain_dst"][s],
        p["jitter_ms"][s],
        p["utc_offset_src_h"][s] - p["diurnal_peak_src_h"][s],
        p["utc_offset_dst_h"][s] - p["diurnal_peak_dst_h"][s],
        hours,
    )
    return np.where(known, med, np.nan)
