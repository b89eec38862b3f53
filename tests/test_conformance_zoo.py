"""The mutation zoo: deliberately broken implementations, each flagged by the kit with the failing
case class named; the unbroken framework-style implementation passes.

``framework_loss`` is written the way frameworks write it (dense [N, T] tensors, ``torch.min`` of
the two surrogate branches, a literal k3), independently of refimpl's gated form; each mutant
changes one line of it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from refimpl.conformance import check_group_advantages, check_kl, check_policy_loss
from refimpl.losses import GRPO, get_preset

GRPO_KL = dataclasses.replace(GRPO, kl_coef=0.04)


def framework_loss(variant, bug: str | None = None):
    """A framework-style loss for ``variant`` (token / GSPO sequence ratio; clip or SAPO gate;
    token_mean / seq_mean_token_mean / seq_mean / seq_sum; k3 KL), with an optional ``bug``."""

    def loss_fn(logp, old_logp, advantages, mask, *, ref_logp=None, normalizer=None):
        dtype = torch.promote_types(logp.dtype, torch.float32)
        m = mask.to(dtype)
        if bug == "mask_ignored":
            m = torch.ones_like(m)
        lp, old = logp.to(dtype), old_logp.to(dtype)
        if bug != "nan_through_mask":  # zero the padding before any arithmetic (it may hold NaN)
            lp, old = torch.where(m > 0, lp, 0.0), torch.where(m > 0, old, 0.0)
            ref_logp = None if ref_logp is None else torch.where(m > 0, ref_logp.to(dtype), 0.0)
        a = advantages.to(dtype).unsqueeze(-1)
        log_ratio = (lp - old) * m
        lengths = m.sum(-1)
        if variant.ratio == "sequence_mean":
            total = log_ratio.sum(-1, keepdim=True)
            log_ratio = total if bug == "gspo_product" else total / lengths.clamp(min=1).unsqueeze(-1)
            log_ratio = log_ratio.expand_as(lp)
        # exp(88.8) is inf in float32: beyond 80 a closed gate's gradient is 0 (an open one's is
        # not representable in float32 anyway); unguarded, 0 * inf = NaN (the ratio_overflow class)
        guarded = log_ratio if bug == "unguarded_exp" else log_ratio.clamp(max=80.0)
        ratio = log_ratio if bug == "ratio_not_exponentiated" else torch.exp(guarded)
        if bug == "ratio_from_probabilities":  # exp(logp) / exp(old_logp): underflows in half precision
            ratio = torch.exp(lp) / torch.exp(old)
        if variant.gate == "sapo":
            tau = torch.where(a > 0, torch.full_like(a, variant.tau_pos), torch.full_like(a, variant.tau_neg))
            gate = torch.sigmoid(tau * (ratio - 1))
            surrogate = (gate if bug == "sapo_without_4_over_tau" else 4 / tau * gate) * a
        else:
            low, high = 1 - variant.eps_low, 1 + variant.eps_high
            if bug == "swapped_clip_bounds":
                low, high = 1 - variant.eps_high, 1 + variant.eps_low
            surrogate = torch.min(ratio * a, torch.clamp(ratio, low, high) * a)
        per_token = -surrogate
        if ref_logp is not None and variant.kl_coef > 0:
            base = old if bug == "k3_old_policy_in_denominator" else lp
            log_r = (ref_logp.to(dtype) - base) * m
            per_token = per_token + variant.kl_coef * (torch.exp(log_r) - log_r - 1)
        aggregation = variant.aggregation
        if bug == "wrong_normaliser" and aggregation == "token_mean":
            aggregation = "seq_mean_token_mean"
        local_norm = normalizer if bug != "mean_of_micro_batch_means" else None
        if bug == "scaled_local_mean" and normalizer is not None:  # global via local mean x share
            return (per_token * m).sum() / m.sum() * (m.sum() / normalizer)
        if aggregation == "token_mean":
            return (per_token * m).sum() / (local_norm or m.sum().clamp(min=1))
        if aggregation == "seq_sum":
            return (per_token * m).sum() / (
                local_norm or (lengths > 0).sum().clamp(min=1) * variant.max_length
            )
        rows = (per_token * m).sum(-1) / lengths.clamp(min=1)
        return rows.sum() / (local_norm or (lengths > 0).sum().clamp(min=1))

    return loss_fn


@pytest.mark.parametrize("preset", ["dapo", "grpo", "gspo", "sapo", "dr_grpo", "ppo", "bnpo"])
def test_framework_style_implementation_passes(preset):
    variant = get_preset(preset)
    if variant.aggregation == "seq_sum":
        variant = dataclasses.replace(variant, max_length=16)
    report = check_policy_loss(framework_loss(variant), variant)
    assert report.ok, report.render()


def test_framework_style_implementation_with_kl_passes():
    report = check_policy_loss(framework_loss(GRPO_KL), GRPO_KL)
    assert report.ok, report.render()
    assert "kl_penalty" in [c.case_class for c in report.by_class()]


ZOO = [
    # (bug, variant, a case class that must be among the failing ones)
    ("wrong_normaliser", get_preset("dapo"), "ragged"),
    ("swapped_clip_bounds", get_preset("dapo"), "on_boundary"),
    ("mask_ignored", get_preset("dapo"), "ragged"),
    ("k3_old_policy_in_denominator", GRPO_KL, "kl_penalty"),
    ("ratio_not_exponentiated", get_preset("dapo"), "inside_clip"),
    ("mean_of_micro_batch_means", get_preset("dapo"), "micro_batch"),
    ("gspo_product", get_preset("gspo"), "inside_clip"),
    ("sapo_without_4_over_tau", get_preset("sapo"), "inside_clip"),
    # the classes of issue 10: each fails a plausible bug
    ("nan_through_mask", get_preset("dapo"), "masked_nonfinite"),
    ("scaled_local_mean", get_preset("dapo"), "padding_micro_batch"),
    ("ratio_from_probabilities", get_preset("dapo"), "half_overflow"),
]


@pytest.mark.parametrize(("bug", "variant", "case_class"), ZOO, ids=[z[0] for z in ZOO])
def test_policy_loss_mutant_is_flagged(bug, variant, case_class):
    report = check_policy_loss(framework_loss(variant, bug), variant)
    assert not report.ok
    assert case_class in report.failing_classes(), report.render()
    text = report.render()
    assert f"FAIL: case classes {', '.join(report.failing_classes())}" in text
    assert "smallest failing case:" in text and "expected loss" in text


def test_mean_of_micro_batch_means_fails_only_where_micro_batches_are():
    report = check_policy_loss(framework_loss(get_preset("dapo"), "mean_of_micro_batch_means"), "dapo")
    # a golden vector has a global normaliser
    assert report.failing_classes() == ["micro_batch", "padding_micro_batch", "golden_vectors"]
    assert (
        "diagnosis: matches local means per micro-batch: the normalizer argument is ignored"
        in report.render()
    )


@pytest.mark.parametrize(
    ("bug", "only"),
    [
        ("nan_through_mask", ["masked_nonfinite"]),
        # and 0 / 0 on a step without a token (the class after issue 10's)
        ("scaled_local_mean", ["padding_micro_batch", "empty_step"]),
        ("ratio_from_probabilities", ["half_overflow"]),
        # exp of the raw log-ratio in float32: a closed gate's 0 times inf (issue 27's class)
        ("unguarded_exp", ["ratio_overflow"]),
    ],
)
def test_new_case_classes_catch_what_the_old_ones_miss(bug, only):
    """Each bug passes every case class the kit had before issue 10 and fails the new one."""
    report = check_policy_loss(framework_loss(get_preset("dapo"), bug), "dapo")
    assert report.failing_classes() == only, report.render()


def group_advantages_torch(std_unbiased: bool, eps: float = 1e-6):
    """Framework-style group advantages with sqrt(var + eps), var biased (population) or not."""

    def fn(rewards, group_ids):
        out = torch.zeros_like(rewards)
        for g in torch.unique(group_ids):
            idx = group_ids == g
            r = rewards[idx]
            if r.numel() == 1:
                continue
            var = r.var(unbiased=std_unbiased)
            out[idx] = 0.0 if bool((r == r[0]).all()) else (r - r.mean()) / torch.sqrt(var + eps)
        return out

    return fn


def test_std_population_passes_and_sample_is_flagged_under_reference():
    assert check_group_advantages(group_advantages_torch(False)).ok
    report = check_group_advantages(group_advantages_torch(True))
    assert not report.ok
    assert "equal_groups" in report.failing_classes()


def test_biased_std_is_flagged_under_trl():
    """TRL uses torch.std (sample); a population std is flagged under the trl convention."""

    def trl_with_population_std(rewards, group_ids):
        out = torch.zeros_like(rewards)
        for g in torch.unique(group_ids):
            idx = group_ids == g
            if int(idx.sum()) < 2:
                raise ValueError("TRL needs num_generations >= 2")
            r = rewards[idx]
            out[idx] = (r - r.mean()) / (r.std(unbiased=False) + 1e-4)
        return out

    report = check_group_advantages(trl_with_population_std, convention="trl")
    assert "equal_groups" in report.failing_classes()


def k3(sign_flipped: bool):
    def fn(logp, ref_logp):
        log_r = (logp - ref_logp) if sign_flipped else (ref_logp - logp)
        return torch.exp(log_r) - 1 - log_r

    return fn


def test_kl_sign_flip_is_flagged():
    # the naive exp(log r) - 1 - log r passes every finite class; at log r = +inf it is inf - inf = NaN
    assert check_kl(k3(False), "k3").failing_classes() == ["infinite_log_ratio"]
    report = check_kl(k3(True), "k3")
    assert "moderate_log_ratio" in report.failing_classes()
    assert "zero_log_ratio" not in report.failing_classes()  # at log r = 0 both are 0 with gradient 0
