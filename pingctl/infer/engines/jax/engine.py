"""The JAX engine's entry in the table (`--engine light`, the default where JAX is installed):
compiled forward passes of pingctl's decoder (`net`) over named weights, and its key-value
cache (`kv`) for second bytes."""

from __future__ import annotations

import functools

import numpy as np

from pingctl.infer.engines import weights as W
from pingctl.infer.engines.base import Engine, Source
from pingctl.infer.engines.jax import kv, net
from pingctl.infer.runtime import import_jax


class JaxEngine(Engine):
    name = "light"
    title = "JAX"
    needs = "jax"
    needs_jax = True
    compiles = True
    has_kv_cache = True
    kv_sessions = True
    fallback = "maxtext"

    def __init__(self, source: Source, arch, tensors: dict, jax):
        super().__init__(source, vocab_size=arch.vocab, device=jax.devices()[0].platform)
        self.arch, self.tensors = arch, tensors
        self.state = net.prepare(arch, tensors)
        self._fn = jax.jit(functools.partial(net.decoder, arch=arch))

    @classmethod
    def load(cls, source: Source) -> JaxEngine:
        arch, tensors = W.named(source)
        return cls(source, arch, tensors, import_jax(source.cfg, source.asked_hardware))

    def forward(self, tokens, positions, segments) -> np.ndarray:
        return np.asarray(self._fn(self.state, tokens, positions, segments))

    def weights(self) -> dict[str, np.ndarray]:
        return dict(self.tensors)

    def kv_worth_it(self, firsts, candidates: int) -> bool:
        return bool(firsts) and kv.worth_it(len(firsts), candidates)

    def second_bytes(self, byte0: int, tokens: int):
        return kv.SecondBytes(self.arch, self.state, byte0)
