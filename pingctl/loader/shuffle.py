"""The window shuffle of rows: Grain's block shuffle, with the window's order drawn by NumPy.

Grain's `WindowShuffleIterDataset` fills a window from its parent, then emits it in an order
it draws one position at a time with `index_shuffle` from Python: ~23 µs a row at a window of
1,024, ~10% of the loader's time per core. Here the same contract (a window filled, emitted
in a seeded order, a new seed per window; the state is the parent's state at the window's
start and the position in it, so a restore refills the window and skips what was emitted)
with the order one `Generator.permutation` per window (~0.1 µs a row).

Imported lazily by the pipeline (it imports Grain at the top to subclass it).
"""

from __future__ import annotations

import copy
from typing import Any

import grain
import numpy as np


class WindowShuffle(grain.IterDataset):
    """Rows of `parent` shuffled within windows of `window_size`; deterministic in `seed`."""

    def __init__(self, parent: grain.IterDataset, *, window_size: int, seed: int):
        super().__init__(parent)
        self._window_size = window_size
        self._seed = seed

    def __iter__(self) -> grain.DatasetIterator:
        return _WindowShuffleIterator(self._parent.__iter__(), window_size=self._window_size, seed=self._seed)

    def __str__(self) -> str:
        return f"WindowShuffle(window_size={self._window_size})"


def window_order(n: int, seed: int, window_index: int) -> np.ndarray:
    """The order in which a window of `n` rows is emitted (read from its end, as a stack)."""
    return np.random.default_rng((seed, window_index)).permutation(n)


class _WindowShuffleIterator(grain.DatasetIterator):
    def __init__(self, parent: grain.DatasetIterator, *, window_size: int, seed: int):
        super().__init__(parent)
        self._window_size = window_size
        self._seed = seed
        self._window_index = 0
        self._pos_in_window = 0
        self._window: list = []
        self._window_start_state = self._parent.get_state()
        self._exhausted = False

    def _fill(self) -> None:
        window = []
        try:
            for _ in range(self._window_size):
                window.append(next(self._parent))
        except StopIteration:
            self._exhausted = True
        order = window_order(len(window), self._seed, self._window_index)
        self._window = [window[i] for i in order]

    def __next__(self):
        if not self._window:
            if self._exhausted:
                raise StopIteration
            # A checkpoint refills the window from its start, wherever in it the state is taken.
            self._window_start_state = self._parent.get_state()
            self._fill()
            self._pos_in_window = 0
            if not self._window:
                raise StopIteration
        self._pos_in_window += 1
        row = self._window.pop()
        if not self._window:
            self._window_index += 1
        return row

    def get_state(self) -> dict[str, Any]:
        return {"parent_window_start_state": copy.deepcopy(self._window_start_state),
                "window_index": self._window_index, "pos_in_window": self._pos_in_window}

    def set_state(self, state: dict[str, Any]) -> None:
        self._window_start_state = copy.deepcopy(state["parent_window_start_state"])
        self._parent.set_state(self._window_start_state)
        self._window_index = state["window_index"]
        self._pos_in_window = state["pos_in_window"]
        self._exhausted = False
        self._fill()
        # What was emitted before the state was taken (a state taken after a window's last row
        # already counts the next window, which the next call fills from here).
        del self._window[len(self._window) - min(self._pos_in_window, len(self._window)):]

    def __str__(self) -> str:
        return "WindowShuffleIterator"
