"""`pingctl bench serve RUN`: what the service answers per second, one at a time and micro-batched.

The service runs in this process (uvicorn in a thread, on 127.0.0.1, a free port); the
clients run in a child process (`python -m pingctl.serve.load`), so their HTTP and JSON work
does not share this interpreter's lock with the server's. Each case drives /rtt at a fixed
number of concurrent clients (keep-alive connections), for at most `requests` requests and
`seconds` seconds, after an untimed warm-up (the service's own, `pingctl.serve.warmup`, once,
and a few requests of the case's shapes: compilation is not timed):

- `one at a time`: a service with max_batch 1 and one client — each question its own passes;
- `unbatched, C clients`: max_batch 1 and C clients — concurrency without batching;
- `micro-batched, C clients`: the default service (max_batch = the model's batch) and C clients;
- `B pairs per request`: one client asking B pairs per request (a request's own batch).

each without context and with `context` measurements of the source's probe in every body.
The pairs are documentation addresses (throughput depends on token counts, not on what the
model believes about them); every request asks other pairs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np

from pingctl.api import Model
from pingctl.errors import PingctlError, UsageError
from pingctl.processes import die_with_us
from pingctl.serve import warmup as W
from pingctl.serve.app import create_app
from pingctl.serve.server import ServerThread

T0 = 1_704_067_200  # 2024-01-01: context rows must lie in a canonical row's time range


def _pair(i: int) -> tuple[str, str]:
    return f"192.0.2.{1 + i % 200}", f"198.51.100.{1 + (i * 7) % 250}"


def _context(src: str, n: int) -> list[dict]:
    rng = np.random.default_rng(0)
    t = T0 + np.cumsum(rng.integers(30, 300, n))
    return [{"src": src, "dst": f"198.51.100.{1 + k % 40}", "time": int(t[k]), "rtt": round(float(rng.uniform(5, 200)), 3)}
            for k in range(n)]


def bodies(count: int, pairs: int, context: int) -> list[bytes]:
    """`count` distinct /rtt bodies of `pairs` pairs each (one: the one-pair form) and
    `context` context rows of the (first) pair's source."""
    out = []
    for r in range(count):
        ps = [_pair(r * pairs + j) for j in range(pairs)]
        # exact false in both forms (one pair's default is exact): the cases compare batching, not work
        body: dict = ({"src": ps[0][0], "dst": ps[0][1], "exact": False} if pairs == 1
                      else {"pairs": [{"src": a, "dst": b} for a, b in ps]})
        if context:
            body["context"] = _context(ps[0][0], context)
        out.append(json.dumps(body).encode())
    return out


def _drive_in_child(url: str, payloads: list[bytes], clients: int, count: int, seconds: float) -> dict:
    spec = {"url": url, "payloads": [p.decode() for p in payloads], "clients": clients, "count": count,
            "seconds": seconds, "warmup": max(2 * clients, 8)}
    # the clients die with the bench (kill -9 included): an orphan would go on asking nobody.
    # preexec_fn makes Python fork (and warn that JAX's threads do not survive a fork): the
    # child only calls prctl before it execs, so no JAX code runs in it
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        proc = subprocess.run([sys.executable, "-m", "pingctl.serve.load"], input=json.dumps(spec), capture_output=True,
                              text=True, timeout=2 * seconds + 300, preexec_fn=die_with_us(), check=False)
    if proc.returncode != 0:
        raise PingctlError(f"the bench's clients failed: {proc.stderr[-800:]}")
    return json.loads(proc.stdout)


