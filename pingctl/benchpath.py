"""`pingctl bench path`: a synthetic day shaped like RIPE Atlas built-in pings through the whole
data path (synth, shard by regimes, build-rows by both, hints), each stage a measured child
process, at several sizes; per stage its rows in, wall time, rows/s, peak memory and how its time
grows between sizes (docs/benchmarks.md, "The whole path at a day's size").

It knows the stages only as commands (`pingctl.benchutil.run_measured`), never as library calls:
a stage's figure is what a user running that command pays, start-up included, and its peak
memory is its own, untouched by the bench's. With a kept work directory every finished stage
leaves its result there (`SIZE/stages/STAGE.json`), so a second run redoes only what did not
finish.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from pingctl.atomic import write_json
from pingctl.benchutil import run_measured
from pingctl.errors import PingctlError, UsageError

STAGES = ("synth", "shard", "build-rows", "hints")
# a growth exponent above this is flagged: timing noise on a shared machine reaches ~10% between
# sizes a decade apart, so 1.15 is the first value that says more than noise
WORSE_THAN_LINEAR = 1.15
WORSE = "worse than linear"
MIN_SIZE, MAX_SIZE = 10_000, 100_000_000
# RIPE Atlas built-ins: ~10-12k probes, each pinging the same few tens of targets (root servers,
# anchors) over IPv4 and, where both ends have it, IPv6. One probe per 10k rows keeps the rounds
# per pair (the span) the same at every size, so pairs and nodes grow with rows as they would
# from a sample of probes to all of them.
ROWS_PER_PROBE, MIN_PROBES, MAX_PROBES = 10_000, 10, 10_000
TARGETS, TARGETS_PER_PROBE = 40, 25
SEED = 0
RECORD = 1  # a stage's record layout; a record of another layout is redone, never read


def parse_sizes(text: str) -> list[int]:
    """`--size`: comma-separated row counts, each a whole number with an optional k or M suffix
    (`20k`, `1M`, `10M`), in [MIN_SIZE, MAX_SIZE], increasing (a UsageError otherwise)."""
    sizes = []
    for word in (w.strip() for w in text.split(",")):
        scale = {"k": 1_000, "K": 1_000, "M": 1_000_000}.get(word[-1:], 1)
        digits = word[:-1] if scale > 1 else word
        try:
            value = float(digits) * scale
        except ValueError:
            value = float("nan")
        if not math.isfinite(value) or value != int(value):
            raise UsageError(f"--size {text!r}: {word!r} is not a row count; give comma-separated counts like 1M,10M")
        if not MIN_SIZE <= value <= MAX_SIZE:
            raise UsageError(f"--size {text!r}: {word!r} must be between {MIN_SIZE:,} and {MAX_SIZE:,} rows")
        sizes.append(int(value))
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise UsageError(f"--size {text!r}: give each size once, smallest first")
    return sizes


def label(size: int) -> str:
    """1000000 -> '1M', 20000 -> '20k' (a size's name in the table and its work directory)."""
    for unit, name in ((1_000_000, "M"), (1_000, "k")):
        if size % unit == 0:
            return f"{size // unit}{name}"
    return str(size)


def world(size: int) -> dict:
    """The synthetic day's shape at `size` rows: `pingctl synth` options."""
    probes = min(max(size // ROWS_PER_PROBE, MIN_PROBES), MAX_PROBES)
    return {"rows": size, "probes": probes, "targets": TARGETS, "targets_per_probe": TARGETS_PER_PROBE, "seed": SEED}


def _args(stage: str, d: Path, size: int, memory_limit: str) -> list[str]:
    """The command line of `stage` at `size` in the work directory `d` (--force: every output
    here is the bench's own, and one a killed stage left half-written is replaced)."""
    if stage == "synth":
        w = world(size)
        return ["synth", "-o", str(d / "synth"), "--rows", str(w["rows"]), "--probes", str(w["probes"]),
                "--targets", str(w["targets"]), "--targets-per-probe", str(w["targets_per_probe"]),
                "--seed", str(w["seed"]), "--force"]
    if stage == "shard":
        return ["shard", str(d / "synth"), "-o", str(d / "splits"), "--strategy", "regimes",
                "--memory-limit", memory_limit, "--force"]
    if stage == "build-rows":
        return ["build-rows", str(d / "splits" / "train"), "-o", str(d / "rows"), "--by", "both",
                "--memory-limit", memory_limit, "--force"]
    return ["hints", str(d / "splits" / "train"), "-o", str(d / "hints.npz")]


def _counts(stage: str, res: dict) -> dict:
    """What a stage's JSON says it read and wrote (rows), and the shape it worked on."""
    if stage == "synth":
        return {"rows_in": res["rows"], "rows_out": res["rows"], "probes": res["probes"], "pairs": res["pairs"],
                "streams": res["streams"], "failed_rows": res["failed_rows"], "v6_rows": res["v6_rows"],
                "span_s": res["span_s"]}
    if stage == "shard":
        train = next(s for s in res["splits"] if s["split"] == "train")
        return {"rows_in": res["rows_read"], "rows_out": res["rows_written"], "train_rows": train["rows"],
                "train_pairs": train["pairs"]}
    if stage == "build-rows":
        return {"rows_in": res["rows_read"], "rows_out": res["measurements"], "records": res["records"],
                "destination_records": res.get("destination", {}).get("records")}
    return {"rows_in": res["measurements"], "rows_out": res["measurements"], "nodes": res["nodes"],
            "pairs_per_fold": res["pairs"], "estimate_median_rel_err": res["estimate_median_rel_err"]}


def _reconcile(done: dict[str, dict]) -> list[str]:
    """Where one stage's rows in are not what the stage before it wrote: the bench's own check
    that every stage worked on the whole day."""
    want = {"shard": ("synth", "rows_out"), "build-rows": ("shard", "train_rows"), "hints": ("shard", "train_rows")}
    bad = []
    for stage, (before, key) in want.items():
        if stage in done and before in done and done[stage]["rows_in"] != done[before][key]:
            bad.append(f"{stage} read {done[stage]['rows_in']:,} rows, {before} wrote {done[before][key]:,}")
    return bad


def _kept(path: Path, args: list[str]) -> dict | None:
    """A finished stage's record if it is there and ran the same command line, else None."""
    import json

    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(rec, dict) and rec.get("record") == RECORD and rec.get("args") == args
    return rec if ok else None


def run_size(size: int, d: Path, memory_limit: str, progress: Callable[[str, int], None]) -> list[dict]:
    """Every stage at `size` in work directory `d`: one record per stage. A stage whose record
    is kept (same command line) and whose earlier stages were all kept is not run again."""
    done: dict[str, dict] = {}
    records, resumable = [], True
    for i, stage in enumerate(STAGES):
        args = _args(stage, d, size, memory_limit)
        path = d / "stages" / f"{stage}.json"
        rec = _kept(path, args) if resumable else None
        if rec is None:
            resumable = False
            progress(f"{label(size)}: {stage}", i)
            res, seconds, peak = run_measured(args)
            rec = {"record": RECORD, "args": args, "stage": stage, "size": size, "seconds": seconds,
                   "peak_rss_mb": peak, **_counts(stage, res)}
            write_json(path, rec)
            rec = {**rec, "resumed": False}
        else:
            rec = {**rec, "resumed": True}
        done[stage] = rec
        records.append(rec)
    bad = _reconcile(done)
    if bad:
        raise PingctlError(f"bench path at {label(size)}: the stages' rows do not reconcile: {'; '.join(bad)}")
    return records


def growth(t1: float, t2: float, n1: int, n2: int) -> float | None:
    """The exponent k of t ∝ n^k between two sizes: log(t2/t1) / log(n2/n1)."""
    if min(t1, t2) <= 0 or n2 == n1 or min(n1, n2) <= 0:
        return None
    return math.log(t2 / t1) / math.log(n2 / n1)


def _table(records: list[dict]) -> list[dict]:
    """One row per size and stage, with the growth exponent from the size before."""
    before: dict[str, dict] = {}
    rows = []
    for r in records:
        prev = before.get(r["stage"])
        k = growth(prev["seconds"], r["seconds"], prev["rows_in"], r["rows_in"]) if prev else None
        rows.append({"case": label(r["size"]), "stage": r["stage"], "rows_in": r["rows_in"],
                     "wall_s": round(r["seconds"], 2), "rows_per_s": int(r["rows_in"] / max(r["seconds"], 1e-9)),
                     "peak_rss_mb": round(r["peak_rss_mb"], 1), "growth": None if k is None else round(k, 2),
                     "flag": WORSE if k is not None and k > WORSE_THAN_LINEAR else ""})
        before[r["stage"]] = r
    return rows


def bench_path(sizes: list[int], keep: Path | None = None, memory_limit: str = "4GB",
               progress: Callable[[str, int, int], None] = lambda what, done, total: None) -> dict:
    """Run the whole path at each size (smallest first); returns the bench's report dict. Work
    goes to `keep` (kept, resumable) or to a temporary directory removed at the end."""
    # absolute: a stage's record holds its command line, which must not depend on the working directory
    work = Path(keep).resolve() if keep is not None else Path(tempfile.mkdtemp(prefix="pingctl-bench-path-"))
    total = len(sizes) * len(STAGES)
    records: list[dict] = []
    try:
        for size in sizes:
            records.extend(run_size(size, work / label(size), memory_limit,
                                    lambda what, i: progress(what, len(records) + i, total)))
            progress(f"{label(size)}: done", len(records), total)
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    table = _table(records)
    resumed = [f"{label(r['size'])} {r['stage']}" for r in records if r["resumed"]]
    return {"name": "path", "table": table, "sizes": sizes, "work": str(work) if keep is not None else None,
            "worlds": {label(s): world(s) for s in sizes}, "stages": records,
            "worse_than_linear": sorted({f"{r['stage']} ({r['case']})" for r in table if WORSE in r["flag"]}),
            "notes": [
                "each stage is its command in a child process: wall s include its start-up; peak RSS is its own",
                f"growth: log(t2/t1)/log(n2/n1) against the size before, rows in; above {WORSE_THAN_LINEAR} is "
                "flagged worse than linear",
                f"world: probes = rows/{ROWS_PER_PROBE:,} (between {MIN_PROBES} and {MAX_PROBES:,}), {TARGETS} targets, "
                f"{TARGETS_PER_PROBE} per probe, IPv4 and IPv6, failures as synth makes them; seed {SEED}",
                "ingest of RIPE Atlas JSON is `pingctl bench ingest`'s; training, eval and serve are not part of this bench",
                *([f"resumed (figures kept from an earlier run): {', '.join(resumed)}"] if resumed else []),
            ]}
