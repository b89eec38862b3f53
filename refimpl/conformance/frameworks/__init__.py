"""Drivers for the real frameworks: the installed framework's own loss code, driven by the kit.

Each driver module ``refimpl.conformance.frameworks.<name>`` turns a kit call into a call of the
*installed* framework's own functions (no hand-written transcription) and imports that framework
lazily: ``import refimpl`` never imports one. Import-only dependencies the losses never call (ray,
deepspeed, model classes) may be stubbed at import time *inside the driver*, for the import only;
the installed package is never edited.

The interface a driver module follows, and the ``Driver`` object through which every layer above
uses it, are in ``refimpl.conformance.frameworks.driver`` (docs/conformance.md, "Adding a
framework"). Adding a framework = its module + its name in ``FRAMEWORKS``.
"""

from __future__ import annotations

import importlib

from .driver import KINDS, Driver, Mode, VariantRefused, distribution_version, source_hash

__all__ = [
    "FRAMEWORKS",
    "KINDS",
    "Driver",
    "Mode",
    "VariantRefused",
    "distribution_version",
    "load_driver",
    "source_hash",
]

FRAMEWORKS = ("trl", "verl", "openrlhf", "liger", "skyrl", "areal")


def load_driver(name: str) -> Driver:
    """The driver of framework ``name`` (one of ``FRAMEWORKS``); imports no framework."""
    if name not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {FRAMEWORKS}, got {name!r}")
    return Driver(importlib.import_module(f"{__name__}.{name}"))
