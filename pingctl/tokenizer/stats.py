"""Token statistics of a measurement table (`pingctl tokenize --stats`)."""

from __future__ import annotations

import numpy as np

from pingctl.tokenizer import compact, full
from pingctl.tokenizer.api import encode
from pingctl.tokenizer.measurements import Measurements
from pingctl.tokenizer.packing import pack_contexts
from pingctl.tokenizer.rtt_codec import decode_rtt, encode_rtt
from pingctl.tokenizer.vocab import get_vocab


def by_source_in_time_order(m: Measurements) -> tuple[Measurements, np.ndarray]:
    """Rows grouped by source address, time-ordered within each; and where each group starts."""
    hi = m.src[:, :8].copy().view(">u8").ravel()
    lo = m.src[:, 8:].copy().view(">u8").ravel()
    order = np.lexsort((m.time_s, lo, hi, m.src_v6))
    m = m[order]
    key = np.concatenate([m.src, m.src_v6[:, None].astype(np.uint8)], axis=1)
    change = np.flatnonzero((key[1:] != key[:-1]).any(axis=1)) + 1
    return m, np.concatenate([[0], change]) if len(m) else np.zeros(0, np.int64)


def token_stats(table, seq_len: int) -> dict:
    m, groups = by_source_in_time_order(Measurements.from_arrow(table))
    n = len(m)
    contexts = pack_contexts(m, "compact", seq_len, groups)
    per, usage = [], {}
    for scheme in ("compact", "full"):
        enc = encode(m, scheme, rng=np.random.default_rng(0), context_starts=contexts if scheme == "compact" else None)
        lengths = enc.lengths
        for fam, sel in (("IPv4", ~m.src_v6), ("IPv6", m.src_v6), ("all", np.ones(n, bool))):
            if not sel.any():
                continue
            ln = lengths[sel]
            per.append({
                "scheme": scheme, "family": fam, "measurements": int(sel.sum()), "tokens": int(ln.sum()),
                "mean": float(ln.mean()), "min": int(ln.min()), "max": int(ln.max()),
            })
        vocab = get_vocab(scheme)
        used = np.bincount(enc.tokens, minlength=vocab.size) > 0
        usage[scheme] = {
            "size": vocab.size,
            "used": int(used.sum()),
            "unused_roles": [vocab.roles[i] for i in range(vocab.byte_offset) if not used[i]],
            "unused_bytes": int((~used[vocab.byte_offset:]).sum()),
        }
    kind, _ = compact.time_kinds(m, contexts)
    timed = max(int((kind > 0).sum()), 1)
    ok = m.rtt_ms >= 0
    rtt = m.rtt_ms[ok]
    err = np.abs(decode_rtt(encode_rtt(rtt)) - rtt)
    big = rtt >= 1.024
    return {
        "rows": n,
        "sources": len(groups),
        "seq_len": seq_len,
        "contexts": len(contexts),
        "per_measurement": per,
        "compact_timestamps": {name: (kind == k).sum() / timed for k, name in enumerate(compact.TIME_KIND_NAMES) if k},
        "vocab_usage": usage,
        "compact_rtt": {
            "max_rel_error": float((err[big] / rtt[big]).max()) if big.any() else 0.0,
            "max_abs_error_us_below": float(err[~big].max() * 1000) if (~big).any() else 0.0,
        },
        "failed_share": float((~ok).mean()) if n else 0.0,
        "full_clamped": full.clamped(m),
    }
