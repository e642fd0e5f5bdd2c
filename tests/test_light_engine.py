"""The JAX engine (`--engine light`, pingctl/infer/engines/jax/) against MaxText, the reference: the same logits on
every preset's architecture, the same answers from the trained fixture, and no MaxText import
on the answering path.

Tolerances: in float32, the bound of tests/tolerance.py for the architecture, the length and
the magnitude of the log-probabilities (today's MaxText 0.2.5 and JAX 0.12 give 0.0 against
MaxText: the same operations compile to the same program; the cached and blocked paths sum in
other orders, and so do other CPUs' kernels). `base` computes in bfloat16 (its preset): there
the bound is 1/16, one bfloat16 ulp of a logit between 8 and 16 (bfloat16 keeps 8 significant
bits), the rounding a different fusion of the same operations could introduce; `base` in
float32 is also held to float32's bound, so the architecture itself is checked at full
precision.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.errors import PingctlError
from tests.tolerance import (assert_log_probs_close, assert_probs_close, assert_within, decoder_terms, f32_tol,
                             log_prob_tol, model_log_tol, run_arch)

runner = CliRunner()
BF16_TOL = 1 / 16
VOCAB, SEQ = 267, 64  # the compact vocabulary; a short context keeps the MaxText builds quick


def _keys(preset: str, dtype: str | None = None) -> dict:
    """The MaxText keys `pingctl train` renders for a preset (pingctl/templates/maxtext.yml.j2)."""
    from pingctl.train.presets import PRESETS

    a = PRESETS[preset]
    return {"decoder_block": "llama2", "vocab_size": VOCAB, "base_emb_dim": a["emb_dim"],
            "base_num_decoder_layers": a["layers"], "base_num_query_heads": a["heads"],
            "base_num_kv_heads": a["heads"], "head_dim": a["head_dim"], "base_mlp_dim": a["mlp_dim"],
            "mlp_activations": a["mlp_activations"], "max_target_length": SEQ, "dtype": dtype or a["dtype"],
            "weight_dtype": "float32", "logits_via_embedding": False, "enable_dropout": False}


def _random_tensors(arch, seed: int = 0) -> dict:
    """Weights of every name and shape the architecture has: kernels at the scale MaxText
    initialises them, norm scales around 1 (so that they matter)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in arch.weight_shapes().items():
        if name.endswith("scale"):
            out[name] = (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            fan_in = shape[0] if "out" not in name else shape[0] * shape[2]
            out[name] = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
    return out


def _batch(rng, batch: int = 3, length: int = SEQ):
    """Tokens with padding: one full row, one cut at 40, one at 9 (segment 0 after)."""
    tok = rng.integers(0, VOCAB, (batch, length)).astype(np.int32)
    seg = np.ones((batch, length), np.int32)
    seg[1, 40:] = 0
    seg[2, 9:] = 0
    pos = np.ascontiguousarray(np.broadcast_to(np.arange(length, dtype=np.int32), (batch, length)))
    return tok, pos, seg


@pytest.mark.slow
@pytest.mark.parametrize("preset,dtype", [("tiny", None), ("mini", None), ("small", None), ("base", None),
                                          ("base", "float32")])
def test_light_logits_are_maxtext_s_on_every_preset(preset, dtype):
    """A model of each preset's architecture, built by MaxText with random weights (its own
    initialisation, every weight then perturbed), against the light engine on the same named
    weights: the log-probabilities of a padded batch."""
    pytest.importorskip("maxtext")
    from pingctl.artifacts.run import MAXTEXT_YML
    from pingctl.infer.engines.maxtext.config import inference_config
    from pingctl.infer.runtime import prepare_env

    prepare_env("cpu", True)
    import jax
    from flax import nnx
    from maxtext.utils import model_creation_utils

    from pingctl.infer.engines import arch as A
    from pingctl.infer.engines.jax import net as jnet
    from pingctl.infer.engines.maxtext import weights as W

    keys = _keys(preset, dtype)
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / MAXTEXT_YML).write_text(yaml.safe_dump(
            {"base_config": "base.yml", "run_name": "equality", "base_output_directory": d, **keys}))
        model, mesh = model_creation_utils.from_pretrained(inference_config(Path(d), None, "cpu", batch=1))
    graphdef, state = nnx.split(model)
    tensors = {}
    for name, v in W.named_arrays(state).items():
        noise = 0.1 if name.endswith("scale") else 0.5 * float(v.std())
        tensors[name] = (v + rng.normal(0, noise, v.shape)).astype(np.float32)
    state = W.assign(state, tensors, Path("random"))

    @jax.jit
    def reference(state, tok, pos, seg):
        m = nnx.merge(graphdef, state)
        logits = m(tok, pos, decoder_segment_ids=seg, enable_dropout=False)
        return jax.nn.log_softmax(logits.astype(jax.numpy.float32), axis=-1)

    arch = A.Arch.from_keys(keys)
    A.check_weights(arch, tensors, "random")  # the names and shapes MaxText gave them
    tok, pos, seg = _batch(rng)
    with jax.set_mesh(mesh):
        want = np.asarray(reference(state, tok, pos, seg))
    got = np.asarray(jax.jit(lambda p, t, q, s: jnet.decoder(p, t, q, s, arch))(
        jnet.prepare(arch, tensors), tok, pos, seg))
    real = seg > 0  # padding's outputs are ignored by every caller
    diff = float(np.abs(got - want)[real].max())
    assert np.isfinite(want[real]).all() and want[real].min() < -5  # spread-out log-probs, not a flat line
    tol = BF16_TOL if keys["dtype"] == "bfloat16" else log_prob_tol(arch, SEQ, want[real])
    assert diff <= tol, (preset, keys["dtype"], diff, tol)


