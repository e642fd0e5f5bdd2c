"""The MaxText engine's entry in the table (`--engine maxtext`): MaxText's own model and Orbax
restore, the reference the other engines reproduce and the engine for a model they do not
implement; its key-value cache is MaxText's MaxEngine (`kv`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pingctl.artifacts.run import checkpoint_items, checkpoint_steps
from pingctl.errors import PingctlError
from pingctl.infer.engines.base import Engine, Source
from pingctl.infer.engines.maxtext import kv, weights
from pingctl.infer.engines.maxtext.config import inference_config
from pingctl.infer.engines.weights import quiet_failed_restore
from pingctl.infer.runtime import import_jax


def _running_mean(mean, x, k: int):
    """mean of k-1 arrays updated with the k-th; non-float leaves (RNG keys, counters) kept from the first."""
    import jax.numpy as jnp

    if not jnp.issubdtype(mean.dtype, jnp.floating):
        return mean
    return (mean + (x.astype(jnp.float32) - mean.astype(jnp.float32)) / k).astype(mean.dtype)


def _restore(source: Source, items: Path):
    """(mt config, mesh, graphdef, state) of one checkpoint, or an error naming the others."""
    from flax import nnx
    from maxtext.utils import model_creation_utils

    try:
        with quiet_failed_restore():
            mt = inference_config(source.run, items, source.hardware, batch=1)
            model, mesh = model_creation_utils.from_pretrained(mt)
            return mt, mesh, *nnx.split(model)
    except Exception as e:  # noqa: BLE001 - Orbax/TensorStore raise many types for a damaged checkpoint
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise PingctlError(
            f"{items.parent}: cannot restore this checkpoint ({type(e).__name__}: {first}); it may be "
            f"damaged or from another model shape; pick another with --step "
            f"(checkpoints: {', '.join(map(str, checkpoint_steps(source.run)))})"
        ) from e


class MaxTextEngine(Engine):
    name = "maxtext"
    title = "MaxText"
    needs = "maxtext"
    needs_jax = True
    compiles = True
    has_kv_cache = True

    def __init__(self, source: Source, jax, mt, mesh, graphdef, state, items: Path | None):
        super().__init__(source, vocab_size=int(mt.vocab_size), device=jax.devices()[0].platform)
        self.state, self.items = state, items  # items: the one checkpoint's (None: averaged, or an export)
        from flax import nnx

        @jax.jit
        def forward(state, tokens, positions, segments):
            m = nnx.merge(graphdef, state)
            logits = m(tokens, positions, decoder_segment_ids=segments, enable_dropout=False)
            return jax.nn.log_softmax(logits.astype(jax.numpy.float32), axis=-1)

        def run_forward(st, t, p, s):
            with jax.set_mesh(mesh):
                return forward(st, t, p, s)

        self._fn = run_forward

    @classmethod
    def load(cls, source: Source) -> MaxTextEngine:
        paths = [] if source.export else [checkpoint_items(source.run, s) for s in source.steps]
        jax = import_jax(source.cfg, source.asked_hardware)
        if source.export:
            mt, mesh, graphdef, state = weights.build_exported(source.run, source.hardware)
        else:
            mt, mesh, graphdef, state = _restore(source, paths[0])
        # Checkpoint averaging (Vaswani et al. 2017 averaged their last 5-20): a running mean
        # keeps at most two copies of the weights in memory.
        for k, items in enumerate(paths[1:], start=2):
            other = _restore(source, items)[3]
            state = jax.tree.map(lambda a, b, k=k: _running_mean(a, b, k), state, other)
            del other
        return cls(source, jax, mt, mesh, graphdef, state, paths[0] if len(paths) == 1 else None)

    def forward(self, tokens, positions, segments) -> np.ndarray:
        return np.asarray(self._fn(self.state, tokens, positions, segments))

    def weights(self) -> dict[str, np.ndarray]:
        return weights.named_arrays(self.state)

    def kv_worth_it(self, firsts, candidates: int) -> bool:
        return bool(firsts) and kv.worth_it(min(len(f) for f in firsts), candidates)

    def second_bytes(self, byte0: int, tokens: int):
        # MaxEngine restores a checkpoint itself: averaged weights have none to restore
        if self.items is None or tokens < kv.MIN_TOKENS:
            return None
        s = self.source
        return kv.SecondBytes(s.run, self.items, s.hardware, s.seq_len, byte0)
