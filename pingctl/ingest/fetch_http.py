"""The requests of `pingctl fetch`: built by ripe-atlas-cousteau (its public request classes:
URL path, query parameters, headers with the key as `Authorization: Key ...`), sent and read
here, every answer bounded.

Bounded in time (`Api.timeout_s` for a whole answer, not each socket read), in size
(`Api.max_page_bytes` for a page of results, `META_MAX_BYTES` for a metadata answer, as decoded)
and in what it may hold (fetch_page). The API key is sent in the Authorization header only:
never in a URL, a message or a file.
"""

from __future__ import annotations

import codecs
import contextlib
import datetime as dt
import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import urlsplit

from pingctl.atomic import atomic_file
from pingctl.errors import PingctlError, UsageError
from pingctl.ingest.fetch_key import KEY_ENV, RC_FIELD, TOOLS_ENV, find_key, rc_path
from pingctl.ingest.fetch_page import PageError, one_object, page_lines

DEFAULT_API = "https://atlas.ripe.net"
API_ENV = "PINGCTL_ATLAS_API"
# The ripe-atlas-cousteau releases fetch was tested with (pyproject.toml pins the same range):
# fetch reads the URL path and the requests arguments its request objects build, which a
# release outside it may build otherwise
COUSTEAU_RANGE = ">=2.3,<2.4"
# RIPE Atlas answers busy periods with 429/503; an outage longer than the bounded backoff
# (about a minute at the defaults) is better met by rerunning, which resumes
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
# a day of a busy measurement is tens of MB; a page past this is a --window too long for it, or
# not the API
DEFAULT_MAX_PAGE_MB = 512
# a measurement's description is a few kB, a page of 500 probes under 1 MB
META_MAX_BYTES = 16_000_000
# probe ids per results request: about 4,000 characters of query string, under the URL lengths
# servers and proxies take (cousteau's listings split theirs at the same count)
PROBE_CHUNK = 500
_READ = 1 << 16  # bytes per network read
_ERROR_BODY = 1 << 16  # what is read of a refusal's body, for its message


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
    measurements need no key), `key_source` says where the key came from (fetch_key).
    `timeout_s` bounds one whole answer, `max_page_bytes` one page of results as decoded."""

    base: str = DEFAULT_API
    key: str | None = field(default=None, repr=False)
    timeout_s: float = 120.0
    retry: Retry = Retry()
    max_page_bytes: int = DEFAULT_MAX_PAGE_MB * 1_000_000
    key_source: str | None = None

    def redact(self, text: str) -> str:
        return text.replace(self.key, "***") if self.key else text


def api_from_env(base: str | None = None, key_env: str | None = None, **kw) -> Api:
    """The API base from the option, else $PINGCTL_ATLAS_API, else atlas.ripe.net; the key from
    its sources (fetch_key.find_key). A base URL with credentials and a key no HTTP header can
    carry are refused, and neither is ever shown."""
    source = "--api" if base else f"${API_ENV}"
    base = (base or os.environ.get(API_ENV) or DEFAULT_API).rstrip("/")
    head, at, tail = base.rpartition("@")
    shown = head[:head.find("//") + 2 if "//" in head else 0] + "***@" + tail if at else base
    if at:
        # requests would send them as Basic auth in place of the key, and every message
        # names the API by its URL
        raise UsageError(f"{source} {shown}: a user name or password in the API's URL is not accepted; "
                         f"give the API key in ${key_env or KEY_ENV}")
    try:
        parts = urlsplit(base)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise UsageError(f"{source} {shown!r}: expected a URL such as {DEFAULT_API} or http://127.0.0.1:8000")
    key = find_key(key_env)
    return Api(base=base, key=key.value, key_source=key.source, **kw)


class FetchError(PingctlError):
    """One measurement could not be fetched for a reason a retry does not fix (404, 403, a
    damaged page, ...)."""


class _Expired(BaseException):
    """An answer's deadline passed. A BaseException, as the alarm raises it from inside requests
    and urllib3, whose `except Exception` blocks must not turn it into one of their errors."""


class _Refused(Exception):
    def __init__(self, status: int, retry_after: str | None, detail: str):
        super().__init__(status)
        self.status, self.retry_after, self.detail = status, retry_after, detail


@contextlib.contextmanager
def _deadline(seconds: float):
    """Interrupts whatever blocks the answer once `seconds` have passed: connecting, headers or a
    body trickling a byte at a time, which socket timeouts (per read) never end. A signal can
    only reach the main thread; elsewhere the body's reads check the clock (`_pieces`)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    armed = [True]

    def expire(signum, frame):
        if armed[0]:
            raise _Expired

    previous = signal.signal(signal.SIGALRM, expire)
    outer, every = signal.setitimer(signal.ITIMER_REAL, seconds)
    t0 = time.monotonic()
    try:
        yield
    finally:
        armed[0] = False  # first: an alarm now must not interrupt the restoring below
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:  # someone else's alarm, put back with what is left of it
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - t0), 1e-3), every)


