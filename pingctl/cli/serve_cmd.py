"""`pingctl serve RUN`: the model as an HTTP JSON service (docs/serve.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import (
    EngineOpt,
    HardwareOpt,
    JsonOpt,
    StepOpt,
    emit,
    err_console,
    handle_errors,
    kv_table,
    say,
)

# the defaults and bounds of the batching options (pingctl.serve applies them; the CLI imports
# nothing heavy at start-up)
MAX_BATCH = 1024
MAX_WAIT_MS = 1000.0


def serve(
    run: Annotated[Path, typer.Argument(help="A `pingctl train` run directory.")],
    host: Annotated[str, typer.Option(
        help="Address to listen on (default loopback only; 0.0.0.0 exposes it to the network).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port (0: any free one, printed).")] = 8000,
    step: StepOpt = None,
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
    warmup: Annotated[bool, typer.Option(
        "--warmup/--no-warmup", help="Compile the shapes the batches use before /health says ready (requests "
                                     "meanwhile get 503 warming); --no-warmup: ready at once.")] = True,
    as_json: JsonOpt = False,
) -> None:
    """Serve the model over HTTP JSON: RTT distributions (micro-batched), completions, search, scores.

    Example: pingctl serve runs/demo/train --port 8000   # then: curl -s localhost:8000/rtt -H 'content-type: application/json' -d '{"src": "78.143.22.26", "dst": "194.255.199.229"}'

    Endpoints: POST /rtt /complete /search /score, GET /health /version /metadata, OpenAPI docs at /docs.
    Stop with Ctrl-C (the requests in flight are answered first).
    """
    import logging

    from pingctl.api import Model
    from pingctl.serve import server as SV
    from pingctl.serve.app import create_app

    sock = SV.bind(host, port)  # before the load: an address in use is said at once
    try:
        with err_console.status(f"loading {run} ..."):
            model = Model.load(run, step, hardware, calibration=False if no_calibration else calibration,
                               engine=engine)
        limits = SV.Limits()
        app = create_app(model, max_batch=max_batch, max_wait_ms=max_wait_ms, log_requests=True, warmup=warmup)
        url = SV.url(sock)
        cal = model.calibration
        info = {"url": url, "docs": f"{url}/docs", "health": f"{url}/health", "run": str(model.run),
                "step": model.step, "steps": list(model.steps), "device": model.device,
                "engine": getattr(model.loaded, "engine", None),
                "max_batch": app.state.batcher.max_batch, "max_wait_ms": max_wait_ms,
                "calibration": cal.path if cal is not None else None, "warmup": warmup,
                "limits": {"header_timeout_s": limits.header_timeout_s, "body_timeout_s": limits.body_timeout_s,
                           "keep_alive_s": limits.keep_alive_s, "max_connections": limits.max_connections,
                           "max_header_bytes": limits.max_header_bytes}}
        emit(info, as_json, kv_table(f"pingctl serve (step {model.step})", [
            ("listening", url), ("docs", f"{url}/docs"), ("run", str(model.run)), ("device", model.device),
            ("max batch", info["max_batch"]), ("max wait ms", "auto" if max_wait_ms is None else max_wait_ms),
            ("calibration", info["calibration"] or "none"),
            ("ready", f"after the warm-up ({url}/health)" if warmup else "at once")]))
        sys.stdout.flush()
        sys.__stdout__.flush()  # a script waiting for the --json line reads it now, not at exit
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        log = logging.getLogger("pingctl.serve")
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False  # a root handler (uvicorn's, a library's) would print each line a second time
        try:
            SV.serve_forever(app, sock, limits=limits)
        except KeyboardInterrupt:  # Ctrl-C is how a service is stopped: not a failure
            pass
        say("stopped", "dim", err=True)
    finally:
        sock.close()


def register(app) -> None:
    app.command("serve")(handle_errors(serve))
