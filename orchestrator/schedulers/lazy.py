"""A scheduler package's attributes loaded when first used: the spec imports a package for its SECTION
alone, so its launch code (plans, backends, manifests) is imported only by who asks for it."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """The package's module ``__getattr__``: ``table`` maps an attribute to the submodule defining it;
    each is looked up once, then found in the package itself."""

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