def _whole_sequence_reads(fwd, params, first, candidates, byte0: int = 11, length: int = 64) -> np.ndarray:
    """[len(candidates), vocab]: the next-token log-probs after first + [byte b], each sequence
    run whole (no cache): what the cached paths must equal."""
    seqs = np.stack([np.concatenate([first, [byte0 + b]]) for b in candidates]).astype(np.int32)
    n = seqs.shape[1]
    tok = np.zeros((len(candidates), length), np.int32)
    tok[:, :n] = seqs
    seg = np.zeros_like(tok)
    seg[:, :n] = 1
    pos = np.ascontiguousarray(np.broadcast_to(np.arange(length, dtype=np.int32), tok.shape))
    return np.asarray(fwd(params, tok, pos, seg))[:, n - 1]


def test_attention_in_query_blocks_gives_one_block_s_log_probs():
    """The JAX decoder computing attention a block of query rows at a time (each block attending
    only to the keys up to its last row) against the whole sequence at once, on sequences longer
    than a block, not a multiple of it, with padding: the same log-probs and keys and values to
    float32 rounding (the softmax's sums run over fewer exact zeros, in another order)."""
    from pingctl.infer.runtime import prepare_env

    prepare_env("cpu", True)
    import jax

    from pingctl.infer.engines import arch as A
    from pingctl.infer.engines.jax import net as jnet

    arch = A.Arch.from_keys(_keys("tiny"))
    params = jnet.prepare(arch, _random_tensors(arch))
    tok, pos, seg = _batch(np.random.default_rng(5), batch=3, length=150)
    seg[0, 120:] = 0  # a row of padding that starts inside a block

    def run(block):
        return jax.jit(lambda p, t, q, s: jnet.decoder(p, t, q, s, arch, want_kv=True, block=block))(
            params, tok, pos, seg)

    want, (wk, wv) = run(None)
    want, wk, wv = np.asarray(want), np.asarray(wk), np.asarray(wv)
    real = seg > 0
    for block in (16, 64, jnet.ATTENTION_BLOCK):
        got, (gk, gv) = run(block)
        assert_log_probs_close(np.asarray(got)[real], want[real], arch, tok.shape[1], f"block {block}")
        for g, w in ((gk, wk), (gv, wv)):  # [layers, b, t, heads, head_dim]: at most the whole depth's terms
            bound = f32_tol(float(np.abs(w[:, real]).max()), decoder_terms(arch, tok.shape[1]))
            assert_within(np.asarray(g)[:, real], w[:, real], bound, f"keys or values, block {block}")


