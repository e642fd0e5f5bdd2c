import json
import os
import pickle
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from pingctl.config import LoaderConfig
from pingctl.loader import pipeline
from pingctl.loader.pipeline import FEATURES, make_dataset
from pingctl.tokenizer import decode, validate

SEQ = 512


def _cfg(**kw):
    base = dict(seq_len=SEQ, batch_size=4, workers=0, shuffle_window=64)
    base.update(kw)
    return LoaderConfig(**base)


def _batches(rows, n, **kw):
    it = iter(make_dataset(rows, _cfg(**kw), with_stats=True))
    return [next(it) for _ in range(n)]


def _segments(batch):
    for b in range(batch["inputs"].shape[0]):
        seg = batch["inputs_segmentation"][b]
        for s in range(1, seg.max() + 1):
            yield batch["inputs"][b][seg == s], batch["inputs_position"][b][seg == s]


def test_batch_format_targets_and_segments(synth_rows):
    for batch in _batches(synth_rows / "rows", 6):
        for k in FEATURES:
            assert batch[k].shape == (4, SEQ) and batch[k].dtype == np.int32
        inp, tgt = batch["inputs"], batch["targets"]
        seg, tseg = batch["inputs_segmentation"], batch["targets_segmentation"]
        assert np.array_equal(tgt[:, :-1], inp[:, 1:])  # targets are inputs shifted left
        live = tseg[:, :-1] != 0
        # a counted target never crosses into another segment or padding
        assert np.all(seg[:, 1:][live] == seg[:, :-1][live])
        assert np.all(tseg[:, -1] == 0) and np.all(tseg[seg == 0] == 0)
        assert np.array_equal(batch["targets_position"], batch["inputs_position"])
        for tokens, pos in _segments(batch):
            assert np.array_equal(pos, np.arange(len(pos)))  # positions restart per segment
            assert validate(tokens, "compact") == []  # every segment is grammatical
        # padding only at the end of a row, never inside
        for row in seg:
            used = int((row > 0).sum())
            assert np.all(row[:used] > 0)


def test_padding_below_one_percent(synth_rows):
    it = iter(make_dataset(synth_rows / "rows", _cfg(seq_len=1024, batch_size=8), with_stats=True))
    used = total = 0
    for _ in range(30):
        b = next(it)
        used += int((b["inputs_segmentation"] > 0).sum())
        total += b["inputs_segmentation"].size
    assert 1 - used / total < 0.01


def _truth_times(synth_rows):
    t = pq.read_table(synth_rows / "synth" / "part-00000.parquet", columns=["dst_addr", "event_time"])
    return {(d, int(e.timestamp())) for d, e in zip(t.column(0).to_pylist(), t.column(1).to_pylist())}


def test_timestamp_modes(synth_rows):
    truth = _truth_times(synth_rows)
    batches = _batches(synth_rows / "rows", 100)
    counts = sum(b["stat_modes"] for b in batches).astype(float)
    for batch in batches[:20]:
        for tokens, _ in _segments(batch):
            dec = decode(tokens, "compact")
            assert dec.errors == []
            m = dec.measurements
            times = m.time_s[m.has_time]
            assert np.all(np.diff(times) >= 0)  # timestamped measurements keep temporal order
            dst = m.dst_text()
            for i in np.flatnonzero(m.has_time):  # deltas reconstruct real measurement times
                assert (dst[i], int(m.time_s[i])) in truth
    shares = counts / counts.sum()
    assert counts.sum() > 800
    assert np.allclose(shares, [0.4, 0.3, 0.3], atol=0.05), shares
    only_none = _batches(synth_rows / "rows", 5, mode_weights=(0, 0, 1))
    for batch in only_none:
        assert batch["stat_modes"][0] == batch["stat_modes"][1] == 0
        for tokens, _ in _segments(batch):
            assert not np.isin(tokens, [5, 6, 7]).any()  # no timestamp role tokens at all
    only_full = _batches(synth_rows / "rows", 5, mode_weights=(1, 0, 0))
    for batch in only_full:
        for tokens, _ in _segments(batch):
            assert decode(tokens, "compact").measurements.has_time.all()


