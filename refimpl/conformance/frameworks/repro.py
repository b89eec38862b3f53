"""Standalone reproductions of the drivers' bug findings (``refimpl check framework F --repro DIR``).

Each finding of class ``bug`` or ``validation`` (findings.py: ``REPRODUCED_KINDS``) has a script here:
it imports only torch and the installed framework (a JAX framework's: numpy and JAX, ``ARRAYS``; no
refimpl), runs the framework's own function on a small case, prints the framework's
value next to the exact one, and exits 0 when the departure reproduces, 1 when it does not (a release
that fixed it) and 2 when the framework cannot be loaded. A maintainer can run it without our kit;
tests/test_framework_findings.py runs every script against the installed frameworks (CI).

``PREAMBLE`` is the part every script shares (written at its top, so each file stands alone): inert
stand-ins for import-only dependencies that are not installed (ray, deepspeed, ...), a loader that
executes one installed file of a package without running the package's ``__init__`` (which imports
the training stack), one that registers a package's folders as empty packages (``bare_packages``: a
file importing its siblings absolutely loads them, not the package's ``__init__``), one that makes
``torch.compile`` the identity (``identity_compile``) and the verdict.
``BODIES`` (repro_bodies.py) holds each finding's case, keyed by framework and finding key.
"""

from __future__ import annotations

import pathlib

from . import load_driver
from .findings import REPRODUCED_KINDS
from .repro_bodies import BODIES

__all__ = ["ARRAYS", "BODIES", "PREAMBLE", "preamble", "repro_script", "unscripted", "write_repros"]

#: the array library a framework's scripts import in place of torch: (its name in the header, the lines)
ARRAYS = {"tunix": ("numpy, JAX", "import jax\nimport jax.numpy as jnp\nimport numpy as np\n")}

PREAMBLE = '''\
# Standalone: imports only torch and the installed framework. Import-only dependencies that are not
# installed (ray, deepspeed, ...) are inert stand-ins while the framework's modules load; nothing is
# written to site-packages. Exit 0: the departure reproduces; 1: it does not (a release that fixed
# it?); 2: the framework cannot be loaded.
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import pathlib
import sys
import types

import torch


class _Inert(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name[:1].isupper():
            value = type(name, (), {"__init__": lambda self, *args, **kwargs: None})
        else:
            value = _Inert(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value

    def __call__(self, *args, **kwargs):  # a decorator returns what it wraps
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else self


class _InertFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names):
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Inert(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        return None


def stand_ins(*names, **attributes):
    """Inert modules for those of ``names`` that are not installed; ``attributes`` ("ray.is_initialized"
    spelt ray__is_initialized) set on a stand-in where the inert default would not do."""
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    sys.meta_path.append(_InertFinder(missing))
    for dotted, value in attributes.items():
        name, _, attribute = dotted.partition("__")
        if name in missing:
            setattr(importlib.import_module(name), attribute, value)


def load_file(package, relative):
    """Execute the installed file ``package/relative`` (its siblings importable relatively) without
    running the package's ``__init__``."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        print(f"{package} is not installed")
        sys.exit(2)
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / relative
    parent = types.ModuleType(f"_repro_{package}")
    parent.__path__ = [str(path.parent)]
    sys.modules[parent.__name__] = parent
    spec = importlib.util.spec_from_file_location(f"{parent.__name__}.{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def identity_compile():
    """``torch.compile`` as the identity decorator: for a file that compiles a function this script does
    not call (importing the compiler takes seconds; what the script runs is eager either way)."""
    torch.compile = lambda fn=None, **kwargs: fn if fn is not None else (lambda f: f)


def bare_packages(package, *subpackages):
    """Register ``package`` and its ``subpackages`` (dotted, relative) as empty packages on their installed
    folders: absolute imports of the files inside load them without running any package ``__init__``."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        print(f"{package} is not installed")
        sys.exit(2)
    root = pathlib.Path(next(iter(spec.submodule_search_locations)))
    for name in ("", *subpackages):
        module = types.ModuleType(f"{package}.{name}" if name else package)
        module.__path__ = [str(root.joinpath(*name.split(".")) if name else root)]
        sys.modules[module.__name__] = module
    return root


def verdict(what, framework, exact, reproduced):
    print(what)
    print(f"  framework: {framework}")
    print(f"  exact:     {exact}")
    print("REPRODUCED" if reproduced else "NOT REPRODUCED (fixed in this release?)")
    sys.exit(0 if reproduced else 1)

'''

def preamble(framework: str) -> str:
    """``PREAMBLE`` for ``framework``'s scripts: with its array library (``ARRAYS``) in place of torch
    (``identity_compile`` is torch's and unused there)."""
    if framework not in ARRAYS:
        return PREAMBLE
    name, lines = ARRAYS[framework]
    text = PREAMBLE.replace("imports only torch", f"imports only {name}", 1)
    return text.replace("import torch\n", lines, 1)


def repro_script(framework: str, key: str) -> str:
    """The standalone script of ``framework``'s finding ``key`` (``PREAMBLE`` and its body)."""
    finding = next((f for f in load_driver(framework).findings() if f.key == key), None)
    if finding is None or (framework, key) not in BODIES:
        raise KeyError(f"{framework} has no reproduction for finding {key!r}")
    header = (f'"""{framework} finding `{key}` ({finding.kind}): {finding.text}\n\n'
              f"Where: {finding.where} ({finding.affected}).\n")
    if finding.fixed_in:
        header += f"Fixed in: {finding.fixed_in}.\n"
    if finding.upstream:
        header += f"Upstream: {finding.upstream}.\n"
    return header + '"""\n\n' + preamble(framework) + BODIES[(framework, key)]


def unscripted(framework: str) -> list[str]:
    """The keys of ``framework``'s bug and validation findings that have no script yet (``BODIES``;
    tests/test_framework_findings.py lists the ones allowed)."""
    return [f.key for f in load_driver(framework).findings()
            if f.kind in REPRODUCED_KINDS and (framework, f.key) not in BODIES]


def write_repros(framework: str, directory: str | pathlib.Path) -> list[pathlib.Path]:
    """Write one script per bug or validation finding of ``framework`` that has one (``unscripted``
    names the others) into ``directory`` (created); never replaces a file that exists
    (FileExistsError naming it)."""
    out = pathlib.Path(directory)
    missing = set(unscripted(framework))
    keys = [f.key for f in load_driver(framework).findings() if f.kind in REPRODUCED_KINDS
            and f.key not in missing]
    paths = [out / f"repro_{framework}_{key.replace(':', '_')}.py" for key in keys]
    existing = [str(p) for p in paths if p.exists()]
    if existing:
        raise FileExistsError(f"--repro: {', '.join(existing)} exists; choose an empty directory")
    out.mkdir(parents=True, exist_ok=True)
    for key, path in zip(keys, paths, strict=True):
        path.write_text(repro_script(framework, key))
    return paths
