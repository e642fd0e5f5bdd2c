"""A trained run (or an export), loaded for inference.

Two engines run the forward passes, with the same answers (tests/test_light_engine.py):
`light` (the default; pingctl.infer.light: the decoder in plain JAX over named weights, an
export's safetensors or a run's checkpoint converted once, pingctl.infer.light_weights) and
`maxtext` (MaxText's own model and Orbax restore: the reference, and the engine for a model
the light one does not implement). `--engine` / $PINGCTL_ENGINE choose.

Forward passes run jitted at fixed [batch, length] buckets (short queries are padded with
segment 0, which attention and the outputs ignore), so a session compiles a handful of
shapes once. Everything the callers see is NumPy.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pingctl.artifacts import export as EX
from pingctl.artifacts.run import (MAXTEXT_YML, checkpoint_items, checkpoint_steps, model_dir_kind, resolve_steps,
                                   read_maxtext_doc, run_config)
from pingctl.errors import PingctlError, UsageError, install_line
from pingctl.infer import kv_cache, light, light_kv, light_numpy_kv, weights
from pingctl.infer import light_weights as LW
from pingctl.infer.runtime import (check_hardware, default_engine, inference_config, prepare_env, require_engine,
                                   require_gpu)
from pingctl.tokenizer import C, GrammarState, decode, get_vocab

ENGINES = ("light", "maxtext", "numpy")
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
    if engine is not None and engine not in ENGINES:
        raise UsageError(f"{what} {engine!r}: expected one of {', '.join(ENGINES)}")
    return engine


def _maxtext_keys(run: Path, export: bool) -> dict:
    """The MaxText keys the network is built from: an export's architecture.maxtext, or the
    run's maxtext.yml (run-only keys included: the light engine ignores them)."""
    if export:
        config = EX.read_config(run)
        config = config.model_dump() if hasattr(config, "model_dump") else config  # a typed config.json
        keys = config["architecture"]["maxtext"]
        where = run / EX.CONFIG
    else:
        where = run / MAXTEXT_YML
        keys = read_maxtext_doc(run)
    if not isinstance(keys, dict):
        raise PingctlError(f"{where}: no MaxText keys describing the network")
    return keys


def _jax(cfg, hardware: str | None):
    """JAX, imported once the environment is set, with the compilation cache training uses:
    a later process reuses the compiled forward shapes."""
    import jax

    if hardware == "gpu":
        require_gpu(jax)
    jax.config.update("jax_compilation_cache_dir", str(Path(cfg.train.jax_cache_dir).expanduser()))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return jax


def _export_steps(export: Path, step: int | Sequence[int] | None) -> list[int]:
    have = EX.source_steps(EX.read_config(export))
    if step is not None and sorted([step] if isinstance(step, int) else step) != have:
        raise UsageError(f"--step: {export} is an export of {steps_label(have)} of its run and holds only those "
                         "weights; leave --step out, or export the step(s) you want")
    return have


def _running_mean(mean, x, k: int):
    """mean of k-1 arrays updated with the k-th; non-float leaves (RNG keys, counters) kept from the first."""
    import jax.numpy as jnp

    if not jnp.issubdtype(mean.dtype, jnp.floating):
        return mean
    return (mean + (x.astype(jnp.float32) - mean.astype(jnp.float32)) / k).astype(mean.dtype)


@contextlib.contextmanager
def _quiet_failed_restore():
    """A damaged checkpoint makes Orbax abandon TensorStore reads mid-flight: their callbacks then
    hit a closed event loop and asyncio logs each orphaned task, pages of tracebacks around the
    one error that matters. Silence exactly those; on failure the filter stays, as we exit."""
    import logging

    log = logging.getLogger("asyncio")
    level, hook = log.level, sys.unraisablehook

    def unraisable(u):
        if isinstance(u.exc_value, RuntimeError) and "Event loop is closed" in str(u.exc_value):
            return
        hook(u)

    log.setLevel(logging.CRITICAL)
    sys.unraisablehook = unraisable
    yield
    log.setLevel(level)
    sys.unraisablehook = hook


