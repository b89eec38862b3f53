"""Import-only dependencies of a framework, stubbed for the duration of its import only.

A driver that must import a framework whose package ``__init__`` files pull in heavy dependencies
the loss code never calls (ray, tensordict, deepspeed, ...) wraps the import in
``stubbed_imports(names)``: each name that is not installed resolves, with every submodule and
attribute, to an inert stub while the block runs; afterwards the stubs leave ``sys.modules`` and
``sys.meta_path`` again (the framework's modules keep the names they bound), so no other code sees
a fake package. ``plain_torch_compile()`` makes ``torch.compile`` the identity for the block (a
decorator of a function the losses never call would otherwise import ``torch._dynamo``).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator

__all__ = ["stubbed_imports", "plain_torch_compile"]


class _Stub(types.ModuleType):
    """An inert module: any attribute is another stub (a class for capitalised names), so that
    ``from ray import ...`` and annotations such as ``dict | TensorDict`` evaluate."""

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if name[:1].isupper():
            value = type(name, (), {"__init__": lambda self, *args, **kwargs: None})
        else:
            value = _Stub(f"{self.__name__}.{name}")
            value.__path__ = []
            sys.modules[value.__name__] = value
        setattr(self, name, value)
        return value

    def __call__(self, *args, **kwargs):  # decorators (@ray.remote) return what they wrap
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else self


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``import ray.util`` / ``from tensordict.tensorclass import X`` under a stubbed
    package to further stubs."""

    def __init__(self, packages: list[str]) -> None:
        self.packages = packages

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self.packages:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Stub(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        return None


@contextlib.contextmanager
def stubbed_imports(names: tuple[str, ...]) -> Iterator[list[str]]:
    """Stub the import-only dependencies that are not installed, for the duration of the import
    only: afterwards the stubs leave ``sys.modules`` and ``sys.meta_path`` again (verl's modules
    keep the names they bound), so no other code sees a fake ``ray`` or ``tensordict``."""
    stubbed = [
        name for name in names if name not in sys.modules and importlib.util.find_spec(name) is None
    ]
    finder = _StubFinder(stubbed)
    if stubbed:
        sys.meta_path.append(finder)
    try:
        yield stubbed
    finally:
        if stubbed:
            sys.meta_path.remove(finder)
            for name in [m for m in sys.modules if m.partition(".")[0] in stubbed]:
                del sys.modules[name]


@contextlib.contextmanager
def plain_torch_compile() -> Iterator[None]:
    """While the block runs, ``torch.compile`` returns its function unchanged."""
    import torch

    original = torch.compile
    torch.compile = lambda fn=None, *args, **kwargs: fn if fn is not None else (lambda f: f)
    try:
        yield
    finally:
        torch.compile = original
