"""The NumPy engine (pingctl/infer/engines/numpy/) against the JAX engine
(pingctl/infer/engines/jax/): the same log-probabilities of whole sequences and of
second bytes from a key-value cache, on the `tiny` and `mini` architectures, and the same
answers from the trained fixture; and the engine chosen where JAX is not installed.

Tolerances: float32's bound for the architecture, the length and the magnitude of the numbers
(tests/tolerance.py), between the engines and between the NumPy engine's own cached and
whole-sequence paths alike: each sums in its own order, and so does one engine on another CPU.
Exact only where the same computation runs twice on the same inputs.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.test_light_engine import SEQ, VOCAB, _batch, _keys, _random_tensors
from tests.tolerance import assert_log_probs_close, assert_probs_close, assert_within, log_prob_tol, model_log_tol

PRESETS = ("tiny", "mini")


def _engines(preset: str):
    """(arch, JAX params, NumPy params) of the preset's architecture with random weights."""
    from pingctl.infer.runtime import prepare_env

    prepare_env("cpu", True)
    from pingctl.infer.engines import arch as A
    from pingctl.infer.engines.jax import net as jnet
    from pingctl.infer.engines.numpy import net as nnet

    arch = A.Arch.from_keys(_keys(preset))
    tensors = _random_tensors(arch)
    return arch, jnet.prepare(arch, tensors), nnet.prepare(arch, tensors)


@pytest.mark.parametrize("preset", PRESETS)
def test_the_numpy_decoder_is_the_jax_one(preset):
    """A padded batch (a full row, rows cut at 40 and 9), and a row of two segments (the general
    mask), at every position a caller reads."""
    import jax

    from pingctl.infer.engines.jax import net as jnet
    from pingctl.infer.engines.numpy import net as nnet

    arch, pj, pn = _engines(preset)
    tok, pos, seg = _batch(np.random.default_rng(1))
    seg[0, 30:] = 2  # two segments in one row: masked attention rather than a prefix's causal one
    pos[0, 30:] -= 30
    want = np.asarray(jax.jit(lambda p, *x: jnet.decoder(p, *x, arch))(pj, tok, pos, seg))
    got = nnet.decoder(pn, tok, pos, seg, arch)
    assert got.dtype == np.float32 and got.shape == want.shape
    live = seg > 0
    assert_log_probs_close(got[live], want[live], arch, SEQ, preset)
    # keys and values for a cache: those of the same pass, at every live position (the same
    # operations on the same inputs as the call above: equal to the bit)
    lp, (keys, values) = nnet.decoder(pn, tok, pos, seg, arch, want_kv=True)
    assert np.array_equal(lp, got) and keys.shape == (arch.layers, *tok.shape, arch.kv_heads, arch.head_dim)


@pytest.mark.parametrize("preset", PRESETS)
def test_second_bytes_from_the_cache_are_the_jax_engine_s(preset):
    """The NumPy engine's key-value cache against the JAX engine's and against the NumPy engine's own whole sequences: prompts
    of different lengths, 0 to 256 candidates (one prompt's 256 split over decode steps)."""
    from pingctl.infer.engines.jax import kv as jkv
    from pingctl.infer.engines.numpy import kv as nkv
    from pingctl.infer.engines.numpy import net as nnet

    arch, pj, pn = _engines(preset)
    rng = np.random.default_rng(3)
    firsts = [rng.integers(0, VOCAB, n).astype(np.int32) for n in (5, 30, 12, 60, 7)]
    candidates = [rng.choice(256, k, replace=False) for k in (1, 17, 256, 3, 0)]
    want = jkv.SecondBytes(arch, pj, byte0=11).log_probs(firsts, candidates, lambda n: 64)
    kv = nkv.SecondBytes(arch, pn, byte0=11)
    kv_slots = nkv.SLOTS
    try:
        nkv.SLOTS = 100  # several decode steps, a prompt's candidates split across them
        got = kv.log_probs(firsts, candidates)
    finally:
        nkv.SLOTS = kv_slots
    for f, c, g, w in zip(firsts, candidates, got, want):
        assert g.shape == (len(c), VOCAB)
        if not len(c):
            continue
        assert_log_probs_close(g, w, arch, SEQ, "numpy cache against jax cache")
        seqs = np.concatenate([np.broadcast_to(f, (len(c), len(f))), 11 + c[:, None]], axis=1).astype(np.int32)
        whole = nnet.decoder(pn, seqs, np.broadcast_to(np.arange(seqs.shape[1]), seqs.shape),
                                    np.ones_like(seqs), arch)[:, -1]
        assert_log_probs_close(g, whole, arch, SEQ, "numpy cache against numpy whole sequences")


