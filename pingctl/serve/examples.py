"""The named examples /openapi.json (and so Swagger UI's "Try it out") shows for each route:
request bodies a service accepts as they are (tests/test_serve_ops.py sends every one and
checks its answer against the route's response model), and what the answers look like.

Addresses are RIPE's own (193.0.0.0/21) and public resolvers; times lie in 2024, so a context
row passes build-rows' time range. A run trained without timestamps refuses a question's time
(422): the examples "one pair" and "many pairs" carry none for that reason; "at a time" and
"with context" do.
"""

from __future__ import annotations

T = 1_704_067_200  # 2024-01-01T00:00:00Z

_CONTEXT = [{"src": "193.0.0.1", "dst": "8.8.8.8", "time": T - 3600 * k, "rtt": 14.2 + k, "prb_id": 6001}
            for k in range(1, 4)]
_CONTEXT.append({"src": "193.0.0.1", "dst": "1.1.1.1", "time": T - 1800, "rtt": -1, "prb_id": 6001})  # a failed ping


def _ex(summary: str, value, description: str | None = None) -> dict:
    out = {"summary": summary, "value": value}
    if description:
        out["description"] = description
    return out


RTT = {
    "one_pair": _ex("One pair", {"src": "193.0.0.1", "dst": "8.8.8.8"},
                    "The RTT distribution of one (source, destination), as `pingctl sample --src --dst` prints it"),
    "one_pair_at_a_time": _ex("One pair at a time", {"src": "193.0.0.1", "dst": "8.8.8.8",
                                                     "time": "2024-01-01T12:00:00Z"}),
    "many_pairs": _ex("Many pairs", {"pairs": [{"src": "193.0.0.1", "dst": "8.8.8.8"},
                                               {"src": "193.0.0.1", "dst": "1.1.1.1"},
                                               {"src": "193.0.0.2", "dst": "9.9.9.9"}]},
                      "Each answered in order, as `pingctl sample --pairs` does"),
    "with_context": _ex("With context", {"src": "193.0.0.1", "dst": "8.8.8.8", "time": T,
                                         "context": _CONTEXT, "context_per_pair": 8},
                        "Earlier measurements of the source's probe, before the question's time"),
    "many_pairs_exact": _ex("Many pairs, every code", {"pairs": [{"src": "193.0.0.1", "dst": "8.8.8.8"},
                                                                 {"src": "193.0.0.1", "dst": "1.1.1.1"}],
                                                       "exact": True}),
}

COMPLETE = {
    "destinations": _ex("Destinations in a /16", {"src": "193.0.0.1", "dst": "8.8.*.*", "k": 3}),
    "given_rtt": _ex("Given an RTT", {"src": "193.0.0.0/16", "dst": "8.8.8.8", "rtt": 20.0, "k": 3}),
    "with_context": _ex("With context", {"src": "193.0.0.1", "dst": "8.8.*.*", "k": 3, "context": _CONTEXT}),
}

SEARCH = {
    "range": _ex("An RTT range", {"src": "193.0.0.1", "rtt": "10-30", "n": 64, "k": 5}),
    "one_rtt": _ex("One RTT, seeded", {"src": "193.0.0.1", "rtt": 20, "n": 32, "k": 3, "seed": 7}),
}

SCORE = {
    "measurements": _ex("Measurements", {"rows": [
        {"src": "193.0.0.1", "dst": "8.8.8.8", "time": T + 60 * k, "rtt": 14.0 + k, "prb_id": 6001} for k in range(3)
    ] + [{"src": "193.0.0.1", "dst": "8.8.8.8", "time": T + 240, "rtt": -1, "prb_id": 6001}]}),
    "no_context": _ex("Without context", {"rows": [{"src": "193.0.0.1", "dst": "1.1.1.1", "time": T, "rtt": 9.5}],
                                          "context_policy": "none"}),
}

