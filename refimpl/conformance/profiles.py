"""Profiles: ``--convention NAME`` as the flags of framework NAME's driver modes.

A framework's profile for a preset is ``convention_from_flags(name, flags)`` of the modes its
driver lists for that preset (the driver's ``PROFILE``; ``Driver.profile_flags``): one source, kept
with the driver, proven against the installed framework by tests/test_framework_<name>.py and
``refimpl check --framework NAME`` (docs/conformance-matrix.md). ``profile("trl", preset,
scale_rewards="batch")`` selects TRL's batch std (advantages.md eq. (14)). ``conventions_table()``
is the table of docs/conformance.md section 5: per flag, the values of every framework's modes.
"""

from __future__ import annotations

import dataclasses

from refimpl.losses import get_preset

from .conventions import FLAG_GROUP, FLAGS, Convention, convention_from_flags
from .frameworks import FRAMEWORKS, KINDS, load_driver
from .kinds import KIND_REGISTRY
from .presets import preset_key, resolve_preset

__all__ = [
    "PROFILE_NAMES",
    "profile",
    "listing_profile",
    "profile_flags",
    "framework_config",
    "unsupported_flags",
    "advantage_convention",
    "mode_convention",
    "flag_values",
    "conventions_table",
]

PROFILE_NAMES = ("reference", *FRAMEWORKS)
_TRL_SCALE_REWARDS = ("group", "batch", "none")


def profile_flags(name: str, preset: str) -> dict[str, object]:
    """The merged ``Mode.convention`` flags of framework ``name``'s profile for ``preset``."""
    return load_driver(name).profile_flags(preset)


def profile(name: str | Convention, preset: str = "grpo", *, scale_rewards: str | None = None) -> Convention:
    """The convention ``name`` ("reference" or a framework) for ``preset``; a ``Convention`` is
    returned unchanged. ``scale_rewards`` (TRL only): TRL's ``GRPOConfig.scale_rewards`` ("group",
    "batch", "none"; None: TRL's value for the preset). ValueError for an unknown profile, a preset
    the framework has no equivalent of, or ``scale_rewards`` outside the TRL profile."""
    if isinstance(name, Convention):
        if scale_rewards is not None:
            raise ValueError("scale_rewards applies to the 'trl' profile, not to a Convention value")
        return name
    if not isinstance(name, str) or name.lower() not in PROFILE_NAMES:
        raise ValueError(f"convention must be one of {PROFILE_NAMES} or a Convention, got {name!r}")
    name = name.lower()
    if scale_rewards is not None and name != "trl":
        raise ValueError(f"scale_rewards is TRL's GRPOConfig option; profile {name!r} does not take it")
    if scale_rewards is not None and scale_rewards not in _TRL_SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {_TRL_SCALE_REWARDS}, got {scale_rewards!r}")
    if name == "reference":
        return Convention()
    conv = convention_from_flags(name, profile_flags(name, preset))
    if scale_rewards is not None:
        conv = dataclasses.replace(conv, adv_scale=load_driver("trl").SCALE_REWARDS[scale_rewards])
    return conv


def listing_profile(name: str) -> Convention:
    """The profile that stands for ``name`` in a listing of every flag (``refimpl conventions``): its
    grpo profile, or that of its first preset where the framework has no grpo (AReaL's loss is a
    global token mean: no seq-mean-token-mean)."""
    if name == "reference" or "grpo" in load_driver(name).profile_table:
        return profile(name, "grpo")
    return profile(name, next(iter(load_driver(name).profile_table)))


