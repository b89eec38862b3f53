"""The tiny-LM trainer (refimpl.lm.train): every preset runs; on-policy ratios are 1; the global
normaliser makes micro-batching exact; the KL term is minimised and counted in the normaliser;
exact resume; Ctrl-C and non-finite losses; clear errors."""

import dataclasses
import json
import os
import signal

import pytest
import torch

from refimpl import losses
from refimpl.lm import train as train_module
from refimpl.lm.checkpoint import load_checkpoint
from refimpl.lm.model import GPT, KVCache
from refimpl.lm.recipes import RECIPES
from refimpl.lm.rollout import policy_logprobs, response_logits
from refimpl.lm.run import run_training
from refimpl.lm.train import LOSS_NAMES, NonFiniteLossError, TrainConfig, Trainer


def tiny(**kw) -> TrainConfig:
    base = dict(
        device="cpu",
        steps=2,
        n_layer=1,
        n_head=2,
        n_embd=16,
        prompts_per_step=4,
        group_size=4,
        micro_batch_size=5,
        minibatches=1,
        inner_epochs=1,
        eval_size=16,
        sft_target_accuracy=0.0,
        sft_eval_every=1,
        sft_batch_size=8,
        sft_max_steps=3,
        eval_every=1,
        checkpoint_every=1,
        lr=1e-2,
        reward="partial",
    )
    base.update(kw)
    return TrainConfig(**base)


def rl_trainer(**kw) -> Trainer:
    trainer = Trainer(tiny(**kw))
    trainer.finish_warmup()
    return trainer


def perturb(model, seed=0, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def flat_grad(model) -> torch.Tensor:
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in model.parameters()]
    )


class PolicyLossSpy:
    """Records the arguments of every policy-loss call made by the trainer: ``policy_loss``, or the
    fast path ``fused_policy_loss`` that compiled runs take."""

    def __init__(self, monkeypatch):
        self.calls = []
        for owner, name in ((losses, "policy_loss"), (train_module, "fused_policy_loss")):
            monkeypatch.setattr(owner, name, self._recording(getattr(owner, name)))

    def _recording(self, real):
        def call(logp, old_logp, advantages, mask, variant, **kw):
            self.calls.append(
                dict(
                    logp=logp.detach().clone(),
                    old_logp=old_logp.clone(),
                    mask=mask.clone(),
                    variant=variant,
                    **{k: v for k, v in kw.items()},
                )
            )
            return real(logp, old_logp, advantages, mask, variant, **kw)
        return call


@pytest.mark.parametrize("loss", LOSS_NAMES)
def test_every_preset_trains_a_few_steps(loss, monkeypatch):
    spy = PolicyLossSpy(monkeypatch)
    trainer = rl_trainer(loss=loss, kl_coef=0.05 if loss in ("grpo", "bnpo") else None)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    for _ in range(2):
        metrics = trainer.rl_step()
        assert torch.isfinite(torch.tensor(metrics["loss"])) and metrics["entropy"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))
    preset = RECIPES[loss].variant  # a policy-loss preset, or a replace() of one
    variant = spy.calls[0]["variant"]
    assert (variant.ratio, variant.gate, variant.aggregation) == (
        preset.ratio,
        preset.gate,
        preset.aggregation,
    )
    if loss == "ppo_rlhf":  # PPO-RLHF: KL folded into the reward, token-level advantages from GAE
        assert variant.kl_coef == 0.0 and spy.calls[0]["ref_logp"] is None
    if loss in ("grpo", "bnpo"):
        assert variant.kl_coef == 0.05 and spy.calls[0]["ref_logp"] is not None
        assert metrics["kl"] > 0


@pytest.mark.parametrize("loss", ["dapo", "gspo", "ppo_rlhf"])
def test_on_policy_first_micro_batch_ratios_are_one(loss, monkeypatch):
    """Old log-probs recomputed by the trainer with the sampling transform (temperature 0.7,
    top-k 6): the first micro-batch of the first epoch has ratios 1 to 1e-6."""
    spy = PolicyLossSpy(monkeypatch)
    trainer = rl_trainer(loss=loss, temperature=0.7, top_k=6, prompts_per_step=6, micro_batch_size=7)
    trainer.rl_step()
    first = spy.calls[0]
    m = first["mask"].bool()
    ratio = torch.exp(first["logp"] - first["old_logp"])[m]
    assert m.sum() > 20
    torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=1e-6)
    assert first["normalizer"] is not None


