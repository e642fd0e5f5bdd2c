"""The NumPy engine's entry in the table (`--engine numpy`, the default without JAX): pingctl's
decoder in NumPy alone (`net`) over named weights, and its key-value cache (`kv`)."""

from __future__ import annotations

import numpy as np

from pingctl.infer.engines import weights as W
from pingctl.infer.engines.base import Engine, Source
from pingctl.infer.engines.numpy import kv, net


class NumpyEngine(Engine):
    name = "numpy"
    title = "NumPy"
    has_kv_cache = True
    kv_sessions = True
    fallback = "maxtext"

    def __init__(self, source: Source, arch, tensors: dict):
        super().__init__(source, vocab_size=arch.vocab, device="cpu")
        self.arch, self.tensors = arch, tensors
        self.state = net.prepare(arch, tensors)

    @classmethod
    def load(cls, source: Source) -> NumpyEngine:
        return cls(source, *W.named(source))

    def forward(self, tokens, positions, segments) -> np.ndarray:
        return net.decoder(self.state, tokens, positions, segments, arch=self.arch)

    def weights(self) -> dict[str, np.ndarray]:
        return dict(self.tensors)

    def kv_worth_it(self, firsts, candidates: int) -> bool:
        # the JAX engine's rule: with one candidate a prompt, the prefill costs a whole pass
        return bool(firsts) and candidates >= 2 * len(firsts)

    def second_bytes(self, byte0: int, tokens: int):
        return kv.SecondBytes(self.arch, self.state, byte0)
