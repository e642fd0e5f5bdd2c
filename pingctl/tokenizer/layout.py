"""Scheme-independent encoding machinery: field orders, block placement, block writing.

A measurement is `MeasurementStart` followed by k blocks; each scheme supplies the block
lengths per measurement and fills the blocks. Everything here is whole-batch array work.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

TOKEN_DTYPE = np.int32


@dataclass
class Encoded:
    """A token stream: measurement i is tokens[offsets[i]:offsets[i + 1]]."""

    scheme: str
    tokens: np.ndarray  # int32[T]
    offsets: np.ndarray  # int64[n + 1]
    order: np.ndarray  # int8[n, k]: order[i, j] = block index in slot j of measurement i

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def measurement(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]


@lru_cache(maxsize=None)
def permutations(k: int) -> np.ndarray:
    """All k! orders; drawing a row index uniformly draws a uniform random order."""
    return np.array(list(itertools.permutations(range(k))), dtype=np.int8)


def field_order(n: int, blocks: Sequence[str], rng: np.random.Generator | None = None, order=None) -> np.ndarray:
    """int8[n, k] block order per measurement.

    `order` (one permutation for all, or one per measurement; block indices or names) wins;
    else `rng` draws an independent uniform order per measurement; else canonical order.
    """
    k = len(blocks)
    if order is not None:
        arr = np.asarray([blocks.index(b) if isinstance(b, str) else b for b in order] if _is_flat(order) else order)
        if arr.ndim == 1:
            arr = np.broadcast_to(arr, (n, k))
        if arr.shape != (n, k):
            raise ValueError(f"order must be a permutation of {k} blocks or an [{n}, {k}] array, got shape {arr.shape}")
        if n and not np.array_equal(np.sort(arr, axis=1), np.broadcast_to(np.arange(k), (n, k))):
            raise ValueError(f"order rows must be permutations of 0..{k - 1} (blocks {', '.join(blocks)})")
        return np.ascontiguousarray(arr, dtype=np.int8)
    if rng is None:
        return np.ascontiguousarray(np.broadcast_to(np.arange(k, dtype=np.int8), (n, k)))
    perms = permutations(k)
    return perms[rng.integers(0, len(perms), n)]


def _is_flat(order) -> bool:
    return isinstance(order, (list, tuple)) and all(isinstance(b, (str, int, np.integer)) for b in order)


def place(lengths: np.ndarray, order: np.ndarray, start_token: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Allocate the stream: (tokens with MeasurementStart written, offsets[n+1], block starts[n, k]).

    A zero-length block (an absent optional field) occupies no tokens wherever it is ordered.
    """
    n = len(lengths)
    lens_by_slot = np.take_along_axis(lengths, order.astype(np.intp), axis=1)
    slot_start = np.cumsum(lens_by_slot, axis=1) - lens_by_slot + 1
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(1 + lengths.sum(axis=1), out=offsets[1:])
    starts = np.empty_like(slot_start)
    np.put_along_axis(starts, order.astype(np.intp), slot_start, axis=1)
    starts += offsets[:-1, None]
    tokens = np.empty(offsets[-1], TOKEN_DTYPE)
    tokens[offsets[:-1]] = start_token
    return tokens, offsets, starts


def write(tokens: np.ndarray, at: np.ndarray, head: Sequence[int], body: np.ndarray | None = None,
          byte_offset: int = 0) -> None:
    """Write header tokens `head` then `body` bytes (uint8[m, w], shifted to byte ids) at each position."""
    m = len(at)
    if m == 0:
        return
    h = len(head)
    for j, t in enumerate(head):
        tokens[at + j] = t
    if body is not None and body.shape[1]:
        w = body.shape[1]
        tokens[(at + h)[:, None] + np.arange(w)] = body.astype(TOKEN_DTYPE) + byte_offset


def be_bytes(values: np.ndarray, dtype: str) -> np.ndarray:
    """Big-endian bytes of each value as uint8[n, itemsize]."""
    v = np.ascontiguousarray(values, dtype=dtype)
    return v.view(np.uint8).reshape(len(v), v.dtype.itemsize)


def from_be_bytes(b: np.ndarray, dtype: str) -> np.ndarray:
    """Inverse of be_bytes (b: uint8[n, itemsize])."""
    return np.ascontiguousarray(b, dtype=np.uint8).view(dtype).reshape(len(b)).astype(np.dtype(dtype).newbyteorder("="))


def context_ids(n: int, context_starts) -> np.ndarray | None:
    """Context number per measurement from the indices where contexts start (None = one context)."""
    if context_starts is None:
        return None
    mark = np.zeros(n, np.int64)
    starts = np.asarray(context_starts, np.int64)
    if starts.size and (starts.min() < 0 or starts.max() >= max(n, 1)):
        raise ValueError(f"context_starts must lie in 0..{n - 1}")
    mark[starts[starts > 0]] = 1
    return np.cumsum(mark)