def _accumulated_grad(trainer, batch, micro_batch_size):
    trainer.config.micro_batch_size = micro_batch_size
    trainer.model.zero_grad(set_to_none=True)
    sums = trainer.accumulate_gradients(batch, torch.arange(len(batch)))
    assert sums is not None
    return flat_grad(trainer.model), float(sums.loss)


@pytest.mark.parametrize(
    "loss,kl_coef",
    [("grpo", 0.1), ("dapo", None), ("dr_grpo", None), ("gspo", None), ("bnpo", 0.2), ("ppo_rlhf", None)],
)
def test_micro_batching_gives_the_full_batch_gradient(loss, kl_coef):
    """Micro-batches with the global normaliser sum to the full-batch loss and gradient (1e-6
    relative); the mean of micro-batch means (the trap) does not."""
    trainer = rl_trainer(loss=loss, kl_coef=kl_coef, prompts_per_step=5, inner_epochs=1)
    perturb(trainer.model)  # policy != reference, so the KL term has a gradient
    batch = trainer.collect()
    full_grad, full_loss = _accumulated_grad(trainer, batch, len(batch))
    micro_grad, micro_loss = _accumulated_grad(trainer, batch, 3)
    assert full_grad.norm() > 0
    assert (micro_grad - full_grad).norm() <= 1e-6 * full_grad.norm()
    assert micro_loss == pytest.approx(full_loss, rel=1e-5, abs=1e-7)
    if loss in ("dapo", "bnpo"):
        # the trap: averaging micro-batch token means weights tokens unequally
        means = []
        for idx in torch.arange(len(batch)).split(3):
            logits = response_logits(trainer.model, batch.prompts[idx], batch.responses[idx])
            logp, _ = policy_logprobs(logits, batch.responses[idx])
            loss_i, _ = losses.policy_loss(
                logp,
                batch.old_logp[idx],
                batch.advantages[idx],
                batch.mask[idx],
                trainer.variant,
                ref_logp=None if batch.ref_logp is None else batch.ref_logp[idx],
            )
            means.append(float(loss_i.detach()))
        mean_of_means = sum(means) / len(means)
        assert abs(mean_of_means - full_loss) > 1e-4 * abs(full_loss)


def test_kl_term_is_minimised_and_inside_the_global_normaliser():
    trainer = rl_trainer(loss="bnpo", kl_coef=0.5, prompts_per_step=5, inner_epochs=1)
    perturb(trainer.model, scale=0.2)
    batch = trainer.collect()
    batch.advantages = torch.zeros_like(batch.advantages)  # only the KL term remains

    def k3_sum():
        with torch.no_grad():
            logits = response_logits(trainer.model, batch.prompts, batch.responses)
            logp, _ = policy_logprobs(logits, batch.responses)
        log_r = (batch.ref_logp - logp).double()
        return float(((log_r.exp() - 1 - log_r) * batch.mask).sum())

    expected = 0.5 * k3_sum() / float(batch.mask.sum())  # token mean over the whole batch
    _, loss = _accumulated_grad(trainer, batch, 3)
    assert expected > 1e-4
    assert loss == pytest.approx(expected, rel=1e-5, abs=0.0)
    before = k3_sum()
    trainer.config.inner_epochs = 5
    trainer.update(batch)
    assert k3_sum() < 0.8 * before  # descending the loss brings the policy back to the reference


def _records(path):
    out = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        skip = ("wall_time", "cpu_time", "run")
        out.append({k: v for k, v in rec.items() if k not in skip and "per_s" not in k})
    return out


def _weights(path):
    return load_checkpoint(path)["model"]


def _assert_same_run(a, b):
    assert _records(a / "metrics.jsonl") == _records(b / "metrics.jsonl")
    wa, wb = _weights(a / "checkpoint.pt"), _weights(b / "checkpoint.pt")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize(
    "kw",
    [dict(loss="grpo", kl_coef=0.05), dict(loss="prorl", ref_reset_every=3)],  # ProRL resets after the resume
    ids=["grpo", "prorl"],
)
def test_resume_reproduces_the_uninterrupted_run(tmp_path, kw):
    config = tiny(**kw, steps=4, sft_target_accuracy=1.0, sft_max_steps=3, minibatches=2)
    assert run_training(config, tmp_path / "a", progress=False, plot=False) == 0
    first = dataclasses.replace(config, steps=2)
    assert run_training(first, tmp_path / "b", progress=False, plot=False) == 0
    assert (
        run_training(
            config,
            tmp_path / "b",
            resume=tmp_path / "b" / "checkpoint.pt",
            progress=False,
            steps_override=4,
            plot=False,
        )
        == 0
    )
    _assert_same_run(tmp_path / "a", tmp_path / "b")