def test_the_key_value_cache_gives_the_whole_sequence_log_probs():
    """Second-byte scoring from one cache per prompt (the JAX engine's `kv`) against whole sequences, for
    prompts of different lengths and numbers of candidates (bucketed and padded together)."""
    from pingctl.infer.runtime import prepare_env

    prepare_env("cpu", True)
    import jax

    from pingctl.infer.engines import arch as A
    from pingctl.infer.engines.jax import kv as jkv
    from pingctl.infer.engines.jax import net as jnet

    arch = A.Arch.from_keys(_keys("tiny"))
    params = jnet.prepare(arch, _random_tensors(arch))
    fwd = jax.jit(lambda p, t, q, s: jnet.decoder(p, t, q, s, arch))
    rng = np.random.default_rng(3)
    firsts = [rng.integers(0, VOCAB, n).astype(np.int32) for n in (5, 30, 12, 60)]
    candidates = [rng.choice(256, k, replace=False) for k in (1, 17, 256, 3)]
    kv = jkv.SecondBytes(arch, params, byte0=11)
    got = kv.log_probs(firsts, candidates, lambda n: 64)
    for f, c, g in zip(firsts, candidates, got):
        assert g.shape == (len(c), VOCAB)
        assert_log_probs_close(g, _whole_sequence_reads(fwd, params, f, c), arch, 64, "cache against whole")


def test_a_session_keeps_each_prompt_s_cache_across_calls():
    """The JAX engine's key-value `Session`: prompts prefilled on their first call, their caches reused by later calls
    (a few rows of a prefill, a 256-candidate prompt split by the slot budget), against whole
    sequences."""
    from pingctl.infer.runtime import prepare_env

    prepare_env("cpu", True)
    import jax

    from pingctl.infer.engines import arch as A
    from pingctl.infer.engines.jax import kv as jkv
    from pingctl.infer.engines.jax import net as jnet

    arch = A.Arch.from_keys(_keys("tiny"))
    params = jnet.prepare(arch, _random_tensors(arch))
    fwd = jax.jit(lambda p, t, q, s: jnet.decoder(p, t, q, s, arch))
    rng = np.random.default_rng(4)
    firsts = [rng.integers(0, VOCAB, n).astype(np.int32) for n in (5, 30, 12, 60, 9) * 8]
    session = jkv.SecondBytes(arch, params, byte0=11).session(firsts, lambda n: 64)
    rounds = [(list(range(0, 40, 2)), [rng.choice(256, k, replace=False) for k in (1, 3, 0, 17) * 5]),
              ([3, 4, 39], [rng.choice(256, 2, replace=False), rng.choice(256, 256, replace=False), np.arange(5)]),
              (list(range(40)), [rng.choice(256, 2, replace=False) for _ in range(40)])]
    prefilled = []
    for prompts, candidates in rounds:
        got = session.log_probs(prompts, candidates)
        prefilled.append(len(session.groups))
        for i, c, g in zip(prompts, candidates, got):
            assert g.shape == (len(c), VOCAB)
            if not len(c):
                continue
            assert_log_probs_close(g, _whole_sequence_reads(fwd, params, firsts[i], c), arch, 64, f"prompt {i}")
    assert len(session.where) == 40
    # 15 prompts with candidates, then 2 more (3 and 39), then the other 23: each prefilled once
    assert prefilled == [1, 2, 3]


