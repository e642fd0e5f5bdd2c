#!/usr/bin/env python
"""ONNX Runtime as pingctl's answering runtime, measured against the light engine (issue #51).

Usage: .venv/bin/python scripts/bench_onnx.py EXPORT_DIR [--out DIR] [--queries 64] [--json]

Needs `onnxruntime` and `jax2onnx` in the venv (not pingctl dependencies: this is a
measurement, not an engine). jax2onnx 0.17.1 pins orbax-checkpoint < 0.11.37 (pingctl's is newer)
and pulls equinox, optax, dm-pix, netron, huggingface-hub: install it without them,
`uv pip install --no-deps jax2onnx onnx onnx-ir onnxruntime flatbuffers`. What it does, on the CPU:

1. Loads the export with the light engine (pingctl/infer/engines/jax/) and converts its forward
   pass, its `net.decoder` with the weights baked in as constants, to ONNX with jax2onnx: one
   model per length bucket the model's `log_probs` pads to, the batch dimension dynamic (a
   symbolic length fails in jax2onnx 0.17.1 with JAX 0.12: "'_DynamicDimSentinel' object has
   no attribute 'rmax'" while tracing; a symbolic batch converts).
2. Checks ONNX Runtime's log-probs against the light engine's on random tokens (max abs diff),
   and the RTT distributions `pingctl sample` reads from them.
3. Times, each in a fresh process: loading (the JAX engine: `LoadedModel.load`; ONNX: the
   pingctl model without JAX (`engine="numpy"`, for the tokenizer and prompts) then
   `import onnxruntime` and one InferenceSession per bucket) and the first exact answer.
4. Times, in this process, `pingctl bench sample`'s cases (`pingctl.infer.bench.bench_sample`:
   forward 32xLEN, lazy and exact RTT distributions with 0 and 24 context measurements) for
   the light engine as it answers (the key-value cache on), the light engine with whole
   sequences (PINGCTL_KV_CACHE's off), and ONNX Runtime (whole sequences: the key-value-cache
   path, `net.decode`, is not exported).

The ONNX models go to --out (default: a temporary directory).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

INPUTS = ("tokens", "positions", "segments")


def _buckets(model) -> list[int]:
    from pingctl.infer.model import LENGTH_BUCKETS

    return sorted({b for b in LENGTH_BUCKETS if b <= model.seq_len} | {model.seq_len})


def convert(model, out: Path) -> dict:
    """One ONNX file per length bucket; returns {length: path} and the conversion's seconds."""
    import jax.numpy as jnp
    from jax2onnx import to_onnx

    from pingctl.infer.engines.jax import net

    arch, params = model.net.arch, model.net.state

    def forward(tok, pos, seg):  # jax2onnx's symbolic batch comes as float32 inputs: integers < 2**24 are exact
        return net.decoder(params, tok.astype(jnp.int32), pos.astype(jnp.int32), seg.astype(jnp.int32), arch)

    files, t0 = {}, time.perf_counter()
    for length in _buckets(model):
        path = out / f"model_{length}.onnx"
        to_onnx(forward, inputs=[("B", length)] * 3, input_names=list(INPUTS), output_names=["log_probs"],
                model_name=f"pingctl_{length}", return_mode="file", output_path=str(path))
        files[length] = path
    return {"files": files, "seconds": time.perf_counter() - t0}


def ort_sessions(files: dict[int, Path]) -> dict:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # the converter leaves unused initializers, warned about one by one
    return {length: ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"])
            for length, p in files.items()}


def use_ort(model, sessions: dict) -> None:
    """Route the model's whole-sequence forward passes through ONNX Runtime (no key-value cache)."""
    def forward(tok, pos, seg):
        feed = {k: np.asarray(v, np.float32) for k, v in zip(INPUTS, (tok, pos, seg))}
        return sessions[tok.shape[1]].run(None, feed)[0]

    model.net.forward = forward
    model._kv = False
    model.engine = "onnx"


def first_answer(model) -> float:
    from pingctl.infer import queries as Q
    from pingctl.infer.bench import _pairs

    (a, b), = _pairs(1)
    t0 = time.perf_counter()
    Q.rtt_distributions(model, [Q.query_prefix(a, b, None, np.zeros(0, np.int32), None)])
    return time.perf_counter() - t0


def child(export: str, engine: str, onnx_dir: str) -> None:
    """A fresh process's load and first answer, as JSON on stdout."""
    t0 = time.perf_counter()
    from pingctl.infer.model import LoadedModel

    if engine == "jax":
        model = LoadedModel.load(export, engine="light")
        loaded = time.perf_counter() - t0
        ort_only = None
    else:
        model = LoadedModel.load(export, engine="numpy")
        t1 = time.perf_counter()
        sessions = ort_sessions({int(p.stem.split("_")[1]): p for p in Path(onnx_dir).glob("model_*.onnx")})
        use_ort(model, sessions)
        loaded = time.perf_counter() - t0
        ort_only = time.perf_counter() - t1
    first = first_answer(model)
    print(json.dumps({"load": loaded, "import_onnxruntime_and_sessions": ort_only, "first_answer": first,
                      "jax_imported": "jax" in sys.modules}))


