"""The question objects of `pingctl sample` (pingctl/infer/questions.py) and the CLI's option
parsing that builds them (pingctl/cli/sample_options.py): which options make which question, what
each refuses, the bounds on every size. No model, no run: fast."""

from __future__ import annotations

from pathlib import Path

import pytest

from pingctl.errors import PingctlError, UsageError
from pingctl.cli.sample_options import question_from_options
from pingctl.infer import questions as QS


def ask(**options):
    return question_from_options(**options)


def test_the_mode_follows_from_what_was_given():
    q = ask(src=" 1.2.3.4 ", dst="8.8.8.8")
    assert isinstance(q, QS.RttQuestion) and (q.src, q.dst, q.time) == ("1.2.3.4", "8.8.8.8", None)
    q = ask(src="8.8.*.*")
    assert isinstance(q, QS.CompleteQuestion) and q.dst == "*.*.*.*" and q.k == QS.K
    assert ask(dst="2a09:6189::/32").src == "::/0"  # the side left out: the other side's family
    q = ask(src="1.2.3.4", rtt="10-30")
    assert isinstance(q, QS.InverseQuestion) and (q.rtt_lo, q.rtt_hi, q.samples) == (10.0, 30.0, QS.SAMPLES)
    q = ask()
    assert isinstance(q, QS.GenerateQuestion) and (q.streams, q.measurements) == (QS.STREAMS, QS.MEASUREMENTS)
    assert ask(src="1.2.3.4", n=3).src == "1.2.3.4"
    assert isinstance(ask(pairs=Path("p.csv")), QS.PairsQuestion)
    with pytest.raises(UsageError, match="say what to ask"):
        ask(dst="8.8.8.8")
    with pytest.raises(UsageError, match="say what to ask"):
        ask(src="1.2.3.4", dst="8.8.8.8", rtt="20")


def test_sampling_values_come_from_the_options_then_the_config():
    class Sampling:
        seed, temperature, top_p = 7, 0.5, 0.9

    q = ask(n=2, sampling=Sampling())
    assert (q.seed, q.temperature, q.top_p) == (7, 0.5, 0.9)
    q = ask(n=2, seed=3, temperature=2.0, sampling=Sampling())
    assert (q.seed, q.temperature, q.top_p) == (3, 2.0, 0.9)
    q = ask(src="1.2.3.4", rtt="20")
    assert (q.seed, q.temperature) == (0, 1.0)


@pytest.mark.parametrize("options, message", [
    ({"src": "1.2.3.4", "dst": "8.8.8.8", "n": 4}, "--n does not apply to an RTT distribution (--src IP --dst IP); "
                                                  "it is for inverse search and generation"),
    ({"src": "1.2.3.4", "dst": "8.8.8.8", "k": 4}, "-k does not apply to an RTT distribution"),
    ({"n": 2, "calibration": Path("c.json")}, "--calibration does not apply to generation"),
    ({"src": "8.8.*.*", "seed": 1}, "--seed does not apply to a completion"),
    ({"src": "1.2.3.4", "rtt": "20", "top_p": 0.5}, "--top-p does not apply to inverse search"),
    ({"src": "1.2.3.4", "rtt": "20", "out": Path("x.json")}, "--out does not apply to inverse search"),
    ({"n": 2, "time": "2021-01-01"}, "--time does not apply to generation"),
    ({"src": "1.2.3.4", "dst": "8.8.8.8", "since": "2021-01-01"}, "--since does not apply"),
    ({"src": "1.2.3.4", "dst": "8.8.8.8", "measurements": 3}, "--measurements does not apply"),
    ({"src": "1.2.3.4", "dst": "8.8.8.8", "exact": True}, "--exact is for --pairs"),
    ({"pairs": Path("p.csv"), "src": "1.2.3.4", "n": 2}, "--src, --n: --pairs answers the pairs"),
    ({"pairs": Path("p.csv"), "k": 3, "seed": 1}, "-k, --seed: --pairs computes each pair's RTT distribution exactly"),
    ({"pairs": Path("p.csv"), "out": Path("p.txt")}, "--pairs writes .parquet, .csv or .json"),
    ({"n": 2, "out": Path("s.txt")}, "written as .parquet, .csv or .json"),
    ({"src": "8.8.*.*", "rtt": "10-30"}, "a completion conditions on one RTT"),
    ({"src": "1.2.3.4", "rtt": "10-"}, "a range needs both ends"),
    ({"n": 2, "context_per_pair": 3}, "give --context too"),
    ({"n": 2, "context": Path("c.parquet"), "context_per_pair": -1}, "must be >= 0"),
    ({"src": "1.2.3.4", "dst": "2001:db8::1"}, "--src is IPv4 but --dst is IPv6"),
    ({"src": "fe80::1%eth0", "dst": "fe80::2"}, "--src 'fe80::1%eth0': an IPv6 zone id"),
    ({"n": 2, "since": "2021-02-01", "until": "2021-01-01"}, "is after --until"),
    ({"n": 2, "since": "1990-01-01"}, "generated rows are canonical rows"),
    ({"src": "1.2.3.4", "dst": "8.8.8.8", "time": " "}, "--time is empty"),
])
def test_each_question_refuses_what_does_not_fit_it(options, message):
    with pytest.raises(UsageError) as e:
        ask(**options)
    assert message in str(e.value)


