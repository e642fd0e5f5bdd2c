"""Shared CLI plumbing: config options, error handling, JSON/table output, progress."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Callable

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pingctl.atomic import json_default

console = Console()
err_console = Console(stderr=True)

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="YAML config file (see `pingctl config init`).")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-S", metavar="KEY=VALUE", help="Override a config key, e.g. data.shard.seed=3."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an output directory pingctl did not write.")]
MemoryLimitOpt = Annotated[str | None, typer.Option(help="DuckDB memory limit, e.g. 4GB (larger inputs spill).")]
HardwareOpt = Annotated[str | None, typer.Option(
    help="Run the model on cpu or gpu (default: as the run was trained, its train.hardware; a run "
         "trained for a GPU is then asked on the CPU where JAX finds none).")]
EngineOpt = Annotated[str | None, typer.Option(
    help="What runs the model: light (plain JAX, no MaxText), maxtext (the reference) or numpy (no JAX; "
         "slower); default: $PINGCTL_ENGINE, else light where JAX is installed and numpy where not.")]
StepOpt = Annotated[str | None, typer.Option(
    help="Checkpoint step (default: the latest); several, comma-separated (1000,1100,1200), "
         "average those checkpoints' weights.")]
AnswerOpt = Annotated[str | None, typer.Option(
    metavar="model|combined|classical",
    help="Which predictor answers RTT questions: model; combined: the model pooled with the classical estimate "
         "of the question's regime (the pair's own packets in the prompt, else the run's hints), weighted as "
         "`pingctl eval RUN --regimes SPLITS` fitted it; classical: that estimate alone. Default: combined where "
         "the run's combination.json fits and was better than the model on val, else model; each answer says "
         "which and why.")]
CombinationOpt = Annotated[Path | None, typer.Option(
    help="The combination.json to pool with (default: RUN/combination.json, or an export's copy).")]
RevisionOpt = Annotated[str | None, typer.Option(
    help="A model given as a Hugging Face Hub repo id: its branch, tag or commit (default: main).")]

# The options of a fanned-out step (`ingest`, `build-rows` with --target slurm|modal), in the
# help panels they share.
SLURM_PANEL = "SLURM (--target slurm)"
MODAL_PANEL = "Modal (--target modal)"
PartitionOpt = Annotated[str | None, typer.Option(help="SLURM partition.", rich_help_panel=SLURM_PANEL)]
AccountOpt = Annotated[str | None, typer.Option(help="SLURM account.", rich_help_panel=SLURM_PANEL)]
QosOpt = Annotated[str | None, typer.Option(help="SLURM quality of service.", rich_help_panel=SLURM_PANEL)]
TimeLimitOpt = Annotated[str, typer.Option(help="Time limit per task.", rich_help_panel=SLURM_PANEL)]
MaxParallelOpt = Annotated[int, typer.Option(help="At most this many tasks at once (0 = no limit).",
                                             rich_help_panel=SLURM_PANEL)]
SetupOpt = Annotated[str, typer.Option(help="Shell lines each task runs first, e.g. 'module load python'.",
                                       rich_help_panel=SLURM_PANEL)]
ModalCpuOpt = Annotated[float, typer.Option(help="CPUs per Modal call.", rich_help_panel=MODAL_PANEL)]


def load(config: Path | None, overrides: list[str] | None, **cli_values: Any):
    """Resolve the config; `cli_values` maps dotted keys to explicit option values (None = unset)."""
    from pingctl.config import load_config

    return load_config(config, overrides, cli_values)


def model_dir(model: Path, revision: str | None = None) -> Path:
    """A command's model argument as the directory it names: itself, or, for a Hugging Face Hub
    repo id (`owner/name` that is no path here), the local snapshot of that repo at `revision`."""
    from pingctl.artifacts.hub import resolve_model_path

    return resolve_model_path(str(model), revision)


_JSON_OUT: contextvars.ContextVar = contextvars.ContextVar("pingctl_json_stdout", default=None)


def _stdout():
    """Where machine output goes: the real stdout, also while a --json command's prints are sent to stderr."""
    return _JSON_OUT.get() or sys.stdout


