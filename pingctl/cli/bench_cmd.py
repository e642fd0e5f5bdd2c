"""`pingctl bench ...`: every performance figure comes from here, as a Rich table plus JSON.

Library bench functions return {"name": ..., "table": [row dicts], ...extra}; this module
only prints and writes them.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import (ConfigOpt, HardwareOpt, JsonOpt, SetOpt, StepOpt, console, emit, fmt, grid_table, handle_errors, load,
                                say)
from pingctl.errors import PingctlError, UsageError

app = typer.Typer(no_args_is_help=True, add_completion=False)

# Upper bounds of every size a bench takes (Typer's max=: a usage error, exit 2, naming the
# option and the bound, before any work). A bench times the work at a size, so a size is
# bounded by what one machine (this one: 2 cores, 23 GB) finishes in about an hour and holds:
MAX_ROWS = 100_000_000  # synth/shard/build-rows: 10x the default; synth writes ~20 B/row to a temp dir
MAX_TOKENIZE = 20_000_000  # bench tokenize --n: the rows, their Measurements and tokens all in memory (~5 GB)
MAX_SAGAN = 1_000_000  # bench ingest --limit: results per file parsed by ripe.atlas.sagan (Python objects)
MAX_WORKERS = 64  # --workers: processes started per case
MAX_SEQ_LEN = 32_768  # --seq-len: a packed sequence (32x the default)
MAX_BATCH = 1_024  # --batch-size: with MAX_SEQ_LEN, 32M tokens a batch
MAX_BATCHES = 100_000  # bench loader --batches
MAX_STEPS = 100_000  # bench train --steps
MAX_QUERIES = 100_000  # bench sample --queries / --exact-queries: distributions per context case
MAX_STREAMS = 10_000  # bench sample --streams: pingctl.infer.questions.MAX_STREAMS, generation's bound
MAX_CONTEXT = 10_000  # bench sample --context: measurements in a prompt of at most seq_len tokens (>= 12 each)

OutOpt = Annotated[
    Path | None, typer.Option("--out", help="Write the JSON report here (default runs/bench/NAME.json).")
]


def _counts(text: str, option: str, lowest: int, highest: int) -> list[int]:
    """A comma-separated list of counts, each in [lowest, highest] (a usage error otherwise)."""

    try:
        values = [int(w) for w in text.split(",")]
    except ValueError:
        raise UsageError(f"{option} {text!r}: give comma-separated whole numbers, like 0,1,2") from None
    if any(v < lowest for v in values):
        raise UsageError(f"{option} {text!r}: each count must be at least {lowest}")
    if any(v > highest for v in values):
        raise UsageError(f"{option} {text!r}: each count must be at most {highest:,}")
    return values


def _memory(text: str) -> None:
    """A memory limit checked as the config checks it, before minutes of benchmark."""
    from pingctl.config import check_memory_limit

    try:
        check_memory_limit(text)
    except ValueError as e:
        raise UsageError(f"--memory-limit {text!r}: {e}") from None


def _check_out(out: Path | None) -> None:
    """Refuse an unusable --out before the benchmark runs (minutes at the default sizes)."""
    from pingctl.atomic import unwritable_reason

    if out is not None and (out.is_dir() or (reason := unwritable_reason(out))):
        raise PingctlError(f"--out {out}: cannot be written ({'a directory' if out.is_dir() else reason})")


def report(result: dict, as_json: bool, out: Path | None) -> None:
    import os

    from pingctl.atomic import write_json

    result.setdefault("machine", {"cpus": os.cpu_count(), "python": platform.python_version()})
    out = out or Path("runs/bench") / f"{result['name']}.json"
    write_json(out, result)
    rows = result.get("table", [])
    cols = list(rows[0].keys()) if rows else []
    names = ("case", "stage", "tool")
    # the figures are the point of a bench: they never break; the case names fold instead
    t = grid_table(f"bench {result['name']}", cols, left=names, whole=tuple(c for c in cols if c not in names),
                   listing=True)
    for r in rows:
        t.add_row(*(fmt(v) for v in r.values()))
    emit(result, as_json, t)
    if not as_json:
        for note in result.get("notes", []):
            console.print(f"  {note}", highlight=False)
        say(f"JSON written to {out}", "dim")


@app.command("ingest")
@handle_errors
def bench_ingest(
    inputs: Annotated[list[Path], typer.Argument(help="RIPE Atlas result files (default: ../shared samples).")] = None,
    workers: Annotated[str, typer.Option(help="Comma-separated worker counts to measure.")] = "1,2",
    sagan: Annotated[bool, typer.Option(help="Also time ripe.atlas.sagan on the same input.")] = True,
    limit: Annotated[int | None, typer.Option(min=1, max=MAX_SAGAN, help="Results per file for the sagan timing.")] = 20000,
    as_json: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Results/s of `pingctl ingest` per worker count, against the RIPE NCC parser.

    Example: pingctl bench ingest ../shared/data/ripe-atlas/*.jsonl.bz2 --workers 1,2
    """
    from pingctl.ingest.bench import bench_ingest as run

    counts = _counts(workers, "--workers", 1, MAX_WORKERS)
    _check_out(out)
    report(run(inputs or [], counts, sagan, limit), as_json, out)


