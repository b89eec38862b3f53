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


def test_eps_high_and_aggregation_override_the_variant():
    """Left out: the preset's own; given: that field of the variant changes and no other."""
    grpo = losses.get_preset("grpo")
    assert resolve_recipe(TrainConfig(loss="grpo")).variant == grpo
    higher = resolve_recipe(TrainConfig(loss="grpo", eps_high=0.28)).variant
    assert higher == dataclasses.replace(grpo, eps_high=0.28)
    token = resolve_recipe(TrainConfig(loss="grpo", aggregation="token_mean")).variant
    assert token == dataclasses.replace(grpo, aggregation="token_mean")
    # GRPO plus clip-higher and the token-level loss is DAPO's policy loss
    both = resolve_recipe(TrainConfig(loss="grpo", eps_high=0.28, aggregation="token_mean")).variant
    assert both == losses.get_preset("dapo")
    # the aggregations' own constants come from the config: L_max = max_new_tokens, G = group_size
    seq_sum = resolve_recipe(TrainConfig(loss="grpo", aggregation="seq_sum", max_new_tokens=7)).variant
    assert (seq_sum.aggregation, seq_sum.max_length) == ("seq_sum", 7)
    config = TrainConfig(loss="grpo", aggregation="seq_sqrt_token_mean", group_size=6)
    sqrt_g = resolve_recipe(config).variant
    assert (sqrt_g.aggregation, sqrt_g.group_size) == ("seq_sqrt_token_mean", 6)


def test_an_override_that_makes_the_variant_invalid_is_refused(monkeypatch):
    variant = dataclasses.replace(losses.get_preset("grpo"), dual_clip=3.0)
    monkeypatch.setitem(RECIPES, "grpo", dataclasses.replace(RECIPES["grpo"], variant=variant))
    TrainConfig(loss="grpo", eps_high=1.5)  # 1 + eps_high <= dual_clip: fine
    match = r"^eps_high: not valid for loss 'grpo' \(variant.dual_clip must be >= "
    with pytest.raises(ValueError, match=match):
        TrainConfig(loss="grpo", eps_high=2.5)


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


def test_prorl_and_magistral_are_replacements_of_the_dapo_preset():
    """Their loss parts are ``replace(...)`` of an existing preset, not new presets (Liu et al. 2025 (ProRL);
    Mistral AI 2025)."""
    dapo = losses.PRESETS["dapo"]
    prorl, magistral = RECIPES["prorl"], RECIPES["magistral"]
    assert prorl.variant == dataclasses.replace(dapo, eps_high=0.4, kl_coef=prorl.variant.kl_coef)
    assert prorl.variant.aggregation == "token_mean" and prorl.variant.kl_coef > 0  # KL kept
    assert prorl.ref_reset_every > 0 and not prorl.dynamic_sampling
    assert magistral.variant == dataclasses.replace(dapo, eps_high=0.25) and magistral.variant.kl_coef == 0
    assert (magistral.advantage_scale, magistral.dynamic_sampling) == ("batch", True)
    assert magistral.overlong_cache_len == RECIPES["dapo"].overlong_cache_len
    assert "prorl" not in losses.PRESETS and "magistral" not in losses.PRESETS


def _tiny_rl_trainer(**kw):
    from refimpl.lm.train import Trainer

    config = dict(
        device="cpu", n_layer=1, n_head=2, n_embd=16, prompts_per_step=4, group_size=4, micro_batch_size=5,
        minibatches=2, inner_epochs=1, eval_size=16, lr=1e-2, reward="partial",
    )
    trainer = Trainer(TrainConfig(**{**config, **kw}))
    trainer.finish_warmup()
    return trainer


def test_prorl_reset_makes_the_reference_the_policy_and_the_optimizer_fresh(monkeypatch):
    """At the start of RL step 3 (ref_reset_every=2) the reference is a copy of the current
    policy and the optimizer has no state (a fresh AdamW); after that step its moments count that
    step's own 2 optimizer steps, not 6."""
    from refimpl.lm.train import Trainer

    seen = []
    real_collect = Trainer.collect

    def spy(self):  # collect runs right after the reset, before any gradient of the step
        params = [p.detach().clone() for p in self.model.parameters()]
        ref = [p.detach().clone() for p in self.ref_model.parameters()]
        seen.append((params, ref, self.optimizer, len(self.optimizer.state)))
        return real_collect(self)

    monkeypatch.setattr(Trainer, "collect", spy)
    trainer = _tiny_rl_trainer(loss="prorl", ref_reset_every=2)
    for _ in range(3):
        trainer.rl_step()
    same = [all(torch.equal(a, b) for a, b in zip(params, ref, strict=True)) for params, ref, _, _ in seen]
    assert same == [True, False, True]  # step 1: the warm-up's reference; step 2: moved; step 3: reset
    assert [n for *_, n in seen] == [0, len(list(trainer.model.parameters())), 0]
    assert seen[2][2] is not seen[1][2] and seen[2][2] is trainer.optimizer
    assert all(float(state["step"]) == 2 for state in trainer.optimizer.state.values())
    assert not any(p.requires_grad for p in trainer.ref_model.parameters())
    lr = trainer.config.lr * (1 - 0.9 * 2 / 200)  # the schedule continues through the reset
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(lr, rel=1e-15, abs=0.0)


