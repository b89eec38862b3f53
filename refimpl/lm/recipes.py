"""The trainer's recipes: what each ``--loss`` name means, in one table (``RECIPES``).

A recipe is a policy-loss variant (a value of ``refimpl.losses.PRESETS``, or a
``dataclasses.replace`` of one) plus the trainer settings that come with it: how advantages are
scaled, DAPO's dynamic sampling and overlong penalty, PPO-RLHF's value head and KL-shaped reward.
This is the one home of every preset-dependent default: a ``TrainConfig`` field left at ``None``
takes its recipe's value (``resolve_recipe``), and ``refimpl train --help`` describes the defaults
from this table.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

from refimpl import losses
from refimpl.losses import PolicyLossVariant

__all__ = [
    "Recipe",
    "RECIPES",
    "resolve_recipe",
    "recipe_default_note",
    "OVERRIDABLE",
    "VARIANT_FIELDS",
    "RECIPE_DEFAULTED",
    "ZERO_SIGNAL_MODES",
]


@dataclass(frozen=True)
class Recipe:
    """One trainer loss: the policy-loss ``variant`` and the settings it trains with.

    ``advantage_scale``: group-centred rewards divided by the group std ("group", GRPO, Shao et al. 2024,
    section 4.1.2), by the std of each optimizer minibatch ("batch", Mistral AI 2025) or not at
    all ("none", Dr. GRPO, Liu et al. 2025 (Dr. GRPO)). ``dynamic_sampling`` / ``overlong_cache_len``: DAPO's
    zero-variance group filter and soft overlong penalty (Yu et al. 2025, sections 3.2 and 3.4).
    ``ref_reset_every``:
    ProRL's hard reset of the reference policy and the optimizer state every this many RL steps
    (0 = never). ``rlhf``: PPO-RLHF (value head, KL folded into the per-token reward (Ouyang et al. 2022,
    eq. (2)),
    token-level GAE (Schulman et al. 2016, eq. (16))); its variant's ``kl_coef`` is 0 (the KL is in the
    reward).
    ``upweight_zero_signal``: dynamic sampling's alternative (an alternative to DAPO's oversampling;
    advantages.md eq.
    (16)): no resampling; the zero-signal groups are filtered out and the rest upweighted by
    1/(1 - f) (never together with ``dynamic_sampling``; ``zero_signal`` names the three ways)."""

    variant: PolicyLossVariant
    advantage_scale: str = "group"
    dynamic_sampling: bool = False
    overlong_cache_len: int = 0
    ref_reset_every: int = 0
    rlhf: bool = False
    upweight_zero_signal: bool = False

    @property
    def zero_signal(self) -> str:
        """What the trainer does with groups whose rewards are all equal: "resample" (DAPO's
        dynamic sampling), "upweight" (filter them, upweight the rest by 1/(1 - f)) or "keep"."""
        if self.dynamic_sampling:
            return "resample"
        return "upweight" if self.upweight_zero_signal else "keep"


RECIPES: dict[str, Recipe] = {
    "grpo": Recipe(losses.get_preset("grpo")),
    "dr_grpo": Recipe(losses.get_preset("dr_grpo"), advantage_scale="none"),
    "dapo": Recipe(losses.get_preset("dapo"), dynamic_sampling=True, overlong_cache_len=2),
    "bnpo": Recipe(losses.get_preset("bnpo")),
    "gspo": Recipe(losses.get_preset("gspo")),
    "gspo_token": Recipe(losses.get_preset("gspo_token")),
    "sapo": Recipe(losses.get_preset("sapo")),
    "cispo": Recipe(losses.get_preset("cispo")),
    # PPO-RLHF's clipped loss is the "ppo" preset; the trainer's name says it is more than that loss
    "ppo_rlhf": Recipe(dataclasses.replace(losses.get_preset("ppo"), kl_coef=0.0), rlhf=True),
    # ProRL (Liu et al. 2025 (ProRL)): DAPO's clip-higher with
    # eps_high = 0.4 and its token-level loss (token_mean), GRPO's group-std advantages, and a KL
    # term that is kept, with the reference hard-reset to the current policy and the optimizer state
    # re-initialised periodically. The seeds give neither the KL weight nor the period, so both are
    # choices, not tuned (one value each, one run): kl_coef = 0.01 with k3 (GRPO's estimator), a
    # quarter of GRPO's common 0.04, because this tiny policy moves far per step (in the seed-0 run
    # the per-token k3 KL to a reference up to 50 steps old reaches 0.1-0.25) and the usual advice is that the
    # resets exist so that the penalty does not dominate; ref_reset_every = 50, four segments in the
    # default 200-step run (ProRL resets a few times in runs of 2000+ steps). Seed 0 reaches 99.0 %
    # held-out greedy accuracy with these values.
    "prorl": Recipe(
        dataclasses.replace(losses.get_preset("dapo"), eps_high=0.4, kl_coef=0.01, kl_estimator="k3"),
        ref_reset_every=50,
    ),
    # Magistral (Mistral AI 2025): all of DAPO's extensions (token-level
    # loss, dynamic sampling, soft overlong penalty, no KL) with eps_high = 0.25, and advantages
    # centred per group, then divided by the std of each optimizer minibatch (all ranks' together).
    "magistral": Recipe(
        dataclasses.replace(losses.get_preset("dapo"), eps_high=0.25),
        advantage_scale="batch",
        dynamic_sampling=True,
        overlong_cache_len=2,
    ),
}

# TrainConfig fields of the policy-loss variant, None = the recipe's variant's value
VARIANT_FIELDS: tuple[str, ...] = ("kl_coef", "kl_estimator", "entropy_coef", "eps_high", "aggregation")
# TrainConfig fields that default to their recipe's value when None (the variant's for VARIANT_FIELDS)
OVERRIDABLE: tuple[str, ...] = (
    *VARIANT_FIELDS,
    "advantage_scale",
    "dynamic_sampling",
    "overlong_cache_len",
    "ref_reset_every",
)
# TrainConfig fields with a recipe default that are not a single Recipe field: zero_signal is
# dynamic_sampling and upweight_zero_signal together (Recipe.zero_signal)
RECIPE_DEFAULTED: tuple[str, ...] = (*OVERRIDABLE, "zero_signal")
ZERO_SIGNAL_MODES: tuple[str, ...] = ("resample", "upweight", "keep")


def resolve_recipe(config) -> Recipe:
    """The recipe ``config.loss`` with the config's explicit settings applied: the fields of
    ``OVERRIDABLE`` that are not None replace the recipe's (PPO-RLHF keeps ``kl_coef = 0``: its KL
    is ``rlhf_kl_coef`` in the reward), a sequence-sum aggregation without its own ``L_max``
    (Dr. GRPO) uses the generation limit ``max_new_tokens``, and the sqrt(G) aggregation without its
    own ``G`` the config's ``group_size``. ``zero_signal`` sets ``dynamic_sampling`` ("resample")
    and ``upweight_zero_signal`` ("upweight"); "keep" turns both off."""
    recipe = RECIPES[config.loss]
    variant_changes = {
        name: getattr(config, name)
        for name in VARIANT_FIELDS
        if getattr(config, name) is not None and not (recipe.rlhf and name == "kl_coef")
    }
    aggregation = variant_changes.get("aggregation", recipe.variant.aggregation)
    if aggregation == "seq_sum" and recipe.variant.max_length is None:
        variant_changes["max_length"] = config.max_new_tokens
    if aggregation == "seq_sqrt_token_mean" and recipe.variant.group_size is None:
        variant_changes["group_size"] = config.group_size
    changes = {
        name: getattr(config, name)
        for name in OVERRIDABLE[len(VARIANT_FIELDS) :]
        if getattr(config, name) is not None
    }
    if getattr(config, "zero_signal", None) is not None:
        changes["dynamic_sampling"] = config.zero_signal == "resample"
        changes["upweight_zero_signal"] = config.zero_signal == "upweight"
    variant = dataclasses.replace(recipe.variant, **variant_changes) if variant_changes else recipe.variant
    return dataclasses.replace(recipe, variant=variant, **changes)


def recipe_default_note(name: str) -> str:
    """What leaving the ``TrainConfig`` field ``name`` out (None) means, from ``RECIPES`` (--help)."""
    if name in VARIANT_FIELDS:
        return "left out: the loss preset's own"
    values = {loss: getattr(recipe, name) for loss, recipe in RECIPES.items()}
    common = Counter(values.values()).most_common(1)[0][0]
    special = [f"{_show(value)} for {loss}" for loss, value in values.items() if value != common]
    rest = f"{_show(common)} otherwise" if special else f"{_show(common)} for every loss"
    return f"left out: the loss's own ({', '.join([*special, rest])})"


def _show(value) -> str:
    return {True: "on", False: "off"}.get(value, str(value)) if isinstance(value, bool) else str(value)