@app.command("synth")
@handle_errors
def bench_synth(
    rows: Annotated[int, typer.Option(min=1, max=MAX_ROWS, help="Rows to generate.")] = 10_000_000,
    seed: Annotated[int, typer.Option(min=0, help="Seed.")] = 0,
    as_json: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Rows/s and peak memory of `pingctl synth`.

    Example: pingctl bench synth --rows 10000000
    """
    from pingctl.synth.bench import bench_synth as run

    _check_out(out)
    report(run(rows, seed), as_json, out)


@app.command("shard")
@handle_errors
def bench_shard(
    rows: Annotated[int, typer.Option(min=1, max=MAX_ROWS, help="Rows of synthetic input to split.")] = 10_000_000,
    strategy: Annotated[str, typer.Option(help="Comma-separated strategies to time.")] = "time,probe",
    memory_limit: Annotated[str, typer.Option(help="DuckDB memory limit.")] = "4GB",
    as_json: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Rows/s and peak memory of `pingctl shard` on synthetic data.

    Example: pingctl bench shard --rows 10000000 --strategy time,probe,pair,random
    """
    from pingctl.shard import bench_shard as run

    strategies = strategy.split(",")
    known = ("time", "probe", "target", "pair", "random", "regimes")
    bad = [s for s in strategies if s not in known]
    if bad:
        raise UsageError(f"--strategy {strategy!r}: {', '.join(map(repr, bad))} is not one of {', '.join(known)}")
    _memory(memory_limit)
    _check_out(out)
    report(run(rows, strategies, memory_limit), as_json, out)


@app.command("tokenize")
@handle_errors
def bench_tokenize(
    n: Annotated[int, typer.Option("--n", min=1000, max=MAX_TOKENIZE, help="Measurements to encode.")] = 1_000_000,
    scheme: Annotated[str, typer.Option(help="compact | full | both.")] = "both",
    as_json: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Tokenizer throughput: from canonical rows (strings) and from pre-parsed rows, per core.

    Example: pingctl bench tokenize --n 1000000 --scheme both
    """
    from pingctl.tokenizer.bench import bench_tokenize as run

    if scheme not in ("compact", "full", "both"):
        raise UsageError(f"--scheme {scheme!r}: compact, full or both")
    _check_out(out)
    report(run(n, scheme), as_json, out)


@app.command("build-rows")
@handle_errors
def bench_build_rows(
    rows: Annotated[int, typer.Option(min=1, max=MAX_ROWS, help="Rows of synthetic input.")] = 10_000_000,
    memory_limit: Annotated[str, typer.Option(help="DuckDB memory limit.")] = "2GB",
    max_row_mb: Annotated[float, typer.Option(min=0.001, help="Record size cap.")] = 8.0,
    as_json: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Measurements/s and peak memory of `pingctl build-rows` on synthetic data.

    Example: pingctl bench build-rows --rows 10000000
    """
    from pingctl.records.build import bench_build_rows as run

    _memory(memory_limit)
    _check_out(out)
    report(run(rows, memory_limit, max_row_mb), as_json, out)


@app.command("path")
@handle_errors
def bench_path(
    size: Annotated[str, typer.Option(
        help="Comma-separated sizes in rows, smallest first (k, M suffixes): one synthetic day each.")] = "1M,10M",
    keep: Annotated[Path | None, typer.Option(
        help="Keep every stage's output and result in this directory; a rerun resumes, redoing only the "
             "stages not finished.")] = None,
    memory_limit: Annotated[str, typer.Option(help="DuckDB memory limit of shard and build-rows.")] = "4GB",
    as_json: JsonOpt = False,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Write the JSON report here (default runs/bench/path.json).")] = None,
) -> None:
    """Synth (shaped like RIPE Atlas built-ins), shard --strategy regimes, build-rows --by both and
    hints at each size, each stage a measured child process: rows in, wall s, rows/s, peak RSS and
    the growth exponent between sizes (above 1.15 flagged worse than linear).

    Example: pingctl bench path --size 1M,10M --keep runs/bench/path-work
    """
    from pingctl.benchpath import bench_path as run, parse_sizes
    from pingctl.cli.common import step_progress

    sizes = parse_sizes(size)
    _memory(memory_limit)
    if keep is not None and keep.exists() and not keep.is_dir():
        raise UsageError(f"--keep {keep}: not a directory")
    _check_out(out)
    with step_progress("bench path") as bar:
        result = run(sizes, keep, memory_limit, progress=bar)
    report(result, as_json, out)


@app.command("loader")
@handle_errors
def bench_loader(
    rows: Annotated[Path | None, typer.Argument(help="A build-rows output (default: synthetic rows).")] = None,
    workers: Annotated[str, typer.Option(help="Comma-separated Grain worker counts.")] = "0,1,2",
    seq_len: Annotated[int, typer.Option(min=32, max=MAX_SEQ_LEN, help="Sequence length.")] = 1024,
    batch_size: Annotated[int, typer.Option(min=1, max=MAX_BATCH, help="Batch size.")] = 8,
    batches: Annotated[int, typer.Option(
        min=50, max=MAX_BATCHES, help="Batches timed per case (after warm-up; fewer would time the prefetch buffer).")] = 600,
    warmup: Annotated[int, typer.Option(
        min=1, max=MAX_BATCHES, help="Batches before timing; raise it (e.g. 800) to time the steady state, every record "
        "decoded and cached, where a long run spends its time.")] = 10,
    scheme: Annotated[str, typer.Option(help="compact | full.")] = "compact",
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    as_json: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Loader throughput (rows -> packed batches) per worker count, padding, mode shares, stages.

    tokens_per_cpu_s divides by the CPU seconds of this process and its workers (Linux): the
    rate per core, steadier than wall-clock rates where other jobs share the cores.

    Other loader settings come from --config/--set (e.g. --set loader.max_per_pair=1). With
    --set loader.triangulation_share=0.5 every case is timed with triangulation on and, right
    after, off (synthetic rows are then built with --by both).

    Example: pingctl bench loader --workers 0,1,2 --seq-len 1024
    """
    from pingctl.loader.bench import bench_loader as run

    loader = load(config, overrides).loader
    counts = _counts(workers, "--workers", 0, MAX_WORKERS)
    if scheme not in ("compact", "full"):
        raise UsageError(f"--scheme {scheme!r}: compact or full")
    _check_out(out)
    result = run(rows, counts, seq_len, batch_size, batches, scheme, loader=loader, warmup=warmup)
    report(result, as_json, out)


@app.command("train")
@handle_errors
def bench_train(
    rows: Annotated[Path | None, typer.Argument(help="Training rows (default: synthetic).")] = None,
    presets: Annotated[str, typer.Option(help="Comma-separated presets.")] = "tiny,mini,small",
    steps: Annotated[int, typer.Option(
        min=3, max=MAX_STEPS, help="Steps per preset (the first two, warm-up, are not timed).")] = 20,
    seq_len: Annotated[int, typer.Option(min=32, max=MAX_SEQ_LEN, help="Sequence length.")] = 1024,
    batch_size: Annotated[int, typer.Option(min=1, max=MAX_BATCH, help="Global batch size.")] = 8,
    hardware: Annotated[str, typer.Option(help="cpu | gpu.")] = "cpu",
    set_: SetOpt = None,
    as_json: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Training throughput per model preset: tokens/s, step time, model TFLOP/s, MFU on GPU, and
    how long a step waited for its batch (near the whole step, the input side sets the pace).

    Example: pingctl bench train ROWS --presets mini --hardware gpu --set loader.triangulation_share=0.5
    """
    from pingctl.train.bench import bench_train as run

    _check_out(out)
    report(run(rows, presets.split(","), steps, seq_len, batch_size, hardware, list(set_ or [])), as_json, out)


@app.command("sample")
@handle_errors
def bench_sample(
    run: Annotated[Path, typer.Argument(help="A `pingctl train` run directory, or a `pingctl export` model.")],
    queries: Annotated[int, typer.Option(
        min=1, max=MAX_QUERIES, help="RTT distributions per context case (read at the quantiles).")] = 64,
    context: Annotated[str, typer.Option(
        help="Comma-separated context sizes (measurements in the prompt) to time the distributions at.")] = "0,24",
    exact_queries: Annotated[int, typer.Option(
        min=0, max=MAX_QUERIES, help="Of those, how many to time with every code computed (0: skip).")] = 4,
    streams: Annotated[int, typer.Option(
        min=0, max=MAX_STREAMS, help="Streams of 4 measurements to generate (0: skip).")] = 8,
    engine: EngineChoiceOpt = None,
    step: StepOpt = None,
    hardware: HardwareOpt = None,
    as_json: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """What a trained model costs to ask, per engine: load, first answer, forward tokens/s, RTT distributions/s
    by context size, generation.

    Example: pingctl bench sample runs/demo/train --queries 64 --context 0,24

    One engine: pingctl bench sample runs/demo/train --engine light
    """
    from pingctl.artifacts.run import parse_steps
    from pingctl.cli.common import step_progress
    from pingctl.infer.bench import bench_engines
    from pingctl.infer.model import LoadedModel
    from pingctl.infer.runtime import check_hardware

    check_hardware(hardware)
    engines = _engines(engine)
    sizes = _counts(context, "--context", 0, MAX_CONTEXT)
    steps = parse_steps(step)
    _check_out(out)
    with step_progress("bench sample") as bar:
        result = bench_engines(lambda e: LoadedModel.load(run, steps, hardware, engine=e), engines, queries, sizes,
                               exact_queries, streams, progress=lambda what: bar(what, 0, None))
    report(result, as_json, out)


EngineChoiceOpt = Annotated[str | None, typer.Option(
    "--engine", help="light, maxtext, numpy, both (light and maxtext) or all (default: both where MaxText is "
                     "installed, else light, or numpy without JAX).")]


def _engines(engine: str | None) -> list[str]:
    """The engines `--engine` names, each one in turn."""
    from pingctl.infer.engines.registry import compared

    return compared(engine)


# bench serve: the clients are threads of one child process, each with its connection; a
# body's context rows are bounded by the service itself (pingctl.serve.schemas.MAX_CONTEXT_ROWS)
MAX_CLIENTS = 256
MAX_SERVE_SECONDS = 600.0
MAX_SERVE_CONTEXT = 4096


@app.command("serve")
@handle_errors
def bench_serve(
    run: Annotated[Path, typer.Argument(help="A `pingctl train` run directory.")],
    requests: Annotated[int, typer.Option(
        min=1, max=MAX_QUERIES, help="Requests per case (after an untimed warm-up).")] = 512,
    clients: Annotated[int, typer.Option(min=1, max=MAX_CLIENTS, help="Concurrent clients of the concurrent cases.")] = 32,
    seconds: Annotated[float, typer.Option(
        min=0.1, max=MAX_SERVE_SECONDS, help="At most this long per case (fewer requests then).")] = 15.0,
    context: Annotated[str, typer.Option(
        help="Comma-separated context sizes (measurements of the probe in every request body).")] = "0,24",
    max_batch: Annotated[int | None, typer.Option(
        min=1, max=MAX_BATCH, help="The micro-batched service's max batch (default: the model's batch).")] = None,
    max_wait_ms: Annotated[float | None, typer.Option(
        min=0.0, max=1000.0, help="The service's batching wait, ms (default: automatic, as `pingctl serve`).")] = None,
    engine: EngineChoiceOpt = None,
    step: StepOpt = None,
    hardware: HardwareOpt = None,
    as_json: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Requests/s, pairs/s and p50/p99 latency of `pingctl serve`: one at a time against micro-batched.

    Example: pingctl bench serve runs/demo/train --clients 32 --requests 512 --context 0,24

    One engine: pingctl bench serve runs/demo/train --engine light
    """
    from pingctl.artifacts.run import parse_steps
    from pingctl.cli.common import step_progress
    from pingctl.infer.model import LoadedModel
    from pingctl.infer.runtime import check_hardware
    from pingctl.serve.bench import bench_serve_engines

    check_hardware(hardware)
    engines = _engines(engine)
    sizes = _counts(context, "--context", 0, MAX_SERVE_CONTEXT)
    steps = parse_steps(step)
    _check_out(out)
    with step_progress("bench serve") as bar:
        result = bench_serve_engines(lambda e: LoadedModel.load(run, steps, hardware, engine=e), engines,
                                     requests=requests, clients=clients, seconds=seconds, contexts=tuple(sizes),
                                     max_batch=max_batch, max_wait_ms=max_wait_ms,
                                     progress=lambda what: bar(what, 0, None))
    report(result, as_json, out)