def test_deterministic_and_seed_dependent(synth_rows):
    a = _batches(synth_rows / "rows", 3)
    b = _batches(synth_rows / "rows", 3)
    c = _batches(synth_rows / "rows", 3, seed=7)
    assert all(np.array_equal(x["inputs"], y["inputs"]) for x, y in zip(a, b))
    assert not all(np.array_equal(x["inputs"], y["inputs"]) for x, y in zip(a, c))


RESTORE = """
import pickle, sys, numpy as np
from pingctl.config import LoaderConfig
from pingctl.loader.pipeline import make_dataset
rows, state_file, out_file = sys.argv[1:4]
cfg = LoaderConfig(seq_len=512, batch_size=4, workers=0, shuffle_window=64)
it = iter(make_dataset(rows, cfg))
it.set_state(pickle.load(open(state_file, "rb")))
np.save(out_file, np.stack([next(it)["inputs"] for _ in range(3)]))
"""


def test_state_restores_in_a_fresh_process(synth_rows, tmp_path):
    it = iter(make_dataset(synth_rows / "rows", _cfg()))
    for _ in range(5):
        next(it)
    (tmp_path / "state.pkl").write_bytes(pickle.dumps(it.get_state()))
    expected = np.stack([next(it)["inputs"] for _ in range(3)])
    subprocess.run(
        [sys.executable, "-c", RESTORE, str(synth_rows / "rows"), str(tmp_path / "state.pkl"), str(tmp_path / "o.npy")],
        check=True,
    )
    assert np.array_equal(np.load(tmp_path / "o.npy"), expected)


def test_eval_iterator_is_one_deterministic_padded_pass(synth_rows):
    cfg = _cfg(batch_size=5)
    a = list(make_dataset(synth_rows / "rows", cfg, train=False))
    b = list(make_dataset(synth_rows / "rows", cfg, train=False))
    assert len(a) == len(b) > 0
    assert all(np.array_equal(x["inputs"], y["inputs"]) for x, y in zip(a, b))
    assert all(x["inputs"].shape == (5, SEQ) for x in a)


def test_sharding_splits_elements(synth_rows):
    cfg = _cfg()
    s0 = next(iter(make_dataset(synth_rows / "rows", cfg, shard_index=0, shard_count=2)))["inputs"]
    s1 = next(iter(make_dataset(synth_rows / "rows", cfg, shard_index=1, shard_count=2)))["inputs"]
    assert not np.array_equal(s0, s1)


@pytest.mark.parametrize("with_stats", [True, False])
def test_worker_processes_give_the_same_batches(synth_rows, with_stats):
    # a worker hands the features over as one block in shared memory, the statistics pickled
    rows = synth_rows / "rows"
    it = iter(make_dataset(rows, _cfg(), with_stats=with_stats))
    a = [next(it) for _ in range(2)]
    it = iter(make_dataset(rows, _cfg(workers=1), with_stats=with_stats))
    try:
        b = [next(it) for _ in range(2)]
        state, third = it.get_state(), next(it)
    finally:
        it.close()
    if not with_stats:  # Grain's iterator state (checkpoints) restores the data position through workers
        fresh = iter(make_dataset(rows, _cfg(workers=1), with_stats=False))
        try:
            fresh.set_state(state)
            assert all(np.array_equal(third[k], v) for k, v in next(fresh).items())
        finally:
            fresh.close()
    assert set(b[0]) == set(FEATURES) | ({"stat_modes", "stat_measurements"} if with_stats else set())
    assert all(x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b))
    assert all(b[0][k].dtype == np.int32 and b[0][k].shape == (4, SEQ) for k in FEATURES)