@pytest.mark.parametrize("preset", PRESETS)
def test_the_float32_bound_still_sees_half_precision(preset):
    """The bound the engines are held to is no blanket: the NumPy engine on the same weights
    rounded to float16 (a model computed at half precision) is far outside it."""
    import jax

    from pingctl.infer.engines.jax import net as jnet
    from pingctl.infer.engines.numpy import net as nnet

    arch, pj, _ = _engines(preset)
    half = {k: v.astype(np.float16).astype(np.float32) for k, v in _random_tensors(arch).items()}
    tok, pos, seg = _batch(np.random.default_rng(1))
    want = np.asarray(jax.jit(lambda p, *x: jnet.decoder(p, *x, arch))(pj, tok, pos, seg))
    got = nnet.decoder(nnet.prepare(arch, half), tok, pos, seg, arch)
    live = seg > 0
    assert np.abs(got - want)[live].max() > 10 * log_prob_tol(arch, SEQ, want[live])


def test_a_session_keeps_each_prompt_s_cache(monkeypatch):
    """The NumPy engine's key-value `Session`: a prompt prefilled on its first call with candidates, or taken from
    a teacher-forced pass over a sequence it starts, and never prefilled again."""
    from pingctl.infer.engines.numpy import kv as nkv

    arch, pj, pn = _engines("tiny")
    rng = np.random.default_rng(4)
    firsts = [rng.integers(0, VOCAB, n).astype(np.int32) for n in (5, 30, 12, 60)]
    kv = nkv.SecondBytes(arch, pn, byte0=11)
    prefilled: list[int] = []
    real = nkv.SecondBytes.prefill
    monkeypatch.setattr(nkv.SecondBytes, "prefill",
                        lambda self, f: prefilled.append(len(f)) or real(self, f))
    session = kv.session(firsts)
    # prompts 0 and 1 start their sequences; prompt 2's sequence is another one
    seqs = [np.concatenate([firsts[0], [3, 4]]), np.concatenate([firsts[1], [5]]), firsts[3][:20]]
    lps = session.whole([s.astype(np.int32) for s in seqs] + [firsts[3]])
    assert [lp.shape for lp in lps] == [(len(s), VOCAB) for s in seqs] + [(60, VOCAB)]
    assert sorted(session.caches) == [0, 1, 3]
    c = [np.arange(7), np.arange(256), np.array([9]), np.array([1, 2])]
    got = session.log_probs([0, 1, 2, 3], c)
    assert prefilled == [1]  # prompt 2 only
    got_again = session.log_probs([2, 0], [np.array([9]), np.arange(7)])
    assert prefilled == [1]
    fresh = nkv.SecondBytes(arch, pn, byte0=11).log_probs(firsts, c)
    for g, f in zip(got, fresh):
        assert_log_probs_close(g, f, arch, SEQ, "a session against a fresh cache")
    # the same caches, read in a decode step of other rows: a matmul of another height, for
    # which a BLAS may pick another kernel, so equal to float32 rounding rather than to the bit
    assert_log_probs_close(got_again[0], got[2], arch, SEQ, "prompt 2 read again")
    assert_log_probs_close(got_again[1], got[0], arch, SEQ, "prompt 0 read again")


# ----------------------------------------------------------------- the trained fixture


@pytest.mark.slow
def test_answers_are_the_light_engine_s(tiny_run, pair, synth_rows):
    """The trained fixture through both engines: exact distributions without and with context,
    lazy reads at quantiles and points, teacher-forced scores; the NumPy engine on its cache."""
    import pyarrow.parquet as pq

    from pingctl.infer.engines.numpy import kv as nkv
    from pingctl.infer import queries as Q
    from pingctl.infer.model import LoadedModel
    from pingctl.infer.score import teacher_forced_kept
    from pingctl.tokenizer import Measurements

    lt, npy = LoadedModel.load(tiny_run, engine="light"), LoadedModel.load(tiny_run, engine="numpy")
    assert npy.engine == "numpy" and npy.device == "cpu"
    rows = Measurements.from_arrow(pq.read_table(synth_rows / "synth" / "part-00000.parquet").slice(0, 300))
    src, dst = rows.src_text(), rows.dst_text()
    prompts = [Q.query_prefix(*pair, None, np.zeros(0, np.int32), None)]
    for k in (4, 24):
        ctx, _ = Q.context_tokens(lt, rows.take(np.arange(10 * k, 11 * k)), 240, timed=False)
        prompts.append(Q.query_prefix(src[250 + k], dst[250 + k], None, ctx, None))
    tol = model_log_tol(lt, [np.append(p, Q.C.RttStart).astype(np.int32) for p in prompts])
    # P(failure) and each code's probability are made of two log-probabilities each (failure
    # against RttStart, first byte and second byte)
    for a, b in zip(Q.rtt_distributions(lt, prompts), Q.rtt_distributions(npy, prompts)):
        assert_probs_close([b.p_fail], [a.p_fail], 2 * tol, "p_fail")
        assert_probs_close(b.probs, a.probs, 2 * tol, "probs")
    assert isinstance(npy._kv, nkv.SecondBytes)  # 256 candidates a prompt: the cache ran
    points = np.linspace(1.0, 300.0, len(prompts))
    for a, b in zip(Q.rtt_distributions_at(lt, prompts, points=points),
                    Q.rtt_distributions_at(npy, prompts, points=points)):
        live = (a.probs > 0) | (b.probs > 0)
        assert_within(np.log(b.probs[live]), np.log(a.probs[live]), 2 * tol, "lazy reads")
        assert [a.quantile(q) for q in Q.QUANTILES] == [b.quantile(q) for q in Q.QUANTILES]
    fulls = [np.concatenate([p, [Q.C.RttStart, Q.BYTE0 + 3, Q.BYTE0 + 7]]).astype(np.int32) for p in prompts]
    for s, t in zip(teacher_forced_kept(lt, prompts, fulls)[2], teacher_forced_kept(npy, prompts, fulls)[2]):
        assert_within(t, s, tol, "teacher-forced scores")