def test_ctrl_c_saves_a_checkpoint_that_resumes_exactly(tmp_path, monkeypatch):
    config = tiny(loss="dapo", steps=4, checkpoint_every=100)
    assert run_training(config, tmp_path / "a", progress=False, plot=False) == 0
    real_step = Trainer.rl_step

    def step_then_ctrl_c(self):
        metrics = real_step(self)
        if self.step == 3:
            os.kill(os.getpid(), signal.SIGINT)  # the step finishes, then the run saves and stops
        return metrics

    monkeypatch.setattr(Trainer, "rl_step", step_then_ctrl_c)
    assert run_training(config, tmp_path / "b", progress=False, plot=False) == 130
    assert load_checkpoint(tmp_path / "b" / "checkpoint.pt")["step"] == 3
    monkeypatch.setattr(Trainer, "rl_step", real_step)
    assert (
        run_training(
            config, tmp_path / "b", resume=tmp_path / "b" / "checkpoint.pt", progress=False, plot=False
        )
        == 0
    )
    _assert_same_run(tmp_path / "a", tmp_path / "b")


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    real = losses.policy_loss
    trainer_steps = []

    def poisoned(*args, **kw):
        loss, metrics = real(*args, **kw)
        return (loss * float("nan") if len(trainer_steps) >= 2 else loss), metrics

    real_step = Trainer.rl_step

    def counting_step(self):
        out = real_step(self)
        trainer_steps.append(self.step)
        return out

    monkeypatch.setattr(losses, "policy_loss", poisoned)
    monkeypatch.setattr(Trainer, "rl_step", counting_step)
    assert run_training(tiny(steps=5), tmp_path, progress=False, plot=False) == 1
    assert "non-finite loss" in capsys.readouterr().err
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    assert state["step"] == 2
    assert all(torch.isfinite(v).all() for v in state["model"].values())


def test_nan_gradient_stops_before_the_step_and_keeps_the_checkpoint_bit_identical(tmp_path, monkeypatch):
    """A finite loss with a NaN in one gradient entry, on the last optimizer step of RL step 3:
    the run stops (exit 1) before that optimizer step, and checkpoint.pt keeps the bytes written
    after step 2."""
    real = Trainer.accumulate_gradients
    seen = {"calls": 0, "checkpoint": None}

    def poisoned(self, batch, idx):
        out = real(self, batch, idx)
        if self.step == 2:  # RL step 3 is running; minibatches=2: its 2nd call is the last step
            seen["calls"] += 1
            if seen["checkpoint"] is None:
                seen["checkpoint"] = (tmp_path / "checkpoint.pt").read_bytes()
            if seen["calls"] == 2:
                next(iter(self.model.parameters())).grad.view(-1)[0] = float("nan")
        return out

    monkeypatch.setattr(Trainer, "accumulate_gradients", poisoned)
    stepped = []
    real_step = torch.optim.AdamW.step
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, *a, **k: stepped.append(1) or real_step(self))
    assert run_training(tiny(steps=5, minibatches=2), tmp_path, progress=False, plot=False) == 1
    assert seen["calls"] == 2 and seen["checkpoint"] is not None
    assert (tmp_path / "checkpoint.pt").read_bytes() == seen["checkpoint"]
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    assert state["step"] == 2 and all(torch.isfinite(v).all() for v in state["model"].values())
    # the warm-up's steps + 2 RL steps x 2 optimizer steps + the first optimizer step of RL step 3
    assert len(stepped) == state["sft_step"] + 2 * 2 + 1
    assert [r.get("step") for r in _records(tmp_path / "metrics.jsonl") if r["phase"] == "rl"] == [1, 2]


