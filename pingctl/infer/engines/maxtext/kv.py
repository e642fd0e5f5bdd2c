"""Second-byte log-probabilities from one shared key-value cache per prompt (MaxText's MaxEngine).

An RTT distribution needs P(second byte | prompt, RttStart, b) for many first bytes b of one
prompt: all 256 for an exact distribution, a few dozen for one read at its quantiles. As whole
sequences (`LoadedModel.next_log_probs`) each of them is a forward pass over the whole prompt.
Here the prompt + RttStart is prefilled once into a KV cache, the cache is copied into decode
slots, and one decode step scores one candidate byte per slot. The numbers are the same to
~1e-5 in log-probability (a test compares them); with a 24-measurement context an exact
distribution costs 10x less on this CPU, one read at its quantiles 5x (docs/benchmarks.md).

MaxEngine comes from the pip package as is; its JetStream stub `ResultTokens` is registered
as a JAX pytree (../shared/notes/maxtext-0.2.5-on-cpu.md), and its import-time notes are
swallowed so that `--json` stays the only thing on stdout and stderr holds only pingctl's own.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

import numpy as np

from pingctl.infer.engines.maxtext.config import inference_config

SLOTS = 32  # decode slots per step: candidate bytes (of one or several prompts) scored together
MIN_TOKENS = 100_000  # below this many sequence tokens the uncached passes finish before the engine is built
# Per call: a decode step attends over the whole cache and every prompt is prefilled and copied into
# its slots, which a short prompt's whole-sequence passes undercut (a context-free question: 15 ms
# uncached, 116 ms through the cache on this CPU); from ~8 context measurements on, the cache wins
# once its slots fill (docs/benchmarks.md, "Serve").
MIN_PROMPT = 128


def worth_it(shortest_prompt: int, candidates: int) -> bool:
    """Whether a second-byte call with these prompts should go through the shared cache."""
    return shortest_prompt >= MIN_PROMPT and candidates >= SLOTS


def _register_result_tokens(engine_api) -> None:
    import jax

    rt = engine_api.ResultTokens
    try:
        jax.tree_util.register_pytree_node(
            rt, lambda r: ((r.data, r.log_prob), (r.tokens_idx, r.valid_idx, r.length_idx, r.samples_per_slot)),
            lambda aux, ch: rt(data=ch[0], log_prob=ch[1], tokens_idx=aux[0], valid_idx=aux[1], length_idx=aux[2],
                               samples_per_slot=aux[3]))
    except ValueError:  # registered already (a second model in this process)
        pass


class SecondBytes:
    """Scores candidate second bytes after prompts that end with RttStart, sharing each prompt's cache."""

    def __init__(self, run: Path, items: Path, hardware: str, seq_len: int, byte0: int):
        self.seq_len, self.byte0 = seq_len, byte0
        # its import and restore print notes ("jetstream: dependency missing", Orbax metadata):
        # not for users, and never on stdout, which --json owns; an error still raises
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            from maxtext.inference.maxengine import maxengine as me

            _register_result_tokens(me.engine_api)
            cfg = inference_config(run, items, hardware, SLOTS, f"max_prefill_predict_length={seq_len}",
                                   f"max_target_length={seq_len + 8}", "return_log_prob=false")
            self.engine = me.MaxEngine(cfg)
            self.params = self.engine.load_params()

    def log_probs(self, firsts: list[np.ndarray], candidates: list[np.ndarray], bucket) -> list[np.ndarray]:
        """[len(candidates[i]), vocab] log-probs of the token after firsts[i] + [byte b], per b."""
        import jax
        import jax.numpy as jnp

        out = [np.zeros((len(c), 0), np.float32) for c in candidates]
        parts: dict[int, list] = {i: [] for i in range(len(firsts))}
        eng = self.engine
        state, used, filled = None, 0, []  # filled: (prompt index, first slot, how many, their bytes)

        def step() -> None:
            nonlocal state, used, filled
            tokens = np.zeros((SLOTS, 1), np.int32)
            for i, start, n, bs in filled:
                tokens[start : start + n, 0] = self.byte0 + bs
            state["tokens"] = jnp.asarray(tokens)
            state, _ = eng.generate(self.params, state)
            lp = np.asarray(jax.nn.log_softmax(state["logits"][:, -1].astype(jnp.float32)))
            for i, start, n, _ in filled:
                parts[i].append(lp[start : start + n])
            state, used, filled = None, 0, []

        with warnings.catch_warnings():
            # donated buffers the CPU backend cannot reuse: harmless, and one warning per call
            warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
            for i, (first, cand) in enumerate(zip(firsts, candidates)):
                cand = np.asarray(cand, np.int64)
                if not len(cand):
                    continue
                padded = np.zeros(bucket(len(first)), np.int32)
                padded[: len(first)] = first
                prefix, _ = eng.prefill(params=self.params, padded_tokens=jnp.asarray(padded), true_length=len(first))
                pos = 0
                while pos < len(cand):  # fill the free slots; a full set of slots is one decode step
                    if state is None:
                        state = eng.init_decode_state()
                    take = cand[pos : pos + SLOTS - used]
                    # a copy per insert: bulk_insert donates its prefix, which later inserts still need
                    state = eng.bulk_insert(jax.tree.map(jnp.copy, prefix), state,
                                            slots=list(range(used, used + len(take))))
                    filled.append((i, used, len(take), take))
                    used += len(take)
                    pos += len(take)
                    if used == SLOTS:
                        step()
            if filled:
                step()
        for i in parts:
            if parts[i]:
                out[i] = np.concatenate(parts[i])
        return out
