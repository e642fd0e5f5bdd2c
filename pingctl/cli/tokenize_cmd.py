"""`pingctl tokenize`: show how measurements become tokens, decode ids, token statistics."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import (
    ConfigOpt, JsonOpt, SetOpt, console, emit, fmt, handle_errors, kv_table, load, option_time, read_valid_rows,
)
from pingctl.errors import PingctlError, UsageError

STYLE = {
    "start": "bold white",
    "src": "cyan",
    "dst": "magenta",
    "result": "green",
    "rtt": "green",
    "time": "yellow",
    "size": "blue",
    "errors": "red",
    "msm_id": "bright_black",
}

# Upper bounds of the row counts (Typer's max=: a usage error, exit 2, before any row is read).
# The rows are read whole into memory (Arrow, then Measurements and their tokens, ~400 bytes a
# row in all for --stats): 10,000,000 rows (10x the default) stay under ~5 GB. Every shown row
# becomes a table of its tokens (or a JSON object of them): 100,000 is already pages of text.
MAX_SHOW = 100_000
MAX_STATS_ROWS = 10_000_000


def tokenize(
    inputs: Annotated[
        list[Path] | None, typer.Argument(help="Canonical Parquet file(s) or directories to read rows from.")
    ] = None,
    n: Annotated[int, typer.Option("--n", "-n", min=1, max=MAX_SHOW, help="Rows to show from the input.")] = 5,
    src: Annotated[str | None, typer.Option("--src", help="Source address of one measurement.")] = None,
    dst: Annotated[str | None, typer.Option("--dst", help="Destination address of one measurement.")] = None,
    rtt: Annotated[float | None, typer.Option("--rtt", help="RTT in ms.")] = None,
    time: Annotated[str | None, typer.Option("--time", help="UTC time: ISO 8601 or Unix seconds.")] = None,
    failed: Annotated[bool, typer.Option("--failed", help="The measurement failed (no RTT).")] = False,
    size: Annotated[int, typer.Option("--size", min=0, max=65535, help="Packet size (full scheme).")] = 0,
    errors: Annotated[int, typer.Option("--errors", min=0, max=255, help="Packet error count (full scheme).")] = 0,
    msm_id: Annotated[int, typer.Option("--msm-id", min=0, max=2**63 - 1, help="Measurement id (full scheme).")] = 0,
    decode: Annotated[
        str | None, typer.Option("--decode", help='Token ids to decode: "0 1 204 ...", "-" = stdin, @FILE = a file.')
    ] = None,
    stats: Annotated[bool, typer.Option("--stats", help="Token statistics of the input instead of examples.")] = False,
    max_rows: Annotated[int, typer.Option(
        "--max-rows", min=1, max=MAX_STATS_ROWS, help="Rows read for --stats.")] = 1_000_000,
    scheme: Annotated[str | None, typer.Option(help="compact | full (overrides config tokenizer.scheme).")] = None,
    seed: Annotated[
        int | None, typer.Option(min=0, help="Shuffle field order with this seed (default: canonical order).")
    ] = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show how measurements become tokens (from Parquet rows or --src/--dst/--rtt), decode ids, or --stats.

    Example: pingctl tokenize --src 193.0.14.129 --dst 8.8.8.8 --rtt 12.3 --time 2024-01-01T00:00:00Z
    """

    cfg = load(config, set_, **{"tokenizer.scheme": scheme})
    sch = cfg.tokenizer.scheme
    fields_given = any(v is not None for v in (src, dst, rtt, time)) or failed
    given = (("--decode", decode is not None), ("FILE", bool(inputs)), ("--src/--dst", fields_given))
    modes = [name for name, on in given if on]
    if len(modes) != 1:
        raise UsageError(
            "give exactly one of: Parquet FILE(s), --src/--dst/--rtt fields, or --decode IDS"
            + (f" (got {' and '.join(modes)})" if modes else "")
        )
    if stats and not inputs:
        raise UsageError("--stats needs Parquet FILE(s)")
    if decode is not None:
        _decode_mode(decode, sch, as_json)
        return
    if stats:
        _stats_mode(inputs, max_rows, cfg, as_json)
        return
    from pingctl.tokenizer import Measurements

    if fields_given:
        m = _from_fields(src, dst, rtt, time, failed, size, errors, msm_id)
        source, read = "command line", None
    else:
        source = ", ".join(map(str, inputs))
        table, read = read_valid_rows(inputs, n)
        with _naming(inputs):
            m = Measurements.from_arrow(table)
    _show(m, sch, seed, source, as_json, read)


# ---------------------------------------------------------------- input