@contextlib.contextmanager
def _machine_stdout():
    """With --json stdout carries one JSON document: anything else printed there (MaxText's import
    prints "[NO-OP] gcs_storage dependency missing" where the GCS client is absent) would make it
    unparseable, so prints go to stderr and only emit()/_fail() write to the real stdout."""
    token = _JSON_OUT.set(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _JSON_OUT.reset(token)


def handle_errors(fn: Callable) -> Callable:
    """User errors become one red message and a non-zero exit, never a traceback; with --json
    the same error is also one JSON object on stdout, so a script reading stdout sees why."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from pingctl.errors import PingctlError, duckdb_interrupted, duckdb_out_of_memory, missing_extra

        as_json = bool(kwargs.get("as_json"))
        try:
            with _machine_stdout() if as_json else contextlib.nullcontext():
                return fn(*args, **kwargs)
        except PingctlError as e:
            _debug_traceback()
            _fail(as_json, e.kind, str(e), e.exit_code)
        except KeyboardInterrupt:
            _fail(as_json, "interrupted", _interrupted(fn), 130)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except Exception as e:  # noqa: BLE001 - last line of defence for the user
            if duckdb_interrupted(e):
                _fail(as_json, "interrupted", _interrupted(fn), 130)
            debug = _debug_traceback()
            missing = missing_extra(e)
            if missing:
                _fail(as_json, "input", missing, 1)
            if _damaged_input(e):
                _fail(as_json, "input", f"damaged input: {e}", 1)
            full = _disk_full(e, kwargs)
            if full:
                _fail(as_json, "input", full, 1)
            if duckdb_out_of_memory(e):
                _fail(as_json, "input", "DuckDB ran out of memory under its memory limit: raise it (--memory-limit, "
                      f"or data.shard.memory_limit / rows.memory_limit) or use fewer threads ({str(e).splitlines()[0]})",
                      1)
            _fail(as_json, "internal", f"{type(e).__name__}: {e}", 70,
                  hint="" if debug else "  rerun with PINGCTL_DEBUG=1 for the traceback and please report it")

    return wrapper


def _debug_traceback() -> bool:
    """With PINGCTL_DEBUG set, the traceback of the error being handled, on stderr; the exit
    code stays the one the error has (a re-raise would turn every one into 1)."""
    if not os.environ.get("PINGCTL_DEBUG"):
        return False
    import traceback

    sys.stderr.write(traceback.format_exc())
    sys.stderr.flush()
    return True


_LABELS = {"interrupted": ("interrupted: ", "yellow"), "internal": ("internal error: ", "bold red")}


def _fail(as_json: bool, kind: str, message: str, code: int, hint: str = ""):
    label, style = _LABELS.get(kind, ("error: ", "bold red"))
    # Text, not markup: a message quotes user input, and "[...]" in it must print as given
    err_console.print(Text.assemble((label, style), message, "\n" + hint if hint else ""),
                      highlight=False, soft_wrap=True)
    if as_json:
        _stdout().write(json.dumps({"error": {"kind": kind, "message": message, "exit_code": code}},
                                   indent=2, sort_keys=True, allow_nan=False) + "\n")
    raise typer.Exit(code) from None


def _interrupted(fn: Callable) -> str:
    if fn.__name__ == "train":
        return "the run keeps its committed checkpoints; the same command resumes from the last one"
    if fn.__name__ == "evaluate":
        return "the output directory's .resume/ keeps the model's finished passes; the same command reuses them"
    return "nothing was left looking complete; run the command again"


def say(text: str, style: str = "", err: bool = False, label: str = "") -> None:
    """One styled line whose text (paths, option values, messages) prints as given: as a
    markup string, "o[red]x" in a path would lose its brackets."""
    label_style = {"error: ": "bold red", "warning: ": "yellow"}.get(label, style)
    (err_console if err else console).print(Text.assemble((label, label_style), (text, style)), highlight=False,
                                            soft_wrap=True)


def _damaged_input(e: Exception) -> bool:
    """DuckDB reading a file that is damaged past its footer (a bad page found mid-query): an
    input problem, and DuckDB's message names the file."""
    return type(e).__module__.lstrip("_").startswith("duckdb") and "Failed to read file" in str(e)


# The output option of each command that writes one (train: --run-dir, None = from the config)
_OUTPUT_KWARGS = ("out", "run_dir")


def _disk_full(e: BaseException, kwargs: dict) -> str | None:
    """A full disk or an exhausted quota (ENOSPC, EDQUOT), as an OSError from Python, pyarrow or
    a worker process, or as the text of DuckDB's, ArrayRecord's or Orbax's own error types: an
    environment problem, so the message names where it wrote and what is free there now; None
    for any other error. Every output is written atomically, so nothing looks complete."""
    import errno
    import re
    import shutil

    names = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}
    texts = {os.strerror(code): code for code in names}  # "No space left on device", "Disk quota exceeded"
    code, culprit, seen, x = None, None, set(), e
    while x is not None and id(x) not in seen and code is None:  # the error or what it was raised from
        seen.add(id(x))
        if isinstance(x, OSError) and x.errno in names:
            code, culprit = x.errno, x
        else:
            code = next((c for t, c in texts.items() if t in str(x)), None)
            culprit = x
        x = x.__cause__ or x.__context__
    if code is None:
        return None
    out = next((kwargs[k] for k in _OUTPUT_KWARGS if kwargs.get(k) is not None), None)
    file = getattr(culprit, "filename", None)
    if file is None:  # DuckDB and ArrayRecord name the file in their text
        m = re.search(r'"(/[^"]+)"|writing (/\S+?);', str(culprit))
        file = m and (m.group(1) or m.group(2))
    where = out if out is not None else file
    if where is None:
        return f"{names[code]} ({str(culprit).splitlines()[0]}): free some space, or write the output elsewhere"
    space = ""
    probe = Path(os.path.abspath(where))
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        usage = shutil.disk_usage(probe)
        space = f"; its file system ({probe}) has {_size(usage.free)} free of {_size(usage.total)} now"
    except OSError:
        pass
    detail = str(culprit).splitlines()[0] if str(culprit) else type(culprit).__name__
    return (f"{names[code]} writing {where}{space}: free some space or write the output elsewhere "
            f"({type(culprit).__name__}: {detail})")


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n} TB"


