"""Fetch RIPE Atlas measurement results through the API with ripe-atlas-cousteau, as JSON lines
that `pingctl ingest` reads.

Layout of the output directory OUT (one subdirectory per measurement):

    OUT/MSM_ID/START-STOP.jsonl    the results of one time window [START, STOP) (Unix seconds),
                                   one result per line as the API sent it; renamed into place
                                   only once the whole window was received
    OUT/MSM_ID/.progress.json      the windows done (a window without results has no file), the
                                   probe ids asked for; hidden, so `ingest OUT` never reads it

A window is marked done right after its file is renamed into place, so a rerun of the same
command (after Ctrl-C, a kill or an API failure) fetches only what is missing. A chunk file
that the progress does not list (killed between the two renames) is removed and fetched again.

The API key is sent in the Authorization header only: never in a URL, a message or a file.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from pingctl.atomic import atomic_file, is_pingctl_output, MANIFEST, write_json
from pingctl.errors import PingctlError, UsageError

DEFAULT_API = "https://atlas.ripe.net"
API_ENV = "PINGCTL_ATLAS_API"
KEY_ENV = "RIPE_ATLAS_KEY"
PROGRESS = ".progress.json"
DAY_S = 86_400
# RIPE Atlas answers busy periods with 429/503; an outage longer than the bounded backoff
# (about a minute at the defaults) is better met by rerunning, which resumes
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Retry:
    tries: int = 6
    wait_s: float = 2.0  # first wait; doubled each try, capped at max_wait_s
    max_wait_s: float = 30.0

    def delay(self, attempt: int, retry_after: str | None) -> float:
        wait = min(self.wait_s * 2 ** attempt, self.max_wait_s)
        if retry_after and retry_after.strip().isdigit():
            wait = max(wait, min(float(retry_after), self.max_wait_s))
        return wait


@dataclass
class Api:
    """Where the API is and how to reach it; `key` None asks as an anonymous user (public
    measurements need no key)."""

    base: str = DEFAULT_API
    key: str | None = field(default=None, repr=False)
    timeout_s: float = 120.0
    retry: Retry = Retry()

    def redact(self, text: str) -> str:
        return text.replace(self.key, "***") if self.key else text


def api_from_env(base: str | None = None, key_env: str = KEY_ENV, **kw) -> Api:
    """The API base from the option, else $PINGCTL_ATLAS_API, else atlas.ripe.net; the key from
    the environment variable `key_env` (unset or empty: no key)."""
    base = (base or os.environ.get(API_ENV) or DEFAULT_API).rstrip("/")
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise UsageError(f"--api {base!r}: expected a URL such as {DEFAULT_API} or http://127.0.0.1:8000")
    return Api(base=base, key=os.environ.get(key_env) or None, **kw)


class FetchError(PingctlError):
    """One measurement could not be fetched for a reason a retry does not fix (404, 403, ...)."""


# -- time windows -------------------------------------------------------------------------------


def windows(start: int, stop: int, window_s: int, done: list[tuple[int, int]] = ()) -> list[tuple[int, int]]:
    """[start, stop) less the `done` intervals, cut at multiples of `window_s` (from the epoch,
    so runs with other --start/--stop cut where earlier runs did)."""
    gaps = [(start, stop)]
    for a, b in sorted(done):
        gaps = [piece for g0, g1 in gaps for piece in ((g0, min(g1, a)), (max(g0, b), g1)) if piece[0] < piece[1]]
    out = []
    for g0, g1 in gaps:
        a = g0
        while a < g1:
            b = min((a // window_s + 1) * window_s, g1)
            out.append((a, b))
            a = b
    return out


# -- one measurement's progress -----------------------------------------------------------------


def chunk_name(a: int, b: int) -> str:
    return f"{a}-{b}.jsonl"


def read_progress(d: Path) -> dict | None:
    f = d / PROGRESS
    if not f.exists():
        return None
    try:
        p = json.loads(f.read_text())
        if not isinstance(p, dict) or not isinstance(p.get("done"), list):
            raise ValueError("no list of windows done")
        return p
    except (OSError, ValueError) as e:
        raise PingctlError(f"{f}: damaged fetch progress ({e}); fetch this measurement again with --force") from None


def _prepare(d: Path, msm_id: int, probe_ids: list[int] | None, force: bool) -> dict:
    """The progress to resume from (an empty one for a new measurement or --force); chunk files
    that it does not list are left by a run killed before it recorded them: removed."""
    if d.exists() and not d.is_dir():
        raise PingctlError(f"{d} exists and is not a directory")
    progress = None if force else read_progress(d)
    if progress is not None and sorted(progress.get("probe_ids") or []) != sorted(probe_ids or []):
        raise UsageError(f"measurement {msm_id}: {d} was fetched for probe ids "
                         f"{progress.get('probe_ids') or 'all'}, not {probe_ids or 'all'}; "
                         "write to another directory or pass --force to fetch it again")
    if progress is None:
        if d.is_dir() and not force and any(not e.name.startswith(".") for e in d.iterdir()):
            raise UsageError(f"{d} holds files that pingctl fetch did not write (no {PROGRESS}); "
                             "choose another output or pass --force")
        progress = {"msm_id": msm_id, "probe_ids": probe_ids, "done": []}
    listed = {w["file"] for w in progress["done"] if w.get("file")}
    if d.is_dir():
        for e in d.iterdir():
            if e.name.endswith(".jsonl") and e.name not in listed:
                e.unlink()
    d.mkdir(parents=True, exist_ok=True)
    return progress


# -- the HTTP requests --------------------------------------------------------------------------


def _request_class():
    """cousteau's AtlasResultsRequest (it builds the path, start/stop and probe_ids parameters
    and the Key header), taught the base URL's scheme (cousteau always writes https://, and a
    test serves on http://127.0.0.1) and to keep the status code and Retry-After it drops."""
    from ripe.atlas.cousteau import AtlasResultsRequest

    class ResultsRequest(AtlasResultsRequest):
        def __init__(self, scheme: str, timeout_s: float, **kw):
            self.scheme, self.status, self.retry_after = scheme, None, None
            super().__init__(**kw)
            self.http_method_args["timeout"] = timeout_s

        def build_url(self):
            self.url = f"{self.scheme}://{self.server}{self.url_path}"

        def get_http_method(self, method):
            response = super().get_http_method(method)
            self.status, self.retry_after = response.status_code, response.headers.get("Retry-After")
            return response

    return ResultsRequest


