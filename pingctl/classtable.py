"""A table of named classes, the built-in ones imported only when asked for: what
`pingctl.executor.registry` (where work runs) and `pingctl.infer.engines.registry` (what
answers) are each one of. Adding an entry is a module and a line in the built-in table;
`register` adds one at run time (a plugin, a test)."""

from __future__ import annotations

import importlib
from typing import Generic, TypeVar

from pingctl.errors import UsageError

T = TypeVar("T")


class ClassTable(Generic[T]):
    """`builtin`: name -> "module:Class", imported by `get` only (an engine's heavy packages
    load only for the engine a command uses); `sort`: list names alphabetically, else the
    table's order with registered ones after it."""

    def __init__(self, builtin: dict[str, str], *, sort: bool = False) -> None:
        self.builtin = builtin
        self.sort = sort
        self.registered: dict[str, type[T]] = {}

    def register(self, name: str, cls: type[T]) -> None:
        self.registered[name] = cls

    def unregister(self, name: str) -> None:
        self.registered.pop(name, None)

    def names(self) -> list[str]:
        listed = [*self.builtin, *(n for n in self.registered if n not in self.builtin)]
        return sorted(listed) if self.sort else listed

    def known(self, name: str) -> bool:
        return name in self.registered or name in self.builtin

    def get(self, name: str, refusal: str) -> type[T]:
        """The class `name`; a UsageError `refusal` followed by the known names otherwise."""
        if name in self.registered:
            return self.registered[name]
        if name not in self.builtin:
            raise UsageError(f"{refusal} {', '.join(self.names())}")
        module, _, cls = self.builtin[name].partition(":")
        return getattr(importlib.import_module(module), cls)
