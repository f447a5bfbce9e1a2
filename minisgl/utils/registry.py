"""A name -> factory table, so a backend is chosen by a string (``--attention-backend torch``).

Each entry registers itself with a decorator, in the module that defines it. A registry
given a ``package`` finds its entries there: the first time it is asked for a name it does
not hold (or for all its names), it imports every module of that package once. Adding a
backend is then one new file, and a backend whose library is missing costs nothing until
it is asked for (its module imports the library inside its factory). Mirrors upstream
``minisgl.utils.registry.Registry``, whose backends are registered in the package's
``__init__``.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, Dict, Generic, Iterable, List, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, package: str | None = None) -> None:
        self.kind = kind
        self.package = package
        self._items: Dict[str, T] = {}
        self._discovered = package is None

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = item
            return item

        return decorator

    def _discover(self) -> None:
        """Import every module of the package once: each registers what it defines."""
        if self._discovered:
            return
        self._discovered = True
        package = importlib.import_module(self.package)  # type: ignore[arg-type]
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{self.package}.{module.name}")

    def __getitem__(self, name: str) -> T:
        self.assert_supported([name])
        return self._items[name]

    def __contains__(self, name: str) -> bool:
        if name not in self._items:
            self._discover()
        return name in self._items

    def items(self) -> Dict[str, T]:
        """Every entry, by name (after finding them all)."""
        self._discover()
        return dict(self._items)

    def names(self) -> List[str]:
        return sorted(self.items())

    def assert_supported(self, names: Iterable[str]) -> None:
        """Raises ``ValueError`` naming the first unknown name and the known ones."""
        for name in names:
            if name not in self:
                raise ValueError(
                    f"unknown {self.kind} {name!r}; supported: {', '.join(self.names())}"
                )