@pytest.mark.slow
def test_rtt_reads_are_the_same_with_and_without_the_kept_caches(tiny_run, synth_rows):
    """`rtt_distributions_at` with each prompt's cache kept across its rounds against the same
    rounds run from scratch (the model without `second_byte_session`)."""
    import pyarrow.parquet as pq

    from pingctl.infer import queries as Q
    from pingctl.infer.model import LoadedModel
    from pingctl.tokenizer import Measurements

    lt = LoadedModel.load(tiny_run, engine="light")
    rows = Measurements.from_arrow(pq.read_table(synth_rows / "synth" / "part-00000.parquet").slice(0, 300))
    src, dst = rows.src_text(), rows.dst_text()
    prompts = []
    for k in range(12):  # 0 to 33 context measurements, cut to fit 200 tokens
        ctx, _ = Q.context_tokens(lt, rows.take(np.arange(20 * k, 20 * k + 3 * k)), 200, timed=False)
        prompts.append(Q.query_prefix(src[250 + k], dst[250 + k], None, ctx, None))

    class Scratch:  # the model's other methods, each round's prompts run again
        def __getattr__(self, name):
            if name == "second_byte_session":
                raise AttributeError(name)
            return getattr(lt, name)

    points = np.linspace(1.0, 300.0, len(prompts))
    kept = Q.rtt_distributions_at(lt, prompts, points=points)
    fresh = Q.rtt_distributions_at(Scratch(), prompts, points=points)
    tol = model_log_tol(lt, [np.append(p, Q.C.RttStart).astype(np.int32) for p in prompts])
    for a, b in zip(kept, fresh):
        assert a.p_fail == b.p_fail  # both from the same first pass: one program on the same inputs
        live = (a.probs > 0) | (b.probs > 0)
        # a code's probability: its two bytes' log-probabilities, each read from a cache or a prefill
        assert_within(np.log(a.probs[live]), np.log(b.probs[live]), 2 * tol, "kept against fresh")
        assert [a.quantile(q) for q in Q.QUANTILES] == [b.quantile(q) for q in Q.QUANTILES]


def test_eval_reads_are_the_same_with_and_without_the_teacher_forced_caches(tiny_run, synth_rows, monkeypatch):
    """eval's reads with the second-byte caches taken from the teacher-forced pass against the
    same reads with every prompt prefilled apart (the model without `teacher_forced_session`)."""
    import pyarrow.parquet as pq

    from pingctl.infer.engines.jax import kv as jkv
    from pingctl.infer import queries as Q
    from pingctl.infer.model import LoadedModel
    from pingctl.infer.score import teacher_forced_kept
    from pingctl.tokenizer import C, Measurements

    lt = LoadedModel.load(tiny_run, engine="light")
    rows = Measurements.from_arrow(pq.read_table(synth_rows / "synth" / "part-00000.parquet").slice(0, 300))
    src, dst = rows.src_text(), rows.dst_text()
    rng = np.random.default_rng(0)
    prompts, fulls = [], []
    for k in range(12):  # 0 to 33 context measurements; every fourth packet failed
        ctx, _ = Q.context_tokens(lt, rows.take(np.arange(20 * k, 20 * k + 3 * k)), 200, timed=False)
        p = Q.query_prefix(src[250 + k], dst[250 + k], None, ctx, None)
        tail = [C.Failed] if k % 4 == 3 else [C.RttStart, *(Q.BYTE0 + rng.integers(0, 40, 1)), Q.BYTE0 + 7]
        prompts.append(p)
        fulls.append(np.concatenate([p, tail]).astype(np.int32))

    class Apart:  # the model's other methods: the prompts prefilled again after the pass
        def __getattr__(self, name):
            if name == "teacher_forced_session":
                raise AttributeError(name)
            return getattr(lt, name)

    prefilled: list[int] = []
    real = jkv.SecondBytes.prefill
    monkeypatch.setattr(jkv.SecondBytes, "prefill",
                        lambda self, firsts, bucket: prefilled.append(len(firsts)) or real(self, firsts, bucket))
    got = {}
    for name, m in (("kept", lt), ("apart", Apart())):
        prefilled.clear()
        first, known, scores, second = teacher_forced_kept(m, prompts, fulls)
        assert (second is None) == (name == "apart")
        got[name] = (scores, Q.rtt_distributions_at(m, prompts, points=np.linspace(1.0, 300.0, 12), first=first,
                                                    known=known, second_bytes=second))
        assert sum(prefilled) == (3 if name == "kept" else 12)  # kept: only the failed packets' prompts
    tol = model_log_tol(lt, fulls)
    for s, t in zip(got["kept"][0], got["apart"][0]):
        assert_within(s, t, tol, "teacher-forced scores")
    for a, b in zip(got["kept"][1], got["apart"][1]):
        assert_probs_close([a.p_fail], [b.p_fail], 2 * tol, "p_fail")  # failure against RttStart
        live = (a.probs > 0) | (b.probs > 0)
        assert_within(np.log(a.probs[live]), np.log(b.probs[live]), 2 * tol, "kept against apart")
        assert [a.quantile(q) for q in Q.QUANTILES] == [b.quantile(q) for q in Q.QUANTILES]