NON_FINITE = "non_finite"  # the --json key that says which values are null for being NaN or infinite


def emit(result: dict, as_json: bool, table: Table | list[Table] | None = None) -> None:
    """Machine output (--json) is the only thing on stdout; otherwise Rich tables."""
    if as_json:
        _stdout().write(json_text(result) + "\n")
        return
    for t in table if isinstance(table, list) else [table] if table is not None else []:
        console.print(t)


def json_text(result: Any) -> str:
    """`result` as strict JSON: NaN and infinity are not JSON (a parser that follows the standard
    refuses the whole document), so each becomes null, and a dict result says which and why under
    "non_finite" ({"rows[3].p_fail": "NaN"}), also in a warning on stderr."""
    bad: dict[str, str] = {}
    clean = _finite_json(result, "", bad)
    if bad:
        if isinstance(clean, dict):
            clean = {**clean, NON_FINITE: bad}
        shown = ", ".join(f"{k} ({v})" for k, v in list(bad.items())[:5]) + (" ..." if len(bad) > 5 else "")
        say(f"{len(bad)} value(s) are not finite numbers, printed as null: {shown}", err=True, label="warning: ")
    return json.dumps(clean, indent=2, sort_keys=True, default=json_default, allow_nan=False)


def _finite_json(v: Any, path: str, bad: dict[str, str]) -> Any:
    if isinstance(v, dict):
        return {k: _finite_json(x, f"{path}.{k}" if path else str(k), bad) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite_json(x, f"{path}[{i}]", bad) for i, x in enumerate(v)]
    numpy_float = getattr(v, "ndim", None) == 0 and getattr(getattr(v, "dtype", None), "kind", "") == "f"
    if isinstance(v, float) or numpy_float:
        f = float(v)
        if f != f or f in (float("inf"), float("-inf")):
            bad[path or "(value)"] = "NaN" if f != f else ("Infinity" if f > 0 else "-Infinity")
            return None
    return v