def _utc(s: int) -> dt.datetime:
    # cousteau's clean_time reads an int with the deprecated utcfromtimestamp; an aware datetime
    # goes through calendar.timegm(timetuple()) unchanged
    return dt.datetime.fromtimestamp(s, dt.timezone.utc)


def _detail(message) -> str:
    if isinstance(message, dict):
        err = message.get("error", message)
        if isinstance(err, dict):
            return str(err.get("detail") or err.get("title") or err)
        return str(err)
    if isinstance(message, tuple):  # a requests exception's args
        return "; ".join(map(str, message))
    return str(message)[:300]


def get_window(api: Api, msm_id: int, a: int, b: int, probe_ids: list[int] | None,
               sleep: Callable[[float], None] = time.sleep, on_retry: Callable[[str], None] | None = None) -> list:
    """The results of measurement `msm_id` with a timestamp in [a, b): the API's start and stop
    are both inclusive (whole seconds), so stop is b - 1."""
    parts = urlsplit(api.base)
    cls = _request_class()
    for attempt in range(api.retry.tries):
        req = cls(parts.scheme, api.timeout_s, server=parts.netloc, key=api.key, msm_id=msm_id,
                  start=_utc(a), stop=_utc(b - 1), probe_ids=probe_ids or None)
        req.url_path = parts.path + req.url_path
        ok, message = req.create()
        if ok and isinstance(message, list):
            return message
        where = f"measurement {msm_id}, {_window_text(a, b)}"
        if ok:
            raise PingctlError(f"{where}: the API at {api.base} answered {type(message).__name__}, "
                               "not a list of results (is --api the RIPE Atlas API?)")
        status, detail = req.status, api.redact(_detail(message))
        if status is not None and status not in RETRY_STATUS:
            raise FetchError(_refusal(msm_id, status, detail, api))
        what = f"HTTP {status}" if status is not None else f"no answer ({detail})"
        if attempt + 1 == api.retry.tries:
            raise PingctlError(f"{where}: {what} after {api.retry.tries} tries from {api.base}; the windows "
                               "fetched are kept: run the same command again to resume")
        wait = api.retry.delay(attempt, req.retry_after)
        if on_retry:
            on_retry(f"{where}: {what}; retry {attempt + 1} of {api.retry.tries - 1} in {wait:.1f} s")
        sleep(wait)
    raise AssertionError("unreachable")


