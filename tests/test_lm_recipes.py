"""The trainer's recipes (refimpl.lm.recipes: what each --loss name means, the one home of
loss-dependent defaults) and the update's metrics type (refimpl.lm.metrics)."""

import dataclasses

import pytest
import torch

from refimpl import losses
from refimpl.lm.config import LOSS_NAMES, TrainConfig
from refimpl.lm.metrics import StepSums, UpdateMetrics
from refimpl.lm.recipes import OVERRIDABLE, RECIPES, recipe_default_note, resolve_recipe


def test_every_loss_name_is_a_recipe_over_a_policy_loss_preset():
    assert LOSS_NAMES == tuple(RECIPES)
    for name in ("grpo", "dr_grpo", "dapo", "bnpo", "gspo", "gspo_token", "sapo", "cispo"):
        assert RECIPES[name].variant == losses.PRESETS[name] and not RECIPES[name].rlhf
    assert RECIPES["ppo_rlhf"].variant == dataclasses.replace(losses.PRESETS["ppo"], kl_coef=0.0)
    assert RECIPES["ppo_rlhf"].rlhf
    # the trainer's own recipes are not policy-loss presets (the kit and the golden vectors stay as they are)
    assert set(RECIPES) - set(losses.PRESETS) <= {"ppo_rlhf", "prorl", "magistral"}


def test_resolve_recipe_defaults_and_explicit_settings():
    dapo = resolve_recipe(TrainConfig(loss="dapo"))
    assert (dapo.dynamic_sampling, dapo.overlong_cache_len, dapo.advantage_scale) == (True, 2, "group")
    dapo = resolve_recipe(TrainConfig(loss="dapo", dynamic_sampling=False, overlong_cache_len=0))
    assert (dapo.dynamic_sampling, dapo.overlong_cache_len) == (False, 0)
    dr = resolve_recipe(TrainConfig(loss="dr_grpo", max_new_tokens=7))
    assert dr.advantage_scale == "none" and dr.variant.max_length == 7  # Dr. GRPO's L_max
    grpo = resolve_recipe(
        TrainConfig(loss="grpo", kl_coef=0.1, kl_estimator="k2", entropy_coef=0.01, advantage_scale="batch")
    )
    assert (grpo.variant.kl_coef, grpo.variant.kl_estimator, grpo.variant.entropy_coef) == (0.1, "k2", 0.01)
    assert grpo.advantage_scale == "batch" and grpo.variant.max_length is None
    # PPO-RLHF's KL is rlhf_kl_coef in the reward: the loss's kl_coef stays 0
    rlhf = resolve_recipe(TrainConfig(loss="ppo_rlhf", kl_coef=0.3))
    assert rlhf.variant.kl_coef == 0.0 and rlhf.rlhf
    assert resolve_recipe(TrainConfig(loss="grpo", ref_reset_every=3)).ref_reset_every == 3


def test_help_notes_come_from_the_recipes():
    assert recipe_default_note("kl_coef") == "left out: the loss preset's own"
    note = recipe_default_note("dynamic_sampling")
    on = [name for name, recipe in RECIPES.items() if recipe.dynamic_sampling]
    assert note == f"left out: the loss's own ({', '.join(f'on for {n}' for n in on)}, off otherwise)"
    for name in OVERRIDABLE:
        assert recipe_default_note(name).startswith("left out:")


def _micro(loss, diagnostics, entropy, kl, mask):
    f32 = dict(dtype=torch.float32)
    return StepSums.micro_batch(
        torch.tensor(loss, **f32),
        {k: torch.tensor(v, **f32) for k, v in diagnostics.items()},
        torch.tensor(entropy, **f32),
        None if kl is None else torch.tensor(kl, **f32),
        torch.tensor(mask, **f32),
    )


def test_update_metrics_by_hand():
    """Two optimizer steps of 3 and 1 sequences (dyadic values, so every sum is exact): the loss's
    diagnostics weighted by sequences, entropy and KL token means over the update (the loss's own
    "entropy" replaced in place), the loss the mean of the steps' losses, the gradient norm
    weighted by sequences."""
    step1 = StepSums()
    step1.add(_micro(0.5, {"clip_fraction": 0.25, "entropy": 9.0}, [[1.0, 2.0]], [[0.5, 0.5]], [[1, 1]]))
    step1.add(_micro(0.25, {"clip_fraction": 0.5, "entropy": 9.0}, [[4.0, 8.0], [2.0, 0.0]],
                     [[1.0, 1.0], [0.25, 0.0]], [[1, 0], [1, 0]]))
    step2 = StepSums()
    step2.add(_micro(-1.0, {"clip_fraction": 1.0, "entropy": 9.0}, [[2.0, 2.0]], [[0.0, 0.75]], [[1, 1]]))
    metrics = UpdateMetrics()
    metrics.add_step(step1, torch.tensor(2.0))
    metrics.add_step(step2, torch.tensor(0.5))
    record = metrics.record()
    assert list(record) == ["clip_fraction", "entropy", "kl", "loss", "grad_norm"]
    assert record["clip_fraction"] == (0.25 * 1 + 0.5 * 2 + 1.0 * 1) / 4
    assert record["entropy"] == (1 + 2 + 4 + 2 + 2 + 2) / 6  # counted tokens only
    assert record["kl"] == (0.5 + 0.5 + 1.0 + 0.25 + 0.0 + 0.75) / 6
    assert record["loss"] == ((0.5 + 0.25) + -1.0) / 2
    assert record["grad_norm"] == (2.0 * 3 + 0.5 * 1) / 4
    assert UpdateMetrics().record() == {"optimizer_steps_skipped": True}
    bad = UpdateMetrics()
    bad.add_step(_micro(float("inf"), {}, [[1.0]], None, [[1]]), torch.tensor(1.0))
    record = bad.record()
    assert "kl" not in record and record["loss"] != record["loss"]  # inf -> NaN


@pytest.mark.parametrize("field", OVERRIDABLE)
def test_overridable_fields_default_to_none(field):
    assert getattr(TrainConfig(), field) is None
