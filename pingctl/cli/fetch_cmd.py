"""`pingctl fetch`: RIPE Atlas measurement results from the API -> JSON lines for `ingest`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import JsonOpt, emit, err_console, grid_table, handle_errors, kv_table, option_time, progress, say


def _window_seconds(text: str) -> int:
    from pingctl.errors import UsageError

    units = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
    t = text.strip().lower()
    num, unit = (t[:-1], t[-1]) if t and t[-1] in units else (t, "s")
    if not num.isdigit() or int(num) == 0:
        raise UsageError(f"--window {text!r}: expected a positive duration such as 1d, 6h, 30m or 3600")
    return int(num) * units[unit]


def fetch(
    msm_ids: Annotated[list[int], typer.Argument(help="RIPE Atlas measurement ids (ping measurements).",
                                                 show_default=False)],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory: one subdirectory of JSON lines "
                                      "per measurement (give it to `pingctl ingest`).")],
    start: Annotated[str, typer.Option(help="Results at/after this UTC time (ISO 8601 or Unix seconds).")],
    stop: Annotated[str, typer.Option(help="Results before this UTC time (ISO 8601 or Unix seconds).")],
    probe: Annotated[list[int] | None, typer.Option("--probe", help="Only this probe id (repeatable).")] = None,
    window: Annotated[str, typer.Option(help="Fetch in time windows of this length (1d, 6h, 30m, seconds): "
                                        "each is one request and one file, the unit a rerun resumes from.")] = "1d",
    api: Annotated[str | None, typer.Option(
        "--api", help="API base URL (else $PINGCTL_ATLAS_API, else https://atlas.ripe.net).")] = None,
    key_env: Annotated[str, typer.Option(help="Environment variable holding the API key (needed for private "
                                         "measurements; never printed or written).")] = "RIPE_ATLAS_KEY",
    retries: Annotated[int, typer.Option(min=1, max=20, help="Tries per window on HTTP 429/5xx or no answer.")] = 6,
    retry_wait: Annotated[float, typer.Option(min=0.0, help="First wait between tries, seconds (doubled each "
                                              "try, at most 30 s; a longer Retry-After is honoured up to 30 s).")] = 2.0,
    timeout: Annotated[float, typer.Option(min=1.0, help="Seconds to wait for one answer.")] = 120.0,
    force: Annotated[bool, typer.Option("--force", help="Fetch every window again (forget earlier progress).")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Fetch RIPE Atlas measurement results through the API (ripe-atlas-cousteau) as JSON lines.

    Each time window is written whole or not at all, and recorded as done: the same command run
    again after an interruption or an API failure fetches only what is missing. HTTP 429 and 5xx
    are retried with backoff. See docs/ingest.md.

    Example: pingctl fetch 2001 2013 --start 2019-05-01 --stop 2019-05-08 -o runs/fetch && pingctl ingest runs/fetch -o runs/ingest
    """
    from pingctl.ingest.fetch import Retry, api_from_env, fetch as run

    begin, end = option_time(start, "--start"), option_time(stop, "--stop")
    conn = api_from_env(api, key_env, timeout_s=timeout, retry=Retry(tries=retries, wait_s=retry_wait))
    with progress(transient=True) as bar:
        task = bar.add_task(f"fetch {len(msm_ids)} measurement(s), windows", total=None)
        summary = run(msm_ids, out, begin, end, probe or None, _window_seconds(window), conn, force,
                      on_start=lambda n: bar.update(task, total=n),
                      on_window=lambda m, n: bar.advance(task),
                      on_retry=lambda msg: err_console.print(msg, markup=False, highlight=False, soft_wrap=True))
    summary["exit_code"] = 1 if summary["failed"] else 0
    t = grid_table(f"fetch -> {out}", ["measurement", "windows\nfetched", "windows\nkept", "results\nfetched",
                                       "results\nin range"], whole=("measurement",))
    for m in summary["measurements"]:
        t.add_row(str(m["msm_id"]), f"{m['windows_fetched']:,}", f"{m['windows_kept']:,}",
                  f"{m['results_fetched']:,}", f"{m['results_in_range']:,}")
    rows = [("API", summary["api"]), ("API key", "yes" if summary["key"] else "no (public measurements only)"),
            ("time window (UTC)", f"{summary['start']:%Y-%m-%d %H:%M:%S} to {summary['stop']:%Y-%m-%d %H:%M:%S}"),
            ("probe ids", ", ".join(map(str, probe)) if probe else "all"),
            ("results fetched", summary["results_fetched"]), ("windows fetched / kept", 
             f"{summary['windows_fetched']:,} / {summary['windows_kept']:,}"),
            ("failed measurements", len(summary["failed"])), ("elapsed s", summary["elapsed_s"])]
    emit(summary, as_json, [t, kv_table("fetch summary", rows)])
    for f in summary["failed"]:
        say(f["error"], err=True, label="error: ")
    if summary["failed"]:
        raise typer.Exit(1)
    if not as_json:
        say(f"next: pingctl ingest {out} -o INGEST_DIR", "dim")


def register(app) -> None:
    app.command("fetch")(handle_errors(fetch))
