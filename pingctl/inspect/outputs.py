"""Describe what `pingctl sample` writes (read by `pingctl.artifacts.sample_output`): a
`--pairs` predictions file and a pair's exact RTT distribution (`--src --dst -o`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pingctl.artifacts.sample_output import rejects_path
from pingctl.errors import PingctlError
from pingctl.infer.queries import RttDistribution


def describe_predictions(path: Path, table, meta: dict, sample: int = 0) -> dict:
    """Counts and spreads of a predictions file, and the rows its command set aside (the
    `P.rejects.jsonl` beside it) so that read = answered + set aside can be checked here."""
    src, dst = (np.asarray(table.column(c).to_pylist(), object) for c in ("src", "dst"))
    n = len(src)

    def col(name) -> np.ndarray:
        return _numbers(path, table, name) if name in table.column_names else np.full(n, np.nan)

    p_fail, p50 = col("p_fail"), col("p50_ms")
    broken = ~np.isfinite(p_fail) | (p_fail < 0) | (p_fail > 1) | ~np.isfinite(p50) | (p50 < 0)
    if broken.any():
        first = int(np.flatnonzero(broken)[0])
        raise PingctlError(f"{path}: row {first} holds no valid prediction (p_fail {p_fail[first]}, p50_ms "
                           f"{p50[first]}); not as `pingctl sample --pairs` writes it")
    rejects = rejects_path(path)
    set_aside = sum(1 for line in rejects.read_text().splitlines() if line.strip()) if rejects.is_file() else None
    fam = col("ip_version")
    times = col("time")
    out = {
        "kind": "predictions", "path": str(path),
        **_meta(meta),
        "rows": n, "distinct_pairs": len(set(zip(src.tolist(), dst.tolist()))),
        "sources": len(set(src.tolist())), "destinations": len(set(dst.tolist())),
        "v4_rows": int((fam == 4).sum()), "v6_rows": int((fam == 6).sum()),
        "rows_with_time": int(np.isfinite(times).sum()),
        "rejects_file": str(rejects) if set_aside is not None else None, "rows_set_aside": set_aside,
        "p_fail": _spread(p_fail), "p50_ms": _spread(p50),
        # mass past the mean's ceiling (queries.MEAN_CEILING_MS); files written before it have none
        "p_over_ceiling": _spread(col("p_over_ceiling")) if "p_over_ceiling" in table.column_names else None,
        "context_measurements_mean": float(np.nanmean(col("context_measurements"))) if n and
        "context_measurements" in table.column_names else None,
    }
    if sample:
        keep = np.sort(np.random.default_rng(0).permutation(n)[:sample])
        cols = [c for c in ("src", "dst", "time", "p_fail", "p5_ms", "p50_ms", "p95_ms") if c in table.column_names]
        rows = table.select(cols).take(keep).to_pylist()
        out["sample"] = rows
    return out


def describe_distribution(path: Path, table, meta: dict) -> dict:
    """Checks that the file is one distribution (probabilities >= 0 summing to 1) and reads
    from it the figures the single query printed (`RttDistribution.summary`)."""
    values, probs = _numbers(path, table, "rtt_ms"), _numbers(path, table, "probability")
    total = float(probs.sum()) if len(probs) else 0.0
    if not len(probs) or not np.all(np.isfinite(probs)) or probs.min() < 0 or abs(total - 1) > 1e-3:
        raise PingctlError(f"{path}: the probabilities do not form a distribution (sum {total:.6g} over "
                           f"{len(probs):,} codes); not as `pingctl sample --src --dst -o` writes it")
    order = np.argsort(values, kind="stable")
    codes = _numbers(path, table, "code")
    p_fail = meta.get("p_fail")
    if not (isinstance(p_fail, (int, float)) and 0 <= p_fail <= 1):
        p_fail = None  # written beside the codes by sample; a file without it still has its quantiles
    d = RttDistribution(p_fail or 0.0, codes[order], values[order], probs[order])
    src, dst = (meta.get(k) if isinstance(meta.get(k), str) else None for k in ("src", "dst"))
    return {"kind": "distribution", "path": str(path), "src": src, "dst": dst,
            "codes": len(probs), "probability_sum": total, **d.summary(), "p_fail": p_fail}


_META_TYPES = {"run": str, "pairs": str, "step": int, "timestamps": bool, "exact": bool}


def _meta(meta: dict) -> dict:
    """What the writing command recorded, each of the type it wrote (None otherwise)."""
    out = {k: meta.get(k) if isinstance(meta.get(k), t) else None for k, t in _META_TYPES.items()}
    steps = meta.get("steps")
    out["steps"] = steps if isinstance(steps, list) and all(isinstance(x, int) for x in steps) else None
    return out


def _numbers(path: Path, table, name: str) -> np.ndarray:
    """A column as float64 (null = NaN), or a message naming file and column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = table.column(name)
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_null(col.type)):
        raise PingctlError(f"{path}: column {name} holds {col.type} values, not numbers; "
                           "not as `pingctl sample` writes it")
    return pc.fill_null(col.cast(pa.float64()), float("nan")).to_numpy(zero_copy_only=False)


def _spread(x: np.ndarray) -> dict:
    if not len(x):
        return {}
    return {"min": float(x.min()), **{f"p{round(q * 100)}": float(np.quantile(x, q)) for q in (0.05, 0.5, 0.95)},
            "max": float(x.max()), "mean": float(x.mean())}