def _refusal(msm_id: int, status: int, detail: str, api: Api) -> str:
    if status == 404:
        why = "no such measurement (check the id)"
    elif status in (401, 403):
        why = (f"refused: the key in ${KEY_ENV} is not valid or may not read this measurement" if api.key else
               f"refused: a private measurement needs an API key in ${KEY_ENV}")
    else:
        why = "the API refused the request"
    return f"measurement {msm_id}: HTTP {status} from {api.base}: {why} ({detail})"


def _window_text(a: int, b: int) -> str:
    f = "%Y-%m-%d %H:%M"
    return f"{_utc(a).strftime(f)} to {_utc(b).strftime(f)} UTC"


# -- the command --------------------------------------------------------------------------------


def check_out(out: Path) -> None:
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {out}: exists and is not a directory")
    if out.is_dir() and is_pingctl_output(out):
        raise UsageError(f"-o {out}: a pingctl output (it has {MANIFEST}); fetch into a directory of its own")


def fetch(msm_ids: list[int], out: Path, start: int, stop: int, probe_ids: list[int] | None = None,
          window_s: int = DAY_S, api: Api | None = None, force: bool = False,
          on_start: Callable[[int], None] | None = None, on_window: Callable[[int, int], None] | None = None,
          on_retry: Callable[[str], None] | None = None, sleep: Callable[[float], None] = time.sleep) -> dict:
    """Fetch each measurement's results in [start, stop) (Unix seconds) into OUT/MSM_ID/.

    A measurement the API refuses (404, 403) is reported in the summary's `failed` and the
    others are still fetched; an API that keeps failing (429/5xx past the retries) stops the run."""
    api = api or Api()
    out = Path(out)
    if not msm_ids:
        raise UsageError("give at least one measurement id")
    if stop <= start:
        raise UsageError(f"--stop ({_utc(stop):%Y-%m-%d %H:%M:%S}) must be after --start ({_utc(start):%Y-%m-%d %H:%M:%S})")
    if window_s < 1:
        raise UsageError("--window must be at least one second")
    check_out(out)
    t0 = time.perf_counter()
    plans = []
    for m in dict.fromkeys(msm_ids):
        d = out / str(m)
        progress = _prepare(d, m, probe_ids, force)
        todo = windows(start, stop, window_s, [(w["start"], w["stop"]) for w in progress["done"]])
        plans.append((m, d, progress, todo))
    if on_start:
        on_start(sum(len(p[3]) for p in plans))
    per_msm, failed = [], []
    for m, d, progress, todo in plans:
        fetched_windows = results = 0
        try:
            for a, b in todo:
                rows = get_window(api, m, a, b, probe_ids, sleep, on_retry)
                name = None
                if rows:
                    name = chunk_name(a, b)
                    with atomic_file(d / name) as tmp:
                        _write_lines(tmp, rows)
                progress["done"].append({"start": a, "stop": b, "results": len(rows), "file": name})
                progress["done"].sort(key=lambda w: w["start"])
                write_json(d / PROGRESS, progress)
                fetched_windows += 1
                results += len(rows)
                if on_window:
                    on_window(m, len(rows))
        except FetchError as e:
            failed.append({"msm_id": m, "error": str(e)})
            if not progress["done"]:  # a wrong id leaves no empty directory behind
                (d / PROGRESS).unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    d.rmdir()
        inside = [w for w in progress["done"] if w["start"] < stop and w["stop"] > start]
        per_msm.append({"msm_id": m, "dir": str(d), "windows_fetched": fetched_windows,
                        "windows_kept": len(inside) - fetched_windows, "results_fetched": results,
                        "results_in_range": sum(w["results"] for w in inside),
                        "files": sum(1 for w in progress["done"] if w["file"])})
    elapsed = time.perf_counter() - t0
    return {"out": str(out), "api": api.base, "key": bool(api.key), "start": _utc(start), "stop": _utc(stop),
            "window_s": window_s, "probe_ids": probe_ids, "measurements": per_msm, "failed": failed,
            "results_fetched": sum(p["results_fetched"] for p in per_msm),
            "windows_fetched": sum(p["windows_fetched"] for p in per_msm),
            "windows_kept": sum(p["windows_kept"] for p in per_msm), "elapsed_s": elapsed}


def _write_lines(path: Path, rows: list) -> None:
    import orjson

    with open(path, "wb") as f:
        for r in rows:
            f.write(orjson.dumps(r))
            f.write(b"\n")
