"""Loading a framework's installed source files without its package ``__init__`` chain.

Several frameworks cannot be imported the ordinary way on a CPU-only machine without their whole
dependency tree (ray, CUDA builds, model classes), although the loss code itself imports little. A
driver then executes the *installed* files it runs, unchanged, as modules of a private name
(``load_source``), with any import-only dependency replaced by a stand-in module only while those
files execute (``temporary_modules``). Nothing in site-packages is edited and no stand-in outlives
the load: ``sys.modules`` holds afterwards only the private modules and whatever was there before.
"""

from __future__ import annotations

import contextlib
import importlib.util
import pathlib
import sys
import types
from collections.abc import Iterator

__all__ = ["package_dir", "load_source", "temporary_modules", "stand_in"]


def package_dir(package: str) -> pathlib.Path | None:
    """The folder of the installed top-level ``package``, found without executing it (None if absent)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def load_source(name: str, path: pathlib.Path, *, package: bool = False) -> types.ModuleType:
    """Execute the file ``path`` as module ``name`` (registered in ``sys.modules``, removed again if
    it raises; a second call returns the module already loaded); ``package``: ``path`` is a
    package's ``__init__.py``, whose folder holds its submodules."""
    if name in sys.modules:
        return sys.modules[name]
    locations = [str(pathlib.Path(path).parent)] if package else None
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=locations)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as {name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def stand_in(name: str, **attributes: object) -> types.ModuleType:
    """A module called ``name`` holding ``attributes``: a stand-in for an import-only dependency."""
    module = types.ModuleType(name)
    module.__doc__ = "refimpl conformance stand-in: an import-only dependency the losses never call"
    for key, value in attributes.items():
        setattr(module, key, value)
    return module


@contextlib.contextmanager
def temporary_modules(
    modules: dict[str, types.ModuleType], *, only_if_missing: bool = True
) -> Iterator[list[str]]:
    """Put ``modules`` (name -> module) into ``sys.modules`` for the duration of the block and remove
    them afterwards. With ``only_if_missing`` a name that is already imported, or whose real package
    is installed, is left alone. Yields the names that were put in."""
    placed = []
    for name, module in modules.items():
        if name in sys.modules:
            continue
        if only_if_missing and _installed(name):
            continue
        sys.modules[name] = module
        placed.append(name)
    try:
        yield placed
    finally:
        for name in placed:
            sys.modules.pop(name, None)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package is absent, or a stand-in without a spec
        return False


def private_package(name: str) -> None:
    """An empty package ``name`` in ``sys.modules`` (the parent of privately loaded sources)."""
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = []
        sys.modules[name] = package


def installed_files(package: str, relative: tuple[str, ...]) -> list[pathlib.Path]:
    """The files ``relative`` to the installed ``package``'s folder ([] when it is not installed)."""
    root = package_dir(package)
    return [] if root is None else [root / rel for rel in relative]


def load_failure(package: str, install: str, load) -> str | None:
    """None when ``load()`` succeeds, else one line: ``package`` is not installed (``install`` says
    how), or why its sources cannot be loaded."""
    if package_dir(package) is None:
        return f"{package} is not installed ({install})"
    try:
        load()
    except Exception as exc:  # any import failure is reported, not raised
        return f"{package}'s loss code cannot be loaded: {type(exc).__name__}: {exc}"
    return None


def function_from_source(path: pathlib.Path, qualname: str, namespace: dict) -> object:
    """The function ``qualname`` ("f" or "Class.method") of the installed file ``path``, its ``def``
    (decorators included) executed unchanged in ``namespace`` (the names it uses: torch, typing...):
    for a function whose module imports what the kit cannot (ray, a trainer). Its line numbers are
    the file's (tracebacks point into the installed file)."""
    import ast

    tree = ast.parse(pathlib.Path(path).read_text(), filename=str(path))
    body = tree.body
    *owners, name = qualname.split(".")
    for owner in owners:
        body = next(n.body for n in body if isinstance(n, ast.ClassDef) and n.name == owner)
    node = next((n for n in body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if node is None:
        raise AttributeError(f"{path.name} has no function {qualname}")
    module = ast.Module(body=[node], type_ignores=[])
    scope = dict(namespace)
    exec(compile(module, str(path), "exec"), scope)  # noqa: S102 (the installed framework's own code)
    return scope[name]
