"""One small registry type, one instance per axis (``rlmap.<axis>.registry``).

Registration is explicit (no import-time scanning, no globals to clear in tests);
a duplicate name is rejected and an unknown name is answered with the known ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from rlmap.core.errors import UnknownComponentError

T = TypeVar("T")


class Registry(Generic[T]):
    """Named components of one kind, e.g. the advantage estimators."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def add(self, name: str, item: T) -> T:
        """Register ``item`` under ``name``; a name can be registered once."""
        if name in self._items:
            raise ValueError(f"{self.kind} '{name}' is already registered")
        self._items[name] = item
        return item

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of :meth:`add`."""

        def decorate(item: T) -> T:
            return self.add(name, item)

        return decorate

    def get(self, name: str) -> T:
        """The component called ``name``; unknown names list the known ones."""
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(self.names()) or "(none)"
            raise UnknownComponentError(f"unknown {self.kind} '{name}'; known: {known}") from None

    def names(self) -> tuple[str, ...]:
        """Registered names in registration order."""
        return tuple(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
