"""`pingctl bench loader`: end-to-end throughput per worker count, and time per stage.

With `loader.triangulation_share` > 0 every case is also timed with it off, right after, on
the same rows (the machine's speed drifts between runs; back to back the two compare)."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np

from pingctl.artifacts.records import read_manifest
from pingctl.config import LoaderConfig, SynthConfig
from pingctl.loader.pipeline import batch_features, element_plan, element_rows, make_dataset, triangulation
from pingctl.loader.sequences import RecordLengths, choose_contexts, pack, tokenize
from pingctl.loader.triangulation import concat_rows, pack_triangulation, triangulation_rows
from pingctl.records.build import build_rows
from pingctl.records.layout import decode
from pingctl.synth.generate import generate

SEED_ANCHOR = "seed pipeline: 320-850k tokens/s on 8 CPUs (~40-106k per CPU); MaxText Grain on C4: ~58k tokens/s per worker"


def _ensure_rows(rows_dir: Path | None, tmp: Path, synth_rows: int, by: str = "source") -> Path:
    if rows_dir is not None:
        return Path(rows_dir)

    generate(SynthConfig(rows=synth_rows, step=900), tmp / "synth")
    build_rows([tmp / "synth"], tmp / "rows", by=by)
    return tmp / "rows"


def _stage_times(rows_dir: Path, cfg: LoaderConfig, scheme: str, elements: int) -> dict:
    """Single-process time per stage over `elements` elements of the real plan."""
    from grain.sources import ArrayRecordDataSource

    manifest = read_manifest(rows_dir)
    src = ArrayRecordDataSource([str(rows_dir / f) for f in manifest["files"]])
    plan = element_plan(manifest, cfg.seq_len, cfg.contexts_per_record, cfg.rows_per_element)
    rng = np.random.default_rng(0)
    pick = rng.choice(len(plan), size=min(elements, len(plan)), replace=False)
    mode_p = np.asarray(cfg.mode_weights, float) / sum(cfg.mode_weights)
    tri, destinations = triangulation(rows_dir, manifest, cfg, scheme)
    t = dict(read=0.0, decode=0.0, sample=0.0, tokenize=0.0, pack=0.0)
    if tri.share > 0:
        t["triangulate"] = 0.0  # choosing, reading destination records, tokenizing and packing them
    tokens = rows = 0
    for rec_id, n_rows in plan[pick]:
        t0 = time.perf_counter()
        raw = src[int(rec_id)]
        t1 = time.perf_counter()
        rec = decode(raw)
        lengths = RecordLengths(rec, scheme)  # read, decode and lengths: once per record in the pipeline's cache
        t2 = time.perf_counter()
        n_tri = triangulation_rows(rng, int(n_rows), tri.share)
        n_plain = int(n_rows) - n_tri
        p = choose_contexts(rec, rng, n_plain, cfg.seq_len, mode_p, scheme, cfg.max_per_pair, cfg.pair_history_share,
                            cfg.pair_history_k, lengths=lengths)
        t3 = time.perf_counter()
        enc = tokenize(rec, rng, p, scheme, cfg.result_last, lengths)
        t4 = time.perf_counter()
        out = pack(p, enc, n_plain, cfg.seq_len)
        t5 = time.perf_counter()
        if n_tri:
            out = concat_rows(out, pack_triangulation(rec, rng, n_tri, cfg.seq_len, mode_p, scheme, tri,
                                                      destinations.lookup(), cfg.result_last, lengths))
        t6 = time.perf_counter()
        batch_features(element_rows({"tokens": out.tokens, "segment": out.segment, "position": out.position,
                                     "modes": out.modes, "measurements": out.measurements}),
                       len(out.tokens), with_stats=True)
        t7 = time.perf_counter()
        for k, a, b in (("read", t0, t1), ("decode", t1, t2), ("sample", t2, t3), ("tokenize", t3, t4),
                        ("pack", t4, t5), ("pack", t6, t7)):
            t[k] += b - a
        if n_tri:
            t["triangulate"] += t6 - t5
        tokens += int((out.segment > 0).sum())
        rows += int(n_rows)
    total = sum(t.values())
    return {"seconds": t, "tokens": tokens, "rows": rows, "tokens_per_s": tokens / total if total else 0.0}


def _descendants(pid: int) -> list[int]:
    """Live descendant processes (Grain's workers and theirs), from Linux's /proc."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                kids = [int(k) for k in task.read_text().split()]
            except OSError:  # the thread ended meanwhile
                continue
            out += kids
            todo += kids
    return out


def cpu_seconds(pids: list[int]) -> float | None:
    """CPU seconds of this process and of `pids` (user + system), or None where /proc cannot
    tell (not Linux). A pid that ended meanwhile counts nothing: time the same live set."""
    total = time.process_time()
    if not pids:
        return total
    try:
        tick = os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return None
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # the name may hold spaces: fields after it
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _end_to_end(rows_dir: Path, cfg: LoaderConfig, scheme: str, batches: int, warmup: int = 10) -> dict:
    it = iter(make_dataset(rows_dir, cfg, scheme, with_stats=True))
    try:
        for _ in range(warmup):  # worker start, first window fill (and, when long, the record caches)
            next(it)
        used = total = 0
        modes = np.zeros(3)
        workers = _descendants(os.getpid()) if cfg.workers else []
        # workers asked for but none found (no /proc children lists): no per-core figure
        t0, c0 = time.perf_counter(), None if cfg.workers and not workers else cpu_seconds(workers)
        for _ in range(batches):
            b = next(it)
            used += int((b["inputs_segmentation"] > 0).sum())
            total += b["inputs_segmentation"].size
            modes += b["stat_modes"]
        dt, c1 = time.perf_counter() - t0, cpu_seconds(workers)
        cpu = None if c0 is None or c1 is None else c1 - c0
    finally:
        if hasattr(it, "close"):
            it.close()
    return {
        "tokens_per_s": used / dt,
        # CPU seconds of this process and its workers: the rate per core even where other jobs
        # share the cores (wall-clock rates then drift with them), at any worker count
        "tokens_per_cpu_s": used / cpu if cpu else None,
        "load_avg": round(os.getloadavg()[0], 2),
        "sequences_per_s": batches * cfg.batch_size / dt,
        "padding": 1 - used / total,
        "modes": (modes / modes.sum()).tolist() if modes.sum() else [0, 0, 0],
    }


def bench_loader(
    rows_dir: Path | None, workers: list[int], seq_len: int, batch_size: int, batches: int, scheme: str,
    synth_rows: int = 2_000_000, loader: LoaderConfig | None = None, warmup: int = 10,
) -> dict:
    """`loader`: the other loader settings (e.g. shaping) of the timed cases; default the defaults."""
    base = (loader or LoaderConfig()).model_copy(update={"seq_len": seq_len, "batch_size": batch_size, "workers": 0})
    share = base.triangulation_share
    with tempfile.TemporaryDirectory(prefix="pingctl-bench-loader-") as d:
        rows = _ensure_rows(rows_dir, Path(d), synth_rows, "both" if share > 0 else "source")
        stages = _stage_times(rows, base, scheme, elements=60)
        table = []
        # with triangulation on, the same case with it off right after: today's figure beside it
        cases = [(w, s) for w in workers for s in ((share, 0.0) if share > 0 else (0.0,))]
        for w, s in cases:
            cfg = base.model_copy(update={"workers": w, "triangulation_share": s})
            r = _end_to_end(rows, cfg, scheme, batches, warmup)
            cores_used = max(1, w)
            label = f"{w} worker{'s' if w != 1 else ''}"
            if share > 0:
                label += f", triangulation {s:g}" if s > 0 else ", triangulation off"
            table.append(
                {
                    "case": label,
                    "tokens_per_s": int(r["tokens_per_s"]),
                    "tokens_per_s_per_core": int(r["tokens_per_s"] / cores_used),
                    "tokens_per_cpu_s": None if r["tokens_per_cpu_s"] is None else int(r["tokens_per_cpu_s"]),
                    "load_avg": r["load_avg"],
                    "seq_per_s": round(r["sequences_per_s"], 1),
                    "padding_pct": round(100 * r["padding"], 3),
                    "full_pct": round(100 * r["modes"][0], 1),
                    "partial_pct": round(100 * r["modes"][1], 1),
                    "none_pct": round(100 * r["modes"][2], 1),
                }
            )
    secs = stages["seconds"]
    total = sum(secs.values())
    stage_rows = [
        {"case": f"stage {k}", "seconds": round(v, 4), "share_pct": round(100 * v / total, 1)} for k, v in secs.items()
    ]
    return {
        "name": "loader",
        "table": table,
        "stages": stage_rows,
        "stage_tokens_per_s_one_core": int(stages["tokens_per_s"]),
        "config": {"seq_len": seq_len, "batch_size": batch_size, "scheme": scheme, "batches": batches,
                   "warmup": warmup,
                   "result_last": base.result_last, "max_per_pair": base.max_per_pair,
                   "triangulation_share": share, "triangulation_k_src": base.triangulation_k_src,
                   "triangulation_k_dst": base.triangulation_k_dst,
                   "triangulation_per_pair": base.triangulation_per_pair},
        "cpus": os.cpu_count(),
        "notes": [
            f"in-process stage sum: {int(stages['tokens_per_s']):,} tokens/s on one core; "
            + ", ".join(f"{r['case'][6:]} {r['share_pct']}%" for r in stage_rows),
            "N workers run in N processes; tokens/s per core divides by max(1, N); tokens per CPU-second counts "
            "the CPU of this process and its workers. Goal: 5M tokens/s per core, padding < 1%",
            SEED_ANCHOR,
        ],
    }
