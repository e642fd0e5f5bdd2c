"""`pingctl serve RUN`: a trained run answering over HTTP JSON (docs/serve.md).

- `schemas`: the request bodies (pydantic, strict types), each size and integer bounded, each
  address and time checked by the rules `pingctl sample` applies;
- `responses`: the typed answers of every route and the error shape, for /openapi.json;
- `answers`: the work of each route over the public `pingctl.api.Model`;
- `batcher`: the one worker thread every model call runs on, and the micro-batching of RTT
  questions from concurrent requests into shared `Model.rtt_many` calls;
- `warmup`: the shapes the batches use, compiled before /health says ready;
- `routes`: module-level route functions over one `ServeState`;
- `app`: `create_app(model, ...)`, the FastAPI application (routes, error mapping, body
  bound, one log line per request);
- `server`: binding a loopback socket and running uvicorn under connection `Limits` (head and
  body deadlines, a connection cap), in the foreground or in a thread;
- `bench`: `pingctl bench serve`, requests/s and latency one at a time against micro-batched.

FastAPI and uvicorn are imported inside the functions that use them.
"""