def test_read_threads_automatic_is_none_with_and_without_workers():
    assert pipeline.read_threads(_cfg(), workers=2) == 0
    assert pipeline.read_threads(_cfg(), workers=0) == 0
    assert pipeline.read_threads(_cfg(read_threads=1), workers=0) == 1
    assert pipeline.read_threads(_cfg(read_threads=3), workers=2) == 3  # an explicit value is kept
    assert pipeline.read_threads(_cfg(read_threads=0), workers=0) == 0
    with pytest.raises(ValueError):
        _cfg(read_threads=-2)


def test_visualize_has_grain_log_the_pipeline_graph(synth_rows, caplog):
    import logging

    import grain

    key = "py_dataset_visualization_output_dir"
    before = grain.config.get_or_default(key)
    caplog.set_level(logging.INFO, logger="absl")
    try:
        it = iter(make_dataset(synth_rows / "rows", _cfg(visualize=True)))
        assert grain.config.get_or_default(key) == ""  # Grain's setting for "log it", the one it supports
        assert next(it)["inputs"].shape == (4, SEQ)
    finally:
        grain.config.update(key, before)
    assert "Grain Dataset graph" in caplog.text and "RandomMapMapDataset(transform=PackSequences)" in caplog.text


def test_bench_cpu_seconds_count_child_processes():
    from pingctl.loader.bench import _descendants, cpu_seconds

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\nprint(1, flush=True)\ntime.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)\n" + burn], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.pid in _descendants(os.getpid())
        before, own = cpu_seconds([child.pid]), time.process_time()
        assert child.stdout.readline().strip() == "1"  # it has burnt its 0.5 CPU seconds
        spent = cpu_seconds([child.pid]) - before
        own = time.process_time() - own
        assert spent - own >= 0.45  # the child's CPU, not only this process's
        assert cpu_seconds([]) == pytest.approx(time.process_time(), abs=0.05)
    finally:
        child.kill()
        child.wait()


def _row_sources(batches) -> list[tuple]:
    """The first source block of every row: identifies the probe (record) a row came from."""
    out = []
    for b in batches:
        for row in b["inputs"]:
            i = int(np.flatnonzero((row == 1) | (row == 2))[0])
            out.append(tuple(row[i : i + (5 if row[i] == 1 else 17)]))
    return out


def test_training_rows_mix_many_probes_within_one_shuffle_window(synth_rows):
    # Grain's window shuffle is a block shuffle: one window's steps only see
    # shuffle_window / rows_per_element records. 32 rows per element once meant 2 probes
    # for 16 consecutive steps here (and a model that forgot each group of probes in turn).
    window = _row_sources(_batches(synth_rows / "rows", 16))  # 64 rows = one window
    assert len(window) == 64
    assert len(set(window)) >= 12
    # the old setting, for contrast: 2-3 elements of ~27 rows (a dual-stack probe has 2 sources)
    few = _row_sources(_batches(synth_rows / "rows", 16, rows_per_element=32))
    assert len(set(few)) <= 6


def test_eval_pass_starts_with_rows_of_many_probes(synth_rows):
    # MaxText evaluates only the first eval_steps batches: they must sample many records.
    it = iter(make_dataset(synth_rows / "rows", _cfg(), train=False))
    first = _row_sources([next(it) for _ in range(4)])
    assert len(set(first)) >= 3


def test_token_fields_label_payloads_by_block_and_headers_as_structure():
    from pingctl.tokenizer import encode
    from pingctl.tokenizer.measurements import Measurements
    from pingctl.tokenizer.spec import fields, get_spec, token_fields

    m = Measurements.from_fields(src=["2001:db8::7"], dst=["2001:db8::1"], rtt_ms=[12.5], time_s=[1_700_000_000])
    spec = get_spec("compact")
    enc = encode(m, "compact", order=["time", "src", "dst", "result"])
    names = np.array(fields(spec))[token_fields(enc.tokens[None, :], spec)[0]]
    # MeasurementStart, TimestampAbs + 8, SrcIPv6 + 16, DstIPv6 + 16, RttStart + 2
    want = ["structure"] * 2 + ["time"] * 8 + ["structure"] + ["src"] * 16 + ["structure"] + ["dst"] * 16
    want += ["structure"] + ["result"] * 2
    assert names.tolist() == want