def test_the_architecture_is_read_or_refused_by_key():
    from pingctl.infer.engines import arch as A

    run_keys = {**_keys("mini"), "base_config": "base.yml", "run_name": "r", "learning_rate": 1e-3,
                "remat_policy": "minimal", "adam_weight_decay": 1.0, "attention": "flash", "grain_train_files": "x"}
    a = A.Arch.from_keys(run_keys)  # a run's maxtext.yml: its run and training keys change no forward pass
    assert (a.emb, a.layers, a.heads, a.head_dim, a.mlp, a.activations, a.dtype) == (256, 4, 4, 64, 1024, ("gelu",),
                                                                                        "float32")
    assert (a.eps, a.rope_min, a.rope_max) == (1e-5, 1, 10_000)  # MaxText's base.yml defaults
    assert A.Arch.from_keys({**run_keys, "dtype": "bfloat16"}).dtype == "bfloat16"
    for key, value, says in [("logits_via_embedding", True, "logits_via_embedding=True"),
                             ("decoder_block", "gemma", "decoder_block='gemma'"),
                             ("final_logits_soft_cap", 30.0, "final_logits_soft_cap"),
                             ("sliding_window_size", 128, "does not implement")]:
        with pytest.raises(A.Unsupported, match=says):
            A.Arch.from_keys({**run_keys, key: value})
    with pytest.raises(A.Unsupported, match="no base_mlp_dim"):
        A.Arch.from_keys({k: v for k, v in run_keys.items() if k != "base_mlp_dim"})
    arch = A.Arch.from_keys(run_keys)
    tensors = _random_tensors(arch)
    tensors["decoder.layers.mlp.wo.kernel"] = tensors["decoder.layers.mlp.wo.kernel"][:, :2]
    with pytest.raises(PingctlError, match=r"wo.kernel has shape \[1024, 2, 256\].*\[1024, 4, 256\]"):
        A.check_weights(arch, tensors, "f.safetensors")


# ----------------------------------------------------------------- the trained fixture


@pytest.fixture(scope="module")
def both(tiny_run):
    pytest.importorskip("maxtext")
    from pingctl import Model

    return Model.load(tiny_run, engine="light"), Model.load(tiny_run, engine="maxtext")


@pytest.mark.slow
def test_answers_are_maxtext_s_end_to_end(both, tiny_run, pair, synth_rows):
    """The trained fixture asked the same questions through either engine: the same weights,
    the same distributions (with and without a context), the same completions."""
    import pyarrow.parquet as pq

    from pingctl.infer import queries as Q

    lt, mx = both
    assert (lt.loaded.engine, mx.loaded.engine) == ("light", "maxtext")
    wl, wm = lt.loaded.weights(), mx.loaded.weights()
    assert sorted(wl) == sorted(wm) and all(np.array_equal(wl[k], wm[k]) for k in wl)
    context = pq.read_table(synth_rows / "synth" / "part-00000.parquet").slice(0, 400)
    # the prompt's log-probabilities, at its address bytes too: the scale of every answer below
    tol = model_log_tol(lt.loaded, [Q.query_prefix(*pair, None, np.zeros(0, np.int32), None)])
    for kw in ({}, {"context": context}):
        a, b = lt.rtt(*pair, **kw), mx.rtt(*pair, **kw)
        # P(failure) and each code's probability: two log-probabilities each
        assert_probs_close([a.p_fail], [b.p_fail], 2 * tol, "p_fail")
        assert_probs_close(a.probs, b.probs, 2 * tol, "probs")
        assert a.info["context_tokens"] == b.info["context_tokens"]
    assert lt.rtt(*pair).info["engine"] == "light" and mx.rtt(*pair).info["engine"] == "maxtext"
    ca, cb = lt.complete(pair[0], "8.8.*.*"), mx.complete(pair[0], "8.8.*.*")
    assert [c["dst"] for c in ca] == [c["dst"] for c in cb]
    # a completion's probability: one log-probability per free byte, two here
    assert_probs_close([c["probability"] for c in ca], [c["probability"] for c in cb], 2 * tol, "complete")


