"""Generation: grammar-constrained continuations of a prompt (the streams and completions of
`pingctl sample`), drawn token by token from a loaded model's next-token log-probabilities.

Every step only tokens the grammar allows are eligible, then optional constraints narrow them
further (a pinned source address, a timestamp on every measurement, times inside a range);
temperature and top-p shape what is left. It asks the model only for `next_log_probs`, so it
runs the same on every engine.
"""

from __future__ import annotations

import numpy as np

from pingctl.errors import PingctlError
from pingctl.tokenizer import C, GrammarState, decode, get_vocab


def sample(
    model,
    prefix: np.ndarray,
    n: int,
    max_tokens: int,
    rng: np.random.Generator,
    temperature: float = 1.0,
    top_p: float = 1.0,
    stop_after_measurements: int | None = None,
    whole_measurements: bool = True,
    src: bytes | None = None,
    timestamps: bool = False,
    time_range: tuple[int, int] | None = None,
) -> list[np.ndarray]:
    """`n` grammar-constrained continuations of `prefix` (whole sequences, prefix included) from
    `model` (a LoadedModel: its `next_log_probs`, scheme, vocabulary size and context length).

    Every step only tokens the grammar allows are eligible; temperature and top-p then
    shape what is left. Sampling stops at `max_tokens`, at the context limit, or once
    `stop_after_measurements` complete measurements were generated. `src` (4 or 16
    address bytes) pins every generated measurement's source: the other family's address
    roles are never eligible and the source bytes are forced — the stream of one probe.
    `timestamps` makes every generated measurement open with its timestamp block (absolute
    or delta, as the grammar allows), one of the block orders training shows, so that each
    has a time — training's *full* mode; without it the model also chooses how many of a
    stream's measurements carry one, as its *partial* and *none* modes taught it.
    `time_range` = (lo, hi) Unix seconds keeps every generated time inside it (absolute
    timestamps by their bytes, deltas by how far they may move the stream's clock), as the
    grammar keeps the structure legal: the model's distribution conditioned on a valid time.
    """
    time_only = None
    if timestamps:
        if model.scheme != "compact":
            raise PingctlError(f"timestamped generation needs the compact scheme (this run: {model.scheme})")
        time_only = np.zeros(model.vocab_size, bool)
        time_only[[C.TimestampAbs, C.TimestampDelta1, C.TimestampDelta4]] = True

    pin = _SourcePin(src) if src is not None else None
    if len(prefix) == 0:  # nothing predicts a context's first token: it is always MeasurementStart
        prefix = np.zeros(1, np.int32)
    states = []
    for _ in range(n):
        g = GrammarState(model.scheme)
        for t in prefix:
            g.step(int(t))
        states.append(g)
    clocks = [_Clock(time_range, _last_time(prefix)) for _ in range(n)] if time_range is not None else None
    seqs = [list(map(int, prefix)) for _ in range(n)]
    done = [False] * n
    # measurements begun after the prefix's last complete one (an open one counts)
    starts = [0 if states[0].can_end else 1] * n
    pending = [0] * n  # forced source bytes still to emit, per stream
    ms = 0  # MeasurementStart token id (0) in both schemes
    budget = min(max_tokens, model.seq_len - len(prefix))
    for _ in range(budget):
        live = [i for i in range(n) if not done[i]]
        if not live:
            break
        lp = model.next_log_probs([np.asarray(seqs[i]) for i in live])
        for row, i in enumerate(live):
            mask = np.asarray(states[i].mask())[: model.vocab_size]
            if pin is not None:
                mask = pin.mask(mask, pending[i])
            if time_only is not None and seqs[i][-1] == ms:
                mask = mask & time_only[: len(mask)]
            if clocks is not None:
                mask = clocks[i].mask(mask)
            tok = _draw(lp[row, : len(mask)], mask, rng, temperature, top_p)
            if clocks is not None:
                clocks[i].after(tok)
            if pin is not None:
                pending[i] = pin.after(tok, pending[i])
            if (
                stop_after_measurements is not None
                and tok == ms
                and starts[i] >= stop_after_measurements
                and states[i].can_end
            ):
                done[i] = True
                continue
            if tok == ms:
                starts[i] += 1
            states[i].step(tok)
            seqs[i].append(tok)
    # A measurement cut by the length limit is dropped: only whole measurements return.
    out = []
    for i in range(n):
        seq = np.asarray(seqs[i], np.int32)
        if whole_measurements and not states[i].can_end:
            last = np.flatnonzero(seq == ms)
            seq = seq[: last[-1]] if len(last) else seq[:0]
        out.append(seq)
    return out