def test_loss_keep_drops_targets_by_field_and_leaves_rows_and_eval_alone(synth_rows):
    from pingctl.errors import PingctlError
    from pingctl.tokenizer.spec import fields, get_spec, token_fields

    spec = get_spec("compact")
    names = fields(spec)
    result = names.index("result")
    plain = _batches(synth_rows / "rows", 4)
    only_result = _batches(synth_rows / "rows", 4, loss_keep={"src": 0, "dst": 0, "time": 0, "structure": 0})
    half_src = _batches(synth_rows / "rows", 4, loss_keep={"src": 0.5})
    n_src = kept_src = 0
    for a, b, h in zip(plain, only_result, half_src):
        assert np.array_equal(a["inputs"], b["inputs"]) and np.array_equal(a["inputs"], h["inputs"])
        target_field = token_fields(a["targets"], spec)
        live = a["targets_segmentation"] != 0
        counted = b["targets_segmentation"] != 0
        # exactly the result targets of the plain batch remain (result keeps its default share of 1)
        assert np.array_equal(counted, live & (target_field == result))
        assert counted.sum() > 0
        is_src = live & (target_field == names.index("src"))
        n_src += int(is_src.sum())
        kept_src += int((is_src & (h["targets_segmentation"] != 0)).sum())
        others = live & (target_field != names.index("src"))
        assert np.array_equal(h["targets_segmentation"][others], a["targets_segmentation"][others])
    assert n_src > 2000 and abs(kept_src / n_src - 0.5) < 4 * 0.5 / np.sqrt(n_src)
    ev = lambda **kw: next(iter(make_dataset(synth_rows / "rows", _cfg(**kw), train=False)))  # noqa: E731
    assert np.array_equal(ev(loss_keep={"src": 0})["targets_segmentation"], ev()["targets_segmentation"])
    with pytest.raises(PingctlError, match="unknown field"):
        make_dataset(synth_rows / "rows", _cfg(loss_keep={"rtt": 0.5}))
    with pytest.raises(ValueError):
        _cfg(loss_keep={"src": 1.5})


def _shape_stats(batches):
    """(measurements, those with the result block last, repeated (src, dst) pairs within a context)."""
    from pingctl.tokenizer import blocks

    res = blocks("compact").index("result")
    n = last = repeats = 0
    for b in batches:
        for tokens, _ in _segments(b):
            dec = decode(tokens, "compact")
            assert dec.ok
            n += len(dec)
            last += int((dec.blocks[:, res] == dec.blocks.max(axis=1)).sum())
            m = dec.measurements
            pairs = np.concatenate([m.src, m.dst, m.src_v6[:, None], m.dst_v6[:, None]], axis=1)
            repeats += len(pairs) - len(np.unique(pairs, axis=0))
    return n, last, repeats


def test_shaping_puts_the_rtt_last_and_caps_each_pair_per_context(synth_rows):
    rows = synth_rows / "rows"
    n, last, repeats = _shape_stats(_batches(rows, 4))
    assert repeats > n / 2 and abs(last / n - 0.25) < 0.05  # default: uniform orders over 4 blocks
    n, last, repeats = _shape_stats(_batches(rows, 4, result_last=1.0, max_per_pair=1))
    assert n > 300 and last == n and repeats == 0
    n, last, _ = _shape_stats(_batches(rows, 4, result_last=0.5))
    assert abs(last / n - (0.5 + 0.5 / 4)) < 4 * np.sqrt(0.625 * 0.375 / n)
    # the cap keeps rows full: padding stays a few tokens per row
    b = _batches(rows, 2, max_per_pair=1)[0]
    assert (b["inputs_segmentation"] == 0).mean() < 0.02


