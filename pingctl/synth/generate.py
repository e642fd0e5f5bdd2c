"""Stream the synthetic measurements to Parquet in time-ordered chunks.

Result i (0-based, over all streams) belongs to round k = i // S and slot j = i % S, where the
S streams are ordered by their offset within the step; its time is k * step + offset. A chunk
is a contiguous range of results, so output rows are in time order and each chunk is computed
with a few dozen NumPy operations over all its results and packets (no Python loop per
measurement). Each chunk draws from its own seeded generator, so memory is bounded by the
chunk size and the bytes depend only on (seed, config).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Callable

import numpy as np

from pingctl import __version__
from pingctl.atomic import atomic_dir, check_replaceable, is_pingctl_output, MANIFEST, write_json
from pingctl.errors import UsageError
from pingctl.schema.columns import arrow_schema, FAILED_RTT
from pingctl.schema.parquet import to_canonical, WRITE_OPTIONS
from pingctl.synth import model as M
from pingctl.synth.truth import write_truth
from pingctl.synth.world import World, build_world

ROW_GROUP_ROWS = 262_144  # one chunk = one Parquet row group
ROW_GROUPS_PER_FILE = 16  # ~4.2M rows per part file
HIST_PER_DECADE = 400  # RTT histogram resolution for the summary quantiles (0.6% bins)
HIST_LO = -2.0  # log10(ms) of the first bin
RTT_DECIMALS = 3  # microsecond resolution, like ping

Progress = Callable[[int, int], None]


def _noop(_done: int, _total: int) -> None:
    pass


class _Arrays:
    """Per-stream float/int arrays used in the hot loop, gathered once."""

    def __init__(self, w: World):
        st = w.streams
        self.order = w.order
        self.S = w.n_streams
        self.offset = st["offset_s"]
        self.base = st["base_rtt_ms"]
        self.amp_s, self.amp_d = st["diurnal_amp_src_ms"], st["diurnal_amp_dst_ms"]
        self.gain_s, self.gain_d = st["jitter_gain_src"], st["jitter_gain_dst"]
        self.jitter0 = st["jitter_ms"]
        self.phase_s = st["utc_offset_src_h"] - st["diurnal_peak_src_h"]
        self.phase_d = st["utc_offset_dst_h"] - st["diurnal_peak_dst_h"]
        self.loss = st["loss_rate"]
        self.af = st["ip_version"]
        self.v6 = (self.af == 6).astype(np.int64)
        self.msm = st["msm_id"]
        self.size = st["size"]
        self.prb = st["prb_id"]
        # address / outage-owner codes: host * 2 + (ip_version == 6)
        self.src_code = st["src"] * 2 + self.v6
        self.dst_code = st["dst"] * 2 + self.v6
        # route segments: key = stream << 40 | start
        r = w.routes
        self.route_key = (r["stream_id"] << 40) | r["start_s"]
        self.route_shift = r["shift_ms"]
        o = w.outages
        self.out_key = (o["owner"] << 40) | o["start_s"]
        self.out_owner = o["owner"]
        self.out_end = o["end_s"]
        self.out_err = o["kind"] == "unreachable"
        self.start_hours = (w.start_s % 86_400) / 3600.0
        self.start_us = w.start_s * 1_000_000


def _outage(a: _Arrays, owner, t):
    """(in_outage, unreachable) for each result, by owner (host * 2 + v6) and time."""
    if len(a.out_key) == 0:
        z = np.zeros(len(t), dtype=bool)
        return z, z
    idx = np.searchsorted(a.out_key, (owner << 40) | t, side="right") - 1
    idx_c = np.maximum(idx, 0)
    hit = (idx >= 0) & (a.out_owner[idx_c] == owner) & (t < a.out_end[idx_c])
    return hit, hit & a.out_err[idx_c]


def chunk_arrays(w: World, a: _Arrays, i0: int, i1: int, chunk_index: int) -> dict[str, np.ndarray]:
    """Columns (NumPy) of results [i0, i1): every packet of every result, in time order."""
    P = w.packets
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([w.seed % 2**64, 0x5EED, chunk_index])))
    i = np.arange(i0, i1, dtype=np.int64)
    k = i // a.S
    s = a.order[i - k * a.S]
    t = k * w.step + a.offset[s]  # seconds since start

    hours = a.start_hours + t * (1.0 / 3600.0)
    b_s = M.bump(hours, a.phase_s[s])
    b_d = M.bump(hours, a.phase_d[s])
    scale = a.jitter0[s] * (1.0 + a.gain_s[s] * b_s + a.gain_d[s] * b_d)
    ridx = np.searchsorted(a.route_key, (s << 40) | t, side="right") - 1
    level = a.base[s] + a.route_shift[ridx] + a.amp_s[s] * b_s + a.amp_d[s] * b_d
    e_res = rng.standard_exponential(len(i))
    res_a = level + (M.JITTER_W * scale) * e_res
    res_b = (1.0 - M.JITTER_W) * scale

    out_s, err_s = _outage(a, a.src_code[s], t)
    out_d, _ = _outage(a, a.dst_code[s], t)
    down = out_s | out_d

    n = len(i) * P
    y = M.jitter_packet(rng.random(n))
    rtt = np.repeat(res_a, P) + np.repeat(res_b, P) * y
    np.round(rtt, RTT_DECIMALS, out=rtt)
    lost = rng.random(n) < np.repeat(a.loss[s], P)
    lost |= np.repeat(down, P)
    rtt[lost] = FAILED_RTT
    err = np.repeat(err_s.astype(np.int64) * P, P)
    srow = np.repeat(s, P)
    return {
        "msm_id": a.msm[srow],
        "event_time": np.repeat(a.start_us + t * 1_000_000, P),
        "src": a.src_code[srow],
        "dst": a.dst_code[srow],
        "ip_version": a.af[srow],
        "rtt": rtt,
        "size": a.size[srow],
        "packet_error_count": err,
        "prb_id": a.prb[srow],
        "_lost": lost,
    }



def _to_table(cols: dict, addr):
    import pyarrow as pa

    table = pa.Table.from_arrays(
        [
            pa.array(cols["msm_id"]),
            pa.array(cols["event_time"]).view(pa.timestamp("us", tz="UTC")),
            addr.take(pa.array(cols["src"])),
            addr.take(pa.array(cols["dst"])),
            pa.array(cols["ip_version"]),
            pa.array(cols["rtt"]),
            pa.array(cols["size"]),
            pa.array(cols["packet_error_count"]),
            pa.array(cols["prb_id"]),
        ],
        names=["msm_id", "event_time", "src_addr", "dst_addr", "ip_version", "rtt", "size",
               "packet_error_count", "prb_id"],
    )
    # the columns the world does not model (ttl, dst_name, dup) are null, as in a table from elsewhere
    return to_canonical(table)


def _writer(path: Path):
    import pyarrow.parquet as pq

    return pq.ParquetWriter(
        path,
        arrow_schema(),
        **WRITE_OPTIONS,
        use_dictionary=["msm_id", "src_addr", "dst_addr", "ip_version", "size", "packet_error_count", "prb_id"],
        column_encoding={"event_time": "DELTA_BINARY_PACKED"},
        write_statistics=True,
    )


class _Stats:
    def __init__(self):
        self.rows = self.v4 = self.v6 = self.failed = self.errors = 0
        self.hist = np.zeros(int(7 * HIST_PER_DECADE), dtype=np.int64)

    def add(self, cols):
        n = len(cols["rtt"])
        self.rows += n
        v6 = int(np.count_nonzero(cols["ip_version"] == 6))
        self.v6 += v6
        self.v4 += n - v6
        lost = cols["_lost"]
        self.failed += int(np.count_nonzero(lost))
        self.errors += int(np.count_nonzero(cols["packet_error_count"]))
        ok = cols["rtt"][~lost]
        b = ((np.log10(ok) - HIST_LO) * HIST_PER_DECADE).astype(np.int64)
        np.clip(b, 0, len(self.hist) - 1, out=b)
        self.hist += np.bincount(b, minlength=len(self.hist))

    def quantile(self, q: float) -> float | None:
        total = int(self.hist.sum())
        if not total:
            return None
        idx = int(np.searchsorted(np.cumsum(self.hist), q * total, side="left"))
        return float(10 ** (HIST_LO + (idx + 0.5) / HIST_PER_DECADE))


def generate(cfg, out: Path, force: bool = False, progress: Progress = _noop) -> dict:
    """Generate the dataset for a SynthConfig into directory `out` (atomically); returns the summary."""
    import pyarrow as pa

    out = Path(out)
    check_replaceable(out, force)
    if not force:
        check_no_other_world(out, cfg)
    t0 = time.perf_counter()
    w = build_world(cfg)
    a = _Arrays(w)
    addr = pa.array(w.addresses, pa.string())
    chunk_res = max(1, ROW_GROUP_ROWS // w.packets)
    n_chunks = max(1, math.ceil(w.results / chunk_res))
    stats = _Stats()
    files: list[str] = []
    t_first = t_last = None
    progress(0, n_chunks)
    with atomic_dir(out) as tmp:
        writer = None
        try:
            for c in range(n_chunks):
                if c % ROW_GROUPS_PER_FILE == 0:
                    if writer is not None:
                        writer.close()
                    name = f"part-{c // ROW_GROUPS_PER_FILE:05d}.parquet"
                    files.append(name)
                    writer = _writer(tmp / name)
                i0, i1 = c * chunk_res, min(w.results, (c + 1) * chunk_res)
                cols = chunk_arrays(w, a, i0, i1, c)
                stats.add(cols)
                if t_first is None:
                    t_first = int(cols["event_time"][0])
                t_last = int(cols["event_time"][-1])
                writer.write_table(_to_table(cols, addr), row_group_size=ROW_GROUP_ROWS)
                del cols
                progress(c + 1, n_chunks)
        finally:
            if writer is not None:
                writer.close()
        truth_files = write_truth(w, tmp)
        gen_s = time.perf_counter() - t0
        summary = _summary(cfg, w, stats, files, truth_files, t_first, t_last)
        manifest = {
            "kind": KIND,
            "pingctl_version": __version__,
            "seed": cfg.seed,
            "config": cfg.model_dump(mode="json"),
            **{k: v for k, v in summary.items() if k not in ("out",)},
            "model": _model_constants(),
        }
        write_json(tmp / MANIFEST, manifest)
    elapsed = time.perf_counter() - t0
    summary["out"] = str(out)
    summary["elapsed_s"] = round(elapsed, 3)
    summary["generate_s"] = round(gen_s, 3)
    summary["rows_per_s"] = int(summary["rows"] / elapsed) if elapsed > 0 else 0
    summary["bytes"] = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    return summary


KIND = "pingctl synth"


def check_no_other_world(out: Path, cfg) -> None:
    """Refuse to replace another world, or any other pingctl output, at `out` (--force does):
    splits and rows built from it would silently stop matching it. The same world again (same
    config, same model constants: the same bytes) may be written over itself, so a script that
    regenerates its world reruns."""
    if not out.is_dir() or not any(out.iterdir()) or not is_pingctl_output(out):
        return  # absent or empty; a directory pingctl did not write is check_replaceable's
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        manifest = {}
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND:
        kind = manifest.get("kind") if isinstance(manifest, dict) else None
        raise UsageError(f"-o {out} holds a pingctl output that is not a synth world{f' ({kind})' if kind else ''}: "
                         "choose another output directory, or pass --force to replace it")
    old, new = manifest.get("config") or {}, cfg.model_dump(mode="json")
    if old == new and manifest.get("model") == _model_constants():
        return
    changed = [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    why = ", ".join(changed) if changed else "the same config under other model constants (another pingctl)"
    rows = manifest.get("rows")
    raise UsageError(f"-o {out} holds another synth world ({f'{rows:,} rows' if isinstance(rows, int) else 'a world'}; "
                     f"this one differs: {why}); splits and rows built from it would no longer match it. "
                     "Pass --force to replace it, or choose another output directory")


def _iso(us: int | None) -> str | None:
    import datetime as dt

    if us is None:
        return None
    return dt.datetime.fromtimestamp(us / 1e6, dt.timezone.utc).isoformat().replace("+00:00", "Z")


def _summary(cfg, w: World, stats: _Stats, files, truth_files, t_first, t_last) -> dict:
    st = w.streams
    pairs = len(set(zip(st["src"].tolist(), st["dst"].tolist())))
    return {
        "rows": stats.rows,
        "results": w.results,
        "probes": cfg.probes,
        "targets": cfg.targets,
        "pairs": pairs,
        "streams": w.n_streams,
        "v6_streams": int(np.count_nonzero(st["ip_version"] == 6)),
        "ases": len(w.ases["asn"]),
        "addresses": cfg.addresses,
        "rounds": w.rounds,
        "v4_rows": stats.v4,
        "v6_rows": stats.v6,
        "failed_rows": stats.failed,
        "error_rows": stats.errors,
        "failure_share": stats.failed / stats.rows if stats.rows else 0.0,
        "start": _iso(t_first),
        "end": _iso(t_last),
        "span_s": (t_last - t_first) // 1_000_000 if t_first is not None else 0,
        "rtt_p5_ms": stats.quantile(0.05),
        "rtt_p50_ms": stats.quantile(0.50),
        "rtt_p95_ms": stats.quantile(0.95),
        "route_segments": len(w.routes["start_s"]),
        "outages": len(w.outages["start_s"]),
        "data_files": files,
        "truth_files": truth_files,
    }


def _model_constants() -> dict:
    return {
        "c_fibre_km_s": M.C_FIBRE_KM_S,
        "earth_radius_km": M.EARTH_RADIUS_KM,
        "diurnal_kappa": M.KAPPA,
        "jitter_result_weight": M.JITTER_W,
        "jitter_tail_q": M.TAIL_Q,
        "jitter_tail_alpha": M.TAIL_ALPHA,
        "jitter_cap": M.Y_CAP,
        "jitter_median": M.JITTER_MEDIAN,
    }
