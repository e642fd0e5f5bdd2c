"""`pingctl fetch`: RIPE Atlas measurement results from the API -> JSON lines for `ingest`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import JsonOpt, emit, err_console, grid_table, handle_errors, kv_table, progress, say

_TIME = "ISO 8601 (naive = UTC), Unix seconds, now, or a time ago such as '7 days ago' or '2h ago'"


def _times(start: str | None, stop: str | None, lookback: str | None) -> tuple[int | None, int | None]:
    from pingctl.errors import UsageError
    from pingctl.ingest.fetch_meta import parse_time
    from pingctl.schema.times import parse_duration

    now = int(time.time())
    if lookback is not None:
        if start is not None or stop is not None:
            raise UsageError("--lookback sets both ends (now less it, to now): give it without --start and --stop")
        return now - parse_duration(lookback, "--lookback", UsageError, bare_seconds=True), now
    return (None if start is None else parse_time(start, "--start", now),
            None if stop is None else parse_time(stop, "--stop", now))


def fetch(
    msm_ids: Annotated[list[int], typer.Argument(help="RIPE Atlas measurement ids (ping measurements).",
                                                 show_default=False)],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory: one subdirectory of JSON lines "
                                      "per measurement (give it to `pingctl ingest`).")],
    start: Annotated[str | None, typer.Option(help=f"Results at/after this time: {_TIME}. Default: the "
                                              "measurement's start.", show_default=False)] = None,
    stop: Annotated[str | None, typer.Option(help=f"Results before this time: {_TIME}. Default: the "
                                             "measurement's stop, or now while it runs.", show_default=False)] = None,
    lookback: Annotated[str | None, typer.Option(help="The last DURATION up to now (7d, 12h, 2w): --start "
                                                 "now less it, --stop now.", show_default=False)] = None,
    probe: Annotated[list[str] | None, typer.Option(
        "--probe", "--probes", help="Only these probes: ids with commas (6090,33194), a file of ids (one a line, "
        "or separated by spaces or commas; # comments) or - for standard input. Repeatable.",
        show_default=False)] = None,
    probe_asn: Annotated[str | None, typer.Option(
        help="Only probes whose address (in the measurement's family) the AS announces: 3320 or 3320,1136 "
        "(resolved with the API's probe list).", show_default=False)] = None,
    probe_country: Annotated[str | None, typer.Option(
        help="Only probes in this country (two-letter code): DE or DE,NL.", show_default=False)] = None,
    probe_prefix: Annotated[str | None, typer.Option(
        help="Only probes with an address in this prefix: 193.0.0.0/21 or 2001:67c:2e8::/48.",
        show_default=False)] = None,
    window: Annotated[str, typer.Option(help="Fetch in time windows of this length (1d, 6h, 30m, seconds): "
                                        "each is one request and one file, the unit a rerun resumes from.")] = "1d",
    api: Annotated[str | None, typer.Option(
        "--api", help="API base URL (else $PINGCTL_ATLAS_API, else https://atlas.ripe.net).")] = None,
    key_env: Annotated[str | None, typer.Option(
        help="Read the API key from this environment variable only. Without it: $RIPE_ATLAS_KEY, else "
        "$ATLAS_FETCH_KEY, else authorisation.fetch in ~/.config/ripe-atlas-tools/rc. Never printed or written.",
        show_default=False)] = None,
    retries: Annotated[int, typer.Option(min=1, max=20, help="Tries per request on HTTP 429/5xx or no answer.")] = 6,
    retry_wait: Annotated[float, typer.Option(min=0.0, help="First wait between tries, seconds (doubled each "
                                              "try, at most 30 s; a longer Retry-After is honoured up to 30 s).")] = 2.0,
    timeout: Annotated[float, typer.Option(min=1.0, help="Seconds for one whole answer (connecting, waiting, "
                                           "receiving the page); past it the try counts as no answer.")] = 120.0,
    max_page_mb: Annotated[float, typer.Option(min=1.0, help="Largest page (one window's results, as decoded) "
                                               "in MB; a larger one fails its measurement: use a shorter "
                                               "--window.")] = 512.0,
    force: Annotated[bool, typer.Option("--force", help="Fetch every window again (forget earlier progress).")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Fetch RIPE Atlas ping measurement results through the API (ripe-atlas-cousteau) as JSON lines.

    The measurement's description is read first: a measurement that is not a ping is refused,
    and the times default to its own start and stop. Each time window is written whole or not
    at all, and recorded as done: the same command run again after an interruption or an API
    failure fetches only what is missing. HTTP 429 and 5xx are retried with backoff; a damaged
    page fails its measurement. See docs/ingest.md.

    Example: pingctl fetch 2001 2013 --start 2019-05-01 --stop 2019-05-08 -o runs/fetch && pingctl ingest runs/fetch -o runs/ingest
    """
    from pingctl.errors import UsageError, require_command

    require_command("fetch")  # before anything is read or written
    from pingctl.ingest.fetch import fetch as run
    from pingctl.ingest.fetch_http import Retry, api_from_env
    from pingctl.ingest.fetch_meta import ProbeFilters, read_probe_ids
    from pingctl.schema.times import parse_duration

    begin, end = _times(start, stop, lookback)
    window_s = parse_duration(window, "--window", UsageError, bare_seconds=True)
    probe_ids = read_probe_ids(probe or [])
    filters = ProbeFilters.parse(probe_asn, probe_country, probe_prefix)
    conn = api_from_env(api, key_env, timeout_s=timeout, retry=Retry(tries=retries, wait_s=retry_wait),
                        max_page_bytes=int(max_page_mb * 1e6))
    with progress(transient=True) as bar:
        task = bar.add_task(f"fetch {len(msm_ids)} measurement(s), windows", total=None)
        summary = run(msm_ids, out, begin, end, probe_ids, filters, window_s, conn, force,
                      on_start=lambda n: bar.update(task, total=n),
                      on_window=lambda m, n: bar.advance(task),
                      on_retry=lambda msg: err_console.print(msg, markup=False, highlight=False, soft_wrap=True))
    summary["exit_code"] = 1 if summary["failed"] else 0
    emit(summary, as_json, _tables(summary, out))
    for w in summary["warnings"]:
        say(w, err=True, label="warning: ")
    for f in summary["failed"]:
        say(f["error"], err=True, label="error: ")
    if summary["failed"]:
        raise typer.Exit(1)
    if not as_json:
        say(f"next: pingctl ingest {out} -o INGEST_DIR", "dim")