class _SourcePin:
    """Masks that force one source address: after the source role token only its bytes, in
    order; the other family's src/dst roles never (src and dst share a family, so a dst of
    the other family would leave no legal source)."""

    def __init__(self, src: bytes):
        vocab = get_vocab("compact")
        self.n = len(src)
        self.role = C.SrcIPv4 if self.n == 4 else C.SrcIPv6
        self.block = np.ones(vocab.size, bool)
        self.block[[C.SrcIPv6, C.DstIPv6] if self.n == 4 else [C.SrcIPv4, C.DstIPv4]] = False
        self.only = np.zeros((self.n, vocab.size), bool)
        self.only[np.arange(self.n), vocab.byte_offset + np.frombuffer(bytes(src), np.uint8).astype(np.int64)] = True

    def mask(self, grammar: np.ndarray, pending: int) -> np.ndarray:
        n = len(grammar)
        if pending:
            return grammar & self.only[self.n - pending, :n]
        return grammar & self.block[:n]

    def after(self, token: int, pending: int) -> int:
        if pending:
            return pending - 1
        return self.n if token == self.role else 0


def _last_time(prefix: np.ndarray) -> int | None:
    """The stream clock at the end of a prompt: its last timestamped measurement's time."""
    if not len(prefix):
        return None
    m = decode(np.asarray(prefix, np.int32), "compact").measurements
    return int(m.time_s[m.has_time][-1]) if m.has_time.any() else None


class _Clock:
    """Keeps one stream's generated times in [lo, hi]: the bytes of an absolute timestamp
    (big-endian int64) or of a delta (u8 / u32, forward from the stream's clock) are drawn
    byte by byte from the values whose prefix can still land inside the range (the usual
    digit-by-digit bound: while the prefix equals the bound's, the next byte may not cross it)."""

    def __init__(self, time_range: tuple[int, int], last: int | None):
        self.lo, self.hi = time_range
        self.last = last
        self.byte0 = get_vocab("compact").byte_offset
        self.width = {C.TimestampAbs: 8, C.TimestampDelta1: 1, C.TimestampDelta4: 4}  # payload bytes per role
        self.delta_roles = (C.TimestampDelta1, C.TimestampDelta4)
        # the time block being drawn: its role, bound bytes, position, prefix value and whether
        # the prefix still equals the low / high bound's; role None between blocks
        self.role: int | None = None
        self.lo_b = self.hi_b = b""
        self.pos = self.value = 0
        self.tight_lo = self.tight_hi = False

    def _bounds(self, role: int) -> tuple[int, int] | None:
        if role not in self.delta_roles:
            return self.lo, self.hi
        if self.last is None or self.last > self.hi:
            return None  # no clock (the grammar forbids a delta then), or one no forward step can bring back
        return max(0, self.lo - self.last), min(self.hi - self.last, 256 ** self.width[role] - 1)

    def mask(self, grammar: np.ndarray) -> np.ndarray:
        n = len(grammar)
        if self.role is None:
            out = grammar.copy()
            for role in self.width:
                if role < n and out[role] and ((b := self._bounds(role)) is None or b[0] > b[1]):
                    out[role] = False  # e.g. a delta from a clock already past hi: an absolute time resets it
            return out if out.any() else grammar
        first = self.lo_b[self.pos] if self.tight_lo else 0
        last = self.hi_b[self.pos] if self.tight_hi else 255
        allowed = np.zeros(n, bool)
        allowed[self.byte0 + first : self.byte0 + last + 1] = True
        return grammar & allowed

    def after(self, tok: int) -> None:
        if self.role is None:
            if tok in self.width and (b := self._bounds(tok)) is not None and b[0] <= b[1]:
                n = self.width[tok]
                self.role, self.lo_b, self.hi_b = tok, b[0].to_bytes(n, "big"), b[1].to_bytes(n, "big")
                self.pos = self.value = 0
                self.tight_lo = self.tight_hi = True
            return
        byte = int(tok) - self.byte0
        self.value = self.value * 256 + byte
        self.tight_lo = self.tight_lo and byte == self.lo_b[self.pos]
        self.tight_hi = self.tight_hi and byte == self.hi_b[self.pos]
        self.pos += 1
        if self.pos == len(self.lo_b):
            self.last = self.value if self.role not in self.delta_roles else self.last + self.value
            self.role = None


def _draw(lp: np.ndarray, mask: np.ndarray, rng: np.random.Generator, temperature: float, top_p: float) -> int:
    logits = np.where(mask, lp / max(temperature, 1e-6), -np.inf)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p)
        keep = np.cumsum(p[order]) - p[order] < top_p
        cut = np.zeros_like(p)
        cut[order[keep]] = p[order[keep]]
        p = cut / cut.sum()
    return int(rng.choice(len(p), p=p))