def test_non_finite_gradient_in_the_warm_up_is_caught(monkeypatch):
    trainer = Trainer(tiny())
    real = torch.Tensor.backward

    def nan_backward(self, *a, **k):
        real(self, *a, **k)
        next(iter(trainer.model.parameters())).grad.view(-1)[-1] = float("inf")

    monkeypatch.setattr(torch.Tensor, "backward", nan_backward)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(NonFiniteLossError, match="non-finite gradient"):
        trainer.sft_step_once()
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))


def test_gradient_clipping_matches_clip_grad_norm():
    """The checked clip is clip_grad_norm_'s arithmetic (bit-identical gradients and norm)."""
    trainer = rl_trainer(grad_clip=1e-3)
    batch = trainer.collect()
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.accumulate_gradients(batch, torch.arange(len(batch)))
    copy_model = [p.grad.clone() for p in trainer.model.parameters()]
    norm = trainer.clip_finite_gradients()
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in copy_model]
    for p, g in zip(params, copy_model, strict=True):
        p.grad = g
    expected = torch.nn.utils.clip_grad_norm_(params, 1e-3)
    assert norm > 1e-3 and torch.equal(norm, expected)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(params, trainer.model.parameters(), strict=True))


@pytest.mark.parametrize("where", [0.05, 0.25, 0.60])
def test_checkpoint_with_a_flipped_byte_is_refused(tmp_path, where):
    assert run_training(tiny(steps=1), tmp_path, progress=False, plot=False) == 0
    path = tmp_path / "checkpoint.pt"
    load_checkpoint(path)  # intact: loads
    data = bytearray(path.read_bytes())
    data[int(where * len(data))] ^= 0x01
    bad = tmp_path / "bad.pt"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"^checkpoint: .*bad\.pt (is damaged|is not a readable)[^\n]*$"):
        load_checkpoint(bad)


def test_checkpoint_of_another_model_shape_is_rejected(tmp_path):
    assert run_training(tiny(steps=1), tmp_path, progress=False, plot=False) == 0
    other = Trainer(tiny(n_embd=32))
    with pytest.raises(ValueError, match="another shape.*n_embd: checkpoint 16, this run 32"):
        other.load_state_dict(load_checkpoint(tmp_path / "checkpoint.pt"))


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(loss="reinforce"), "unknown loss"),
        (dict(task="division"), "unknown task"),
        (dict(group_size=1), "group_size"),
        (dict(micro_batch_size=0), "micro_batch_size"),
        (dict(sft_target_accuracy=1.5), "sft_target_accuracy"),
        (dict(temperature=0.0), "temperature"),
        (dict(grad_clip=-1.0), "^grad_clip: expected > 0"),
        (dict(grad_clip=float("nan")), "^grad_clip: expected a finite"),
        (dict(temperature=float("inf")), "^temperature: expected a finite"),
        (dict(eval_every=0), "^eval_every: expected >= 1"),
        (dict(checkpoint_every=0), "^checkpoint_every: expected >= 1"),
        (dict(sft_eval_every=0), "^sft_eval_every: expected >= 1"),
        (dict(sft_batch_size=0), "^sft_batch_size: expected >= 1"),
        (dict(group_size="8"), "^group_size: expected int, got str '8'"),
        (dict(group_size=True), "^group_size: expected int, got bool"),
        (dict(loss="dapo", max_sampling_rounds=0), "^max_sampling_rounds: expected >= 1"),
        (dict(advantage_scale="foo"), r"^advantage_scale: expected one of \['none', 'group', 'batch'\]"),
        (dict(kl_estimator="k4"), "^kl_estimator: expected one of"),
        (dict(kl_coef=-0.1), "^kl_coef: expected >= 0"),
        (dict(eps_high=-0.1), "^eps_high: expected >= 0"),
        (dict(eps_high="0.28"), "^eps_high: expected float, got str"),
        (dict(aggregation="sum"), "^aggregation: expected one of .'seq_mean_token_mean', 'token_mean'"),
        (dict(gamma=1.5), "^gamma: expected <= 1"),
        (dict(lr="0.1"), "^lr: expected float, got str"),
        (dict(seed=1.5), "^seed: expected int"),
        (dict(dynamic_sampling="yes"), "^dynamic_sampling: expected bool"),
        (dict(overlong_cache_len=9, max_new_tokens=8), "^overlong_cache_len: expected at most"),
        (dict(device="gpu"), "^device: expected 'auto', 'cpu', 'cuda'"),
        (dict(positions="alibi"), "^positions: expected one of"),
    ],
)
def test_bad_config_is_rejected_at_construction(kw, match, monkeypatch):
    """Refused when the config is built: no model, no data, no warm-up has started."""
    monkeypatch.setattr(Trainer, "__init__", lambda *a: pytest.fail("a Trainer was built"))
    with pytest.raises((ValueError, TypeError), match=match):
        tiny(**kw)


