"""Drivers for the real frameworks: the installed framework's own loss code, driven by the kit.

Each driver module ``refimpl.conformance.frameworks.<name>`` turns a kit call into a call of the
*installed* framework's own functions (no hand-written transcription) and imports that framework
lazily: ``import refimpl`` never imports one. Import-only dependencies the losses never call (ray,
deepspeed, model classes) may be stubbed at import time *inside the driver*, for the import only;
the installed package is never edited.

The interface a driver module follows, and the ``Driver`` object through which every layer above
uses it, are in ``refimpl.conformance.frameworks.driver`` (docs/conformance.md, "Adding a
framework"). Adding a framework = its module + its name and display name in ``DISPLAY_NAMES``.

``DISPLAY_NAMES`` is the one list of the driven frameworks: ``FRAMEWORKS`` is its keys, and every
doc that names the frameworks writes ``framework_list()`` between markers, checked by
tests/test_docs_frameworks.py.
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
    "DISPLAY_NAMES",
    "EXTRA_DISPLAY_NAMES",
    "EXTRA_FRAMEWORKS",
    "PACKAGES",
    "distribution_version",
    "framework_list",
    "load_driver",
    "source_hash",
]

#: every driven framework, in the kit's order: its driver module's name -> the name its docs use
#: (the project's own spelling of the distribution: pip's name is the driver's ``DISTRIBUTION``)
DISPLAY_NAMES: dict[str, str] = {
    "trl": "TRL",
    "verl": "verl",
    "openrlhf": "OpenRLHF",
    "liger": "Liger-Kernel",
    "skyrl": "SkyRL-train",
    "areal": "AReaL",
}
FRAMEWORKS: tuple[str, ...] = tuple(DISPLAY_NAMES)
#: the drivers beside the core six (docs/conformance.md, "The maintained packages, Unsloth"): driven,
#: installed and checked like them (``refimpl frameworks install``, ``make check-frameworks``), with
#: a matrix of their own (docs/conformance-matrix-extra.md), so that the core matrix and the docs'
#: lists of the six stay as they are
EXTRA_DISPLAY_NAMES: dict[str, str] = {
    "skyrl_pkg": "skyrl (SkyRL-train's successor)",
    "unsloth": "Unsloth",
    "tunix": "Tunix (JAX)",
}
EXTRA_FRAMEWORKS: tuple[str, ...] = tuple(EXTRA_DISPLAY_NAMES)
#: the import name of each framework's installed package, whose folder a finding's ``where`` is relative
#: to (findings.py)
PACKAGES: dict[str, str] = {"trl": "trl", "verl": "verl", "openrlhf": "openrlhf", "liger": "liger_kernel",
                            "skyrl": "skyrl_train", "areal": "areal", "skyrl_pkg": "skyrl",
                            "unsloth": "unsloth_zoo", "tunix": "tunix"}


def load_driver(name: str) -> Driver:
    """The driver of framework ``name`` (one of ``FRAMEWORKS`` or ``EXTRA_FRAMEWORKS``); imports no
    framework."""
    if name not in FRAMEWORKS + EXTRA_FRAMEWORKS:
        raise ValueError(f"framework must be one of {FRAMEWORKS + EXTRA_FRAMEWORKS}, got {name!r}")
    return Driver(importlib.import_module(f"{__name__}.{name}"))


def framework_list(versions: bool = False, *, conjunction: str = "and") -> str:
    """The driven frameworks as the docs write them: "TRL, verl, ... and AReaL", with ``versions``
    each followed by its driver's ``PINNED_VERSION`` ("TRL 1.16.0, verl 0.9.1, ..."). Reads the
    driver modules only; imports no framework."""
    names = [
        f"{DISPLAY_NAMES[name]} {load_driver(name).pinned_version}" if versions else DISPLAY_NAMES[name]
        for name in FRAMEWORKS
    ]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {conjunction} {names[-1]}"
