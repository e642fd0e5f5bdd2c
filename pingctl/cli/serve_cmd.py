"""`pingctl serve RUN`: the model as an HTTP JSON service (docs/serve.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import (
    AnswerOpt,
    CombinationOpt,
    EngineOpt,
    HardwareOpt,
    JsonOpt,
    RevisionOpt,
    StepOpt,
    emit,
    err_console,
    handle_errors,
    kv_table,
    model_dir,
    say,
)

# the defaults and bounds of the batching options (pingctl.serve applies them; the CLI imports
# nothing heavy at start-up)
MAX_BATCH = 1024
MAX_WAIT_MS = 1000.0
DRAIN_S, MAX_DRAIN_S = 10.0, 3600.0  # pingctl.serve.server.Limits.drain_s's default


def serve(
    run: Annotated[Path, typer.Argument(help="A `pingctl train` run directory, or a `pingctl export` model, or its Hugging Face Hub repo id (owner/name).")],
    host: Annotated[str, typer.Option(
        help="Address to listen on (default loopback only; 0.0.0.0 exposes it to the network).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port (0: any free one, printed).")] = 8000,
    step: StepOpt = None,
    revision: RevisionOpt = None,
    hardware: HardwareOpt = None,
    engine: EngineOpt = None,
    max_batch: Annotated[int | None, typer.Option(
        min=1, max=MAX_BATCH, help="RTT questions of concurrent requests answered in one batch "
                                   "(default: the model's batch, 32; 1 = one at a time).")] = None,
    max_wait_ms: Annotated[float | None, typer.Option(
        min=0.0, max=MAX_WAIT_MS, help="How long the model's worker waits for more questions once it "
                                       "has one, ms (default: by the traffic: 2 ms for one client asking "
                                       "in turn; 30% of a batch's time, at most 150, when clients share "
                                       "batches).")] = None,
    calibration: Annotated[Path | None, typer.Option(
        help="A calibration.json `pingctl eval` fitted for this run and step(s): /rtt answers recalibrated "
             "(default: the map an export carries, if any).")] = None,
    no_calibration: Annotated[bool, typer.Option(
        "--no-calibration", help="Answer with the raw distributions even where an export carries a map.")] = False,
    answer: AnswerOpt = None,
    combination: CombinationOpt = None,
    warmup: Annotated[bool, typer.Option(
        "--warmup/--no-warmup", help="Compile the shapes the batches use before /health says ready (requests "
                                     "meanwhile get 503 warming); --no-warmup: ready at once.")] = True,
    drain_s: Annotated[float, typer.Option(
        "--drain-s", min=0.0, max=MAX_DRAIN_S,
        help="On SIGTERM or Ctrl-C: seconds the requests in flight have to finish; those still running then "
             "get 503 shutting_down, and the service exits 0.")] = DRAIN_S,
    api_key_env: Annotated[str | None, typer.Option(
        "--api-key-env", metavar="VAR",
        help="Require an API key, read from this environment variable (never given on the command line): "
             "requests send `Authorization: Bearer KEY` or `X-API-Key: KEY`, else 401; /health, /healthz and "
             "the docs stay open.")] = None,
    cors_origin: Annotated[list[str] | None, typer.Option(
        "--cors-origin", metavar="ORIGIN", help="A browser origin allowed to call the service (https://dash.example.org, or *); "
                              "repeat for more. Default: none (same-origin only).")] = None,
    access_log: Annotated[str, typer.Option(
        "--access-log", metavar="text|json|off", help="One line per request on stderr: text, json (one JSON object a line: method, path, "
                             "status, duration_ms, request_id; never a header), or off.")] = "text",
    as_json: JsonOpt = False,
) -> None:
    """Serve the model over HTTP JSON: RTT distributions (micro-batched), completions, search, scores.

    Example: pingctl serve runs/demo/train --port 8000   # then: curl -s localhost:8000/rtt -H 'content-type: application/json' -d '{"src": "78.143.22.26", "dst": "194.255.199.229"}'

    Endpoints: POST /rtt /complete /search /score, GET /health /version /metadata /metrics, OpenAPI docs at /docs
    (served from the installed package: no internet needed).
    Stop with Ctrl-C or SIGTERM (the requests in flight are answered first, for up to --drain-s seconds).
    """
    import dataclasses
    import os

    from pingctl.api import Model
    from pingctl.api import checks as C
    from pingctl.errors import UsageError
    from pingctl.serve import ops
    from pingctl.serve import server as SV
    from pingctl.serve.app import create_app

    if access_log not in ("text", "json", "off"):
        raise UsageError(f"--access-log {access_log!r}: text, json or off")
    # before the load, as the socket: a missing key or a bad origin is said at once
    api_key = ops.read_key(api_key_env, os.environ) if api_key_env is not None else None
    origins = ops.check_origins(cors_origin or [])
    sock = SV.bind(host, port)  # before the load: an address in use is said at once
    try:
        run = model_dir(run, revision)  # a Hub repo id: its snapshot
        C.check_combination(run, answer, combination)
        with err_console.status(f"loading {run} ..."):
            model = Model.load(run, step, hardware, calibration=False if no_calibration else calibration,
                               engine=engine, answer=answer, combination=combination)
        limits = SV.Limits(drain_s=drain_s)
        app = create_app(model, max_batch=max_batch, max_wait_ms=max_wait_ms, warmup=warmup,
                         access_log=None if access_log == "off" else access_log, api_key=api_key, cors_origins=origins)
        _announce(model, app, SV.url(sock), dataclasses.asdict(limits), as_json, max_wait_ms=max_wait_ms,
                  warmup=warmup, api_key=f"${api_key_env}" if api_key else None, cors_origins=origins,
                  access_log=access_log)
        sys.stdout.flush()
        sys.__stdout__.flush()  # a script waiting for the --json line reads it now, not at exit
        _log_to_stderr(access_log)
        try:
            SV.serve_forever(app, sock, limits=limits)
        except KeyboardInterrupt:  # Ctrl-C is how a service is stopped: not a failure
            pass
        say("stopped", "dim", err=True)
        SV.leave(app)  # at once where the model's worker is still in a call (docs/serve.md, "Stopping")
    finally:
        sock.close()


def _announce(model, app, url: str, limits: dict, as_json: bool, **options) -> None:
    """What the service is and where it listens: a table, or the --json line a script waits for."""
    cal = model.calibration
    info = {"url": url, "docs": f"{url}/docs", "health": f"{url}/health", "run": str(model.run),
            "step": model.step, "steps": list(model.steps), "device": model.device,
            "engine": getattr(model.loaded, "engine", None), "max_batch": app.state.batcher.max_batch,
            "max_wait_ms": options["max_wait_ms"], "calibration": cal.path if cal is not None else None,
            "answering": model.predictor.describe(), "warmup": options["warmup"], "api_key": options["api_key"],
            "cors_origins": options["cors_origins"], "access_log": options["access_log"], "limits": limits}
    emit(info, as_json, kv_table(f"pingctl serve (step {model.step})", [
        ("listening", url), ("docs", f"{url}/docs"), ("run", str(model.run)), ("device", model.device),
        ("max batch", info["max_batch"]), ("max wait ms", "auto" if info["max_wait_ms"] is None else info["max_wait_ms"]),
        ("calibration", info["calibration"] or "none"), ("answers", _answering(info["answering"])),
        ("api key", f"required (from {info['api_key']})" if info["api_key"] else "none"),
        ("ready", f"after the warm-up ({url}/health)" if info["warmup"] else "at once")]))


def _answering(a: dict) -> str:
    """Which predictor answers by default, with the combination it pools with or why none."""
    if a["combination"]:
        return f"{a['answer']}, pooling with {a['combination']}"
    return f"{a['answer']}: {a['unused']}" if a.get("unused") else a["answer"]


def _log_to_stderr(access_log: str) -> None:
    """The service's log lines (logger pingctl.serve: one per request, the warm-up, the stop) on
    stderr, as text or as JSON lines (`--access-log json`)."""
    import logging

    from pingctl.serve import ops

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(ops.JsonLines() if access_log == "json" else logging.Formatter("%(asctime)s %(message)s"))
    log = logging.getLogger("pingctl.serve")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False  # a root handler (uvicorn's, a library's) would print each line a second time


def register(app) -> None:
    app.command("serve")(handle_errors(serve))