@pytest.mark.slow
def test_averaged_checkpoints_are_maxtext_s(tiny_run):
    pytest.importorskip("maxtext")
    from pingctl.artifacts.run import checkpoint_steps
    from pingctl.infer.model import LoadedModel

    steps = checkpoint_steps(tiny_run)
    assert len(steps) >= 2
    lt, mx = (LoadedModel.load(tiny_run, steps[-2:], engine=e) for e in ("light", "maxtext"))
    wl, wm = lt.weights(), mx.weights()
    for k in wm:  # the mean of two checkpoints, each side in its own order
        assert_within(wl[k], wm[k], f32_tol(float(np.abs(wm[k]).max()), len(steps[-2:])), k)
    seq = [np.array([0, 5, 6, 11, 12, 13, 14, 7], np.int32)]
    assert_log_probs_close(lt.log_probs(seq)[0], mx.log_probs(seq)[0], run_arch(tiny_run), len(seq[0]))


def test_a_run_s_checkpoint_is_converted_once(tiny_run, tmp_path):
    """The first light load of a run writes RUN/.light/STEP.safetensors; later loads read it;
    a checkpoint rewritten under the same step is converted again."""
    import shutil

    from pingctl.artifacts.run import COMMITTED, checkpoint_items, checkpoint_steps
    from pingctl.infer.engines import weights as LW
    from pingctl.infer.model import LoadedModel

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns(LW.CACHE_DIR))
    step = checkpoint_steps(run)[-1]
    cached = LW.cache_path(run, step)
    assert not cached.exists()
    first = LoadedModel.load(run, engine="light")
    assert cached.is_file() and first.engine == "light"
    written = cached.stat().st_mtime_ns
    again = LoadedModel.load(run, engine="light")
    assert cached.stat().st_mtime_ns == written  # read, not rewritten
    assert all(np.array_equal(first.weights()[k], v) for k, v in again.weights().items())
    os.utime(checkpoint_items(run, step).parent / COMMITTED, ns=(written + 10**9, written + 10**9))
    LoadedModel.load(run, engine="light")
    assert cached.stat().st_mtime_ns != written  # a new checkpoint under the same step: converted again


def test_the_numpy_runtime_gives_the_light_engine_s_answers(tiny_run, pair):
    """`--engine numpy` (no JAX): the same log-probabilities to float32 rounding."""
    from pingctl.infer import queries as Q
    from pingctl.infer.model import LoadedModel

    lt, npy = LoadedModel.load(tiny_run, engine="light"), LoadedModel.load(tiny_run, engine="numpy")
    assert npy.engine == "numpy"
    rng = np.random.default_rng(2)
    seqs = [rng.integers(0, lt.vocab_size, n).astype(np.int32) for n in (5, 40, 100)]
    arch = run_arch(tiny_run)
    for a, b in zip(lt.log_probs(seqs), npy.log_probs(seqs)):
        assert_log_probs_close(b, a, arch, len(a), "numpy against light")
    prefix = Q.query_prefix(*pair, None, np.zeros(0, np.int32), None)
    tol = model_log_tol(lt, [np.append(prefix, Q.C.RttStart).astype(np.int32)])
    # each code's probability: its two bytes' log-probabilities
    assert_probs_close(Q.rtt_distribution(npy, prefix).probs, Q.rtt_distribution(lt, prefix).probs, 2 * tol)


