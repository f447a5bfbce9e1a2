"""A name -> factory table, so a backend is chosen by a string (``--attention-backend torch``).

Mirrors upstream ``minisgl.utils.registry.Registry``: adding a backend is one decorator.
"""

from __future__ import annotations

from typing import Callable, Dict, Generic, Iterable, List, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: Dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = item
            return item

        return decorator

    def __getitem__(self, name: str) -> T:
        self.assert_supported([name])
        return self._items[name]

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def names(self) -> List[str]:
        return sorted(self._items)

    def assert_supported(self, names: Iterable[str]) -> None:
        for name in names:
            if name not in self._items:
                raise ValueError(
                    f"unknown {self.kind} {name!r}; supported: {', '.join(self.names())}"
                )
