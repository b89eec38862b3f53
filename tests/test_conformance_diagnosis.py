"""Diagnosis of the common mistakes: a DAPO loss written as a new user would, with one mistake
planted at a time, fails the check and gets a ``diagnosis:`` that names the mistake (another
aggregation or normaliser, a flipped sign, eps_high = eps_low, float32 arithmetic, a missing KL
term, a KL of the wrong estimator). The correct loss passes, so each diagnosis is of the mistake."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from refimpl.conformance import check_policy_loss
from refimpl.conformance.diagnosis import NO_DIAGNOSIS
from refimpl.losses import get_preset

DAPO_KL = dataclasses.replace(get_preset("dapo"), kl_coef=0.04, kl_estimator="k3")


def user_dapo_loss(*, eps_high=0.28, float32=False, adv_sign=1.0, loss_sign=1.0, seq_mean=False,
                   ignore_normalizer=False, kl="k3", beta=0.0, detach=None, log_clamp=None,
                   unmasked_kl=False):
    """DAPO (Yu et al. 2025): clip [0.8, 1 + eps_high], token mean over the batch (or the kit's
    normaliser), plus beta times a per-token KL estimate of log r = ref - logp (kl.md eqs. (2)-(4))."""

    def loss(logp, old_logp, advantages, mask, *, ref_logp=None, normalizer=None):
        mask = mask.bool()
        dtype = torch.float32 if float32 else torch.promote_types(logp.dtype, torch.float32)
        x = logp.to(dtype)
        log_ratio = torch.where(mask, x - old_logp.to(dtype), 0.0)
        if log_clamp is not None:  # a clamp on the log-ratio (verl's, OpenRLHF's)
            log_ratio = log_ratio.clamp(-log_clamp, log_clamp)
        ratio = torch.exp(log_ratio.clamp(max=80.0))
        if detach == "ratio":
            ratio = ratio.detach()
        clipped = ratio.detach() if detach == "clipped_branch" else ratio
        a = adv_sign * advantages.to(dtype).unsqueeze(-1)
        per_token = -torch.min(ratio * a, torch.clamp(clipped, 0.8, 1.0 + eps_high) * a)
        if beta and unmasked_kl:  # k3 over every position of the padded batch, padding included
            log_r = ref_logp.to(dtype) - x
            per_token = torch.where(mask, per_token, 0.0)
            denom = mask.sum().clamp(min=1) if normalizer is None else normalizer
            return per_token.sum() / denom + beta * (torch.expm1(log_r) - log_r).mean()
        if beta and kl is not None:
            log_r = torch.where(mask, ref_logp.to(dtype) - x, 0.0)
            k = {"k1": -log_r, "k2": 0.5 * log_r**2, "k3": torch.expm1(log_r) - log_r}[kl]
            per_token = per_token + beta * k
        per_token = torch.where(mask, per_token, 0.0)
        if seq_mean:
            rows = mask.any(-1)
            means = per_token.sum(-1)[rows] / mask.sum(-1)[rows]
            out = means.mean() if bool(rows.any()) else per_token.sum()
        else:
            denom = mask.sum().clamp(min=1) if (normalizer is None or ignore_normalizer) else normalizer
            out = per_token.sum() / denom
        return loss_sign * out

    return loss


def diagnoses(report) -> set[str]:
    return {r.explanation for r in report.results if r.explanation}


def test_the_correct_loss_passes():
    assert check_policy_loss(user_dapo_loss(), "dapo").ok
    assert check_policy_loss(user_dapo_loss(beta=0.04), DAPO_KL).ok


@pytest.mark.parametrize(
    ("planted", "preset", "diagnosis"),
    [
        ({"eps_high": 0.2}, "dapo", "matches eps_high = eps_low (no clip-higher)"),
        ({"float32": True}, "dapo", "matches flag compute_dtype='float32'"),
        ({"adv_sign": -1.0}, "dapo", "matches the advantages' sign flipped"),
        ({"loss_sign": -1.0}, "dapo", "matches the loss's sign flipped"),
        ({"seq_mean": True}, "dapo", "matches aggregation 'seq_mean_token_mean'"),
        ({"ignore_normalizer": True}, "dapo",
         "matches local means per micro-batch: the normalizer argument is ignored"),
        ({"beta": 0.0}, DAPO_KL, "matches no KL term (kl_coef 0)"),
        ({"beta": 0.04, "kl": "k1"}, DAPO_KL, "matches the KL estimator 'k1'"),
        ({"beta": 0.04, "kl": "k2"}, DAPO_KL, "matches the KL estimator 'k2'"),
        # issue 27: the mistakes a new user made, each named (the gradient 0.5x, a log-ratio clamp,
        # an unmasked KL) and never by a per-class guess
        ({"detach": "ratio"}, "dapo", "matches no gradient at all (a detached ratio or loss)"),
        ({"detach": "clipped_branch"}, "dapo",
         "matches ratio.detach() in the clipped branch (the gradient halved where the two branches tie)"),
        ({"log_clamp": 20.0}, "dapo", "matches flag log_ratio_clamp=20.0"),
        ({"beta": 0.04, "unmasked_kl": True}, DAPO_KL,
         "matches the KL term averaged over every position, padding included (kl.mean())"),
    ],
    ids=lambda p: p if isinstance(p, str) else None,
)
def test_a_planted_mistake_gets_its_diagnosis(planted, preset, diagnosis):
    report = check_policy_loss(user_dapo_loss(**planted), preset)
    assert not report.ok
    assert diagnosis in diagnoses(report), (diagnoses(report), report.render())
    # the one diagnosis the report prints (the smallest failing case's) names the same mistake,
    # or, for a flipped sign inside the clip, both signs
    shown = [line.strip() for line in report.render().splitlines() if line.strip().startswith("diagnosis:")]
    assert shown, report.render()
    assert shown[0] == f"diagnosis: {diagnosis}" or "flipped sign" in shown[0], shown
    # one diagnosis for the whole report: every failing class's smallest case carries the same
    assert len(diagnoses(report)) == 1, diagnoses(report)


def test_two_mistakes_at_once_get_no_per_class_guess():
    """A log-ratio clamp and a missing clip-higher together: no single alternative reproduces every
    failing class, and the report says so rather than naming one in some classes."""
    report = check_policy_loss(user_dapo_loss(log_clamp=20.0, eps_high=0.2), "dapo")
    assert diagnoses(report) == {NO_DIAGNOSIS}, diagnoses(report)
    assert f"diagnosis: {NO_DIAGNOSIS}" in report.render()


@pytest.mark.framework
def test_verl_loss_without_its_global_batch_info_is_diagnosed_by_flags_not_a_profile(monkeypatch):
    """verl's compute_policy_loss_vanilla called as a user might, without the trainer's global batch info
    (agg_loss then divides each micro-batch by its own non-empty rows): the diagnosis names the flag
    (empty_rows='drop'), not "the 'openrlhf' profile"."""
    from refimpl.conformance.frameworks import load_driver
    from refimpl.conformance.frameworks.verl import adapters
    from refimpl.conformance.profiles import mode_convention

    driver = load_driver("verl")
    if driver.availability() is not None:
        pytest.skip(driver.availability())
    mode = driver.modes("policy_loss")["vanilla/seq-mean-token-mean"]
    variant = driver.mode_variant(mode)
    fn, adapter = driver.target(mode, variant)
    monkeypatch.setattr(adapters, "_global_batch_info", lambda call, config: {"dp_size": 1})
    conv = mode_convention(mode, "verl")
    report = check_policy_loss(fn, variant, convention=conv, adapter=adapter,
                               classes=("ragged", "empty_rows"))
    assert report.failing_classes() == ["empty_rows"]
    assert diagnoses(report) == {"matches flag empty_rows='drop'"}, report.render()
    # every class: each micro-batch is also its own mean and an empty step 0 / 0, three flags at once,
    # which no single flag or pair reproduces: said so, not guessed per class
    report = check_policy_loss(fn, variant, convention=conv, adapter=adapter,
                               classes=("empty_rows", "micro_batch", "empty_step"))
    assert report.failing_classes() == ["empty_rows", "micro_batch", "empty_step"]
    assert diagnoses(report) == {NO_DIAGNOSIS}, report.render()