def fresh(export: str, engine: str, onnx_dir: Path) -> dict:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, __file__, export, "--child", engine, "--out", str(onnx_dir)],
                       capture_output=True, text=True, check=False)
    if p.returncode:
        raise SystemExit(f"fresh {engine} process failed:\n{p.stderr[-3000:]}")
    return {**json.loads(p.stdout.strip().splitlines()[-1]), "wall": time.perf_counter() - t0}


def equality(model, sessions: dict) -> dict:
    """Max abs log-prob difference, ONNX Runtime against the light engine, on random full sequences."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for length in sessions:
        for b in (1, 8, model.batch):
            tok = rng.integers(0, model.vocab_size, (b, length)).astype(np.int32)
            pos = np.broadcast_to(np.arange(length, dtype=np.int32), (b, length)).copy()
            seg = np.ones((b, length), np.int32)
            ref = model.net.forward(tok, pos, seg)
            got = sessions[length].run(None, {k: v.astype(np.float32) for k, v in zip(INPUTS, (tok, pos, seg))})[0]
            worst = max(worst, float(np.abs(ref - got).max()))
    return {"max_abs_log_prob_diff": worst}


def distributions_diff(jax_model, ort_model) -> float:
    from pingctl.infer import queries as Q
    from pingctl.infer.bench import _context, _pairs

    ctx, last = _context(jax_model, 24)
    prompts = [Q.query_prefix(a, b, None, ctx, last) for a, b in _pairs(8)]
    a = Q.rtt_distributions(jax_model, prompts)
    b = Q.rtt_distributions(ort_model, prompts)
    return float(max(max(abs(x.p_fail - y.p_fail), np.abs(x.probs - y.probs).max()) for x, y in zip(a, b)))


def installed_mb(*dists: str) -> dict:
    import importlib.metadata as md

    sizes = {}
    for name in dists:
        files = md.distribution(name).files or []
        sizes[name] = round(sum(f.locate().stat().st_size for f in files if f.locate().is_file()) / 1e6, 1)
    return sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Example: .venv/bin/python scripts/bench_onnx.py /tmp/x/tiny-export")
    ap.add_argument("export")
    ap.add_argument("--out", help="where the ONNX models go (default: a temporary directory)")
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--exact-queries", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", choices=("jax", "onnx"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.export, args.child, args.out)

    from pingctl.infer import bench
    from pingctl.infer.model import LoadedModel

    out = Path(args.out or tempfile.mkdtemp(prefix="pingctl-onnx-"))
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"export": args.export, "load_average_start": os.getloadavg()}
    model = LoadedModel.load(args.export, engine="light")
    conv = convert(model, out)
    result["convert_s"] = round(conv["seconds"], 2)
    result["onnx_mb"] = round(sum(p.stat().st_size for p in conv["files"].values()) / 1e6, 2)
    result["buckets"] = list(conv["files"])
    result["installed_mb"] = installed_mb("onnxruntime", "onnx", "onnx-ir", "jax2onnx", "jaxlib", "jax")

    fresh_runs = {e: fresh(args.export, e, out) for e in ("jax", "onnx")}
    result["fresh"] = fresh_runs

    sessions = ort_sessions(conv["files"])
    result.update(equality(model, sessions))
    ort_model = LoadedModel.load(args.export, engine="numpy")
    use_ort(ort_model, sessions)
    whole = LoadedModel.load(args.export, engine="light")
    whole._kv = False  # the light engine over whole sequences, as ONNX Runtime runs them
    result["distributions_max_abs_diff"] = distributions_diff(whole, ort_model)

    rows = []
    for name, m in (("jax (kv cache)", model), ("jax (whole seqs)", whole), ("onnxruntime (whole seqs)", ort_model)):
        r = bench.bench_sample(m, args.queries, [0, 24], args.exact_queries, 0)
        rows += [{"runtime": name, **row} for row in r["table"]]
    result["table"] = rows
    result["load_average_end"] = os.getloadavg()
    if args.json:
        print(json.dumps(result, indent=1, default=str))
        return
    print(f"export {args.export}; ONNX: {len(conv['files'])} buckets {result['buckets']}, {result['onnx_mb']} MB, "
          f"converted in {result['convert_s']} s; installed MB: {result['installed_mb']}")
    print(f"max abs log-prob diff ONNX Runtime vs light: {result['max_abs_log_prob_diff']:.3g}; RTT distributions "
          f"(8 prompts, 24 measurements): {result['distributions_max_abs_diff']:.3g}")
    for e, f in fresh_runs.items():
        extra = f", of it import onnxruntime + sessions {f['import_onnxruntime_and_sessions']:.2f} s" \
            if f["import_onnxruntime_and_sessions"] is not None else ""
        print(f"fresh process {e}: load {f['load']:.2f} s{extra}, first answer {f['first_answer']:.2f} s, "
              f"process wall {f['wall']:.2f} s, JAX imported: {f['jax_imported']}")
    print(f"{'runtime':26} {'case':18} {'tokens':>6} {'n':>4} {'s/call':>8} {'per s':>9} {'tokens/s':>9}")
    for r in rows:
        print(f"{r['runtime']:26} {r['case']:18} {r['prompt_tokens']!s:>6} {r['questions']:>4} {r['seconds']:>8} "
              f"{r['per_s']:>9} {r['tokens_per_s']!s:>9}")
    print("load average start/end:", result["load_average_start"], result["load_average_end"])


if __name__ == "__main__":
    main()