def kv_table(title: str, rows: list[tuple[str, Any]]) -> Table:
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    # fold, not ellipsis: a long path in an 80-column terminal must stay whole to be copied
    t.add_column("value", justify="right", overflow="fold")
    for k, v in rows:
        text = fmt(v)
        # a path that folds reads as a path only when its pieces start at the left
        path_like = isinstance(v, Path) or (isinstance(v, str) and "/" in v and " " not in v)
        # Text, not a markup string: a value like "pingctl[train]" must print as written
        t.add_row(k, Text(text, justify="left" if path_like else "right"))
    return t


def grid_table(title: str, columns: list[str], left: tuple[str, ...] = (), whole: tuple[str, ...] = (),
               listing: bool = False) -> Table:
    """A many-column table that still reads at 80 columns (CI logs, piped output): no outer
    frame and headers that break at "\n"; where even that is too wide, cells fold (never an
    ellipsis), so no name or figure loses characters."""
    from rich import box

    # a listing of records (sample rows) separates columns by one space: an IPv4 pair then fits
    frame = dict(box=None, collapse_padding=True) if listing else dict(box=box.MINIMAL)
    t = Table(title=title, title_justify="left", pad_edge=False, show_edge=False, **frame)
    for c in columns:
        # `whole` columns (numbers, times) never break; the others (addresses) fold to make room
        t.add_column(c, justify="left" if c in left else "right", overflow="fold", no_wrap=c in whole)
    return t


def fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != v:
            return "-"
        return f"{v:,.3f}" if abs(v) < 1000 else f"{v:,.0f}"
    return "-" if v is None else str(v)


@contextlib.contextmanager
def step_progress(name: str):
    """A transient bar; yields `report(step, done, total)` for library progress callbacks."""
    with progress(transient=True) as bar:
        task = bar.add_task(name, total=None)

        def report(step: str, done: int, total: int) -> None:
            bar.update(task, description=step, completed=done, total=total)

        yield report


def progress(transient: bool = False):
    """A Rich progress bar on stderr (stdout stays clean for --json)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=transient,
    )


def read_valid_rows(inputs: list[Path], limit: int | None, what: str = ""):
    """The first `limit` rows (None: all) of canonical Parquet inputs that pingctl accepts, and
    what became of the rest: (Arrow table, {"rows_read", "rows_rejected", "rejected"}). A row
    build-rows would reject (an RTT of 1e300, a negative size, an address of the wrong family)
    is skipped with a warning naming reason, file and row: shown or used as a prompt, it would
    stand for something training never sees. `what` prefixes the messages (e.g. "--context")."""
    from pingctl.artifacts.table import resolve_inputs
    from pingctl.schema.duck import rejected_lines, valid_head

    label = (what + " " if what else "") + ", ".join(map(str, inputs))
    table, info = valid_head(resolve_inputs(inputs), limit, label)
    if info["rejected"]:
        first = "" if limit is None else "the first "
        say(f"{label}: skipped {info['rows_rejected']:,} of {first}{info['rows_read']:,} rows, which build-rows would "
            "reject:", err=True, label="warning: ")
        for line in rejected_lines(info["rejected"]):
            say(line, err=True)
    return table, info


def option_time(text: str | None, option: str = "--time") -> int | None:
    """A time option as users give it (ISO 8601 or Unix seconds) -> Unix seconds; None when
    the option is not given."""
    from pingctl.errors import UsageError
    from pingctl.schema.times import parse_when

    if text is not None and not text.strip():  # parse_when reads "" as "no time" (an unset config key)
        raise UsageError(f"{option} is empty: give ISO 8601 or Unix seconds")
    us = parse_when(text, option, UsageError)
    return None if us is None else us // 1_000_000


def print_engine_plan(r: dict) -> None:
    """A fanned-out step's --dry-run: the SLURM job array script(s) or the Modal app it would run."""
    for i, script in enumerate(r.get("scripts", [])):
        console.rule(f"SLURM job array script{'' if len(r['scripts']) == 1 else f' {i + 1}'} (sbatch)")
        console.print(script, markup=False, highlight=False, soft_wrap=True)
    if r.get("modal"):
        console.rule("Modal")
        console.print("\n".join(f"{k}: {v}" for k, v in r["modal"].items()), markup=False, highlight=False,
                      soft_wrap=True)