# -- requests, as cousteau builds them ----------------------------------------------------------


def cousteau_request(api: Api, url_path: str | None = None, params: dict | None = None,
                     **results) -> tuple[str, dict]:
    """The URL and requests' arguments of one request as cousteau's public request classes make
    them: `AtlasResultsRequest(**results)` for a window of results (msm_id, start, stop,
    probe_ids), else `AtlasRequest(url_path=...)` with `params`; on the base URL's scheme and path
    (cousteau writes https://). A cousteau that no longer builds them so is named, not a crash."""
    from ripe.atlas import cousteau

    parts = urlsplit(api.base)
    try:
        if results:
            req = cousteau.AtlasResultsRequest(server=parts.netloc, key=api.key, **results)
        else:
            req = cousteau.AtlasRequest(server=parts.netloc, key=api.key, url_path=url_path)
        args = {k: req.http_method_args[k] for k in ("params", "headers", "verify", "proxies")}
        path = req.url_path
        if not (isinstance(path, str) and isinstance(args["params"], dict) and isinstance(args["headers"], dict)):
            raise TypeError("url_path or http_method_args changed type")
    except (AttributeError, KeyError, TypeError) as e:
        from importlib.metadata import version

        raise PingctlError(api.redact(
            f"ripe-atlas-cousteau {version('ripe-atlas-cousteau')} does not build its requests as pingctl fetch "
            f"reads them ({type(e).__name__}: {e}); fetch is tested with ripe-atlas-cousteau{COUSTEAU_RANGE}: "
            f"pip install 'ripe-atlas-cousteau{COUSTEAU_RANGE}'")) from None
    args["params"] = {**args["params"], **(params or {})}
    return f"{parts.scheme}://{parts.netloc}{parts.path}{path}", args


@contextlib.contextmanager
def _answer(api: Api, url: str, args: dict):
    """The streamed response to one GET; _Refused for an answer that is not 2xx."""
    import requests

    with requests.Session() as session, session.get(url, stream=True, timeout=api.timeout_s, **args) as response:
        if not response.ok:
            raise _Refused(response.status_code, response.headers.get("Retry-After"), _error_detail(response))
        yield response


class _Discard(Exception):
    """Thrown into a window's temp file to remove it: the window had no results."""


class _Sink:
    """One window's file, written across its requests (one per chunk of probe ids): created at
    its first result and renamed into place at the end only when it holds some; a failed try's
    lines are cut off again (`mark`, `rollback`) before the retry."""

    def __init__(self, path: Path):
        self.path, self.stack, self.out, self.n = path, contextlib.ExitStack(), None, 0

    def write(self, line: bytes) -> None:
        if self.out is None:
            self.out = self.stack.enter_context(open(self.stack.enter_context(atomic_file(self.path)), "wb"))
        self.out.write(line)
        self.n += 1

    def mark(self) -> tuple[int, int]:
        return (self.out.tell() if self.out else 0), self.n

    def rollback(self, mark: tuple[int, int]) -> None:
        if self.out is not None:
            self.out.seek(mark[0])
            self.out.truncate()
        self.n = mark[1]

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is None and self.n == 0 and self.out is not None:
            kind, exc = _Discard, _Discard()
        self.stack.__exit__(kind, exc, tb)  # atomic_file removes its temp file on any exception
        return False


def _pieces(response, limit: int, deadline: float, past_limit: str) -> Iterator[str]:
    """The answer's text as it arrives, at most `limit` bytes of it."""
    utf8, size = codecs.getincrementaldecoder("utf-8")(), 0
    for data in response.iter_content(_READ):
        size += len(data)
        if size > limit:
            raise PageError(f"the page is larger than {limit / 1e6:,g} MB{past_limit}")
        if time.monotonic() > deadline:
            raise _Expired
        try:
            text = utf8.decode(data)
        except UnicodeDecodeError as e:
            raise PageError(f"not UTF-8 text (byte {size - len(data) + e.start:,})") from None
        yield text
    yield utf8.decode(b"", final=True)


def _error_detail(response) -> str:
    body = b""
    for data in response.iter_content(_READ):
        body += data
        if len(body) >= _ERROR_BODY:
            break
    text = body[:_ERROR_BODY].decode("utf-8", "replace")
    try:
        message = json.loads(text)
    except (ValueError, RecursionError):
        message = text
    return _detail(message)


def _detail(message) -> str:
    if isinstance(message, dict):
        err = message.get("error", message)
        text = str(err.get("detail") or err.get("title") or err) if isinstance(err, dict) else str(err)
    elif isinstance(message, tuple):  # a requests exception's args
        text = "; ".join(map(str, message))
    else:
        text = str(message)
    # the server's words, printed on a terminal: no escape sequences, no screenful
    return "".join(c if c.isprintable() else "?" for c in text[:300])


def utc(s: int) -> dt.datetime:
    # cousteau's clean_time reads an int with the deprecated utcfromtimestamp; an aware datetime
    # goes through calendar.timegm(timetuple()) unchanged
    return dt.datetime.fromtimestamp(s, dt.timezone.utc)


