"""Fetch RIPE Atlas ping measurement results through the API (the requests ripe-atlas-cousteau
builds, fetch_http), as JSON lines that `pingctl ingest` reads.

Layout of the output directory OUT (one subdirectory per measurement):

    OUT/MSM_ID/START-STOP.jsonl    the results of one time window [START, STOP) (Unix seconds),
                                   one result per line; renamed into place only once the
                                   whole window was received and every result in it checked
    OUT/MSM_ID/.progress.json      the windows done (a window without results has no file), the
                                   probes asked for (ids and filters, as given); hidden, so
                                   `ingest OUT` never reads it

A window is marked done right after its file is renamed into place, so a rerun of the same
command (after Ctrl-C, a kill or an API failure) fetches only what is missing. A chunk file
that the progress does not list (killed between the two renames) is removed and fetched again.

Before any result, each measurement's description is read (fetch_meta): a measurement that is
not a ping is refused, and the times default to its own start and stop.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pingctl.atomic import is_pingctl_output, MANIFEST, write_json
from pingctl.errors import PingctlError, UsageError
from pingctl.ingest.fetch_http import Api, FetchError, get_window, utc, window_text
from pingctl.ingest.fetch_meta import Measurement, ProbeFilters, ids_text, measurement_info, resolve_probes

PROGRESS = ".progress.json"
DAY_S = 86_400
# each window is one request and one rewrite of the progress file (which grows with the windows
# done): past this a plan is a --window far too short for its span, not a fetch to start
MAX_WINDOWS = 10_000
_FILTER_KEYS = {"asn", "country", "prefix"}


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


def window_count(start: int, stop: int, window_s: int) -> int:
    """How many windows [start, stop) is cut into, without cutting it."""
    return (stop - 1) // window_s - start // window_s + 1


# -- one measurement's progress -----------------------------------------------------------------


def chunk_name(a: int, b: int) -> str:
    return f"{a}-{b}.jsonl"


def read_progress(d: Path) -> dict | None:
    f = d / PROGRESS
    if not f.exists():
        return None
    try:
        p = json.loads(f.read_text())
        wrong = _progress_fault(p)
    except (OSError, ValueError) as e:
        wrong = str(e) or type(e).__name__
    except RecursionError:
        wrong = "nested too deep"
    if wrong:
        raise PingctlError(f"{f}: damaged fetch progress ({wrong}); fetch this measurement again with --force")
    return p


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _filters_fault(f) -> bool:
    return not (isinstance(f, dict) and set(f) <= _FILTER_KEYS
                and isinstance(f.get("asn", []), list) and all(map(_whole, f.get("asn", [])))
                and isinstance(f.get("country", []), list) and all(isinstance(c, str) for c in f.get("country", []))
                and isinstance(f.get("prefix", ""), str))


def _progress_fault(p) -> str | None:
    """What in a progress file's content this module did not write (None: nothing): every field
    it reads is checked here, so a hand-edited file is refused, not a crash later."""
    if not isinstance(p, dict) or not isinstance(p.get("done"), list):
        return "no list of windows done"
    probes = p.get("probe_ids")
    if probes is not None and not (isinstance(probes, list) and all(map(_whole, probes))):
        return "probe_ids is neither null nor a list of probe ids"
    if p.get("probe_filters") is not None and _filters_fault(p["probe_filters"]):
        return "probe_filters is neither null nor the probe filters fetch records"
    for i, w in enumerate(p["done"]):
        if not isinstance(w, dict):
            return f"done[{i}] is not an object"
        a, b, n = w.get("start"), w.get("stop"), w.get("results")
        if not (_whole(a) and _whole(b) and a < b):
            return f"done[{i}]: start and stop are not Unix seconds with start < stop"
        if not (_whole(n) and n >= 0):
            return f"done[{i}]: results is not a count"
        want = chunk_name(a, b) if n else None
        if "file" not in w or w["file"] != want:
            return f"done[{i}]: file is not {json.dumps(want)}"
    return None


def _selection_text(sel: dict) -> str:
    ids, filters = sel["probe_ids"], ProbeFilters.from_record(sel["probe_filters"])
    if ids and filters:
        return f"probe ids {ids_text(ids)} among the probes of {filters.describe()}"
    return f"probe ids {ids_text(ids)}" if ids else f"the probes of {filters.describe()}" if filters else "all probes"


def _resume_from(d: Path, msm_id: int, wanted: dict, force: bool) -> dict:
    """The progress to resume from (an empty one for a new measurement or --force), checked
    against the probes asked for now; reads only, so every refusal comes before any request."""
    if d.exists() and not d.is_dir():
        raise PingctlError(f"{d} exists and is not a directory")
    progress = None if force else read_progress(d)
    if progress is not None:
        had = {"probe_ids": sorted(progress.get("probe_ids") or []) or None,
               "probe_filters": progress.get("probe_filters") or None}
        if had != wanted:
            raise UsageError(f"measurement {msm_id}: {d} was fetched for {_selection_text(had)}, not "
                             f"{_selection_text(wanted)}; write to another directory or pass --force to fetch it again")
        return progress
    if d.is_dir() and not force and any(not e.name.startswith(".") for e in d.iterdir()):
        raise UsageError(f"{d} holds files that pingctl fetch did not write (no {PROGRESS}); "
                         "choose another output or pass --force")
    return {"msm_id": msm_id, **wanted, "done": []}


def _open(d: Path, progress: dict) -> None:
    """Chunk files that the progress does not list are left by a run killed before it recorded
    them: removed."""
    listed = {w["file"] for w in progress["done"] if w.get("file")}
    if d.is_dir():
        for e in d.iterdir():
            if e.name.endswith(".jsonl") and e.name not in listed:
                e.unlink()
    d.mkdir(parents=True, exist_ok=True)


# -- the plan -----------------------------------------------------------------------------------


def check_out(out: Path) -> None:
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {out}: exists and is not a directory")
    if out.is_dir() and is_pingctl_output(out):
        raise UsageError(f"-o {out}: a pingctl output (it has {MANIFEST}); fetch into a directory of its own")


def _check_windows(start: int, stop: int, window_s: int, what: str) -> None:
    n = window_count(start, stop, window_s)
    if n > MAX_WINDOWS:
        raise UsageError(f"{what} in windows of {window_s:,} s (--window) is {n:,} windows per measurement, "
                         f"one request each; at most {MAX_WINDOWS:,} are fetched in one run: give a longer --window "
                         "or a shorter span")


def check_plan(msm_ids: list[int], start: int | None, stop: int | None, window_s: int) -> None:
    """Refuses, before any request, what cannot be fetched as asked."""
    if not msm_ids:
        raise UsageError("give at least one measurement id")
    if start is not None and stop is not None and stop <= start:
        raise UsageError(f"--stop ({utc(stop):%Y-%m-%d %H:%M:%S}) must be after --start ({utc(start):%Y-%m-%d %H:%M:%S})")
    if window_s < 1:
        raise UsageError("--window must be at least one second")
    if start is not None and stop is not None:
        _check_windows(start, stop, window_s, "--start to --stop")


@dataclass
class _Plan:
    msm: Measurement
    d: Path
    progress: dict
    asked: tuple[int, int]  # the window as asked (each end defaulting to the measurement's)
    span: tuple[int, int]  # what is fetched: the window within the measurement's life, before now
    probe_ids: list[int] | None  # None: all probes


def _describe(api: Api, msms: list[int], sleep, on_retry) -> tuple[dict[int, Measurement], list[dict]]:
    """Each measurement's description; the ones the API refuses fail (the others go on), one that
    is not a ping refuses the whole command (exit 2) before any result is asked for."""
    infos, failed = {}, []
    for m in msms:
        try:
            infos[m] = measurement_info(api, m, sleep, on_retry)
        except FetchError as e:
            failed.append({"msm_id": m, "error": str(e)})
    other = [f"{m} is a {i.type} measurement" for m, i in infos.items() if i.type != "ping"]
    if other:
        raise UsageError(f"measurement {'; '.join(other)}: pingctl fetch reads ping measurements only (their "
                         "results are RTTs); leave it out")
    return infos, failed


def _probes(api: Api, msm: Measurement, ids: list[int] | None, filters: ProbeFilters | None, cache: dict,
            sleep, on_retry) -> list[int] | None:
    """The probe ids to ask for: the ids given, the probes the filters select (resolved once per
    address family), or those of the ids the filters select."""
    if filters is None:
        return ids
    if msm.af not in cache:
        cache[msm.af] = resolve_probes(api, filters, msm, sleep, on_retry)
    chosen = sorted(set(cache[msm.af]) & set(ids)) if ids else cache[msm.af]
    if not chosen:
        among = f" among probe ids {ids_text(ids)}" if ids else ""
        raise FetchError(f"measurement {msm.id}: no probe of {filters.describe()} (IPv{msm.af}){among} at "
                         f"{api.base}; nothing was fetched")
    return chosen


def _plan(api: Api, out: Path, infos: dict[int, Measurement], resumed: dict[int, dict], start: int | None,
          stop: int | None, now: int, window_s: int, ids: list[int] | None, filters: ProbeFilters | None,
          sleep, on_retry, failed: list[dict]) -> list[_Plan]:
    plans, cache = [], {}
    for m, msm in infos.items():
        try:
            probe_ids = _probes(api, msm, ids, filters, cache, sleep, on_retry)
        except FetchError as e:
            failed.append({"msm_id": m, "error": str(e)})
            continue
        a, b = msm.span(start, stop, now)
        if a < b:
            _check_windows(a, b, window_s, f"measurement {m}: {window_text(a, b)}")
        asked = (msm.start if start is None else start, b if stop is None else stop)
        plans.append(_Plan(msm, out / str(m), resumed[m], asked, (a, b), probe_ids))
    return plans


# -- the command --------------------------------------------------------------------------------


def fetch(msm_ids: list[int], out: Path, start: int | None = None, stop: int | None = None,
          probe_ids: list[int] | None = None, probe_filters: ProbeFilters | None = None, window_s: int = DAY_S,
          api: Api | None = None, force: bool = False, on_start: Callable[[int], None] | None = None,
          on_window: Callable[[int, int], None] | None = None, on_retry: Callable[[str], None] | None = None,
          sleep: Callable[[float], None] = time.sleep, now: int | None = None) -> dict:
    """Fetch each ping measurement's results in [start, stop) (Unix seconds; each end None: the
    measurement's own) into OUT/MSM_ID/, from the probes given (ids, filters, both: those of the
    ids the filters select; None: all).

    A measurement the API refuses (404, 403) or sends a damaged page for is reported in the
    summary's `failed` and the others are still fetched; an API that keeps failing (429/5xx or
    no complete answer, past the retries) stops the run. A measurement with no result in the
    window is named in `warnings`, with its life."""
    api = api or Api()
    out = Path(out)
    now = int(time.time()) if now is None else now
    check_plan(msm_ids, start, stop, window_s)
    check_out(out)
    wanted = {"probe_ids": sorted(set(probe_ids)) if probe_ids else None,
              "probe_filters": probe_filters.record() if probe_filters else None}
    t0 = time.perf_counter()
    with _redacted(api):
        msms = list(dict.fromkeys(msm_ids))
        resumed = {m: _resume_from(out / str(m), m, wanted, force) for m in msms}
        infos, failed = _describe(api, msms, sleep, on_retry)
        plans = _plan(api, out, infos, resumed, start, stop, now, window_s, wanted["probe_ids"], probe_filters,
                      sleep, on_retry, failed)
        todo = {p.msm.id: _todo(p, window_s) for p in plans}
        if on_start:
            on_start(sum(map(len, todo.values())))
        per_msm = [_fetch_one(api, p, todo[p.msm.id], failed, on_window, on_retry, sleep) for p in plans]
    warnings = [s["warning"] for s in per_msm if s["warning"]]
    return {"out": str(out), "api": api.base, "key": bool(api.key), "key_source": api.key_source,
            "start": None if start is None else utc(start), "stop": None if stop is None else utc(stop),
            "window_s": window_s, "probe_ids": wanted["probe_ids"], "probe_filters": wanted["probe_filters"],
            "measurements": per_msm, "failed": failed, "warnings": warnings,
            "results_fetched": sum(p["results_fetched"] for p in per_msm),
            "windows_fetched": sum(p["windows_fetched"] for p in per_msm),
            "windows_kept": sum(p["windows_kept"] for p in per_msm), "elapsed_s": time.perf_counter() - t0}


def _todo(p: _Plan, window_s: int) -> list[tuple[int, int]]:
    a, b = p.span
    if a >= b:
        return []
    _open(p.d, p.progress)
    return windows(a, b, window_s, [(w["start"], w["stop"]) for w in p.progress["done"]])


def _fetch_one(api: Api, p: _Plan, todo: list[tuple[int, int]], failed: list[dict], on_window, on_retry,
               sleep) -> dict:
    m, d, progress = p.msm.id, p.d, p.progress
    fetched, results, ok = 0, 0, True
    try:
        for a, b in todo:
            n = get_window(api, m, a, b, p.probe_ids, d / chunk_name(a, b), sleep, on_retry)
            _record(d, progress, a, b, n)
            fetched, results = fetched + 1, results + n
            if on_window:
                on_window(m, n)
    except FetchError as e:
        failed.append({"msm_id": m, "error": str(e)})
        ok = False
        if not progress["done"]:  # a measurement that failed at once leaves no empty directory behind
            (d / PROGRESS).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                d.rmdir()
    s = _measurement_summary(p, fetched, results)
    if ok and not s["results_in_range"]:
        outside = " (outside its life: nothing was asked)" if p.span[0] >= p.span[1] else ""
        s["warning"] = (f"measurement {m} ran from {p.msm.life()}; your window {window_text(*p.asked)} has no "
                        f"results{outside}")
    return s


def _record(d: Path, progress: dict, a: int, b: int, results: int) -> None:
    progress["done"].append({"start": a, "stop": b, "results": results, "file": chunk_name(a, b) if results else None})
    progress["done"].sort(key=lambda w: w["start"])
    write_json(d / PROGRESS, progress)


def _measurement_summary(p: _Plan, fetched: int, results: int) -> dict:
    (start, stop), done = p.span, p.progress["done"]
    inside = [w for w in done if w["start"] < stop and w["stop"] > start]
    return {"msm_id": p.msm.id, "dir": str(p.d), "measurement": p.msm.record(),
            "start": utc(start) if start < stop else None, "stop": utc(stop) if start < stop else None,
            "probes": None if p.probe_ids is None else len(p.probe_ids), "windows_fetched": fetched,
            "windows_kept": len(inside) - fetched, "results_fetched": results,
            "results_in_range": sum(w["results"] for w in inside), "files": sum(1 for w in done if w["file"]),
            "warning": None}


@contextlib.contextmanager
def _redacted(api: Api):
    """Whatever error leaves a fetch carries no key, whoever wrote its message (the HTTP
    library's errors quote headers)."""
    try:
        yield
    except Exception as e:
        text = str(e)
        if not api.key or api.key not in text:
            raise
        if isinstance(e, PingctlError):
            raise type(e)(api.redact(text)) from None
        raise RuntimeError(api.redact(f"{type(e).__name__}: {text}")) from None