def _from_fields(src, dst, rtt, time, failed, size, errors, msm_id):
    from pingctl.tokenizer import Measurements

    if not src or not dst:
        raise UsageError("a measurement needs both --src and --dst")
    if failed and rtt is not None:
        raise UsageError("give either --rtt or --failed, not both")
    if not failed and rtt is None:
        raise UsageError("give --rtt MS (or --failed)")
    if rtt is not None and not (rtt >= 0):
        raise UsageError(f"--rtt must be >= 0 ms (use --failed for a failure), got {rtt}")
    from pingctl.tokenizer.rtt_codec import MAX_MS

    if rtt is not None and not rtt <= MAX_MS:  # also inf: the code would saturate silently
        raise UsageError(f"--rtt {rtt} ms is beyond the RTT code's largest value ({MAX_MS:,.0f} ms)")
    from pingctl.schema.addresses import ipv4_mapped, parse_address

    for opt, value in (("--src", src), ("--dst", dst)):
        if (v4 := ipv4_mapped(value)) is not None:
            raise UsageError(f"{opt} {value!r} is an IPv4-mapped IPv6 address; measurements record the IPv4 "
                             f"address itself: give {v4}")
        if parse_address(value) is None or "%" in value:
            raise UsageError(f"{opt} {value!r} is not an IPv4 or IPv6 address")
    t = option_time(time)
    m = Measurements.from_fields([src], [dst], [-1.0 if failed else rtt], [t], size, errors, msm_id)
    if m.src_v6[0] != m.dst_v6[0]:
        raise UsageError(f"--src {src} and --dst {dst} are of different address families")
    return m


@contextlib.contextmanager
def _naming(inputs: list[Path]):
    """Errors about the rows (a bad address ...) name the input files they came from."""

    source = ", ".join(map(str, inputs))
    try:
        yield
    except PingctlError as e:
        raise PingctlError(e if source in str(e) else f"{source}: {e}") from None


def _parse_ids(text: str, vocab) -> list[int]:
    import re
    import sys

    # ids typed into the option are a usage error (exit 2); ids read from stdin or a file are data (exit 1)
    error = PingctlError if text == "-" or text.startswith("@") else UsageError
    if text == "-":
        text = sys.stdin.read()
    elif text.startswith("@"):
        path = Path(text[1:])
        if not path.is_file():
            raise PingctlError(f"--decode: file not found: {path}")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise PingctlError(f"--decode {path}: not text (byte {e.start} is not UTF-8); give token ids "
                               "as numbers separated by spaces or commas") from None
    parts = [p for p in re.split(r"[\s,\[\]]+", text) if p]
    if not parts:
        raise error("--decode: no token ids given")
    ids = []
    for i, p in enumerate(parts):
        try:
            v = int(p)
        except ValueError:
            raise error(f"--decode: item {i} ({p!r}) is not an integer token id") from None
        if not 0 <= v < vocab.size:
            raise error(
                f"--decode: id {v} (item {i}) is outside the {vocab.scheme} vocabulary (0..{vocab.size - 1})"
            )
        ids.append(v)
    return ids


# ---------------------------------------------------------------- showing measurements


