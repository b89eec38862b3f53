"""Preset names and variants: the one home of preset normalisation and of the L_max default.

``preset_key("Dr-GRPO") == "dr_grpo"``; ``resolve_preset(preset)`` gives ``(name, variant)`` for a
preset name or a ``PolicyLossVariant`` (``"custom"`` when no preset equals it). A ``seq_sum``
variant (Dr. GRPO, policy_losses.md eq. (11)) without ``max_length`` gets ``DEFAULT_MAX_LENGTH``:
wider than every case of the kit, so that the padded width and L_max differ.
"""

from __future__ import annotations

import dataclasses

from refimpl.losses import PRESETS, PolicyLossVariant, get_preset

__all__ = ["DEFAULT_MAX_LENGTH", "preset_key", "resolve_preset", "with_default_max_length"]

#: Dr. GRPO's L_max when a seq_sum variant does not give one (wider than every case)
DEFAULT_MAX_LENGTH = 16


def preset_key(preset: str) -> str:
    """The canonical spelling of a preset name: stripped, lower case, ``-`` -> ``_``."""
    return preset.strip().lower().replace("-", "_")


def with_default_max_length(variant: PolicyLossVariant) -> PolicyLossVariant:
    """``variant`` with L_max = ``DEFAULT_MAX_LENGTH`` when it aggregates by ``seq_sum`` without one."""
    if variant.aggregation == "seq_sum" and variant.max_length is None:
        return dataclasses.replace(variant, max_length=DEFAULT_MAX_LENGTH)
    return variant


def resolve_preset(
    preset: str | PolicyLossVariant, *, kl_coef: float | None = None, max_length: int | None = None
) -> tuple[str, PolicyLossVariant]:
    """(name, variant) for a preset name or a variant, with ``kl_coef`` / ``max_length`` applied and
    the L_max default (``with_default_max_length``)."""
    if isinstance(preset, PolicyLossVariant):
        name = next(
            (
                k
                for k, v in PRESETS.items()
                if v == dataclasses.replace(preset, kl_coef=v.kl_coef, max_length=v.max_length)
            ),
            "custom",
        )
        variant = preset
    else:
        name, variant = preset_key(preset), get_preset(preset)
    if kl_coef is not None:
        variant = dataclasses.replace(variant, kl_coef=kl_coef)
    if max_length is not None:
        variant = dataclasses.replace(variant, max_length=max_length)
    return name, with_default_max_length(variant)
