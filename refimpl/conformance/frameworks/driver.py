"""The driver interface: ``Mode`` (one loss mode of a framework, as data) and ``Driver`` (the one
object through which the kit uses a framework's driver module).

A driver module ``refimpl.conformance.frameworks.<name>`` holds all the kit knows about one
framework (docs/conformance.md, "Adding a framework"):

    NAME, PINNED_VERSION                       # required
    MODES: tuple[Mode, ...]                    # required: every mode in scope, all kinds
    availability() -> str | None               # required: None when drivable, else one line
    source_files() -> list[pathlib.Path]       # required: the files whose code the driver runs
    target(mode, variant) -> (fn, adapter)     # required (adapter None: fn takes the kit's inputs)
    DISTRIBUTION = NAME                        # optional: pip's name, for the installed version
    REQUIREMENTS = ("pkg==1.0", ...)            # optional: what the loss code imports, pinned
    INSTALL_OPTIONS = ("--ignore-...", ...)     # optional: pip options of its --no-deps step
                                               #   (``refimpl frameworks install``, install.py)
    UNSUPPORTED = {kind: {mode: reason}}       # optional: out of scope, with the reason
    PROFILE = {preset: (mode names, ...)}      # optional: the modes whose flags, merged left to
                                               #   right, are ``--convention NAME --preset preset``
    NOTES = {topic: text}                      # optional: what the profile does not reproduce, or
                                               #   what the driver fixes (printed in the matrix)
    FINDINGS = (Finding(key, kind, text, ...),)  # optional: what the driver found in the code, each
                                               #   with its class (bug, value_only, documented_default,
                                               #   subgradient) and the verified line (findings.py); the
                                               #   key (a flag, flag=value or a case class) ties it to
                                               #   the departures that show it
    RELEASE_FLAGS = {version: {mode: {flag: v}}}  # optional: what another release computes differently
    RELEASE_FINDINGS = {version: (Finding, ...)}  #   (releases.py), and its own findings (findings.py)
    framework_config(mode, variant) -> dict    # optional: the framework's own config keys
    KIND_MODES: tuple[Mode, ...]               # optional: modes of the registry's kinds (kinds/),
    kind_target(mode) -> (fn, adapter)         #   each run by kind_target; KIND_UNSUPPORTED =
                                               #   {kind: {mode: reason}} (a marked section of the module)

Modules written against the earlier interface (``modes(kind)``, ``unsupported_modes(kind)``,
``installed_version()``, ``target(kind, mode, variant)``, no ``MODES``) are accepted unchanged.
``Driver`` adds nothing a module must know about: defaults, the mode -> variant rule
(``Driver.variant``: a ``--variant`` that changes a field the mode fixes is refused, in one line,
the same way for every framework) and the source hash.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import pathlib
import warnings
from dataclasses import dataclass, field
from types import ModuleType

from refimpl.losses import PolicyLossVariant, get_preset

from ..kinds import REGISTRY_KINDS
from ..presets import preset_key, with_default_max_length
from .findings import Finding, as_findings

__all__ = ["KINDS", "Mode", "Driver", "VariantRefused", "distribution_version", "find_mode", "source_hash"]

#: every kind a driver's mode may have: the kinds with their own checkers, then the registry's
KINDS = ("policy_loss", "kl", "group_advantages") + REGISTRY_KINDS
#: the PolicyLossVariant fields a mode of each kind determines itself (``Mode.fixed`` default)
_VARIANT_FIELDS = tuple(f.name for f in dataclasses.fields(PolicyLossVariant))
DEFAULT_FIXED = {
    "policy_loss": ("ratio", "gate", "aggregation"),
    "kl": ("kl_estimator",),
    "group_advantages": _VARIANT_FIELDS,
    "token_logprobs": _VARIANT_FIELDS,
}


class VariantRefused(ValueError):
    """A ``--variant`` the mode cannot run (one line naming the field, the mode and the way out)."""


@dataclass(frozen=True)
class Mode:
    """One loss mode of a framework.

    Fields:
        name: the framework's own name of the mode (e.g. ``"dapo"``, ``"vanilla/token-mean"``).
        kind: ``"policy_loss"``, ``"kl"``, ``"group_advantages"`` or ``"token_logprobs"``.
        preset: the refimpl preset it corresponds to (``get_preset`` name), for policy losses.
        variant_overrides: ``PolicyLossVariant`` fields that differ from the preset.
        framework_config: the framework's own configuration keys that select this mode.
        convention: flat ``Convention`` flags that make the reference reproduce the framework's
            numerics (the profile, as data).
        description: one line for reports.
        fixed: the ``PolicyLossVariant`` fields this mode determines (None: ``DEFAULT_FIXED`` of
            its kind); a user's variant may not change them.
    """

    name: str
    kind: str = "policy_loss"
    preset: str | None = None
    variant_overrides: dict = field(default_factory=dict)
    framework_config: dict = field(default_factory=dict)
    convention: dict = field(default_factory=dict)
    description: str = ""
    fixed: tuple[str, ...] | None = None

    def variant(self) -> PolicyLossVariant:
        """The variant this mode runs: its preset (``PolicyLossVariant()`` without one) with its
        ``variant_overrides`` and the L_max default (after the overrides: only a seq_sum variant
        has an L_max). The one home of mode -> variant."""
        variant = get_preset(self.preset) if self.preset else PolicyLossVariant()
        fields = {k: v for k, v in self.variant_overrides.items() if k in _VARIANT_FIELDS}
        return with_default_max_length(dataclasses.replace(variant, **fields))

    def fixed_fields(self) -> tuple[str, ...]:
        return self.fixed if self.fixed is not None else DEFAULT_FIXED.get(self.kind, _VARIANT_FIELDS)

    def check_shape(self, variant: PolicyLossVariant, framework: str) -> None:
        """ValueError (one line) unless ``variant`` has this policy-loss mode's ratio level, gate and
        aggregation (a driver's own guard for variants given to it directly)."""
        want = self.variant()
        for name in ("ratio", "gate", "aggregation"):
            if getattr(variant, name) != getattr(want, name):
                raise ValueError(f"variant.{name}: {framework} mode {self.name!r} runs "
                                 f"{getattr(want, name)!r}, "
                                 f"got {getattr(variant, name)!r}")


def find_mode(modes, mode: str | Mode, framework: str, kind: str = "policy_loss") -> Mode:
    """``mode`` itself, or the mode of ``kind`` named ``mode`` among ``modes`` (a driver's ``MODES``);
    ValueError naming the framework's modes of that kind."""
    if isinstance(mode, Mode):
        return mode
    found = [m for m in modes if m.kind == kind and m.name == mode]
    if not found:
        raise ValueError(f"mode {mode!r} is not a {framework} {kind} mode; modes: "
                         f"{[m.name for m in modes if m.kind == kind]}")
    return found[0]


def source_hash(files: list[pathlib.Path]) -> str:
    """The first 12 hex digits of sha256 over the files' names and contents, in order."""
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


class Driver:
    """A driver module behind the kit's one interface (see the module docstring). Attributes the
    module defines beyond the interface are reachable as attributes of the driver."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.name: str = module.NAME
        self.pinned_version: str = module.PINNED_VERSION
        self._legacy = not hasattr(module, "MODES")
        self.notes: dict[str, str] = dict(getattr(module, "NOTES", {}))
        self.profile_table: dict[str, tuple[str, ...]] = {
            preset_key(k): tuple(v) for k, v in getattr(module, "PROFILE", {}).items()
        }

    # the earlier interface's spellings, so that code and tests written against it keep working
    @property
    def NAME(self) -> str:  # noqa: N802
        return self.name

    @property
    def PINNED_VERSION(self) -> str:  # noqa: N802
        return self.pinned_version

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(self.module, attr)

    def __repr__(self) -> str:
        return f"Driver({self.name!r})"

    # ---------------------------------------------------------------------------------------------
    # installation facts

    def availability(self) -> str | None:
        return self.module.availability()

    def installed_version(self) -> str | None:
        if self._legacy and hasattr(self.module, "installed_version"):
            return self.module.installed_version()
        return distribution_version(getattr(self.module, "DISTRIBUTION", self.name))

    def source_files(self) -> list[pathlib.Path]:
        return list(self.module.source_files())

    def source_hash(self) -> str:
        return source_hash(self.source_files())

    def findings(self) -> tuple[Finding, ...]:
        """The module's ``FINDINGS`` (its earlier ``CANDIDATE_BUGS`` read as bugs) and its
        ``RELEASE_FINDINGS`` of the installed release."""
        return as_findings(self.module, self.installed_version())

    # ---------------------------------------------------------------------------------------------
    # modes

    def modes(self, kind: str = "policy_loss") -> dict[str, Mode]:
        """The modes in scope for ``kind``, by name, each with ``kind`` set."""
        _check_kind(kind)
        if kind in REGISTRY_KINDS:
            return {m.name: m for m in getattr(self.module, "KIND_MODES", ()) if m.kind == kind}
        if self._legacy:
            return {n: dataclasses.replace(m, kind=kind) for n, m in self.module.modes(kind).items()}
        return {m.name: m for m in self.module.MODES if m.kind == kind}

    def all_modes(self) -> list[Mode]:
        """Every mode in scope, kinds in ``KINDS`` order."""
        return [m for kind in KINDS for m in self.modes(kind).values()]

    def unsupported_modes(self, kind: str = "policy_loss") -> dict[str, str]:
        _check_kind(kind)
        if kind in REGISTRY_KINDS:
            return dict(getattr(self.module, "KIND_UNSUPPORTED", {}).get(kind, {}))
        if self._legacy:
            return dict(self.module.unsupported_modes(kind))
        return dict(getattr(self.module, "UNSUPPORTED", {}).get(kind, {}))

    def mode(self, kind: str, name: str | Mode) -> Mode:
        """The mode ``name`` of ``kind`` (a ``Mode`` is returned as it is); ValueError naming the
        reason when it is out of scope, or the modes in scope."""
        if isinstance(name, Mode):
            return name
        modes = self.modes(kind)
        if name in modes:
            return modes[name]
        unsupported = self.unsupported_modes(kind)
        if name in unsupported:
            raise ValueError(f"{self.name} mode {name!r} is not supported: {unsupported[name]}")
        raise ValueError(f"{self.name} has no {kind} mode {name!r}; modes: {', '.join(modes)}")

    def mode_variant(self, mode: str | Mode, kind: str = "policy_loss") -> PolicyLossVariant:
        """The variant of the mode ``mode`` (a name of ``kind``, or a ``Mode``) runs."""
        return self.mode(kind, mode).variant()

    def variant(self, mode: Mode, overrides: dict | None = None) -> PolicyLossVariant:
        """The variant ``mode`` runs with the user's ``overrides`` (PolicyLossVariant fields).
        Raises ``VariantRefused`` (one line) when an override changes a field the mode fixes."""
        base = mode.variant()
        overrides = dict(overrides or {})
        for key in overrides:
            if key not in _VARIANT_FIELDS:
                raise VariantRefused(f"--variant: unknown field {key!r}")
        changed = [k for k in mode.fixed_fields() if k in overrides and overrides[k] != getattr(base, k)]
        if changed:
            k = changed[0]
            others = [
                m.name for m in self.modes(mode.kind).values() if getattr(m.variant(), k) == overrides[k]
            ]
            where = f"; modes with {k}={overrides[k]!r}: {', '.join(others)}" if others else (
                f"; no {self.name} {mode.kind} mode has {k}={overrides[k]!r}"
            )
            raise VariantRefused(
                f"{self.name} mode {mode.name!r} fixes {k}={getattr(base, k)!r}; "
                f"--variant {k}={overrides[k]!r} needs another mode{where}"
            )
        return with_default_max_length(dataclasses.replace(base, **overrides)) if overrides else base

    def target(self, kind_or_mode, mode=None, variant: PolicyLossVariant | None = None):
        """``(fn, adapter)`` running the framework's own code for a mode: ``target(mode, variant)``
        or, as before, ``target(kind, mode_or_name, variant)``; ``variant`` None: the mode's own."""
        if isinstance(kind_or_mode, Mode):
            kind, m, variant = kind_or_mode.kind, kind_or_mode, mode if variant is None else variant
        else:
            kind, m = kind_or_mode, self.mode(kind_or_mode, mode)
        variant = m.variant() if variant is None else variant
        version = self.installed_version()
        if version != self.pinned_version:
            warnings.warn(f"{self.name} {version} is installed; the {self.name} profiles describe "
                          f"{self.pinned_version}", stacklevel=2)
        if kind in REGISTRY_KINDS:  # the registry's kinds: the module's marked kinds section
            return self.module.kind_target(m)
        if self._legacy:
            return self.module.target(kind, m, variant)
        return self.module.target(m, variant)

    def framework_config(self, mode: Mode, variant: PolicyLossVariant | None = None) -> dict:
        """The framework's own configuration keys for ``mode`` running ``variant``."""
        own = getattr(self.module, "framework_config", None)
        if own is None:
            return dict(mode.framework_config)
        return dict(own(mode, mode.variant() if variant is None else variant))

    # ---------------------------------------------------------------------------------------------
    # the profile of a preset (``--convention NAME --preset P``)

    def profile_presets(self) -> tuple[str, ...]:
        return tuple(sorted(self.profile_table))

    def profile_modes(self, preset: str) -> tuple[Mode, ...]:
        """The modes whose flags make this framework's profile for ``preset`` (ValueError naming
        the preset when the framework has no equivalent)."""
        key = preset_key(preset)
        if key not in self.profile_table:
            raise ValueError(
                f"preset {preset!r} has no {self.name} equivalent; {self.name} profile supports "
                f"{sorted(self.profile_table)}"
            )
        out = []
        for name in self.profile_table[key]:
            found = [m for m in self.all_modes() if m.name == name]
            if len(found) != 1:
                raise ValueError(f"the {self.name} driver's PROFILE names {name!r}, which is "
                                 f"{'ambiguous' if found else 'not a mode'} (preset {preset!r})")
            out.append(found[0])
        return tuple(out)

    def profile_flags(self, preset: str) -> dict[str, object]:
        """The merged ``Mode.convention`` flags of ``profile_modes(preset)``."""
        flags: dict[str, object] = {}
        for mode in self.profile_modes(preset):
            flags.update(mode.convention)
        return flags

    def preset_mode(self, kind: str, preset: str) -> Mode:
        """The mode of ``kind`` that runs ``preset``: the one of the profile for that preset (run on
        that preset), else the first mode whose preset it is (ValueError when none)."""
        key = preset_key(preset)
        modes = self.modes(kind)
        if key in self.profile_table:
            for mode in self.profile_modes(key):
                if mode.kind == kind:
                    return mode if mode.preset == key else dataclasses.replace(mode, preset=key)
        matching = [m for m in modes.values() if preset_key(m.preset or "") == key]
        if not matching:
            raise ValueError(
                f"{self.name} has no {kind} mode for preset {preset!r}; modes: "
                + ", ".join(f"{m.name} ({m.preset})" for m in modes.values())
            )
        return matching[0]


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
