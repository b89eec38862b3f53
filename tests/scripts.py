"""One loader, for tests, of the repository's scripts (benchmarks/, tools/) as modules."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str, name: str, *, siblings: bool = False, register: bool = False):
    """The script ``ROOT / relative`` as a module named ``name``. ``siblings``: its folder is on
    ``sys.path`` while it loads (the benchmarks import each other, e.g. timing.py, as when run from
    there); ``register``: the module is put in ``sys.modules`` first (dataclasses look their module up
    while being defined)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    if siblings:
        sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        if siblings:
            sys.path.remove(str(path.parent))
    return module
