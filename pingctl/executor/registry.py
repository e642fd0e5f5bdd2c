"""Which engine each `--target` names: `train --target`, `ingest --target` and `build-rows
--target` all read this one table. Adding an engine is one module with an `Executor` subclass
and one line here (docs/architecture.md, "Adding an engine"); `register` adds one at run time
(a plugin, a test)."""

from __future__ import annotations

from pingctl.classtable import ClassTable
from pingctl.executor.base import Executor

# name -> "module:Class", imported when asked for (the Modal SDK and the training code load
# only for the engine a command uses)
ENGINES: dict[str, str] = {
    "local": "pingctl.executor.local:LocalExecutor",
    "slurm": "pingctl.executor.slurm.engine:SlurmExecutor",
    "modal": "pingctl.executor.modal.engine:ModalExecutor",
}
_TABLE: ClassTable[Executor] = ClassTable(ENGINES, sort=True)
register = _TABLE.register
unregister = _TABLE.unregister
names = _TABLE.names


def get(name: str) -> type[Executor]:
    """The engine class `name`; a UsageError naming the known ones otherwise."""
    return _TABLE.get(name, f"--target {name!r}: choose")


def create(name: str, command: str, options: dict | None = None) -> Executor:
    """The engine `name` with the CLI's `options` for `command` ("ingest", "build-rows", "train")."""
    return get(name).from_options(command, options or {})
