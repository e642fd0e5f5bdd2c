"""A trained run (or an export), loaded for inference.

An engine runs the forward passes (pingctl/infer/engines/: the table `registry` names them):
`light` (the default; the decoder in plain JAX over named weights, an export's safetensors or
a run's checkpoint converted once), `numpy` (the same decoder in NumPy: the default where JAX
is not installed) and `maxtext` (MaxText's own model and Orbax restore: the reference, and the
engine for a model the others do not implement), with the same answers
(tests/test_light_engine.py, tests/test_numpy_engine.py). `--engine` / $PINGCTL_ENGINE choose.

`LoadedModel` is the same on every engine: forward passes at fixed [batch, length] buckets
(short queries are padded with segment 0, which attention and the outputs ignore), so a
compiling engine compiles a handful of shapes once; second bytes through the engine's
key-value cache where it has one and it pays; generation in pingctl.infer.generation.
Everything the callers see is NumPy.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from pingctl.artifacts import export as EX
from pingctl.artifacts.run import model_dir_kind, resolve_steps, run_config
from pingctl.errors import EXTRA_OF, PingctlError, UsageError, install_line
from pingctl.infer import generation
from pingctl.infer.engines import registry
from pingctl.infer.engines.base import Engine, Source, Unsupported
from pingctl.infer.runtime import check_hardware, prepare_env
from pingctl.tokenizer import get_vocab

ENGINE_ENV = "PINGCTL_ENGINE"
LENGTH_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
SMALL_BATCHES = (8,)


def trained_with_timestamps(mode_weights) -> bool:
    """False only for a run whose loader never timestamped a measurement (mode `none` alone):
    its prompts must then carry no timestamps either, or they are out of its distribution."""
    full, partial, _none = mode_weights
    return full > 0 or partial > 0


def untimed_run(what: str, run, consequence: str) -> UsageError:
    """The refusal of a time-bearing question (`--time`, `--timestamps`, a timed `--pairs`
    file) to a run trained without timestamps."""
    return UsageError(f"{what}: {run} was trained without timestamps (loader.mode_weights all on `none`), "
                      f"{consequence}")


def steps_label(steps: Sequence[int]) -> str:
    """How the checkpoint a model was loaded from is named in titles."""
    if len(steps) > 1:
        return f"mean of steps {', '.join(map(str, steps))}"
    return f"step {steps[0]}"


def check_engine(engine: str | None, what: str = "--engine") -> str | None:
    """`--engine` (or $PINGCTL_ENGINE) as typed, checked before anything slow (None: not chosen)."""
    return registry.check(engine, what)


def _export_steps(export: Path, step: int | Sequence[int] | None) -> list[int]:
    have = EX.source_steps(EX.read_config(export))
    if step is not None and sorted([step] if isinstance(step, int) else step) != have:
        raise UsageError(f"--step: {export} is an export of {steps_label(have)} of its run and holds only those "
                         "weights; leave --step out, or export the step(s) you want")
    return have


def _load_engine(source: Source, asked: str | None) -> Engine:
    """`source` on the engine asked for, else on the default one; a model the default engine
    does not implement falls back to the engine it names, where that one is installed."""
    engine = registry.get(asked or registry.default())
    try:
        return engine.load(source)
    except Unsupported as e:
        fallback = registry.get(engine.fallback) if engine.fallback else None
        if asked or fallback is None:
            advice = f"; answer with --engine {fallback.name}" if fallback is not None else ""
            raise PingctlError(f"--engine {engine.name}: {source.run}: {e}{advice}") from None
        if not fallback.available():
            raise PingctlError(f"{source.run}: {e}, and {fallback.title}, which would answer it, is not installed "
                               f"({install_line(EXTRA_OF[fallback.needs])})") from None
        print(f"note: {source.run}: {e}; answering with {fallback.title}", file=sys.stderr)
        return fallback.load(source)


@dataclass(kw_only=True)
class LoadedModel:
    run: Path
    step: int
    steps: tuple[int, ...]  # the checkpoints whose weights were averaged (one: `step` itself)
    scheme: str
    seq_len: int
    vocab_size: int
    batch: int
    net: Engine  # the engine running the forward passes, with the model loaded on it
    engine: str  # its name, as users give it (`--engine`, JSON's "engine")
    device: str  # the platform the forward passes run on (cpu, gpu, tpu)
    max_per_pair: int = 0  # the run's loader.max_per_pair: how its training contexts were shaped
    timestamps: bool = True  # whether its training contexts carried timestamps (loader.mode_weights)
    # each sequence run at a shape of its own (`shape_stable`): its numbers then do not depend on
    # the sequences it is batched with
    stable_shapes: bool = False
    _kv: object = None  # the engine's key-value cache once built; False when it cannot be

    @classmethod
    def create(cls, source: Source, net: Engine) -> LoadedModel:
        """The one constructor: a model of `source` loaded on `net`."""
        cfg = source.cfg
        return cls(run=source.run, step=source.steps[-1], steps=tuple(source.steps), scheme=cfg.tokenizer.scheme,
                   seq_len=source.seq_len, vocab_size=net.vocab_size, batch=source.batch, net=net,
                   engine=net.name, device=net.device, max_per_pair=cfg.loader.max_per_pair,
                   timestamps=trained_with_timestamps(cfg.loader.mode_weights))

    @classmethod
    def load(cls, run_dir: Path | str, step: int | Sequence[int] | None = None, hardware: str | None = None,
             batch: int = 32, engine: str | None = None):
        """`run_dir`: a `pingctl train` run or a `pingctl export` directory.
        `step`: one checkpoint (default: the latest) or several, whose weights are averaged; an
        export holds one set of weights, so only its own step(s) are accepted.
        `hardware`: cpu | gpu (None: the run's train.hardware; a run trained for a GPU is then
        asked on the CPU where JAX finds none, while an explicit gpu insists on one).
        `engine`: a name of the engine table, light | maxtext | numpy (None: $PINGCTL_ENGINE,
        else light where JAX is installed and numpy where not; a model the light engine does not
        implement is then answered by MaxText where it is installed)."""
        asked = check_engine(engine, "--engine") or check_engine(os.environ.get(ENGINE_ENV) or None,
                                                                 f"${ENGINE_ENV}")
        run = Path(run_dir).resolve()
        cfg = run_config(run)
        export = model_dir_kind(run) == "export"
        steps = _export_steps(run, step) if export else resolve_steps(run, step)
        hw = check_hardware(hardware) or cfg.train.hardware
        if asked:
            registry.get(asked).require()
        prepare_env(hw, forced=hardware is not None)
        source = Source(run=run, cfg=cfg, export=export, steps=tuple(steps), hardware=hw, asked_hardware=hardware,
                        batch=batch)
        return cls.create(source, _load_engine(source, asked))

    @property
    def compiles(self) -> bool:
        """Whether the engine compiles each [batch, length] shape once (worth warming up)."""
        return self.net.compiles

    @property
    def label(self) -> str:
        return steps_label(self.steps)

    def shape_stable(self) -> LoadedModel:
        """This model, running every sequence at [batch, the length bucket of its own length]
        and second bytes as whole sequences. A compiled forward pass sums in an order chosen
        per shape (measured on the light engine: a row's log-probabilities moved by ~3e-6
        between batch shapes 8 and 32, and between lengths 32 and 256), so batching by the
        longest neighbour makes a sequence's numbers depend on its neighbours; at one shape per
        sequence they do not, and `pingctl score` gives a row the same scores whichever rows
        share its table or bucket. The cost: partly filled batches, one per length bucket a call."""
        return replace(self, stable_shapes=True)

    def weights(self) -> dict[str, np.ndarray]:
        """The parameters by name, as `pingctl export` writes them."""
        return self.net.weights()

    # ------------------------------------------------------------------ forward

    def _bucket(self, n: int) -> int:
        for b in LENGTH_BUCKETS:
            if n <= b and b <= self.seq_len:
                return b
        if n <= self.seq_len:
            return self.seq_len
        raise PingctlError(f"query of {n} tokens exceeds the model's context of {self.seq_len}")

    def log_probs(self, sequences: list[np.ndarray], at: list[np.ndarray] | None = None) -> list[np.ndarray]:
        """Log-probabilities of the next token, [len(seq), vocab] per sequence (or only at
        the positions in `at`). Each sequence is one segment starting at position 0."""
        out: list[np.ndarray | None] = [None] * len(sequences)
        for idx, length, nb in self._batches([len(s) for s in sequences]):
            tok = np.zeros((nb, length), np.int32)
            seg = np.zeros((nb, length), np.int32)
            for r, j in enumerate(idx):
                s = np.asarray(sequences[j], np.int32)
                tok[r, : len(s)] = s
                seg[r, : len(s)] = 1
            pos = np.broadcast_to(np.arange(length, dtype=np.int32), (nb, length))
            lp = self.net.forward(tok, np.ascontiguousarray(pos), seg)
            for r, j in enumerate(idx):
                n = len(sequences[j])
                rows = lp[r, :n]
                out[j] = rows[np.asarray(at[j])] if at is not None else rows.copy()
        return out  # type: ignore[return-value]

    def _batches(self, lengths: list[int]):
        """(sequence indices, padded length, batch shape) per forward pass, shortest first."""
        order = np.argsort(lengths, kind="stable")
        if self.stable_shapes:
            buckets = np.array([self._bucket(n) for n in np.asarray(lengths, np.int64)[order]], np.int64)
            for group in np.split(order, np.flatnonzero(np.diff(buckets)) + 1):
                for i in range(0, len(group), self.batch):
                    yield group[i : i + self.batch], self._bucket(lengths[group[0]]), self.batch
            return
        for i in range(0, len(order), self.batch):
            idx = order[i : i + self.batch]
            # a short last batch runs at a small batch shape instead of padding to a full one
            yield (idx, self._bucket(max(lengths[j] for j in idx)),
                   next(b for b in (*SMALL_BATCHES, self.batch) if len(idx) <= b or b == self.batch))

    def next_log_probs(self, prefixes: list[np.ndarray]) -> np.ndarray:
        """[n, vocab]: log P(next token | prefix) for each prefix."""
        rows = self.log_probs(prefixes, at=[np.array([len(p) - 1]) for p in prefixes])
        return np.stack([r[0] for r in rows])

    def second_byte_log_probs(self, firsts: list[np.ndarray], candidates: list[np.ndarray]) -> list[np.ndarray]:
        """[len(candidates[i]), vocab]: log P(next | firsts[i] + [byte b]) for each candidate
        byte b of each prompt (prompts ending with RttStart). Where the engine says it pays
        (`Engine.kv_worth_it`, per call: the JAX and NumPy engines whenever the prompts have
        several candidates each; MaxText's for a large batch of long prompts), each prompt's
        key-value cache is shared by its candidates. Otherwise, or where the cache cannot be built (MaxText with averaged weights, PINGCTL_KV_CACHE=0), whole
        sequences are run: the same numbers to float32 rounding."""
        byte0 = get_vocab(self.scheme).byte_offset
        kv = None
        if (not self.stable_shapes and self.net.has_kv_cache
                and self.net.kv_worth_it(firsts, sum(len(c) for c in candidates))):
            kv = self._kv_engine(sum(len(f) * len(c) for f, c in zip(firsts, candidates)), byte0)
        if kv is not None:
            try:
                return [r[:, : self.vocab_size] for r in kv.log_probs(firsts, candidates, self._bucket)]
            except Exception as e:  # noqa: BLE001 - e.g. the decode cache out of device memory: same answer, slower
                self._kv_off("the shared key-value cache failed", e)
        seqs = [np.concatenate([f, [byte0 + int(b)]]).astype(np.int32) for f, c in zip(firsts, candidates) for b in c]
        flat = self.next_log_probs(seqs) if seqs else np.zeros((0, self.vocab_size), np.float32)
        return np.split(flat, np.cumsum([len(c) for c in candidates])[:-1])

    def second_byte_session(self, firsts: list[np.ndarray]):
        """`(prompts, candidates) -> second_byte_log_probs([firsts[i] for i in prompts], candidates)`
        over several calls; an engine with `kv_sessions` prefills each prompt once and keeps its
        key-value cache for every later call (the JAX engine's `kv.Session`)."""
        byte0 = get_vocab(self.scheme).byte_offset
        kv = self._kv_engine(0, byte0) if self.net.kv_sessions else None
        return self._session_reads(kv.session(firsts, self._bucket) if kv is not None else None, firsts)

    def _session_reads(self, session, firsts: list[np.ndarray]):
        def log_probs(prompts: list[int], candidates: list[np.ndarray]) -> list[np.ndarray]:
            if session is not None and self._kv:
                try:
                    return [r[:, : self.vocab_size] for r in session.log_probs(prompts, candidates)]
                except Exception as e:  # noqa: BLE001 - as in second_byte_log_probs: same answer, slower
                    self._kv_off("the shared key-value cache failed", e)
            return self.second_byte_log_probs([firsts[i] for i in prompts], candidates)

        return log_probs

    def teacher_forced_session(self, firsts: list[np.ndarray], sequences: list[np.ndarray]):
        """(`log_probs(sequences)`, `second_byte_session(firsts)`) where sequences[i] is the
        whole packet of prompt firsts[i]: on an engine with `kv_sessions` the pass over the
        sequences also fills the session's caches of the prompts they start with
        (`Session.whole`), so those prompts are never prefilled again; other engines run the
        two apart."""
        byte0 = get_vocab(self.scheme).byte_offset
        kv = self._kv_engine(0, byte0) if self.net.kv_sessions and sequences else None
        if kv is not None:
            try:
                session = kv.session(firsts, self._bucket)
                lps = [lp[:, : self.vocab_size] for lp in session.whole(sequences)]
            except Exception as e:  # noqa: BLE001 - as in second_byte_log_probs: same answer, slower
                self._kv_off("the shared key-value cache failed", e)
            else:
                return lps, self._session_reads(session, firsts)
        return self.log_probs(sequences), self.second_byte_session(firsts)

    def _kv_engine(self, tokens: int, byte0: int):
        if self._kv is not None or os.environ.get("PINGCTL_KV_CACHE", "1") == "0":
            return self._kv or None
        try:
            self._kv = self.net.second_bytes(byte0, tokens)
        except Exception as e:  # noqa: BLE001 - any failure leaves the (slower, equal) uncached path
            self._kv_off("no shared key-value cache", e)
        return self._kv or None

    def _kv_off(self, what: str, e: Exception) -> None:
        self._kv = False
        print(f"note: {what} ({type(e).__name__}: {str(e)[:200]}); running whole sequences", file=sys.stderr)

    def score(self, sequences: list[np.ndarray]) -> list[np.ndarray]:
        """Teacher forcing: log P(token t | tokens < t) for t = 1..n-1, per sequence."""
        lps = self.log_probs(sequences)
        return [lp[np.arange(len(s) - 1), np.asarray(s[1:])] for lp, s in zip(lps, sequences)]

    # ------------------------------------------------------------------ generation

    def sample(self, prefix: np.ndarray, n: int, max_tokens: int, rng: np.random.Generator, **options) -> list[np.ndarray]:
        """`n` grammar-constrained continuations of `prefix` (pingctl.infer.generation.sample,
        whose keyword arguments `options` are)."""
        return generation.sample(self, prefix, n, max_tokens, rng, **options)
