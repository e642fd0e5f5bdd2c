"""`pingctl serve RUN`: a trained run answering over HTTP JSON (docs/serve.md).

- `schemas`: the request bodies (pydantic, strict types), each size and integer bounded, each
  address and time checked by the rules `pingctl sample` applies; an /rtt request's work budget;
- `responses`: the typed answers of every route and the error shape, for /openapi.json;
- `answers`: the work of each route over the public `pingctl.api.Model`;
- `batcher`: the one worker thread every model call runs on, the micro-batching of RTT
  questions from concurrent requests into shared `Model.rtt_summaries` calls, and fair turns
  (a large request answered a batch at a time, between other requests' batches);
- `warmup`: the shapes the batches use, compiled before /health says ready;
- `routes`: module-level route functions over one `ServeState`;
- `app`: `create_app(model, ...)`, the FastAPI application (routes, error mapping, body
  bound, one log line and the metrics of each request, docs served locally);
- `ops`: what an operator needs beside the answers: Prometheus metrics, the optional API key,
  CORS origins, request ids and the JSON access log;
- `examples`: the named request and answer examples /openapi.json shows for each route;
- `server`: binding a loopback socket and running uvicorn under connection `Limits` (head and
  body deadlines, a connection cap, the drain deadline of a stop), in the foreground or in a
  thread; `Drain`, which cuts the requests still running at that deadline;
- `bench`: `pingctl bench serve`, requests/s and latency one at a time against micro-batched.

FastAPI and uvicorn are imported inside the functions that use them.
"""
