"""Profiles: ``--convention NAME`` as the flags of framework NAME's driver modes.

A framework's profile for a preset is ``convention_from_flags(name, flags)`` of the modes its
driver lists for that preset (the driver's ``PROFILE``; ``Driver.profile_flags``): one source, kept
with the driver, proven against the installed framework by tests/test_framework_<name>.py and
``refimpl check --framework NAME`` (docs/conformance-matrix.md). ``profile("trl", preset,
scale_rewards="batch")`` selects TRL's batch std (advantages.md eq. (14)).
"""

from __future__ import annotations

import dataclasses

from refimpl.losses import get_preset

from .conventions import Convention, convention_from_flags
from .frameworks import FRAMEWORKS, load_driver
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