def _tables(summary: dict, out: Path) -> list:
    t = grid_table(f"fetch -> {out}", ["measurement", "from (UTC)", "to (UTC)", "probes", "windows\nfetched",
                                       "windows\nkept", "results\nfetched", "results\nin range"],
                   whole=("measurement", "from (UTC)", "to (UTC)"))
    for m in summary["measurements"]:
        span = [f"{m[k]:%Y-%m-%d %H:%M}" if m[k] else "-" for k in ("start", "stop")]
        t.add_row(str(m["msm_id"]), *span, "all" if m["probes"] is None else f"{m['probes']:,}",
                  f"{m['windows_fetched']:,}", f"{m['windows_kept']:,}", f"{m['results_fetched']:,}",
                  f"{m['results_in_range']:,}")
    asked = [f"{summary[k]:%Y-%m-%d %H:%M:%S}" if summary[k] else f"the measurement's {k}" for k in ("start", "stop")]
    rows = [("API", summary["api"]),
            ("API key", f"from {summary['key_source']}" if summary["key"] else "none (public measurements only)"),
            ("time window (UTC)", f"{asked[0]} to {asked[1]}"),
            *_probe_rows(summary["probe_ids"], summary["probe_filters"]),
            ("results fetched", summary["results_fetched"]),
            ("windows fetched / kept", f"{summary['windows_fetched']:,} / {summary['windows_kept']:,}"),
            ("failed measurements", len(summary["failed"])), ("elapsed s", summary["elapsed_s"])]
    return [t, kv_table("fetch summary", rows)]


def _probe_rows(ids: list[int] | None, filters: dict | None) -> list[tuple[str, str]]:
    from pingctl.ingest.fetch_meta import ids_text

    rows = [(f"probe {k}", ", ".join(map(str, v)) if isinstance(v, list) else v) for k, v in (filters or {}).items()]
    return ([("probe ids", ids_text(ids, 20))] if ids else []) + rows or [("probes", "all")]


def register(app) -> None:
    app.command("fetch")(handle_errors(fetch))