def framework_config(
    name: str, preset: str, variant: object | None = None, *, scale_rewards: str | None = None
) -> dict[str, object]:
    """The framework's own config keys that reproduce ``preset`` (run as ``variant``, default the
    preset) under profile ``name``: the driver's ``framework_config`` of the preset's mode (TRL
    ``GRPOConfig``, verl's actor / algorithm config, OpenRLHF's ``--actor.*`` / ``--algo.*``)."""
    key = preset_key(preset)
    v = get_preset(key) if variant is None else variant
    if name == "reference":
        return dataclasses.asdict(v)
    driver = load_driver(name)
    profile(name, key if key in driver.profile_table else "grpo", scale_rewards=scale_rewards)  # validates
    if key in driver.profile_table or variant is None:
        mode = driver.preset_mode("policy_loss", key)
    elif hasattr(driver.module, "mode_of_variant"):
        mode = driver.module.mode_of_variant(v)
    else:
        raise ValueError(f"preset {preset!r} has no {name} equivalent; supported: {driver.profile_presets()}")
    config = driver.framework_config(mode, v)
    if scale_rewards is not None:
        config["scale_rewards"] = scale_rewards
    return config


def unsupported_flags(name: str) -> dict[str, str]:
    """Framework behaviours the profile does not reproduce (stated, not silently approximated):
    the driver's unsupported policy-loss modes and its ``NOTES``."""
    if name not in FRAMEWORKS:
        return {}
    driver = load_driver(name)
    return {**driver.unsupported_modes("policy_loss"), **driver.notes}


def advantage_convention(convention: str | Convention, preset: str | None) -> Convention:
    """The convention of a group-advantage check: ``profile(convention, preset)``; under the
    reference convention the ``dr_grpo`` preset drops the std scaling (Dr. GRPO, advantages.md)."""
    if preset is None:
        return profile(convention)
    key = resolve_preset(preset)[0]
    conv = profile(convention, key)
    if key == "dr_grpo" and conv.name == "reference":
        conv = dataclasses.replace(conv, adv_scale="none")
    return conv


def mode_convention(mode, framework: str) -> Convention:
    """The profile of one driver mode: its flags, named ``framework:mode``."""
    return convention_from_flags(f"{framework}:{mode.name}", mode.convention)


#: the flag groups only some modes exercise, with the mode kind that always does
_GROUP_KIND = {"advantages": "group_advantages", "kl": "kl"}


def flag_values(name: str, flag: str) -> list[object] | None:
    """The values ``flag`` takes over framework ``name``'s modes (every kind), in the order of its
    modes; None where no mode exercises the flag's group: advantage (KL) flags count only in the
    advantage (KL) modes and in the modes that set one of the group's flags (TRL's inline
    advantages, a policy loss with a KL term)."""
    driver, group = load_driver(name), FLAG_GROUP[flag]
    values: list[object] = []
    for kind in KINDS:
        if kind in KIND_REGISTRY:  # the registry's kinds have flags of their own (kinds/), not Convention's
            continue
        for mode in driver.modes(kind).values():
            sets_group = any(FLAG_GROUP[f] == group for f in mode.convention)
            if group in _GROUP_KIND and kind != _GROUP_KIND[group] and not sets_group:
                continue
            if group not in _GROUP_KIND and kind != "policy_loss" and not sets_group:
                continue
            value = mode_convention(mode, name).flags()[flag]
            if value not in values:
                values.append(value)
    return values or None


def _cell(values: list[object] | None) -> str:
    if values is None:
        return "(not driven)"
    return ", ".join("none" if v is None else f"`{v}`" for v in values)


def conventions_table() -> str:
    """The Markdown table of docs/conformance.md section 5: one row per flag on which some
    framework's mode departs from the spec, its value under the spec (``reference``) and, per
    framework of ``FRAMEWORKS``, the values its modes take (the union; "(not driven)": no mode
    exercises the flag's group). Generated, so that a new framework or profile change shows."""
    reference = Convention().flags()
    header = ["flag", "spec (`reference`)", *(f"`{name}`" for name in FRAMEWORKS)]
    rows = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for flag in FLAGS:
        cells = [flag_values(name, flag) for name in FRAMEWORKS]
        if all(c is None or c == [reference[flag]] for c in cells):
            continue
        rows.append("| " + " | ".join([f"`{flag}`", _cell([reference[flag]]), *map(_cell, cells)]) + " |")
    return "\n".join(rows)