def test_magistral_trains_with_minibatch_normalised_advantages(monkeypatch):
    """The recipe's advantage scale reaches the update: the batch keeps group-centred advantages
    and each optimizer minibatch B sees them divided by its own std, so their population variance
    is var_B / (var_B + 1e-6) (Mistral AI 2025; float32 values, 1e-5 relative)."""
    from refimpl.lm.train import Trainer

    seen = []
    real = Trainer.accumulate_gradients

    def spy(self, batch, idx):
        seen.append((idx.clone(), batch.advantages[idx].double()))
        return real(self, batch, idx)

    monkeypatch.setattr(Trainer, "accumulate_gradients", spy)
    trainer = _tiny_rl_trainer(loss="magistral", prompts_per_step=8)
    batch = trainer.collect()
    centred = batch.advantages.double()
    groups = int(batch.group_ids.max()) + 1
    sums = torch.zeros(groups, dtype=torch.float64).index_add(0, batch.group_ids, centred)
    assert len(batch) > 0 and torch.allclose(sums, torch.zeros_like(sums), atol=1e-5)  # centred per group
    trainer.update(batch)
    assert len(seen) == 2
    for idx, adv in seen:
        var = float(centred[idx].var(unbiased=False))
        assert var > 1e-3 and float(adv.var(unbiased=False)) == pytest.approx(
            var / (var + 1e-6), rel=1e-5, abs=0.0
        )


def test_zero_signal_modes_resolve_and_refuse_contradictions():
    assert [resolve_recipe(TrainConfig(loss=n)).zero_signal for n in ("dapo", "grpo")] == ["resample", "keep"]
    up = resolve_recipe(TrainConfig(loss="dapo", zero_signal="upweight"))
    assert (up.zero_signal, up.dynamic_sampling, up.upweight_zero_signal) == ("upweight", False, True)
    assert resolve_recipe(TrainConfig(loss="grpo", zero_signal="resample")).dynamic_sampling
    assert resolve_recipe(TrainConfig(loss="dapo", dynamic_sampling=False)).zero_signal == "keep"
    with pytest.raises(ValueError, match=r"^zero_signal: 'upweight' contradicts dynamic_sampling=True"):
        TrainConfig(zero_signal="upweight", dynamic_sampling=True)
    with pytest.raises(ValueError, match=r"^zero_signal: expected one of \['resample', 'upweight', 'keep'\]"):
        TrainConfig(zero_signal="drop")
    with pytest.raises(ValueError, match=r"^zero_signal: 'upweight' needs group advantages"):
        TrainConfig(loss="ppo_rlhf", zero_signal="upweight")
    assert recipe_default_note("zero_signal").startswith("left out: the loss's own (resample for dapo")


@pytest.mark.parametrize("loss,entropy_coef", [("dapo", 0.0), ("grpo", 0.0), ("dapo", 0.01)])
def test_upweight_step_loss_is_the_hand_computed_upweighted_loss(loss, entropy_coef):
    """zero_signal="upweight", one optimizer step's gradient accumulation on one rank: its loss
    and gradient are those of ``policy_loss(mask & keep, normalizer=upweighted_normalizer(mask,
    variant, keep))`` computed here in one piece from the policy's log-probs, and (without an
    entropy term; the zero-signal rows carry advantage 0) the gradient is the unfiltered loss's
    times 1/(1 - f); with one, the filtered rows' entropy must not count. Under DAPO's token_mean
    the denominator is not the kept tokens' count. (GRPO's on-policy loss value is 0:
    per-sequence means of group-centred advantages; its gradient is not.) Tolerances:
    float32 sums over 5-row micro-batches vs one sum, about 1e-6 relative; 1e-4 on gradients
    whose entries are sums of many float32 terms."""
    from refimpl.lm.rollout import policy_logprobs, response_logits

    trainer = _tiny_rl_trainer(
        loss=loss,
        zero_signal="upweight",
        minibatches=1,
        prompts_per_step=8,
        group_size=2,
        entropy_coef=entropy_coef,
    )
    batch = trainer.collect()
    keep, variant = batch.keep, trainer.variant
    rows = batch.mask.bool().any(dim=-1)
    f = 1 - float((rows & keep).sum()) / float(rows.sum())
    assert 0 < f < 1, "the test needs filtered and kept groups"  # reward="partial", seed 0, G = 2
    assert (batch.kept_rows, batch.rows) == (int((rows & keep).sum()), int(rows.sum()))
    params = list(trainer.model.parameters())

    trainer.optimizer.zero_grad(set_to_none=True)
    sums = trainer.accumulate_gradients(batch, torch.arange(len(batch)))
    got = [p.grad.clone() for p in params]

    def hand(mask, normalizer=None):
        trainer.optimizer.zero_grad(set_to_none=True)
        logits = response_logits(trainer.model, batch.prompts, batch.responses)
        logp, entropy = policy_logprobs(logits, batch.responses, trainer.config.temperature)
        loss, _ = losses.policy_loss(
            logp, batch.old_logp, batch.advantages, mask, variant, entropy=entropy, normalizer=normalizer
        )
        loss.backward()
        return float(loss.detach()), [p.grad.clone() for p in params]

    upweighted = losses.upweighted_normalizer(batch.mask, variant, keep)
    up_loss, up_grad = hand(batch.mask * keep[:, None], upweighted)
    _, unfiltered_grad = hand(batch.mask)
    assert float(sums.loss) == pytest.approx(up_loss, rel=1e-5, abs=1e-7)
    if loss == "dapo":
        assert up_loss != 0.0
    norm = torch.cat([g.flatten() for g in up_grad]).norm()
    assert norm > 0
    for a, b, c in zip(got, up_grad, unfiltered_grad, strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6 * float(norm))
        if entropy_coef == 0.0:
            assert torch.allclose(c / (1 - f), b, rtol=1e-4, atol=1e-6 * float(norm))
