"""The compact scheme's 16-bit RTT float: value_us = mantissa * 2**exponent.

Code layout (big-endian on the wire): bits 15..11 = exponent e (0..31), bits 10..0 =
mantissa m (0..2047). Encoding rounds to the nearest representable value (ties to even):

- below 2048 us the exponent is 0 and the value is the integer number of microseconds,
  so the error is at most 0.5 us (RIPE Atlas reports 1 us resolution: exact there);
- from 2048 us up the mantissa is normalised to 1024..2047, a relative step of at most
  1/1024, so round-to-nearest keeps the relative error <= 1/2048;
- 0 ms is code 0 (exactly 0); above MAX_US (2047 * 2**31 us, about 50.9 days) the code
  saturates at 0xFFFF.

Non-canonical codes (e > 0 with m < 1024) never come out of the encoder but decode to
their value like any other code.

What a token stream may carry is narrower than what the code can express: `token_codes`
clamps RTTs at CEILING_MS (2047 * 2**16 us = 134.15 s, the largest code with e <= 16, code
0x87FF) and emits canonical codes only, so of the 256 first bytes exactly the 72 in
POSSIBLE_FIRST_BYTES ever occur. The grammar forbids the other 184 and the RTT read-out
renormalises over the 72: a model's small floor on each byte it never saw would
otherwise add up to visible mass at hours and days (docs/tokenizer.md, "RTT ceiling").
"""

from __future__ import annotations

import numpy as np

MANTISSA_BITS = 11
EXPONENT_BITS = 5
MAX_CODE = 0xFFFF
MAX_US = 2047 * 2**31  # 4,395,899,027,456 us = 50.88 days
MAX_MS = MAX_US / 1000.0
_SAT_MS = 2.0**44 / 1000.0  # any ms at or above this encodes as MAX_CODE

# Above every reply in the data sets here (the largest: 90.5 s, four packets of the Seattle
# matrix; the RIPE Atlas samples' 11.4 s; the held-back sets' 11.5 s) and above the 60 s past
# which the read-out already called mass the model's error. First-byte aligned (exponent
# <= 16), so the ceiling splits no first byte between possible and impossible codes.
CEILING_EXPONENT = 16
CEILING_CODE = (CEILING_EXPONENT << MANTISSA_BITS) | 0x7FF  # 0x87FF
CEILING_US = 2047 * 2**CEILING_EXPONENT  # 134,152,192 us
CEILING_MS = CEILING_US / 1000.0


def encode_rtt(rtt_ms) -> np.ndarray:
    """uint16 codes for RTTs in ms (>= 0; negatives are treated as 0, NaN as the max)."""
    # Clamp in ms *before* scaling (ms * 1000 of a huge value overflows to inf with a
    # RuntimeWarning), so the product and frexp/rint only see finite values; 2**44 us >
    # MAX_US still saturates below, as do NaN and +inf; -inf and negatives become 0.
    ms = np.asarray(rtt_ms, dtype=np.float64)
    ms = np.clip(np.nan_to_num(ms, nan=_SAT_MS, posinf=_SAT_MS, neginf=0.0), 0.0, _SAT_MS)
    us = np.minimum(ms * 1000.0, 2.0**44)
    _, k = np.frexp(us)  # us = f * 2**k with f in [0.5, 1)
    e = np.maximum(k - MANTISSA_BITS, 0).astype(np.int64)
    m = np.rint(np.ldexp(us, -e)).astype(np.int64)
    carry = m >= 1 << MANTISSA_BITS  # rounded up to 2048: renormalise
    m[carry] >>= 1
    e[carry] += 1
    code = (e << MANTISSA_BITS) | m
    code[e >= 1 << EXPONENT_BITS] = MAX_CODE
    return code.astype(np.uint16)


def decode_rtt(codes) -> np.ndarray:
    """RTT in ms (float64) for uint16 codes."""
    c = np.asarray(codes).astype(np.int64)
    us = np.ldexp((c & 0x7FF).astype(np.float64), (c >> MANTISSA_BITS).astype(np.int32))
    return us / 1000.0


def token_codes(rtt_ms) -> np.ndarray:
    """The codes a token stream carries: `encode_rtt` of min(rtt, CEILING_MS), so every code
    is canonical and at most CEILING_CODE (NaN and +inf become the ceiling too)."""
    return encode_rtt(np.fmin(np.asarray(rtt_ms, dtype=np.float64), CEILING_MS))


def _possible_first_bytes() -> np.ndarray:
    b = np.arange(256)
    e, m_hi = b >> (MANTISSA_BITS - 8), b & 0x7
    ok = (e <= CEILING_EXPONENT) & ((e == 0) | (m_hi >= 4))  # e > 0 needs a mantissa >= 1024
    ok.flags.writeable = False
    return ok


POSSIBLE_FIRST_BYTES = _possible_first_bytes()  # bool[256], 72 True


def possible_first_bytes(p1) -> np.ndarray:
    """P(first RTT byte) [..., 256] restricted to POSSIBLE_FIRST_BYTES and renormalised: the
    distribution an answer reads (uniform over them where a row holds no mass there)."""
    p = np.where(POSSIBLE_FIRST_BYTES, np.asarray(p1, dtype=np.float64), 0.0)
    total = p.sum(axis=-1, keepdims=True)
    flat = POSSIBLE_FIRST_BYTES / POSSIBLE_FIRST_BYTES.sum()
    return np.where(total > 0, p / np.where(total > 0, total, 1.0), flat)


def error_bound_ms(rtt_ms) -> np.ndarray:
    """The guaranteed |decode(encode(x)) - x| for 0 <= x <= MAX_MS: max(0.5 us, x / 2048)."""
    x = np.asarray(rtt_ms, dtype=np.float64)
    return np.maximum(0.0005, x / 2048.0)