def test_answering_imports_no_maxtext(tiny_run, pair):
    """A fresh process answers from the run (its conversion cached) importing neither MaxText
    nor its stack (flax, tokamax) nor Orbax."""
    from pingctl.infer.model import LoadedModel

    LoadedModel.load(tiny_run, engine="light")  # the conversion, once
    code = (f"import sys; from pingctl import Model; m = Model.load({str(tiny_run)!r}); "
            f"r = m.rtt({pair[0]!r}, {pair[1]!r}); assert r.probs.sum() > 0.99; print(m.loaded.engine); "
            "print(sorted({k.split('.')[0] for k in sys.modules} & {'maxtext', 'flax', 'tokamax', 'orbax'}))")
    env = {k: v for k, v in os.environ.items() if k != "PINGCTL_ENGINE"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["light", "[]"]


def test_engine_choice_is_checked(tiny_run, pair, monkeypatch):
    r = runner.invoke(app, ["sample", str(tiny_run), "--src", pair[0], "--dst", pair[1], "--engine", "onnx"])
    assert r.exit_code == 2 and "--engine 'onnx': expected one of light, maxtext, numpy" in r.output, r.output
    monkeypatch.setenv("PINGCTL_ENGINE", "fast")
    r = runner.invoke(app, ["sample", str(tiny_run), "--src", pair[0], "--dst", pair[1]])
    assert r.exit_code == 2 and "$PINGCTL_ENGINE 'fast'" in r.output, r.output


@pytest.mark.slow
def test_a_model_the_light_engine_cannot_run_is_left_to_maxtext(tiny_run, pair, tmp_path):
    """A run with a MaxText key the light engine does not implement: refused by name with
    --engine light, answered by MaxText (with a note) by default."""
    pytest.importorskip("maxtext")
    import shutil

    run = tmp_path / "capped"
    shutil.copytree(tiny_run, run)
    with open(run / "maxtext.yml", "a") as f:
        f.write("final_logits_soft_cap: 30.0\n")
    r = runner.invoke(app, ["sample", str(run), "--src", pair[0], "--dst", pair[1], "--engine", "light"])
    assert r.exit_code == 1 and "final_logits_soft_cap" in r.output and "--engine maxtext" in r.output, r.output
    r = runner.invoke(app, ["sample", str(run), "--src", pair[0], "--dst", pair[1], "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["engine"] == "maxtext"
    assert "final_logits_soft_cap" in r.stderr and "answering with MaxText" in r.stderr


def test_a_diverged_checkpoint_is_refused_naming_the_tensor(tiny_run, tmp_path):
    """A run whose checkpoint holds NaN weights (training diverged) answered NaN probabilities
    as if they were answers; it is refused at load, naming the checkpoint and the tensor."""
    import shutil

    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    from pingctl.artifacts.run import checkpoint_steps
    from pingctl.infer.engines import weights as LW
    from pingctl.infer.model import LoadedModel

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    step = checkpoint_steps(run)[-1]
    LoadedModel.load(run, engine="light")  # writes the converted weights, stamped with the checkpoint
    cached = LW.cache_path(run, step)
    with safe_open(str(cached), framework="numpy") as f:
        meta = f.metadata()
    tensors = load_file(str(cached))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].copy()
    tensors[name].flat[-1] = np.inf
    save_file(tensors, str(cached), metadata=meta)  # the same stamp: read as the checkpoint's weights
    with pytest.raises(PingctlError, match=rf"checkpoint {step}\): tensor {name} holds 1 non-finite"):
        LoadedModel.load(run, engine="light")
    r = runner.invoke(app, ["sample", str(run), "--src", "192.0.2.1", "--dst", "192.0.2.2"])
    assert r.exit_code == 1 and "non-finite" in r.output and "--step" in r.output, r.output
