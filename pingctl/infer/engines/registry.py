"""Which engine each `--engine` (and $PINGCTL_ENGINE, `Model.load(engine=...)`, the service's
--engine) names: everything that loads a model reads this one table, and nothing else compares
engine names. Adding an engine is one module with an `Engine` subclass and one line here
(docs/architecture.md, "Adding an inference engine"); `register` adds one at run time (a
plugin, a test)."""

from __future__ import annotations

from pingctl.classtable import ClassTable
from pingctl.infer.engines.base import Engine

# name -> "module:Class", imported when asked for (JAX and MaxText load only for the engine a
# command uses; the NumPy engine's install has neither)
ENGINES: dict[str, str] = {
    "light": "pingctl.infer.engines.jax.engine:JaxEngine",
    "maxtext": "pingctl.infer.engines.maxtext.engine:MaxTextEngine",
    "numpy": "pingctl.infer.engines.numpy.engine:NumpyEngine",
}
# the default where its package is installed, in this order: compiled, fused passes first
DEFAULTS = ("light", "numpy")
# `bench --engine both`: the default against the reference it reproduces
BOTH = ("light", "maxtext")
_TABLE: ClassTable[Engine] = ClassTable(ENGINES)
register = _TABLE.register
unregister = _TABLE.unregister
names = _TABLE.names


def check(name: str | None, what: str = "--engine") -> str | None:
    """An engine name as typed, checked before anything slow (None: not chosen)."""
    if name is not None and not _TABLE.known(name):
        _TABLE.get(name, f"{what} {name!r}: expected one of")
    return name


def get(name: str, what: str = "--engine") -> type[Engine]:
    """The engine class `name`; a UsageError naming the known ones otherwise."""
    return _TABLE.get(name, f"{what} {name!r}: expected one of")


def default() -> str:
    """The engine an answer runs on when none is asked for: the first of DEFAULTS this install
    can run (the NumPy one needs nothing beyond the base install)."""
    return next(n for n in DEFAULTS if get(n).available())


def compared(which: str | None) -> list[str]:
    """The engines `bench --engine` runs one after another: one by name, `both` (BOTH), `all`
    (every engine of the table), or None: BOTH where all of them are installed, else the default."""
    if which is None:
        return list(BOTH) if all(get(n).available() for n in BOTH) else [default()]
    if which == "both":
        return list(BOTH)
    if which == "all":
        return [*BOTH, *(n for n in ENGINES if n not in BOTH)]
    return [check(which)]
