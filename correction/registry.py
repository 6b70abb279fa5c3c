"""A name -> function registry, so a config picks an implementation by name and users add their own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Functions of one kind (``kind`` names it in errors), looked up by exact name."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._functions: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: register the function under ``name``; a name may be taken only once."""

        def add(fn: F) -> F:
            if name in self._functions:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._functions[name] = fn
            return fn

        return add

    def get(self, name: str) -> F:
        """The function registered as ``name``; ``ValueError`` listing the known names otherwise."""
        try:
            return self._functions[name]
        except KeyError:
            raise ValueError(
                f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._functions)

    def __contains__(self, name: object) -> bool:
        return name in self._functions
