"""Which engine each `--target` names: `train --target`, `ingest --target` and `build-rows
--target` all read this one table. Adding an engine is one module with an `Executor` subclass
and one line here (docs/architecture.md, "Adding an engine"); `register` adds one at run time
(a plugin, a test)."""

from __future__ import annotations

import importlib

from pingctl.errors import UsageError
from pingctl.executor.base import Executor

# name -> "module:Class", imported when asked for (the Modal SDK and the training code load
# only for the engine a command uses)
ENGINES: dict[str, str] = {
    "local": "pingctl.executor.local:LocalExecutor",
    "slurm": "pingctl.executor.slurm:SlurmExecutor",
    "modal": "pingctl.executor.modal:ModalExecutor",
}
_registered: dict[str, type[Executor]] = {}


def register(name: str, cls: type[Executor]) -> None:
    _registered[name] = cls


def unregister(name: str) -> None:
    _registered.pop(name, None)


def names() -> list[str]:
    return sorted(set(ENGINES) | set(_registered))


def get(name: str) -> type[Executor]:
    """The engine class `name`; a UsageError naming the known ones otherwise."""
    if name in _registered:
        return _registered[name]
    if name not in ENGINES:
        raise UsageError(f"--target {name!r}: choose {', '.join(names())}")
    module, _, cls = ENGINES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def create(name: str, command: str, options: dict | None = None) -> Executor:
    """The engine `name` with the CLI's `options` for `command` ("ingest", "build-rows", "train")."""
    return get(name).from_options(command, options or {})