def _iso(t: int) -> str:
    import datetime as dt

    try:
        return dt.datetime.fromtimestamp(int(t), dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return f"{int(t)} s"


def _block_values(m, i: int, scheme: str, time_kind: int, delta: int) -> dict[str, str]:
    from pingctl.tokenizer.rtt_codec import decode_rtt, token_codes

    out = {"src": _addr(m.src[i], bool(m.src_v6[i])), "dst": _addr(m.dst[i], bool(m.dst_v6[i]))}
    rtt = float(m.rtt_ms[i])
    t = int(m.time_s[i])
    if scheme == "compact":
        if rtt < 0:
            out["result"] = "failed"
        else:
            code = int(token_codes([rtt])[0])  # what the stream carries: clamped at the ceiling
            out["result"] = (
                f"{decode_rtt([code])[0]:.3f} ms (input {rtt:g} ms; e={code >> 11}, m={code & 0x7FF})"
            )
        if time_kind == 1:
            out["time"] = f"{_iso(t)} (absolute)"
        elif time_kind in (2, 3):
            out["time"] = f"+{delta} s -> {_iso(t)}"
    else:
        out["rtt"] = "failed (-1.0)" if rtt < 0 else f"{rtt:g} ms"
        out["size"] = str(int(m.size[i]))
        out["errors"] = str(int(m.errors[i]))
        out["time"] = _iso(t)
        out["msm_id"] = str(int(m.msm_id[i]))
    return out


def _addr(b, v6: bool) -> str:
    import ipaddress

    return str(ipaddress.IPv6Address(bytes(b))) if v6 else ".".join(str(int(x)) for x in b[:4])


def _describe(m, scheme: str, seed: int | None) -> dict:
    import numpy as np

    from pingctl.tokenizer import blocks, encode, get_vocab
    from pingctl.tokenizer.compact import TIME_KIND_NAMES, time_kinds
    from pingctl.tokenizer.decode import decode as run_decode

    vocab = get_vocab(scheme)
    enc = encode(m, scheme, rng=np.random.default_rng(seed) if seed is not None else None)
    dec = run_decode(enc.tokens, scheme)
    if scheme == "compact":
        kind, delta = time_kinds(m)
    else:
        kind, delta = np.ones(len(m), np.int8), np.zeros(len(m), np.int64)
    names = blocks(scheme)
    out = []
    for i in range(len(m)):
        lo, hi = int(enc.offsets[i]), int(enc.offsets[i + 1])
        ids = enc.tokens[lo:hi].tolist()
        values = _block_values(m, i, scheme, int(kind[i]), int(delta[i]))
        present = sorted((int(p), names[b]) for b, p in enumerate(dec.blocks[i]) if p >= 0)
        parts = [{"field": "start", "ids": ids[:1], "tokens": [vocab.name(ids[0])], "value": ""}]
        for j, (p, name) in enumerate(present):
            end = present[j + 1][0] if j + 1 < len(present) else hi
            seg = enc.tokens[p:end].tolist()
            parts.append({"field": name, "ids": seg, "tokens": [vocab.name(t) for t in seg], "value": values[name]})
        out.append({
            "index": i,
            "src": values["src"],
            "dst": values["dst"],
            "rtt_ms": float(m.rtt_ms[i]),
            "time": _iso(int(m.time_s[i])) if (m.has_time[i] or scheme == "full") else None,
            "timestamp": TIME_KIND_NAMES[int(kind[i])] if scheme == "compact" else "abs",
            "n_tokens": hi - lo,
            "ids": ids,
            "tokens": [vocab.name(t) for t in ids],
            "blocks": parts,
        })
    return {
        "scheme": scheme,
        "vocab_size": vocab.size,
        "seed": seed,
        "order": [[names[j] for j in o] for o in enc.order.tolist()],
        "measurements": out,
    }


def _show(m, scheme: str, seed: int | None, source: str, as_json: bool, read: dict | None = None) -> None:
    result = _describe(m, scheme, seed)
    result["source"] = source
    result.update(read or {})
    if as_json:
        emit(result, True)
        return
    from rich.table import Table
    from rich.text import Text

    from pingctl.tokenizer import get_vocab

    off = get_vocab(scheme).byte_offset
    order = "canonical field order" if seed is None else f"field order shuffled with seed {seed}"
    console.print(
        f"[bold]{scheme}[/] scheme, vocab {result['vocab_size']}, {order}; bytes shown as values "
        f"(token ByteN = id N+{off})",
        highlight=False,
    )
    for d in result["measurements"]:
        rtt = "failed" if d["rtt_ms"] < 0 else f"{d['rtt_ms']:g} ms"
        when = f", {d['time']}" if d["time"] else ""
        t = Table(
            title=f"#{d['index']}  {d['src']} -> {d['dst']}, {rtt}{when}  ({d['n_tokens']} tokens)",
            title_justify="left", show_edge=False, pad_edge=False,
        )
        t.add_column("field")
        t.add_column("tokens")
        t.add_column("ids", overflow="fold")
        t.add_column("meaning", overflow="fold")
        for b in d["blocks"]:
            style = STYLE.get(b["field"], "")
            if b["field"] == "result" and b["value"] == "failed":
                style = "red"
            roles = [x for x in b["tokens"] if not x.startswith("Byte")]
            values = [str(x - off) for x in b["ids"] if x >= off]
            text = Text(" ".join(roles), style=f"bold {style}")
            if values:
                text.append(" [" + " ".join(values) + "]", style=style)
            t.add_row(Text(b["field"], style=style), text, " ".join(map(str, b["ids"])), b["value"])
        console.print(t)
        console.print(Text("ids: " + " ".join(map(str, d["ids"])), style="dim"))


# ---------------------------------------------------------------- decoding


def _decode_mode(text: str, scheme: str, as_json: bool) -> None:
    from pingctl.tokenizer import decode, get_vocab
    from pingctl.tokenizer.compact import TIME_KIND_NAMES

    vocab = get_vocab(scheme)
    ids = _parse_ids(text, vocab)
    dec = decode(ids, scheme)
    m = dec.measurements
    src, dst = m.src_text(), m.dst_text()
    rows = []
    for i in range(len(m)):
        r = {
            "span": [int(x) for x in dec.spans[i]],
            "src": src[i],
            "dst": dst[i],
            "rtt_ms": float(m.rtt_ms[i]),
            "time": _iso(int(m.time_s[i])) if m.has_time[i] else None,
            "timestamp": TIME_KIND_NAMES[int(dec.time_kind[i])] if scheme == "compact" else "abs",
        }
        if scheme == "full":
            r.update(size=int(m.size[i]), errors=int(m.errors[i]), msm_id=int(m.msm_id[i]))
        rows.append(r)
    result = {
        "scheme": scheme,
        "tokens": len(ids),
        "valid": dec.ok,
        "measurements": rows,
        "errors": [e.to_dict() for e in dec.errors],
    }
    if as_json:
        emit(result, True)
    else:
        from rich.table import Table

        t = Table(title=f"{len(rows)} measurement(s) from {len(ids)} {scheme} tokens", title_justify="left")
        cols = ["tokens", "src", "dst", "rtt ms", "time (UTC)", "timestamp"]
        if scheme == "full":
            cols += ["size", "errors", "msm_id"]
        for c in cols:
            t.add_column(c, justify="right" if c in ("rtt ms", "size", "errors", "msm_id") else "left")
        for r in rows:
            cells = [
                f"{r['span'][0]}..{r['span'][1] - 1}", r["src"], r["dst"],
                "failed" if r["rtt_ms"] < 0 else f"{r['rtt_ms']:g}", r["time"] or "-", r["timestamp"],
            ]
            if scheme == "full":
                cells += [str(r["size"]), str(r["errors"]), str(r["msm_id"])]
            t.add_row(*cells)
        tables = [t]
        if dec.errors:
            et = Table(title=f"[red]{len(dec.errors)} malformed span(s)[/]", title_justify="left")
            for c in ("tokens", "at", "kind", "message"):
                et.add_column(c)
            for e in dec.errors:
                et.add_row(f"{e.start}..{e.end - 1}", str(e.pos), e.kind, e.message)
            tables.append(et)
        emit(result, False, tables)
    if not dec.ok:
        raise typer.Exit(1)


# ---------------------------------------------------------------- statistics


def _stats_mode(inputs: list[Path], max_rows: int, cfg, as_json: bool) -> None:
    from pingctl.tokenizer.stats import token_stats

    table, read = read_valid_rows(inputs, max_rows)
    with _naming(inputs):
        result = token_stats(table, cfg.loader.seq_len)
    result["inputs"] = [str(p) for p in inputs]
    result.update(read)
    if as_json:
        emit(result, True)
        return
    from rich.table import Table

    t = Table(title="tokens per measurement", title_justify="left")
    for c in ("scheme", "family", "measurements", "tokens", "mean", "min", "max"):
        t.add_column(c, justify="left" if c in ("scheme", "family") else "right")
    for r in result["per_measurement"]:
        t.add_row(r["scheme"], r["family"], fmt(r["measurements"]), fmt(r["tokens"]), f"{r['mean']:.2f}",
                  fmt(r["min"]), fmt(r["max"]))
    ts = result["compact_timestamps"]
    usage = result["vocab_usage"]
    summary = kv_table(
        "stats",
        [
            ("rows read", result["rows_read"]),
            ("rows rejected (not counted)", result["rows_rejected"]),
            ("sources (histories)", result["sources"]),
            (f"contexts of <= {result['seq_len']} compact tokens", result["contexts"]),
            ("compact timestamp abs", f"{ts['abs']:.2%}"),
            ("compact timestamp delta1", f"{ts['delta1']:.2%}"),
            ("compact timestamp delta4", f"{ts['delta4']:.2%}"),
            *[(f"{s} vocab ids used", f"{u['used']} / {u['size']}") for s, u in usage.items()],
            *[(f"{s} role tokens unused", ", ".join(u["unused_roles"]) or "-") for s, u in usage.items()],
            ("compact RTT max rel. error (>= 1.024 ms)", f"{result['compact_rtt']['max_rel_error']:.2e}"),
            ("compact RTT max abs. error (< 1.024 ms)", f"{result['compact_rtt']['max_abs_error_us_below']:.3f} us"),
            ("full: size clamped to 65535", result["full_clamped"]["size"]),
            ("full: errors clamped to 255", result["full_clamped"]["errors"]),
        ],
    )
    emit(result, False, [t, summary])
    console.print(
        "[dim]contexts: each source's rows in time order, packed greedily into loader.seq_len tokens "
        "(the first timestamp of a context is absolute)[/]"
    )


def register(app) -> None:
    app.command("tokenize")(handle_errors(tokenize))
