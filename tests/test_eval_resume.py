"""An interrupted eval resumes: what the model computed for each finished chunk is kept in
OUT/.resume (artifacts.eval_output.Resume) and given back bit for bit (eval.model), here without
a trained model; the whole eval interrupted and run again: tests/test_eval_regimes.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import pingctl.eval.model as EM
from pingctl.artifacts.eval_output import RESUME, Resume
from pingctl.infer import queries as Q


def _dists(n: int, seed: int = 0, scale: float | None = None) -> list:
    """Distributions as the passes make them: the code table's codes and values, an unrefined
    first byte's mass spread evenly over its 256 codes, a refined one's not."""
    rng = np.random.default_rng(seed)
    codes, values = Q.code_table()[:2]
    out = []
    for _ in range(n):
        joint = np.repeat(rng.random(256)[:, None] / 256, 256, axis=1)
        joint[rng.integers(256)] = rng.random(256) / 256
        j = joint.reshape(-1)[codes.astype(np.int64)]
        out.append(Q.RttDistribution(float(rng.random()), codes, values if scale is None else values * scale,
                                     j / j.sum()))
    return out


def _scores(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.log(rng.random(int(k))).astype(np.float32) for k in rng.integers(5, 40, n)]


@pytest.mark.parametrize("scale", [None, 1.7])
def test_a_chunk_comes_back_bit_for_bit(scale):
    ks = np.array([4, 0, 2])
    dists, scores = _dists(3, scale=scale), _scores(3)
    arrays = EM.chunk_arrays(ks, scores, dists)
    # the code table is not kept again; the values only where a hint's scale moved them
    assert "codes" not in arrays and ("values_ms" in arrays) == (scale is not None)
    got_scores, got = EM.from_chunk(arrays, ks)
    codes, values = Q.code_table()[:2]
    for a, b in zip(scores, got_scores):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes() and b.base is None
    for a, b in zip(dists, got):
        assert type(b.p_fail) is float and b.p_fail == a.p_fail
        assert b.probs.tobytes() == a.probs.tobytes() and b.values_ms.tobytes() == a.values_ms.tobytes()
        assert b.codes is codes and (scale is not None or b.values_ms is values)
    # kept for other packets: not theirs
    assert EM.from_chunk(arrays, np.array([4, 0, 3])) is None
    assert EM.from_chunk(None, ks) is None


def test_a_kept_chunk_is_read_back_under_its_key_only(tmp_path):
    arrays = {"ks": np.arange(3), "x": np.linspace(0, 1, 5)}
    kept = Resume(tmp_path).ask({"k": 1})
    assert kept.read(0) is None
    kept.keep(0, arrays)
    names = sorted(p.name for p in (tmp_path / RESUME / "ask-0").iterdir())
    assert names == ["chunk-0000000.npz", "key.json"]  # no temp left beside them
    again = Resume(tmp_path).ask({"k": 1})
    assert {k: v.tolist() for k, v in again.read(0).items()} == {k: v.tolist() for k, v in arrays.items()}
    assert again.read(8) is None
    # the second ask of the eval has a folder of its own
    resume = Resume(tmp_path)
    resume.ask({"k": 1})
    assert resume.ask({"k": 1}).read(0) is None
    # another key: not read, and the stale chunks are gone
    other = Resume(tmp_path).ask({"k": 2})
    assert other.read(0) is None and not (tmp_path / RESUME / "ask-0").exists()
    (tmp_path / RESUME / "ask-0").mkdir()
    (tmp_path / RESUME / "ask-0" / "key.json").write_text('{"k": 1}')
    (tmp_path / RESUME / "ask-0" / "chunk-0000000.npz").write_bytes(b"not a zip")
    assert Resume(tmp_path).ask({"k": 1}).read(0) is None  # unreadable: computed again
    Resume(tmp_path).finish()
    assert not (tmp_path / RESUME).exists() and tmp_path.exists()


def test_a_chunk_that_cannot_be_kept_leaves_the_eval_going(tmp_path, monkeypatch, caplog):
    import pingctl.artifacts.eval_output as EO

    def full(_path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(EO, "atomic_file", full)
    kept = Resume(tmp_path).ask({"k": 1})
    kept.keep(0, {"ks": np.arange(2)})
    kept.keep(2, {"ks": np.arange(2)})
    assert kept.read(0) is None
    assert sum("not keeping" in r.message for r in caplog.records) == 1


class _Interrupted(Exception):
    pass


def _passes(tmp_path: Path, monkeypatch, n: int = 10, reads=(0.5, 0.9), stop: int | None = None):
    """ModelPasses over `n` made-up packets with a made-up pass (each packet's answer from its own
    prompt), `stop`: interrupted before that many passes; returns (passes, model passes run,
    progress calls) or raises _Interrupted."""
    calls = []

    def one_pass(self, ks):
        if stop is not None and len(calls) == stop:
            raise _Interrupted
        calls.append(list(ks))
        dists = [_dists(1, seed=int(self.ps[k][0]))[0] for k in ks]
        return [np.full(len(self.fulls[k]) - 1, -0.5 * k, np.float32) for k in ks], dists

    monkeypatch.setattr(EM.ModelPasses, "_pass", one_pass)
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    model = SimpleNamespace(run=run, steps=(60,), engine="light", device="cpu", batch=8, seq_len=256)
    ps = [np.array([k, 1, 2][: 1 + k % 3]) for k in range(n)]
    fulls = [np.concatenate([p, [7, 8]]) for p in ps]
    passes = EM.ModelPasses(model, ps, fulls, np.arange(n, dtype=np.float64), reads, 1e-3, None, 3)
    shown = []
    passes.run(lambda done, total: shown.append((done, total)),
               Resume(tmp_path / "out").ask(passes.key()))
    return passes, calls, shown


def test_a_rerun_passes_only_the_chunks_not_kept(tmp_path, monkeypatch):
    whole, calls, _ = _passes(tmp_path, monkeypatch)
    assert len(calls) == 4  # 10 packets, 3 to a pass
    Resume(tmp_path / "out").finish()
    with pytest.raises(_Interrupted):
        _passes(tmp_path, monkeypatch, stop=2)
    again, calls, shown = _passes(tmp_path, monkeypatch)
    assert len(calls) == 2 and shown[0] == (6, 10) and shown[-1] == (10, 10)  # the kept shown done at once
    for a, b in zip(whole.dists, again.dists):
        assert a.probs.tobytes() == b.probs.tobytes() and a.p_fail == b.p_fail
    assert [s.tobytes() for s in whole.scores] == [s.tobytes() for s in again.scores]
    # other reads (a recalibration map's levels decide which first bytes are refined): nothing reused
    _, calls, shown = _passes(tmp_path, monkeypatch, reads=(0.5, 0.95))
    assert len(calls) == 4 and shown[0] == (0, 10)


def test_the_key_holds_the_inputs_and_the_model(tmp_path, monkeypatch):
    passes, _, _ = _passes(tmp_path, monkeypatch)
    key = passes.key()
    assert key["model"]["steps"] == [60] and key["chunk"] == 3 and key["reads"] == [0.5, 0.9]
    passes.ps[3] = passes.ps[3] + 1  # another prompt: another key
    assert passes.key()["inputs"] != key["inputs"]
    passes.model.batch = 16  # another batch shape can move the last bit of a float
    assert passes.key()["model"] != key["model"]
