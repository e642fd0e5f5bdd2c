"""The one interface every inference engine implements (the shape of pingctl.executor.base):
load a model's weights, run forward passes over padded batches, and, where it has one, score
second bytes through a key-value cache.

An engine is a class: its capabilities are class attributes (what it needs installed, whether it
compiles its shapes, whether it keeps a key-value cache over calls), and `load` returns an
instance holding one loaded model. `pingctl.infer.model.LoadedModel` does everything else
(length buckets, batching, the questions' routing) the same way on every engine, so an engine
never sees a question.

Adding one: a module (or a small subpackage) under pingctl/infer/engines/ with a subclass of
`Engine`, and one line in `registry.ENGINES` (docs/architecture.md, "Adding an inference
engine").
"""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from pingctl.errors import EXTRA_OF, PingctlError, install_line


class Unsupported(ValueError):
    """A model this engine does not implement (a MaxText key it would get wrong); the loader
    answers it with the engine's `fallback` instead, unless the user named this engine."""


@dataclass(frozen=True)
class Source:
    """What an engine loads, resolved and checked by `LoadedModel.load` before any engine runs."""

    run: Path  # a `pingctl train` run or a `pingctl export` directory
    cfg: Any  # the run's typed config (pingctl.config.Config)
    export: bool  # an export (one set of weights in safetensors) rather than a run (checkpoints)
    steps: tuple[int, ...]  # the checkpoints whose weights are averaged (an export: its own)
    hardware: str  # cpu | gpu: asked for, else the run's train.hardware
    asked_hardware: str | None  # --hardware as given: an explicit gpu insists on one
    batch: int  # sequences per forward pass

    @property
    def seq_len(self) -> int:
        return int(self.cfg.loader.seq_len)


class Engine(ABC):
    """One engine, and once `load`ed, one model on it."""

    name: ClassVar[str]  # the name users give (`--engine`, $PINGCTL_ENGINE, JSON's "engine")
    title: ClassVar[str]  # the name in sentences ("JAX", "NumPy", "MaxText")
    needs: ClassVar[str | None] = None  # the package it needs beyond the base install (errors.EXTRA_OF)
    needs_jax: ClassVar[bool] = False  # its passes run on JAX (a device other than the CPU is possible)
    # forward passes compiled once per [batch, length] shape: warming the service up walks the
    # shapes; an engine that compiles nothing gains nothing from that
    compiles: ClassVar[bool] = False
    has_kv_cache: ClassVar[bool] = False  # `second_bytes` can build a shared key-value cache
    # that cache keeps each prompt over several calls (`session`, and `whole` filling it from a
    # teacher-forced pass); without, every call is its own
    kv_sessions: ClassVar[bool] = False
    fallback: ClassVar[str | None] = None  # the engine that answers a model this one calls `Unsupported`

    def __init__(self, source: Source, *, vocab_size: int, device: str = "cpu"):
        self.source = source
        self.vocab_size = vocab_size
        self.device = device  # the platform the forward passes run on (cpu, gpu, tpu)

    @classmethod
    def available(cls) -> bool:
        """Whether this install has what the engine needs."""
        return cls.needs is None or importlib.util.find_spec(cls.needs) is not None

    @classmethod
    def require(cls, what: str = "--engine") -> None:
        """The engine asked for by name, on an install without its package: one line naming the
        extra, before anything slow (an ImportError deep in a load would be a traceback)."""
        if not cls.available():
            raise PingctlError(f"{what} {cls.name}: {cls.needs} is not installed; "
                               f"{install_line(EXTRA_OF[cls.needs])}, or leave the engine out to answer with NumPy")

    @classmethod
    @abstractmethod
    def load(cls, source: Source) -> Engine:
        """The model of `source` on this engine, or `Unsupported` for a model it does not implement."""

    @abstractmethod
    def forward(self, tokens: np.ndarray, positions: np.ndarray, segments: np.ndarray) -> np.ndarray:
        """log P(next token) [b, t, >= vocab] float32 after each position of tokens [b, t] (int32),
        positions and segment ids [b, t] (segment 0: padding, whose rows nobody reads). The shapes
        are the loader's buckets, so a compiling engine sees a handful."""

    def weights(self) -> dict[str, np.ndarray]:
        """The parameters by name, as `pingctl export` writes them."""
        raise PingctlError(f"the {self.name} engine does not name its weights; export from another engine")

    def kv_worth_it(self, firsts: list[np.ndarray], candidates: int) -> bool:
        """Whether second bytes after these prompts (`candidates` in all) should go through the cache."""
        return False

    def second_bytes(self, byte0: int, tokens: int):
        """The engine's shared key-value cache (`log_probs(firsts, candidates, bucket)`, and with
        `kv_sessions` also `session(firsts, bucket)`), or None where it would not pay for a call
        of `tokens` sequence tokens yet (asked again on a later call)."""
        return None
