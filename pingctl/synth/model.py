"""The formulas of the synthetic world, shared by the generator and the ground truth.

Every measured RTT (ms) of a successful packet is

    rtt = base_rtt + route_shift(t) + diurnal(t) + jitter_scale(t) * (W * E_result + (1 - W) * Y_packet)

with
    base_rtt      = propagation * inflation + peering + access_src + access_dst
    propagation   = 2 * distance_km / C_FIBRE_KM_S * 1000          (speed of light in fibre, 2/3 c)
    diurnal(t)    = amp_src * bump_src(t) + amp_dst * bump_dst(t)
    jitter_scale  = jitter0 * (1 + gain_src * bump_src(t) + gain_dst * bump_dst(t))
    bump_x(t)     = exp(KAPPA * (cos(2 pi (utc_hour(t) + utc_offset_x - peak_x) / 24) - 1))   in (0, 1]
    E_result      ~ Exp(1), shared by the packets of one result (they see the same queues)
    Y_packet      = exponential body with a Pareto tail (see `jitter_packet`)

All terms after `propagation * inflation` are >= 0 and inflation >= 1, so no successful packet
is ever faster than light in fibre. The conditional median of a successful packet given its
stream and time is `base + shift + diurnal + JITTER_MEDIAN * jitter_scale` (`median_ms`).
"""

from __future__ import annotations

import math

import numpy as np

C_KM_S = 299_792.458
C_FIBRE_KM_S = C_KM_S * 2.0 / 3.0  # 199,861.6 km/s
EARTH_RADIUS_KM = 6371.0

KAPPA = 1.5  # diurnal peak sharpness: bump = exp(-2 KAPPA) = 0.05 twelve hours from the peak
JITTER_W = 0.4  # share of jitter common to all packets of a result
TAIL_Q = 0.05  # probability mass of the Pareto tail of Y
TAIL_ALPHA = 1.8  # Pareto tail index of Y
TAIL_Y0 = -math.log(TAIL_Q)  # where the tail starts (continuous with the exponential body)
Y_CAP = 200.0  # Y is capped (a spike of 200 jitter scales); mass above it is ~3e-5

REGIONS = ("RIPE", "ARIN", "APNIC", "LACNIC", "AFRINIC")
ACCESS = ("home", "datacenter", "mobile", "satellite")


def haversine_km(lat1, lon1, lat2, lon2):
    """Great-circle distance (km) on a sphere of radius EARTH_RADIUS_KM; degrees in, arrays ok."""
    p1, p2 = np.radians(lat1), np.radians(lat2)
    dp = p2 - p1
    dl = np.radians(np.asarray(lon2) - np.asarray(lon1))
    a = np.sin(dp / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_KM * np.arcsin(np.sqrt(np.clip(a, 0.0, 1.0)))


def propagation_ms(distance_km):
    """Round-trip time of light in fibre (2/3 c) over `distance_km` each way."""
    return 2.0 * np.asarray(distance_km, dtype=np.float64) / C_FIBRE_KM_S * 1000.0


def bump(utc_hours, phase_h):
    """Diurnal congestion shape in (0, 1]: 1 at the local peak hour. phase = utc_offset - peak."""
    return np.exp(KAPPA * (np.cos((2.0 * np.pi / 24.0) * (utc_hours + phase_h)) - 1.0))


def jitter_packet(u):
    """Per-packet jitter multiplier Y from uniforms u in [0, 1): Exp(1) body, Pareto(TAIL_ALPHA) tail.

    CDF: 1 - exp(-y) for y < TAIL_Y0, 1 - TAIL_Q * (y / TAIL_Y0) ** -TAIL_ALPHA above; median ln 2.
    """
    y = -np.log1p(-u)
    tail = u > 1.0 - TAIL_Q
    if tail.any():
        y[tail] = TAIL_Y0 * ((1.0 - u[tail]) / TAIL_Q) ** (-1.0 / TAIL_ALPHA)
    np.minimum(y, Y_CAP, out=y)
    return y


def _y_cdf(y):
    y = np.asarray(y, dtype=np.float64)
    body = 1.0 - np.exp(-np.clip(y, 0.0, None))
    tail = 1.0 - TAIL_Q * (np.maximum(y, TAIL_Y0) / TAIL_Y0) ** (-TAIL_ALPHA)
    out = np.where(y < TAIL_Y0, body, tail)
    return np.where(y >= Y_CAP, 1.0, out)


def jitter_cdf(z):
    """CDF of Z = JITTER_W * Exp(1) + (1 - JITTER_W) * Y (numerical integration over the Exp)."""
    e = np.linspace(0.0, z / JITTER_W, 20_001)
    f = np.exp(-e) * _y_cdf((z - JITTER_W * e) / (1.0 - JITTER_W))
    return float(np.sum((f[1:] + f[:-1]) * 0.5 * np.diff(e)))


def _solve_jitter_median() -> float:
    lo, hi = 0.0, 10.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if jitter_cdf(mid) < 0.5 else (lo, mid)
    return 0.5 * (lo + hi)


# median of Z (a constant of the model; tests re-derive it with `_solve_jitter_median`)
JITTER_MEDIAN = 0.831776615470802


def median_ms(base, shift, amp_src, amp_dst, gain_src, gain_dst, jitter0, phase_src, phase_dst, utc_hours):
    """True conditional median RTT of a successful packet (vectorized over streams x times)."""
    b_src = bump(utc_hours, phase_src)
    b_dst = bump(utc_hours, phase_dst)
    scale = jitter0 * (1.0 + gain_src * b_src + gain_dst * b_dst)
    return base + shift + amp_src * b_src + amp_dst * b_dst + JITTER_MEDIAN * scale