def _pairs_per_context(batches) -> list[int]:
    """Distinct (src, dst) pairs in each context of the batches."""
    out = []
    for b in batches:
        for tokens, _ in _segments(b):
            m = decode(tokens, "compact").measurements
            out.append(len(np.unique(np.concatenate([m.src, m.dst, m.src_v6[:, None], m.dst_v6[:, None]], axis=1),
                                     axis=0)))
    return out


def test_pair_history_contexts_hold_one_pair_and_mix_by_their_share(synth_rows):
    rows = synth_rows / "rows"
    every = _pairs_per_context(_batches(rows, 2, pair_history_share=1.0, pair_history_k=8, max_per_pair=1))
    assert len(every) > 20 and set(every) == {1}  # each context is one pair's history (the per-pair cap does not apply)
    plain = _pairs_per_context(_batches(rows, 2, max_per_pair=1))
    assert np.mean([p == 1 for p in plain]) < 0.5  # a probe window spans many pairs
    half = _pairs_per_context(_batches(rows, 4, pair_history_share=0.5, pair_history_k=8, max_per_pair=1))
    one = np.mean([p == 1 for p in half])
    assert np.mean([p == 1 for p in plain]) < one < 1.0


def test_pair_history_is_the_pairs_last_k_before_a_query_and_the_query():
    from types import SimpleNamespace

    from pingctl.loader.sequences import pair_history

    rec = SimpleNamespace(n=7, src_idx=np.array([0, 0, 1, 0, 0, 1, 0], np.uint32),
                          dst_idx=np.array([5, 6, 5, 5, 5, 5, 6], np.uint32))

    class At:  # an rng whose integers() picks the query
        def __init__(self, q):
            self.q = q

        def integers(self, n):
            return self.q

    assert pair_history(rec, At(4), 16).tolist() == [0, 3, 4]  # (0, 5) up to position 4
    assert pair_history(rec, At(4), 1).tolist() == [3, 4]
    assert pair_history(rec, At(6), 16).tolist() == [1, 6]
    assert pair_history(rec, At(2), 16).tolist() == [2]  # the pair's first packet: the query alone


def test_first_per_pair_keeps_the_earliest_k_of_each_pair_in_time_order():
    from types import SimpleNamespace

    from pingctl.loader.sequences import _first_per_pair

    rec = SimpleNamespace(src_idx=np.array([0, 0, 1, 0, 0, 1, 0], np.uint32), dst_idx=np.array([5, 6, 5, 5, 5, 5, 6], np.uint32))
    idx = np.arange(1, 7)  # a window that skips position 0
    assert _first_per_pair(rec, idx, 1).tolist() == [1, 2, 3]
    assert _first_per_pair(rec, idx, 2).tolist() == [1, 2, 3, 4, 5, 6]
    assert _first_per_pair(rec, np.array([0, 3, 4]), 2).tolist() == [0, 3]


def test_bench_loader_times_the_configured_shaping(synth_rows, tmp_path):
    from typer.testing import CliRunner

    from pingctl.cli.app import app

    args = ["bench", "loader", str(synth_rows / "rows"), "--workers", "0", "--batches", "50", "--seq-len", "256",
            "--json", "--out", str(tmp_path / "b.json")]
    r = CliRunner().invoke(app, [*args, "--set", "loader.max_per_pair=1", "--set", "loader.result_last=0.5"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["config"]["max_per_pair"] == 1 and rep["config"]["result_last"] == 0.5
    assert rep["config"]["seq_len"] == 256 and rep["table"][0]["tokens_per_s"] > 0
    bad = CliRunner().invoke(app, [*args, "--set", "loader.max_per_pair=-1"])
    assert bad.exit_code != 0 and "Traceback" not in bad.output
    # with a worker, the CPU per token counts the worker's: a rate per core, not the trainer's alone
    w = CliRunner().invoke(app, [*args[:4], "1", *args[5:]])
    assert w.exit_code == 0, w.output
    row = json.loads(w.stdout)["table"][0]
    assert row["case"] == "1 worker" and 0 < row["tokens_per_cpu_s"] < 3 * row["tokens_per_s"]