def window_text(a: int, b: int) -> str:
    f = "%Y-%m-%d %H:%M"
    return f"{utc(a).strftime(f)} to {utc(b).strftime(f)} UTC"


# -- tries ----------------------------------------------------------------------------------------


def _retrying(api: Api, where: str, attempt: Callable[[], object], refused: Callable[[int, str], str],
              damaged: str, sleep: Callable[[float], None], on_retry: Callable[[str], None] | None):
    """`attempt()` until it answers: HTTP 429/5xx, no answer and no complete answer in time are
    tried again (`api.retry`); a refusal (`refused(status, detail)` says it) and a damaged
    answer (`damaged` names it) are not, as a retry gets the same."""
    import requests

    for i in range(api.retry.tries):
        try:
            with _deadline(api.timeout_s):
                return attempt()
        except PageError as e:
            raise FetchError(f"{where}: {damaged.format(api.base, api.redact(str(e)))}") from None
        except _Refused as e:
            if e.status not in RETRY_STATUS:
                raise FetchError(refused(e.status, api.redact(e.detail))) from None
            what, retry_after = f"HTTP {e.status}", e.retry_after
        except _Expired:
            what, retry_after = f"no complete answer within --timeout {api.timeout_s:g} s", None
        except requests.RequestException as e:
            what, retry_after = f"no answer ({api.redact(_detail(e.args))})", None
        if i + 1 == api.retry.tries:
            raise PingctlError(f"{where}: {what} after {api.retry.tries} tries from {api.base}; the windows "
                               "fetched are kept: run the same command again to resume")
        wait = api.retry.delay(i, retry_after)
        if on_retry:
            on_retry(f"{where}: {what}; retry {i + 1} of {api.retry.tries - 1} in {wait:.1f} s")
        sleep(wait)
    raise AssertionError("unreachable")


def get_window(api: Api, msm_id: int, a: int, b: int, probe_ids: list[int] | None, path: Path,
               sleep: Callable[[float], None] = time.sleep, on_retry: Callable[[str], None] | None = None) -> int:
    """The results of measurement `msm_id` with a timestamp in [a, b), written to `path` as
    JSON lines (renamed there whole, and only when there are some); returns their number. The
    API's start and stop are both inclusive (whole seconds), so stop is b - 1. Many probe ids
    are asked for in requests of PROBE_CHUNK each, into the one file."""
    where = f"measurement {msm_id}, {window_text(a, b)}"
    chunks = [probe_ids[i:i + PROBE_CHUNK] for i in range(0, len(probe_ids), PROBE_CHUNK)] if probe_ids else [None]
    asks = [cousteau_request(api, msm_id=msm_id, start=utc(a), stop=utc(b - 1), probe_ids=c) for c in chunks]
    past = " (--max-page-mb): fetch it in shorter windows (--window) or raise --max-page-mb"

    def receive(url: str, args: dict, sink: _Sink, mark: tuple[int, int]) -> None:
        sink.rollback(mark)  # what a failed try of this request wrote
        with _answer(api, url, args) as response:
            for line in page_lines(_pieces(response, api.max_page_bytes, time.monotonic() + api.timeout_s, past)):
                sink.write(line)

    with _Sink(path) as sink:
        for url, args in asks:
            mark = sink.mark()
            _retrying(api, where, lambda: receive(url, args, sink, mark),  # noqa: B023 - called at once
                      lambda status, detail: refusal(msm_id, status, detail, api),
                      "damaged page from {}: {}; nothing was written for this window", sleep, on_retry)
        return sink.n


def get_json(api: Api, url_path: str, params: dict, where: str, what: str, refused: Callable[[int, str], str],
             sleep: Callable[[float], None] = time.sleep, on_retry: Callable[[str], None] | None = None) -> dict:
    """The one JSON object the API answers GET `url_path`?`params` with (a measurement, a page of
    probes), at most META_MAX_BYTES; retried as a window is."""
    url, args = cousteau_request(api, url_path=url_path, params=params)

    def receive() -> dict:
        with _answer(api, url, args) as response:
            return one_object(_pieces(response, META_MAX_BYTES, time.monotonic() + api.timeout_s,
                                      " (no metadata answer is that large)"), what)

    return _retrying(api, where, receive, refused, "damaged answer from {}: {}", sleep, on_retry)


def refusal(msm_id: int, status: int, detail: str, api: Api) -> str:
    if status == 404:
        why = "no such measurement (check the id)"
    elif status in (401, 403):
        why = (f"refused: the key from {api.key_source or 'the caller'} is not valid or may not read this "
               "measurement" if api.key else
               f"refused: a private measurement needs an API key (in ${KEY_ENV}, ${TOOLS_ENV} or {RC_FIELD} "
               f"in {rc_path()})")
    else:
        why = "the API refused the request"
    return f"measurement {msm_id}: HTTP {status} from {api.base}: {why} ({detail})"
