"""One prompt specification (`pingctl.prompt.PromptSpec`): the policy parsed once, the per-pair
cap decided by one rule, and every path that asks a model (sample's single question and
--pairs, the API and the service through them, score, eval) reading the same cap from it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pingctl.artifacts.run import MAXTEXT_YML, write_config
from pingctl.config import Config
from pingctl.errors import UsageError
from pingctl.infer import pairs as P
from pingctl.infer import questions as QS
from pingctl.infer import score as S
from pingctl.prompt import FAIR_POLICIES, Policy, PromptSpec, check_sides, parse_policy, regime_policies
from pingctl.tokenizer import Measurements

MAX_PER_PAIR, TRI_PER_PAIR = 3, 2  # distinct, so a path that takes the wrong one shows


def _config(**loader) -> Config:
    return Config.model_validate({"loader": {"max_per_pair": MAX_PER_PAIR, "triangulation_per_pair": TRI_PER_PAIR,
                                             "triangulation_share": 0.5, **loader}})


@pytest.fixture
def run(tmp_path) -> Path:
    """A run directory as far as its prompt rules go: its config.yaml (no checkpoint)."""
    d = tmp_path / "run"
    d.mkdir()
    write_config(d / "config.yaml", _config())
    (d / MAXTEXT_YML).write_text("{}\n")
    return d


@pytest.mark.parametrize("policy, cap", [("probe", MAX_PER_PAIR), ("cold", MAX_PER_PAIR), ("none", MAX_PER_PAIR),
                                         ("both", TRI_PER_PAIR), ("pair", 0)])
def test_the_cap_is_the_run_s_own_unless_asked(policy, cap):
    assert PromptSpec.from_run(_config(), policy=policy).cap == cap
    # asked for: that, except in a pair history, which is all one pair
    assert PromptSpec.from_run(_config(), policy=policy, per_pair=7).cap == (0 if policy == "pair" else 7)


def test_a_spec_answers_what_callers_asked_of_the_policy_string():
    both = PromptSpec.from_run(_config(hints_file="h.npz"), policy="both", context=8, context_dst=4)
    assert both.two_sided and not both.uses_pair_history and both.hint and both.tokens_cap == 0
    assert both.describe() == {"context_policy": "both", "context_measurements": 8, "context_per_pair": TRI_PER_PAIR,
                               "context_dst": 4, "hint": "embedding"}
    # the destination side defaults to the source side's size; only `both` has one
    assert PromptSpec.from_run(_config(), policy="both", context=8).context_dst == 8
    probe = PromptSpec.from_run(_config(hints_file="h.npz"), policy="probe", context=8, context_dst=4)
    assert probe.probe_history and probe.has_context and not probe.hint and probe.tokens_cap == MAX_PER_PAIR
    assert probe.describe() == {"context_policy": "probe", "context_measurements": 8, "context_per_pair": MAX_PER_PAIR}
    assert not PromptSpec.from_run(_config(), policy="none").has_context
    assert PromptSpec.from_run(_config(), policy="pair").uses_pair_history


def test_policies_are_parsed_once_with_a_usage_error_naming_the_option():
    assert parse_policy("cold") is Policy.COLD
    with pytest.raises(UsageError, match=r"^--context-policy 'bogus': not a context policy here; expected one of probe, cold, none, both, pair"):
        parse_policy("bogus")
    with pytest.raises(UsageError, match="fair gives each regime its own prompt"):
        PromptSpec.from_run(_config(), policy="fair")
    with pytest.raises(UsageError, match="expected one of probe, both"):
        QS.RttQuestion(src="192.0.2.1", dst="192.0.2.2", context=Path("c.parquet"), context_policy="cold")
    assert regime_policies("fair", FAIR_POLICIES) == FAIR_POLICIES
    assert set(regime_policies("cold", ("time", "pair")).values()) == {Policy.COLD}
    check_sides("fair", 4, True)  # the held-out regimes' prompts are two-sided
    for dst, hints in ((4, None), (None, True)):
        with pytest.raises(UsageError, match="--context-dst|--hints"):
            check_sides("cold", dst, hints)


def test_sample_score_and_eval_read_the_same_cap_from_the_run(run, monkeypatch):
    """Each former site of the cap rule: --pairs and the API's rtt_many and the service
    (`pairs.context_cap`), a single question's context and answer (`Question.prompt`), score
    (`score_rows`), and eval and eval --regimes (`PromptSpec.from_run` of the run's config)."""
    model = SimpleNamespace(run=run, scheme="compact", step=1, steps=(1,), timestamps=True,
                            max_per_pair=MAX_PER_PAIR)
    q = QS.RttQuestion(src="192.0.2.1", dst="192.0.2.2", context=Path("c.parquet"), context_policy="both")
    seen = {}

    def fake_score(_model, rows, _context, policy, per_pair, _chunk, _progress):
        seen[str(policy)] = per_pair
        n = len(rows["rtt"])
        return {"nll": np.zeros(n), "pit": np.zeros(n), "tail_p": np.zeros(n), "p_fail": np.zeros(n),
                "context_measurements": np.zeros(n, np.int64)}

    monkeypatch.setattr(S, "_score", fake_score)
    rows = Measurements.from_fields(["192.0.2.1"] * 3, ["192.0.2.9"] * 3, [10.0, 11.0, 12.0]).to_arrow()
    for policy, cap in (("both", TRI_PER_PAIR), ("probe", MAX_PER_PAIR), ("pair", 0)):
        if policy in QS.CONTEXT_POLICIES:  # sample asks no pair histories
            assert P.context_cap(model, policy, None) == cap
        got = S.score_rows(model, S.ScoreInput(rows, rows.num_rows), context=4, context_policy=policy)
        # what the prompts were cut to is what the scores' metadata records
        assert seen[policy] == cap and S.score_meta(got)["context_per_pair"] == cap
        assert PromptSpec.from_run(_config(), policy=policy).cap == cap  # eval's
    assert q.prompt(run).cap == TRI_PER_PAIR
    # asked for: the same override everywhere
    assert P.context_cap(model, "both", 5) == 5
    assert QS.RttQuestion(src="192.0.2.1", dst="192.0.2.2", context=Path("c.parquet"), context_policy="both",
                          context_per_pair=5).prompt(run).cap == 5


def test_a_single_question_s_both_context_is_capped_as_the_run_was_trained(run):
    """The triangulation context of `sample --src --dst --context-policy both`: the probe's
    measurements to another destination, at most the run's triangulation_per_pair of them."""
    src, dst, other = "192.0.2.1", "192.0.2.2", "192.0.2.3"
    ctx = Measurements.from_fields([src] * 4, [other] * 4, [10.0, 11.0, 12.0, 13.0])
    q = QS.RttQuestion(src=src, dst=dst, context=Path("c.parquet"), context_policy="both")
    read: dict = {}
    picked = QS.probe_context(q, ctx, read, None, run)
    assert read["rows_used"] == TRI_PER_PAIR and len(picked) == TRI_PER_PAIR
    # the most recent of the pair
    assert picked.rtt_ms.tolist() == [12.0, 13.0]
