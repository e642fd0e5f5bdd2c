"""`pingctl serve RUN`: a trained run answering over HTTP JSON (docs/serve.md).

- `schemas`: the request bodies (pydantic), each size bounded, each address and time checked
  by the rules `pingctl sample` applies;
- `batcher`: the one worker thread every model call runs on, and the micro-batching of RTT
  questions from concurrent requests into shared forward passes;
- `app`: `create_app(model, ...)`, the FastAPI application (endpoints, error mapping, body
  bound);
- `server`: binding a loopback socket and running uvicorn, in the foreground or in a thread;
- `bench`: `pingctl bench serve`, requests/s and latency one at a time against micro-batched.

FastAPI and uvicorn are imported inside the functions that use them.
"""
