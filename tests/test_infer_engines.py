"""The table of inference engines (pingctl/infer/engines/registry.py): an engine added at run
time through the table alone answers an RTT question end to end through `pingctl.Model`, a
model one engine does not implement falls back to the engine it names, and unknown names are
refused before anything loads."""

from __future__ import annotations

import numpy as np
import pytest

from pingctl.errors import PingctlError, UsageError
from pingctl.infer.engines import registry
from pingctl.infer.engines.base import Engine, Source, Unsupported
from pingctl.tokenizer import C, get_vocab
from pingctl.tokenizer.rtt_codec import decode_rtt, token_codes

RTT_MS = 42.0  # the RTT the fake model always answers
P_FAIL = 0.25  # and its probability of failure


class FixedModel(Engine):
    """A "model" in a few lines of NumPy: after RttStart it puts all its mass on the first byte
    of RTT_MS's code, after that byte on the second; everywhere else Failed against RttStart in
    the ratio P_FAIL : 1 - P_FAIL, the rest of the vocabulary far below."""

    name = "fixed"
    title = "a fixed table"

    def __init__(self, source: Source):
        vocab = get_vocab(source.cfg.tokenizer.scheme)
        super().__init__(source, vocab_size=vocab.size)
        self.byte0 = vocab.byte_offset
        code = int(token_codes([RTT_MS])[0])
        self.hi, self.lo = code >> 8, code & 0xFF
        self.passes = 0

    @classmethod
    def load(cls, source: Source) -> FixedModel:
        return cls(source)

    def _row(self, peak: int | None) -> np.ndarray:
        row = np.full(self.vocab_size, -60.0, np.float32)
        if peak is None:
            row[C.Failed], row[C.RttStart] = np.log(P_FAIL), np.log(1 - P_FAIL)
        else:
            row[peak] = 0.0
        return row

    def forward(self, tokens, positions, segments) -> np.ndarray:
        self.passes += 1
        rows = np.stack([self._row(None), self._row(self.byte0 + self.hi), self._row(self.byte0 + self.lo)])
        after_first = np.zeros(tokens.shape, bool)
        after_first[:, 1:] = tokens[:, :-1] == C.RttStart
        which = np.where(tokens == C.RttStart, 1, np.where(after_first & (tokens == self.byte0 + self.hi), 2, 0))
        return rows[which]


class Picky(FixedModel):
    """An engine that implements no model: the loader answers with its fallback instead."""

    name = "picky"
    fallback = "fixed"

    @classmethod
    def load(cls, source: Source) -> Picky:
        raise Unsupported("MaxText key decoder_block='gemma' (picky implements none)")


@pytest.fixture
def table():
    registry.register(FixedModel.name, FixedModel)
    registry.register(Picky.name, Picky)
    yield registry
    registry.unregister(FixedModel.name)
    registry.unregister(Picky.name)


def test_an_engine_registered_in_the_table_answers_through_the_public_api(table, tiny_run, pair):
    from pingctl import Model

    m = Model.load(tiny_run, engine="fixed")
    r = m.rtt(*pair)
    assert m.loaded.net.passes > 0  # the answer came from the fake's forward passes
    assert m.metadata()["engine"] == "fixed" and r.info["engine"] == "fixed"
    assert r.p_fail == pytest.approx(P_FAIL, rel=1e-5)
    want = float(decode_rtt(token_codes([RTT_MS]))[0])
    assert r.quantile(0.05) == r.quantile(0.95) == pytest.approx(want, rel=1e-6)
    # the engine compiles nothing and keeps no cache: what the loader asks of it, it reads
    # from the table's attributes, not from its name
    assert not m.loaded.compiles and m.loaded._kv is None


def test_a_model_the_default_engine_does_not_implement_falls_back(table, tiny_run, pair, monkeypatch, capsys):
    from pingctl.infer.model import LoadedModel

    monkeypatch.setattr(registry, "DEFAULTS", ("picky",))
    m = LoadedModel.load(tiny_run)
    assert m.engine == "fixed"
    assert "answering with a fixed table" in capsys.readouterr().err
    # asked for by name, the engine that cannot answer says so and names its fallback
    with pytest.raises(PingctlError, match=r"--engine picky: .*\(picky implements none\); answer with --engine fixed"):
        LoadedModel.load(tiny_run, engine="picky")


def test_unknown_engines_are_refused_naming_the_table(table, tiny_run, monkeypatch):
    from pingctl.infer.model import LoadedModel

    with pytest.raises(UsageError, match="--engine 'nope': expected one of light, maxtext, numpy, fixed, picky"):
        LoadedModel.load(tiny_run, engine="nope")
    monkeypatch.setenv("PINGCTL_ENGINE", "nope")
    with pytest.raises(UsageError, match=r"\$PINGCTL_ENGINE 'nope'"):
        LoadedModel.load(tiny_run)
    assert registry.compared("all") == ["light", "maxtext", "numpy"]  # bench's `all`: the table's own engines
