"""Drivers for the real frameworks: the installed TRL, verl and OpenRLHF loss code, driven by the kit.

Each driver module ``refimpl.conformance.frameworks.<name>`` turns a kit call into a call of the
*installed* framework's own functions (no hand-written transcription) and imports that framework
lazily: ``import refimpl`` never imports TRL, verl or OpenRLHF. Import-only dependencies the losses
never call (ray, deepspeed, model classes) may be stubbed at import time *inside the driver*; the
installed package is never edited.

A driver module exposes (the interface every framework follows):

    NAME: str                                   # "trl", "verl", "openrlhf"
    PINNED_VERSION: str                         # the version its profiles describe, e.g. "1.16.0"
    def availability() -> str | None            # None when drivable, else a one-line reason
    def installed_version() -> str | None
    def source_files() -> list[pathlib.Path]    # the framework files whose code the driver runs
    def modes(kind="policy_loss") -> dict[str, Mode]          # the modes in scope for a kind
    def unsupported_modes(kind="policy_loss") -> dict[str, str]   # mode -> why it is out of scope
    def target(kind, mode, variant) -> (fn, adapter)
        # policy_loss: adapter(fn, call: PolicyLossCall) -> scalar loss tensor
        # kl: adapter(fn, logp, ref_logp) -> per-token tensor
        # group_advantages: adapter(fn, rewards, group_ids) -> advantages [N]

``Mode`` records, per framework loss mode, which spec variant it implements and which convention
flags (data, see ``conventions.Convention``) reproduce the framework's numerics exactly.

How the kit uses a driver (``refimpl check --framework F``, ``refimpl matrix``;
``refimpl.conformance.cli.check_framework_mode``): ``variant`` passed to ``target`` is the mode's
preset (``PolicyLossVariant()`` for kinds without one) with the ``PolicyLossVariant`` fields of
``variant_overrides`` (and the user's ``--variant``) applied; the KL estimator of a ``kl`` mode is
``variant.kl_estimator``. An adapter of None calls ``fn`` with the kit's inputs directly. The
policy-loss adapter receives ``call.config["framework_config"] = mode.framework_config`` and the
micro-batch index / count and global counts of ``PolicyLossCall``. The check runs under
``Convention(name=f"{NAME}:{mode.name}", **mode.convention)``, or under the reference with the
mode's flags tried one by one (then together) to explain each departure.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import pathlib
from dataclasses import dataclass, field
from types import ModuleType

__all__ = ["FRAMEWORKS", "KINDS", "Mode", "distribution_version", "load_driver", "source_hash"]

FRAMEWORKS = ("trl", "verl", "openrlhf", "liger", "skyrl", "areal")
KINDS = ("policy_loss", "kl", "group_advantages")


@dataclass(frozen=True)
class Mode:
    """One loss mode of a framework.

    Fields:
        name: the framework's own name of the mode (e.g. ``"dapo"``, ``"vanilla/token-mean"``).
        kind: ``"policy_loss"``, ``"kl"`` or ``"group_advantages"``.
        preset: the refimpl preset it corresponds to (``get_preset`` name), for policy losses.
        variant_overrides: ``PolicyLossVariant`` fields that differ from the preset.
        framework_config: the framework's own configuration keys that select this mode.
        convention: ``Convention`` field overrides that make the reference reproduce the
            framework's numerics (the profile, as data).
        description: one line for reports.
    """

    name: str
    kind: str = "policy_loss"
    preset: str | None = None
    variant_overrides: dict = field(default_factory=dict)
    framework_config: dict = field(default_factory=dict)
    convention: dict = field(default_factory=dict)
    description: str = ""


def load_driver(name: str) -> ModuleType:
    """The driver module of framework ``name`` (one of ``FRAMEWORKS``); imports no framework."""
    if name not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {FRAMEWORKS}, got {name!r}")
    return importlib.import_module(f"{__name__}.{name}")


def source_hash(files: list[pathlib.Path]) -> str:
    """The first 12 hex digits of sha256 over the files' paths (names only) and contents, in order."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(pathlib.Path(path).name.encode())
        digest.update(pathlib.Path(path).read_bytes())
    return digest.hexdigest()[:12]


def distribution_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (pip's name), None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