@pytest.mark.parametrize("options, name, bound", [
    ({"n": QS.MAX_STREAMS + 1}, "--n", QS.MAX_STREAMS),
    ({"n": 1_000_000_000_000}, "--n", QS.MAX_STREAMS),
    ({"n": 1, "measurements": QS.MAX_MEASUREMENTS + 1}, "--measurements", QS.MAX_MEASUREMENTS),
    ({"n": QS.MAX_GENERATED // QS.MAX_MEASUREMENTS + 1, "measurements": QS.MAX_MEASUREMENTS}, "--measurements",
     QS.MAX_GENERATED),
    ({"src": "1.2.3.4", "rtt": "10-30", "n": QS.MAX_SAMPLES + 1}, "--n", QS.MAX_SAMPLES),
    ({"src": "1.2.3.4", "rtt": "10-30", "n": 1_000_000_000_000}, "--n", QS.MAX_SAMPLES),
    ({"src": "1.2.3.4", "rtt": "10-30", "k": QS.MAX_K + 1}, "-k", QS.MAX_K),
    ({"src": "8.8.*.*", "k": QS.COMPLETE_BEAM + 1}, "-k", QS.COMPLETE_BEAM),
])
def test_every_size_is_bounded_by_name(options, name, bound):
    with pytest.raises(UsageError) as e:
        ask(**options)
    assert f"{name} " in str(e.value) and f"bound of {bound:,}" in str(e.value)


def test_sizes_at_the_bound_are_questions():
    assert ask(n=QS.MAX_STREAMS, measurements=QS.MAX_GENERATED // QS.MAX_STREAMS).streams == QS.MAX_STREAMS
    assert ask(n=1, measurements=QS.MAX_MEASUREMENTS).measurements == QS.MAX_MEASUREMENTS
    assert ask(src="1.2.3.4", rtt="20", n=QS.MAX_SAMPLES, k=QS.MAX_K).samples == QS.MAX_SAMPLES
    assert ask(src="8.8.*.*", k=QS.COMPLETE_BEAM).k == QS.COMPLETE_BEAM


def test_the_objects_check_themselves_for_api_callers():
    # a question built without the options (the Python API, a service) is held to the same rules
    with pytest.raises(UsageError, match="--n 100,001 is beyond the bound of 100,000"):
        QS.InverseQuestion(src="1.2.3.4", rtt_lo=10, rtt_hi=30, samples=100_001)
    with pytest.raises(UsageError, match="--n must be at least 1"):
        QS.GenerateQuestion(streams=0)
    with pytest.raises(UsageError, match="beyond the bound of 1,000,000 generated measurements"):
        QS.GenerateQuestion(streams=1_000, measurements=1_001)
    with pytest.raises(UsageError, match="whole addresses"):
        QS.RttQuestion(src="8.8.*.*", dst="1.2.3.4")
    with pytest.raises(UsageError, match="-k 65"):
        QS.CompleteQuestion(src="8.8.*.*", dst="*.*.*.*", k=65)
    q = QS.RttQuestion(src="1.2.3.4", dst="8.8.8.8")
    with pytest.raises(Exception):  # frozen: a checked question stays checked
        q.src = "8.8.*.*"


def test_an_unwritable_out_is_refused_before_any_work(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(PingctlError, match="cannot be written"):
        ask(src="1.2.3.4", dst="8.8.8.8", plot=blocker / "d.png")
    with pytest.raises(PingctlError, match="cannot be written"):
        ask(pairs=Path("p.csv"), out=blocker / "p.parquet")


def test_run_rules_are_read_only_when_the_question_needs_them(tmp_path):
    # no config.yaml there: a question that needs none of the run's rules does not read it
    for q in (ask(src="1.2.3.4", dst="8.8.8.8"), ask(n=2), ask(src="8.8.*.*")):
        QS.check_run(q, tmp_path)
    for q in (ask(src="1.2.3.4", dst="8.8.8.8", time="2021-01-01"), ask(src="1.2.3.4", rtt="20"),
              ask(n=2, timestamps=True), ask(n=2, since="2021-01-01")):
        with pytest.raises(PingctlError, match="not a `pingctl train` run"):
            QS.check_run(q, tmp_path)


def test_the_cli_help_defaults_are_the_library_s_and_bench_bounds_agree():
    from pingctl.cli import bench_cmd, sample_cmd

    assert (sample_cmd._K, sample_cmd._MEASUREMENTS) == (QS.K, QS.MEASUREMENTS)
    assert bench_cmd.MAX_STREAMS == QS.MAX_STREAMS
