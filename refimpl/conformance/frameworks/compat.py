"""The previous driver interface, derived from the new one (drivers liger, skyrl, areal).

A driver written against the interface of the kit's ``Driver`` (``MODES``, ``UNSUPPORTED``,
``DISTRIBUTION``, ``target(mode, variant)``) also offers the functions the earlier kit called on the
module itself: ``modes(kind)``, ``unsupported_modes(kind)``, ``installed_version()`` and
``target(kind, mode, variant)``. ``previous_interface`` builds the first three from the data and
``target_arguments`` reads either form of a ``target`` call. Once every caller goes through
``Driver`` this module and those functions can be deleted.
"""

from __future__ import annotations

from collections.abc import Callable

from . import KINDS, Mode, distribution_version

__all__ = ["previous_interface", "target_arguments"]


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def previous_interface(
    modes: tuple[Mode, ...], unsupported: dict[str, dict[str, str]], distribution: str
) -> tuple[Callable, Callable, Callable]:
    """``(modes(kind), unsupported_modes(kind), installed_version())`` over a driver's data."""

    def modes_of(kind: str = "policy_loss") -> dict[str, Mode]:
        """The driver's modes in scope for ``kind``."""
        _check_kind(kind)
        return {m.name: m for m in modes if m.kind == kind}

    def unsupported_of(kind: str = "policy_loss") -> dict[str, str]:
        """The framework's modes and options out of scope for ``kind``, with the reason."""
        _check_kind(kind)
        return dict(unsupported.get(kind, {}))

    def installed_version() -> str | None:
        """The installed version of the framework's distribution, or None."""
        return distribution_version(distribution)

    return modes_of, unsupported_of, installed_version


def target_arguments(first, second=None, third=None, *, modes: tuple[Mode, ...], name: str):
    """``(mode, variant)`` of ``target(mode, variant)`` or of ``target(kind, mode_or_name, variant)``
    (ValueError naming a mode that is not in scope)."""
    if isinstance(first, Mode):
        return first, second
    kind, mode, variant = first, second, third
    _check_kind(kind)
    if isinstance(mode, Mode):
        return mode, variant
    for m in modes:
        if m.kind == kind and m.name == mode:
            return m, variant
    known = sorted(m.name for m in modes if m.kind == kind)
    raise ValueError(f"mode {mode!r} is not a {name} {kind} mode in scope; modes: {known}")


def find_mode(
    modes: tuple[Mode, ...], unsupported: dict[str, dict[str, str]], kind: str, mode, name: str
) -> Mode:
    """The ``Mode`` of ``kind`` called ``mode`` (a ``Mode`` is returned as is); ValueError naming why
    it is out of scope, or the modes in scope."""
    if isinstance(mode, Mode):
        return mode
    for m in modes:
        if m.kind == kind and m.name == mode:
            return m
    why = unsupported.get(kind, {}).get(mode)
    known = sorted(m.name for m in modes if m.kind == kind)
    raise ValueError(f"mode {mode!r} is not a {name} {kind} mode in scope"
                     + (f" ({why})" if why else f"; modes: {known}"))


def mode_variant(mode: Mode):
    """The PolicyLossVariant a policy-loss mode runs: its preset with ``variant_overrides``."""
    import dataclasses

    from refimpl.losses import get_preset

    return dataclasses.replace(get_preset(mode.preset), **mode.variant_overrides)


def check_shape(mode: Mode, variant, name: str) -> None:
    """ValueError unless ``variant`` has the mode's ratio level, gate and aggregation."""
    want = mode_variant(mode)
    for field in ("ratio", "gate", "aggregation"):
        if getattr(variant, field) != getattr(want, field):
            raise ValueError(f"variant.{field}: {name} mode {mode.name!r} runs {getattr(want, field)!r}, "
                             f"got {getattr(variant, field)!r}")


def warn_other_version(name: str, installed: str | None, pinned: str) -> None:
    """A UserWarning when the installed version is not the one the profiles describe."""
    if installed != pinned:
        import warnings

        warnings.warn(f"{name} {installed} is installed; the {name} profiles describe {pinned}", stacklevel=3)