@dataclass
class LoadedModel:
    run: Path
    step: int
    scheme: str
    seq_len: int
    vocab_size: int
    batch: int
    _forward: object
    _state: object
    max_per_pair: int = 0  # the run's loader.max_per_pair: how its training contexts were shaped
    timestamps: bool = True  # whether its training contexts carried timestamps (loader.mode_weights)
    steps: tuple[int, ...] = ()  # the checkpoints whose weights were averaged (one: `step` itself)
    _items: Path | None = None  # the one checkpoint's Orbax items (None for averaged weights)
    _hardware: str = "cpu"
    device: str = "cpu"  # the JAX platform the forward passes run on (cpu, gpu, tpu)
    _kv: object = None  # kv_cache.SecondBytes / light_kv.SecondBytes once built; False when it cannot be
    engine: str = "light"  # what runs the forward passes: light (pingctl.infer.light), maxtext or numpy
    _tensors: dict | None = None  # the light engine's weights by name, as loaded
    _arch: object = None  # the light engine's light.Arch

    @classmethod
    def load(cls, run_dir: Path | str, step: int | Sequence[int] | None = None, hardware: str | None = None,
             batch: int = 32, engine: str | None = None):
        """`run_dir`: a `pingctl train` run or a `pingctl export` directory.
        `step`: one checkpoint (default: the latest) or several, whose weights are averaged; an
        export holds one set of weights, so only its own step(s) are accepted.
        `hardware`: cpu | gpu (None: the run's train.hardware; a run trained for a GPU is then
        asked on the CPU where JAX finds none, while an explicit gpu insists on one).
        `engine`: light | maxtext | numpy (None: $PINGCTL_ENGINE, else light where JAX is
        installed and numpy where not; a model the light engine does not implement is then
        answered by MaxText where it is installed)."""
        asked = check_engine(engine, "--engine") or check_engine(os.environ.get(ENGINE_ENV) or None,
                                                                 f"${ENGINE_ENV}")
        run = Path(run_dir).resolve()
        cfg = run_config(run)
        export = model_dir_kind(run) == "export"
        steps = _export_steps(run, step) if export else resolve_steps(run, step)
        hw = check_hardware(hardware) or cfg.train.hardware
        if asked:
            require_engine(asked)
        prepare_env(hw, forced=hardware is not None)
        if (asked or "light") != "maxtext":
            try:
                return cls._load_light(run, cfg, export, steps, hw, hardware, batch,
                                       numpy=(asked or default_engine()) == "numpy")
            except light.Unsupported as e:
                if asked:
                    raise PingctlError(f"--engine {asked}: {run}: {e}; answer with --engine maxtext") from None
                if importlib.util.find_spec("maxtext") is None:
                    raise PingctlError(f"{run}: {e}, and MaxText, which would answer it, is not installed "
                                       f"({install_line('train')})") from None
                print(f"note: {run}: {e}; answering with MaxText", file=sys.stderr)
        return cls._load_maxtext(run, cfg, export, steps, hw, hardware, batch)

    @classmethod
    def _load_light(cls, run: Path, cfg, export: bool, steps: list[int], hw: str, hardware: str | None,
                    batch: int, numpy: bool = False):
        arch = light.Arch.from_keys(_maxtext_keys(run, export))
        if export:
            source, tensors = EX.weights_path(run), LW.export_tensors(run)
        else:
            source = checkpoint_items(run, steps[0]).parent if len(steps) == 1 else run
            with _quiet_failed_restore():
                tensors = LW.average(LW.run_tensors(run, s) for s in steps)
        light.check_weights(arch, tensors, source)
        if numpy:  # no JAX at all: the runtime comparison's NumPy column (pingctl.infer.light_numpy)
            from pingctl.infer import light_numpy

            return cls(run, steps[-1], cfg.tokenizer.scheme, cfg.loader.seq_len, arch.vocab, batch,
                       functools.partial(light_numpy.decoder, arch=arch), light_numpy.prepare(arch, tensors),
                       cfg.loader.max_per_pair, trained_with_timestamps(cfg.loader.mode_weights), tuple(steps), None,
                       hw, "cpu", engine="numpy", _tensors=tensors, _arch=arch)
        jax = _jax(cfg, hardware)
        params = light.prepare(arch, tensors)
        forward = jax.jit(functools.partial(light.decoder, arch=arch))
        return cls(run, steps[-1], cfg.tokenizer.scheme, cfg.loader.seq_len, arch.vocab, batch, forward, params,
                   cfg.loader.max_per_pair, trained_with_timestamps(cfg.loader.mode_weights), tuple(steps), None, hw,
                   jax.devices()[0].platform, engine="light", _tensors=tensors, _arch=arch)

    @classmethod
    def _load_maxtext(cls, run: Path, cfg, export: bool, steps: list[int], hw: str, hardware: str | None,
                      batch: int):
        paths = [] if export else [checkpoint_items(run, s) for s in steps]
        jax = _jax(cfg, hardware)
        from flax import nnx
        from maxtext.utils import model_creation_utils

        def restore(items: Path):
            try:
                with _quiet_failed_restore():
                    return _restore(items)
            except Exception as e:  # noqa: BLE001 - Orbax/TensorStore raise many types for a damaged checkpoint
                first = (str(e).strip().splitlines() or [""])[0][:300]
                raise PingctlError(
                    f"{items.parent}: cannot restore this checkpoint ({type(e).__name__}: {first}); it may be "
                    f"damaged or from another model shape; pick another with --step "
                    f"(checkpoints: {', '.join(map(str, checkpoint_steps(run)))})"
                ) from e

        def _restore(items: Path):
            mt = inference_config(run, items, hw, batch=1)
            model, mesh = model_creation_utils.from_pretrained(mt)
            return mt, mesh, *nnx.split(model)

        if export:
            mt, mesh, graphdef, state = weights.build_exported(run, hw)
        else:
            mt, mesh, graphdef, state = restore(paths[0])
        # Checkpoint averaging (Vaswani et al. 2017 averaged their last 5-20): a running mean
        # keeps at most two copies of the weights in memory.
        for k, items in enumerate(paths[1:], start=2):
            other = restore(items)[3]
            state = jax.tree.map(lambda a, b, k=k: _running_mean(a, b, k), state, other)
            del other

        @jax.jit
        def forward(state, tokens, positions, segments):
            m = nnx.merge(graphdef, state)
            logits = m(tokens, positions, decoder_segment_ids=segments, enable_dropout=False)
            return jax.nn.log_softmax(logits.astype(jax.numpy.float32), axis=-1)

        def run_forward(st, t, p, s):
            with jax.set_mesh(mesh):
                return forward(st, t, p, s)

        return cls(run, steps[-1], cfg.tokenizer.scheme, cfg.loader.seq_len, int(mt.vocab_size), batch, run_forward,
                   state, cfg.loader.max_per_pair, trained_with_timestamps(cfg.loader.mode_weights), tuple(steps),
                   paths[0] if len(paths) == 1 else None, hw, jax.devices()[0].platform, engine="maxtext")

    @property
    def label(self) -> str:
        return steps_label(self.steps)

    def weights(self) -> dict[str, np.ndarray]:
        """The parameters by name, as `pingctl export` writes them (pingctl.infer.weights)."""
        if self._tensors is not None:
            return dict(self._tensors)
        return weights.named_arrays(self._state)

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
        order = np.argsort([len(s) for s in sequences], kind="stable")
        for i in range(0, len(order), self.batch):
            idx = order[i : i + self.batch]
            length = self._bucket(max(len(sequences[j]) for j in idx))
            # a short last batch runs at a small batch shape instead of padding to a full one
            nb = next(b for b in (*SMALL_BATCHES, self.batch) if len(idx) <= b or b == self.batch)
            tok = np.zeros((nb, length), np.int32)
            seg = np.zeros((nb, length), np.int32)
            for r, j in enumerate(idx):
                s = np.asarray(sequences[j], np.int32)
                tok[r, : len(s)] = s
                seg[r, : len(s)] = 1
            pos = np.broadcast_to(np.arange(length, dtype=np.int32), (nb, length))
            lp = np.asarray(self._forward(self._state, tok, np.ascontiguousarray(pos), seg))
            for r, j in enumerate(idx):
                n = len(sequences[j])
                rows = lp[r, :n]
                out[j] = rows[np.asarray(at[j])] if at is not None else rows.copy()
        return out  # type: ignore[return-value]

    def next_log_probs(self, prefixes: list[np.ndarray]) -> np.ndarray:
        """[n, vocab]: log P(next token | prefix) for each prefix."""
        rows = self.log_probs(prefixes, at=[np.array([len(p) - 1]) for p in prefixes])
        return np.stack([r[0] for r in rows])

    def second_byte_log_probs(self, firsts: list[np.ndarray], candidates: list[np.ndarray]) -> list[np.ndarray]:
        """[len(candidates[i]), vocab]: log P(next | firsts[i] + [byte b]) for each candidate
        byte b of each prompt (prompts ending with RttStart). Where it pays, each prompt's
        key-value cache is shared by its candidates: the light engine's (`light_kv`) whenever
        the prompts have several candidates each; MaxText's engine (`kv_cache`) for a large
        batch of long prompts (`kv_cache.worth_it`, decided per call). Otherwise, or where the
        cache cannot be built (MaxText with averaged weights, PINGCTL_KV_CACHE=0), whole
        sequences are run: the same numbers to float32 rounding."""
        byte0 = get_vocab(self.scheme).byte_offset
        kv = None
        n_cand = sum(len(c) for c in candidates)
        if self.engine in ("light", "numpy"):
            if firsts and light_kv.worth_it(len(firsts), n_cand):
                kv = self._kv_engine(0, byte0)
        elif self.engine == "maxtext" and firsts and kv_cache.worth_it(min(len(f) for f in firsts), n_cand):
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
        over several calls; the light engine prefills each prompt once and keeps its key-value
        cache for every later call (`light_kv.Session`)."""
        byte0 = get_vocab(self.scheme).byte_offset
        kv = self._kv_engine(0, byte0) if self.engine in ("light", "numpy") else None
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
        whole packet of prompt firsts[i]: the light engine's pass over the sequences also fills
        the session's caches of the prompts they start with (`light_kv.Session.whole`), so those
        prompts are never prefilled again; other engines run the two apart."""
        byte0 = get_vocab(self.scheme).byte_offset
        kv = self._kv_engine(0, byte0) if self.engine in ("light", "numpy") and sequences else None
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
        if self.engine == "light":
            self._kv = light_kv.SecondBytes(self._arch, self._state, byte0)
        elif self.engine == "numpy":
            self._kv = light_numpy_kv.SecondBytes(self._arch, self._state, byte0)
        elif self._items is not None and tokens >= kv_cache.MIN_TOKENS:
            try:
                self._kv = kv_cache.SecondBytes(self.run, self._items, self._hardware, self.seq_len, byte0)
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

    # ------------------------------------------------------------------ sampling

    def sample(
        self,
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
        """`n` grammar-constrained continuations of `prefix` (whole sequences, prefix included).

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
            if self.scheme != "compact":
                raise PingctlError(f"timestamped generation needs the compact scheme (this run: {self.scheme})")
            time_only = np.zeros(self.vocab_size, bool)
            time_only[[C.TimestampAbs, C.TimestampDelta1, C.TimestampDelta4]] = True

        pin = _SourcePin(src) if src is not None else None
        if len(prefix) == 0:  # nothing predicts a context's first token: it is always MeasurementStart
            prefix = np.zeros(1, np.int32)
        states = []
        for _ in range(n):
            g = GrammarState(self.scheme)
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
        budget = min(max_tokens, self.seq_len - len(prefix))
        for _ in range(budget):
            live = [i for i in range(n) if not done[i]]
            if not live:
                break
            lp = self.next_log_probs([np.asarray(seqs[i]) for i in live])
            for row, i in enumerate(live):
                mask = np.asarray(states[i].mask())[: self.vocab_size]
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
