"""`pingctl bench synth`: rows/s, bytes and peak memory of the generator."""

from __future__ import annotations

import os
import platform
import tempfile
import time
from pathlib import Path

from pingctl.benchutil import peak_rss_mb
from pingctl.config import SynthConfig
from pingctl.synth.generate import generate, ROW_GROUP_ROWS


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def bench_synth(rows: int, seed: int) -> dict:
    """Generate `rows` rows with the default world into a temp dir, in this process."""
    cfg = SynthConfig(rows=rows, seed=seed)
    rss0 = peak_rss_mb()
    cpu0 = time.process_time()
    with tempfile.TemporaryDirectory(prefix="pingctl-bench-synth-") as d:
        res = generate(cfg, Path(d) / "synth")
    cpu = time.process_time() - cpu0
    table = [
        {
            "case": "synth",
            "rows": res["rows"],
            "seconds": round(res["elapsed_s"], 2),
            "rows_per_s": res["rows_per_s"],
            "mb_written": round(res["bytes"] / 1e6, 1),
            "peak_rss_mb": round(peak_rss_mb(), 1),
        }
    ]
    return {
        "name": "synth",
        "table": table,
        "config": cfg.model_dump(mode="json"),
        "summary": {k: v for k, v in res.items() if k not in ("out", "data_files", "truth_files")},
        "notes": [
            f"seed {seed}; one process, single-threaded NumPy + Parquet (zstd) writer; {ROW_GROUP_ROWS:,}-row chunks; "
            f"CPU time {cpu:.2f} s; {res['bytes'] / max(res['rows'], 1):.2f} bytes/row",
            f"world: {res['probes']} probes, {res['targets']} targets, {res['streams']:,} streams, "
            f"span {res['span_s'] / 3600:.1f} h",
            f"peak RSS before generating: {rss0:.1f} MB (imports); CPU {_cpu_model()}, {os.cpu_count()} cores",
        ],
    }
