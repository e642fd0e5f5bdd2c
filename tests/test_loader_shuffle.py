"""The window shuffle of rows (`pingctl/loader/shuffle.py`) and the batch built straight into
the feature block (`pipeline.batch_features`)."""

import pickle

import grain
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pingctl.loader.pipeline import FEATURES, batch_features
from pingctl.loader.shuffle import WindowShuffle


def _shuffled(n: int, window: int, seed: int) -> grain.IterDataset:
    return WindowShuffle(grain.MapDataset.range(n).to_iter_dataset(), window_size=window, seed=seed)


@given(st.integers(0, 300), st.integers(1, 70), st.integers(0, 2**31))
@settings(max_examples=150, deadline=None)
def test_each_window_is_a_shuffle_of_its_own_rows(n, window, seed):
    out = list(_shuffled(n, window, seed))
    assert len(out) == n
    for start in range(0, n, window):  # a block shuffle: nothing crosses a window's edge
        assert sorted(out[start:start + window]) == list(range(start, min(n, start + window)))


def test_the_order_is_seeded_and_differs_between_windows():
    a, b, c = (list(_shuffled(400, 100, s)) for s in (3, 3, 4))
    assert a == b and a != c
    orders = [tuple(np.array(a[i:i + 100]) - i) for i in range(0, 400, 100)]
    assert len(set(orders)) == 4  # each window its own order
    assert a[:100] != list(range(100)) and a[:100] != list(range(99, -1, -1))


@pytest.mark.parametrize("window", [1, 7, 16])
def test_a_restored_state_gives_the_same_rows_from_every_position(window):
    """Mid-window, at a window's edge and after the last row: the state is the window's start
    in the parent and the position in it, and it survives pickling (a checkpoint)."""
    n = 3 * window + 5
    ds = _shuffled(n, window, 11)
    want = list(ds)
    for taken in range(n + 1):
        it = iter(ds)
        for _ in range(taken):
            next(it)
        state = pickle.loads(pickle.dumps(it.get_state()))
        fresh = iter(ds)
        fresh.set_state(state)
        assert list(fresh) == want[taken:], taken
        assert list(it) == want[taken:]  # taking the state does not move the iterator


def _rows(rng, n: int, seq_len: int, loss: bool = False) -> list[dict]:
    rows = []
    for _ in range(n):
        used = int(rng.integers(0, seq_len + 1))
        cuts = np.sort(rng.choice(np.arange(1, max(used, 1)), size=min(3, max(used - 1, 0)), replace=False))
        seg = np.zeros(seq_len, np.int32)
        seg[:used] = 1 + np.searchsorted(cuts, np.arange(used), side="right")
        row = {"tokens": np.where(seg > 0, rng.integers(3, 300, seq_len), 0).astype(np.int32), "segment": seg,
               "position": np.zeros(seq_len, np.int32), "modes": rng.integers(0, 4, 3).astype(np.int32),
               "measurements": np.int32(rng.integers(0, 50))}
        for s in range(1, seg.max() + 1):
            row["position"][seg == s] = np.arange((seg == s).sum())
        if loss:
            row["loss"] = rng.random(seq_len) < 0.6
        rows.append(row)
    return rows


def _reference(rows: list[dict], size: int) -> dict:
    """The features as first written: stack, pad the batch with empty rows, then shift."""
    stack = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    pad = size - len(rows)
    stack = {k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype)]) for k, v in stack.items()}
    tok, seg, pos = stack["tokens"], stack["segment"], stack["position"]
    targets = np.concatenate([tok[:, 1:], np.zeros((size, 1), np.int32)], axis=1)
    same = (seg[:, 1:] == seg[:, :-1]) & (seg[:, :-1] > 0)
    if "loss" in stack:
        same &= stack["loss"][:, 1:]
    tseg = np.concatenate([seg[:, :-1] * same, np.zeros((size, 1), np.int32)], axis=1)
    return {"inputs": tok, "inputs_position": pos, "inputs_segmentation": seg, "targets": targets,
            "targets_position": pos, "targets_segmentation": tseg,
            "stat_modes": stack["modes"][: len(rows)].sum(axis=0), "stat_measurements": stack["measurements"].sum()}


@given(st.integers(0, 2**31), st.integers(1, 6), st.integers(0, 3), st.sampled_from([8, 64]), st.booleans())
@settings(max_examples=120, deadline=None)
def test_batch_features_equal_stacking_padding_and_shifting(seed, n, pad, seq_len, loss):
    rng = np.random.default_rng(seed)
    rows = _rows(rng, n, seq_len, loss)
    want = _reference(rows, n + pad)
    got = batch_features(rows, n + pad, with_stats=True)
    assert set(got) == set(want)
    for k in want:
        assert np.array_equal(got[k], want[k]), k
    assert all(got[k].dtype == np.int32 and got[k].shape == (n + pad, seq_len) for k in FEATURES)
    block = batch_features(rows, n + pad, one_block=True)["features"]  # what a worker hands over
    assert block.shape == (len(FEATURES), n + pad, seq_len)
    assert all(np.array_equal(block[i], want[k]) for i, k in enumerate(FEATURES))