def test_every_config_field_has_a_validation_rule():
    from refimpl.lm.config import _FIELD_RULES

    assert list(_FIELD_RULES) == [f.name for f in dataclasses.fields(TrainConfig)]


def test_dynamic_sampling_keeps_only_groups_with_signal(monkeypatch):
    trainer = rl_trainer(loss="dapo", reward="exact", overlong_cache_len=0, max_sampling_rounds=2)
    rows = []
    real_forward = GPT.forward
    monkeypatch.setattr(GPT, "forward", lambda self, idx, *a, **k: rows.append(len(idx)) or real_forward(
        self, idx, *a, **k))
    batch = trainer.collect()  # an untrained model: every exact reward is 0, no group has signal
    assert len(batch) == 0 and batch.kept_fraction == 0.0
    assert trainer.update(batch) == {"optimizer_steps_skipped": True}
    # sampling ran (rows of 16 prompts); no forward pass of an empty batch (CUDA's attention fails there)
    assert rows and 0 not in rows
    trainer = rl_trainer(loss="dapo", reward="partial", overlong_cache_len=0)
    batch = trainer.collect()
    rewards = batch.rewards.view(-1, trainer.config.group_size)
    assert len(batch) > 0 and torch.all(rewards.max(1).values > rewards.min(1).values)