def _without_jax(code: str, env_engine: str | None = None) -> subprocess.CompletedProcess:
    """`code` in a fresh process where `import jax` fails, as in an install without JAX."""
    env = {k: v for k, v in os.environ.items() if k != "PINGCTL_ENGINE"}
    if env_engine:
        env["PINGCTL_ENGINE"] = env_engine
    return subprocess.run([sys.executable, "-c", "import sys; sys.modules['jax'] = None\n" + code],
                          capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
def test_without_jax_the_numpy_engine_answers(tiny_run, pair):
    """No JAX: `Model.load` and `pingctl sample` answer with NumPy, say so, and import neither JAX
    nor MaxText; `--engine light` is refused in one line naming the extra that brings JAX."""
    from pingctl.infer.model import LoadedModel

    LoadedModel.load(tiny_run, engine="light")  # the run's checkpoint converted, once
    code = (f"from pingctl import Model; m = Model.load({str(tiny_run)!r}); r = m.rtt(*{pair!r}); "
            "import json; print(json.dumps({'engine': m.loaded.engine, 'sum': float(r.probs.sum()), "
            "'heavy': sorted({k.split('.')[0] for k in sys.modules if sys.modules[k] is not None} "
            "& {'jax', 'jaxlib', 'maxtext', 'flax', 'orbax'})}))")
    out = _without_jax(code)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["engine"] == "numpy" and got["sum"] > 0.99 and got["heavy"] == [], got
    cli = ("from pingctl.cli import main; sys.argv = ['pingctl', 'sample', %r, '--src', %r, '--dst', %r, '--json']; "
           "main()" % (str(tiny_run), *pair))
    out = _without_jax(cli)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["engine"] == "numpy"
    out = _without_jax(cli, env_engine="light")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "jax is not installed; pip install " in out.stdout + out.stderr and "[infer]" in out.stderr


@pytest.mark.slow
def test_the_service_warm_up_on_the_numpy_engine_asks_no_context_levels(tiny_run):
    """`pingctl serve`'s warm-up exists to compile shapes; the NumPy engine compiles none, so it
    asks the questions without context only (one pair and a full batch, exact and not; a
    completion, a search and a scoring: 7 calls), where the light engine climbs every context
    level up to a full prompt."""
    from pingctl.api import Model
    from pingctl.serve import warmup as W

    npy = Model.load(tiny_run, engine="numpy")
    done = W.warm(npy, 32, npy.metadata()["seq_len"], 32)
    assert done["calls"] == 7 and done["context_measurements"] == [0], done
    assert len(W.levels(npy.metadata()["seq_len"])) > 2  # what the light engine would have climbed


def test_the_warm_up_of_a_run_trained_with_the_rtt_last_asks_no_search(tiny_run, tmp_path):
    """A run trained with loader.result_last=1 (`./run regimes`'s recipe) refuses a search (its
    prompts put the RTT first): the warm-up leaves it out instead of failing, so `pingctl serve`
    reports ready and `pingctl bench serve` runs."""
    import shutil

    import yaml

    from pingctl.api import Model
    from pingctl.serve import warmup as W

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["loader"]["result_last"] = 1.0
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    npy = Model.load(run, engine="numpy")
    with pytest.raises(Exception, match="result_last=1"):
        npy.search("192.0.2.1", "10-30")
    done = W.warm(npy, 32, npy.metadata()["seq_len"], 32)
    assert done["calls"] == 6 and done["context_measurements"] == [0], done