def _get(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


# ----------------------------------------------------------------- the cases


def bench_serve(model, requests: int = 512, clients: int = 32, seconds: float = 15.0, contexts: tuple[int, ...] = (0, 24),
                max_batch: int | None = None, max_wait_ms: float | None = None, progress=lambda what: None) -> dict:
    if requests < 1 or clients < 1 or seconds <= 0:
        raise UsageError("--requests and --clients must be >= 1, --seconds > 0")
    model = model if isinstance(model, Model) else Model(model)
    forward_batch = int(getattr(model.loaded, "batch", 32))
    batch = max_batch or forward_batch
    # (case, server max_batch, clients, pairs per request): one server per max_batch, in turn
    cases = [("one at a time", 1, 1, 1), (f"unbatched, {clients} clients", 1, clients, 1),
             (f"micro-batched, {clients} clients", batch, clients, 1), (f"{batch} pairs per request", batch, 1, batch)]
    table: list[dict] = []
    # once, before any timed case, so that no case pays for a compilation or for building the
    # shared key-value cache; each service below then says ready at once
    progress("warm-up: the shapes the batches use")
    W.warm(model, batch, model.metadata()["seq_len"], forward_batch)
    for ctx in sorted(contexts):
        for server_batch in sorted({c[1] for c in cases}):
            app = create_app(model, max_batch=server_batch, max_wait_ms=max_wait_ms, warmup=False)
            with ServerThread(app) as srv:
                for name, mb, n_clients, pairs in cases:
                    if mb != server_batch:
                        continue
                    label = f"{name}, ctx {ctx}"
                    progress(label)
                    table.append(_case(srv, label, server_batch, n_clients, pairs, ctx, requests, seconds))
    notes = [("pairs_per_s: RTT distributions answered per second (exact at P(failure) and the quantiles, "
              "as `pingctl sample --pairs`); latency: per request, at the client, after an untimed warm-up"),
             "pairs_per_batch: RTT requests' pairs per gathered batch on the model's worker (warm-up included)",
             ("the service's warm-up (pingctl.serve.warmup: every batch shape, the shared key-value cache) runs "
              "untimed before the cases, as a fresh `pingctl serve` runs it before /health says ready")]
    for ctx in contexts:
        rows = {r["case"].split(",")[0]: r for r in table if r["case"].endswith(f"ctx {ctx}")}
        one, mb = rows.get("one at a time"), rows.get("micro-batched")
        if one and mb and one["pairs_per_s"] and mb["pairs_per_s"]:
            notes.append(f"context {ctx}: micro-batched answers {mb['pairs_per_s'] / one['pairs_per_s']:.1f}x the "
                         f"pairs/s of one at a time")
    return {"name": "serve", "table": table, "run": str(model.run), "step": model.step, "device": model.device,
            "batch": batch, "max_wait_ms": max_wait_ms, "clients": clients, "notes": notes}


def bench_serve_engines(load, engines: list[str], **kw) -> dict:
    """`bench_serve` for each engine in turn (`load(engine)`: a LoadedModel), one table with an
    `engine` column; each engine's model is dropped before the next one loads."""
    table: list[dict] = []
    notes: list[str] = []
    result: dict = {}
    progress = kw.pop("progress", lambda what: None)
    for engine in engines:
        progress(f"{engine}: load")
        result = bench_serve(load(engine), progress=lambda what, e=engine: progress(f"{e}: {what}"), **kw)
        table += [{"engine": engine, **row} for row in result["table"]]
        notes += [f"{engine}: {n}" for n in result["notes"] if n.startswith("context ")]
    rest = [n for n in result.get("notes", []) if not n.startswith("context ")]
    return {**result, "table": table, "engines": list(engines), "notes": rest + notes}


def _case(srv, label: str, server_batch: int, clients: int, pairs: int, ctx: int, requests: int,
          seconds: float) -> dict:
    payloads = bodies(min(requests, 4096), pairs, ctx)
    first = json.loads(_post(srv.url + "/rtt", payloads[0]))
    n_ctx = (first.get("predictions") or [first])[0].get("context_measurements")
    before = _get(srv.url + "/healthz")["batcher"]
    got = _drive_in_child(srv.url, payloads, clients, requests, seconds)
    after = _get(srv.url + "/healthz")["batcher"]
    lat = np.array(got["latencies"]) * 1000
    done, wall = len(lat), got["wall_s"]
    # the warm-up's batches are in the difference too; the ratio is what counts
    items, batches = after["items"] - before["items"], after["batches"] - before["batches"]
    return {
        "case": label, "max_batch": server_batch, "clients": clients, "pairs_per_request": pairs,
        "context": n_ctx, "requests": done, "errors": got["errors"], "seconds": round(wall, 2),
        "requests_per_s": round(done / wall, 2) if wall > 0 else None,
        "pairs_per_s": round(done * pairs / wall, 2) if wall > 0 else None,
        "p50_ms": round(float(np.percentile(lat, 50)), 1) if done else None,
        "p99_ms": round(float(np.percentile(lat, 99)), 1) if done else None,
        "pairs_per_batch": round(items / batches, 1) if batches else None,
    }


def _post(url: str, body: bytes) -> str:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, body, {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.read().decode()
    except urllib.error.HTTPError as e:
        raise PingctlError(f"{url}: {e.code} {e.read().decode()[:500]}") from None