def test_ppo_rlhf_returns_fold_the_kl_into_the_per_token_reward():
    """PPO-RLHF (Ouyang et al. 2022, eq. (2)): token reward -beta (log pi_old - log pi_ref), plus the sequence
    reward at the last sampled token; with gamma = lambda = 1 the GAE return at t is the sum of
    the rewards from t on (plus V of the final state for a truncated response)."""
    trainer = rl_trainer(loss="ppo_rlhf", gae_lambda=1.0, gamma=1.0, rlhf_kl_coef=0.3, prompts_per_step=6)
    perturb(trainer.model, scale=0.1)
    batch = trainer.collect()
    with torch.no_grad():
        full = torch.cat([batch.prompts, batch.responses], dim=1)
        _, values = trainer.model(full, return_values=True)
    values = values[:, batch.prompts.shape[1] - 1 :].double()
    assert batch.truncated.any() and (~batch.truncated).any()
    kl_total = 0.0
    for i in range(len(batch)):
        n = int(batch.lengths[i])
        token_rewards = [-0.3 * float(batch.old_logp[i, t] - batch.ref_logp[i, t]) for t in range(n)]
        kl_total += abs(sum(token_rewards))
        token_rewards[-1] += float(batch.rewards[i])
        bootstrap = float(values[i, n]) if batch.truncated[i] else 0.0
        for t in range(n):
            expected = sum(token_rewards[t:]) + bootstrap
            assert float(batch.returns[i, t]) == pytest.approx(expected, rel=1e-5, abs=1e-5), (i, t)
    assert kl_total > 1e-3  # the KL shaping is really exercised
    # advantages are whitened over the counted tokens
    m = batch.mask.bool()
    assert float(batch.advantages[m].mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(batch.advantages[m].std(unbiased=False)) == pytest.approx(1.0, rel=1e-4, abs=0.0)


def test_prorl_reference_reset_copies_the_policy():
    trainer = rl_trainer(loss="grpo", kl_coef=0.1, ref_reset_every=2, steps=3)
    initial_ref = [p.clone() for p in trainer.ref_model.parameters()]
    trainer.rl_step()
    trainer.rl_step()
    assert all(torch.equal(a, b) for a, b in zip(initial_ref, trainer.ref_model.parameters(), strict=True))
    policy = [p.detach().clone() for p in trainer.model.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(initial_ref, policy, strict=True))
    trainer.rl_step()  # step 3 starts by resetting the reference to the current policy
    assert all(torch.equal(a, b) for a, b in zip(policy, trainer.ref_model.parameters(), strict=True))
    assert not any(p.requires_grad for p in trainer.ref_model.parameters())


def test_overlong_filter_masks_truncated_responses_and_penalty_shapes_rewards():
    trainer = rl_trainer(
        loss="dapo",
        overlong_filter=True,
        overlong_cache_len=3,
        max_new_tokens=5,
        dynamic_sampling=False,
        reward="exact",
    )
    batch = trainer.collect()
    assert batch.truncated.any() and (~batch.truncated).any()
    assert torch.all(batch.mask[batch.truncated] == 0)
    assert torch.equal(batch.mask[~batch.truncated].sum(1), batch.lengths[~batch.truncated].float())
    # exact rewards are 0 for an untrained model; the penalty is 0 up to 2 tokens, -1/3 at 3, ..., -1 at 5
    expected = -(batch.lengths - 2).clamp(min=0).double() / 3
    torch.testing.assert_close(batch.rewards.double(), expected, rtol=0, atol=1e-6)


def test_rl_learning_rate_decays_linearly_and_is_applied():
    trainer = rl_trainer(lr=1e-2, lr_decay_steps=4, lr_min_fraction=0.25)
    rates = []
    for _ in range(6):
        trainer.rl_step()
        rates.append(trainer.optimizer.param_groups[0]["lr"])
    expected = [1e-2 * (1 - 0.75 * min(s / 4, 1.0)) for s in range(6)]
    assert rates == pytest.approx(expected, rel=1e-12, abs=0.0)
    with pytest.raises(ValueError, match="lr_min_fraction"):
        tiny(lr_min_fraction=1.5)


def test_reported_reward_and_accuracy_cover_every_drawn_sample():
    trainer = rl_trainer(loss="grpo", reward="partial")
    batch = trainer.collect()
    assert batch.drawn_reward == pytest.approx(float(batch.rewards.mean()), rel=1e-6, abs=0.0)
    assert batch.drawn_accuracy == pytest.approx(float(batch.correct.mean()), abs=1e-12)
    trainer = rl_trainer(loss="dapo", reward="exact", overlong_cache_len=0, max_sampling_rounds=3)
    batch = trainer.collect()  # nothing kept, but 3 rounds of 4 x 4 samples were drawn and scored
    assert len(batch) == 0 and batch.drawn_reward == 0.0 and batch.drawn_accuracy == 0.0


def test_ppo_is_a_deprecated_alias_of_ppo_rlhf(tmp_path):
    """The trainer's PPO-RLHF is "ppo_rlhf"; "ppo" still works (a checkpoint storing it loads)
    with a DeprecationWarning, and trains exactly as "ppo_rlhf"."""
    from refimpl.lm.run import load_run_state

    with pytest.warns(DeprecationWarning, match="'ppo' is a deprecated alias of 'ppo_rlhf'"):
        old = tiny(loss="ppo")
    assert old.loss == "ppo_rlhf" and old.is_rlhf
    assert run_training(tiny(loss="ppo_rlhf", steps=1), tmp_path, progress=False, plot=False) == 0
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    state["config"]["loss"] = "ppo"  # as written before the rename
    from refimpl.lm.checkpoint import save_checkpoint

    save_checkpoint(tmp_path / "old.pt", state)
    with pytest.warns(DeprecationWarning):
        _, config = load_run_state(tmp_path / "old.pt")
    assert config.loss == "ppo_rlhf"


def test_magistral_minibatch_normalisation_equals_batch_scale_on_the_whole_batch():
    """On one rank with the minibatch = the whole batch, minibatch_std_normalise of the centred
    advantages is group_advantages(scale="batch") with the trainer's conventions (a different
    summation order: float32, 64 values, 1e-5 relative is ~100 unit roundoffs)."""
    from refimpl.lm.batch import group_advantages_for, minibatch_std_normalise

    g = torch.Generator().manual_seed(3)
    rewards = torch.randint(0, 3, (64,), generator=g).float() / 2
    group_ids = torch.arange(16).repeat_interleave(4)
    centred = group_advantages_for(rewards, group_ids, "none")
    expected = group_advantages_for(rewards, group_ids, "batch")
    torch.testing.assert_close(minibatch_std_normalise(centred), expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(minibatch_std_normalise(torch.full((5,), 0.25)), torch.zeros(5))
    assert minibatch_std_normalise(torch.zeros(0)).shape == (0,)


def test_magistral_normalises_each_optimizer_minibatch(monkeypatch):
    seen = []
    real = Trainer.accumulate_gradients

    def spy(self, batch, idx):
        seen.append((idx.clone(), batch.advantages[idx].double()))
        return real(self, batch, idx)

    monkeypatch.setattr(Trainer, "accumulate_gradients", spy)
    trainer = rl_trainer(loss="grpo", advantage_scale="batch", prompts_per_step=8, minibatches=2)
    batch = trainer.collect()
    centred = batch.advantages.clone()
    trainer.update(batch)
    assert torch.equal(batch.advantages, centred)  # the stored batch keeps the centred values
    assert len(seen) == 2
    for idx, adv in seen:  # each minibatch's own population variance var_B -> var_B / (var_B + 1e-6)
        var = float(centred[idx].double().var(unbiased=False))
        assert var > 1e-4 and float(adv.var(unbiased=False)) == pytest.approx(
            var / (var + 1e-6), rel=1e-5, abs=0.0
        )
    assert not torch.equal(seen[0][0].sort().values, seen[1][0].sort().values)


@pytest.mark.parametrize("cached", [False, True])
def test_the_model_takes_an_empty_batch_where_attention_returns_none(cached, monkeypatch):
    """On CUDA (torch 2.11) ``F.scaled_dot_product_attention`` returns None for an empty batch
    (the CPU returns an empty tensor): imitated here, the model still gives empty logits."""
    import torch.nn.functional as F

    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda q, *a, **k: None if len(q) == 0 else real(
        q, *a, **k))
    trainer = rl_trainer()
    model, empty = trainer.model, torch.zeros(0, 5, dtype=torch.long)
    cache = KVCache(model.config, 0, 8, "cpu", torch.float32) if cached else None
    logits = model(empty, cache=cache)
    assert logits.shape == (0, 5, model.config.vocab_size) and logits.dtype == torch.float32
    assert model(torch.zeros(2, 5, dtype=torch.long)).shape == (2, 5, model.config.vocab_size)


@pytest.mark.auto_device
@pytest.mark.parametrize("cuda", [False, True])
def test_auto_device_is_cuda_where_present_else_the_cpu(cuda, monkeypatch):
    """device="auto" on purpose, with CUDA imitated present and absent."""
    from refimpl.lm.train import auto_device, resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert auto_device() == ("cuda" if cuda else "cpu")
    assert resolve_device("auto") == torch.device("cuda:0" if cuda else "cpu")
    if not cuda:
        assert Trainer(tiny(device="auto")).device == torch.device("cpu")


def _as_if_sampled_on_cuda(state: dict) -> dict:
    """``state`` with a CUDA sampling generator's state (Philox: 16 bytes, seed and offset) in place
    of the CPU one's, as a run on a GPU saves it."""
    split = state["rng_split"]
    rng = [torch.cat([r[:split], torch.zeros(16, dtype=torch.uint8)]) for r in state["rng"]]
    return {**state, "rng": rng, "device": "cuda:0"}


def test_a_checkpoint_of_another_device_type_evaluates_but_does_not_resume(tmp_path):
    """A checkpoint written on a GPU evaluates and samples on the CPU (weights only); resuming it
    there, which exact resume cannot do, is one line naming both devices."""
    from refimpl.lm.checkpoint import save_checkpoint
    from refimpl.lm.run import RunError
    from refimpl.lm.saved import evaluate_checkpoint, sample_checkpoint

    assert run_training(tiny(steps=1), tmp_path / "run", progress=False, plot=False) == 0
    state = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert state["device"] == "cpu"
    gpu = save_checkpoint(tmp_path / "gpu.pt", _as_if_sampled_on_cuda(state))
    assert evaluate_checkpoint(gpu, device="cpu") == evaluate_checkpoint(tmp_path / "run" / "checkpoint.pt",
                                                                         device="cpu")
    assert len(sample_checkpoint(gpu, n=2, device="cpu")) == 3
    message = "its sampling generator ran on cuda:0, this run on cpu; exact resume needs the device type it"
    with pytest.raises(RunError, match=rf"^--resume: checkpoint: {message} was saved on$"):
        run_training(None, tmp_path / "resumed", resume=gpu, progress=False, plot=False)