_SUMMARY = {"p_fail": 0.012, "mean_ms": 21.7, "p_over_ceiling": 0.0, "trimmed_mean_ms": 20.9, "p5_ms": 14.8,
            "p25_ms": 17.9, "p50_ms": 19.6, "p75_ms": 22.4, "p95_ms": 33.0, "context_measurements": 0,
            "answered_by": {"predictor": "combined", "regime": "pair",
                            "why": "better than the model on val in the pair regime (val CRPS combined 3.10 ms, "
                                   "model 3.90 ms; weight 0.55 on the model, hint 19.2 ms)"}}
# FastAPI leaves null values out of /openapi.json, examples included: a field the schema requires
# is given a value in every example, or the example would not fit its own schema
_HEAD = {"run": "demo-run", "step": 2000, "steps": [2000], "calibration": "demo-eval/calibration.json",
         "combination": "demo-run/combination.json"}

RTT_ANSWERS = {
    "one_pair": _ex("One pair", {"mode": "distribution", **_HEAD, "exact": True, "src": "193.0.0.1",
                                 "dst": "8.8.8.8", "time": T, **_SUMMARY}),
    "many_pairs": _ex("Many pairs, one set aside", {
        "mode": "pairs", **_HEAD, "exact": False, "asked": 2, "answered": 1, "distinct": 1,
        "predictions": [{"index": 0, "src": "193.0.0.1", "dst": "8.8.8.8", "time": T, **_SUMMARY}],
        "rejected": [{"index": 1, "field": "pairs[1].dst", "reason": "value_error",
                      "message": "pairs[1].dst: '8.8.8' is not an IP address"}]}),
}
COMPLETE_ANSWERS = {"completions": _ex("Completions", {"mode": "complete", "run": "demo-run", "step": 2000,
                                                       "completions": [{"src": "193.0.0.1", "dst": "8.8.8.8",
                                                                        "probability": 0.41, "log_prob": -0.89}]})}
SEARCH_ANSWERS = {"candidates": _ex("Candidates", {"mode": "inverse", "run": "demo-run", "step": 2000, "candidates": [
    {"dst": "8.8.4.4", "probability": 0.07, "samples": 5}]})}
SCORE_ANSWERS = {"scored": _ex("Scored rows", {"run": "demo-run", "step": 2000,
                                               "meta": {"rows_read": 1, "rows_scored": 1},
                                               "rows": [{"src_addr": "193.0.0.1", "dst_addr": "8.8.8.8",
                                                         "event_time": T, "rtt": 14.0, "prb_id": 6001, "nll": 2.1,
                                                         "pit": 0.43, "tail_p": 0.86, "p_fail": 0.01,
                                                         "context_measurements": 0}]})}
HEALTH_ANSWERS = {"ready": _ex("Ready", {"status": "ready", "run": "demo-run", "step": 2000, "queued": 0,
                                         "max_batch": 32, "max_wait_ms": 50.0,
                                         "batcher": {"batches": 12, "jobs": 40, "items": 52, "largest_batch": 9,
                                                     "failures": 0},
                                         "warmup": {"calls": 9, "seconds": 4.2}, "uptime_s": 81.5})}
VERSION_ANSWERS = {"version": _ex("Version", {"pingctl": "0.1.0", "run": "demo-run", "step": 2000, "steps": [2000],
                                              "device": "cpu"})}
METADATA_ANSWERS = {"metadata": _ex("Metadata", {
    "run": "demo-run", "step": 2000, "steps": [2000], "preset": "small", "scheme": "compact", "seq_len": 512,
    "timestamps": True, "max_per_pair": 8, "device": "cpu", "engine": "light", "checkpoint_time": "2024-01-31T09:12:44Z",
    "serving_since": "2024-02-01T08:00:00+00:00",
    "eval": {"report": "demo-eval/report.json", "queries": 20000, "median_rel_err": {"model": 0.11}},
    "serve": {"max_batch": 32, "max_wait_ms": 50.0, "bounds": {"pairs": 1024, "work": 32768}}})}
