"""The conformance kit: our presets pass every case class under every shipped convention; literal
transcriptions of verl's public loss code pass under its profile (so the profile reproduces those
numerics) and differ from the spec exactly where ``convention_differences`` says (TRL: the installed
code itself, tests/test_framework_trl.py);
the cases are what their names promise; reports name the failing class and print the smallest
failing case in full."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from refimpl.advantages import group_advantages
from refimpl.conformance import (
    FLAG_REASONS,
    POLICY_CASE_CLASSES,
    Convention,
    check_group_advantages,
    check_kl,
    check_policy_loss,
    check_token_logprobs,
    clip_bounds,
    convention_differences,
    framework_config,
    policy_loss_cases,
    profile,
    reference_policy_loss_fn,
    resolve_preset,
)
from refimpl.conformance.golden import golden_cases
from refimpl.kl import kl_k1, kl_k2, kl_k3
from refimpl.losses import GRPO, get_preset
from refimpl.losses.logprobs import token_logprobs

REQUIRED_CLASSES = {
    "inside_clip",
    "outside_clip",
    "on_boundary",
    "extreme_log_ratio",
    "ragged",
    "empty_rows",
    "zero_variance_group",
    "singleton_group",
    "bf16",
    "fp16",
    "micro_batch",
    "masked_nonfinite",
    "padding_micro_batch",
    "half_overflow",
}
SUPPORTED = [
    (p, c)
    for c in ("reference", "trl", "verl")
    for p in ("ppo", "grpo", "dr_grpo", "dapo", "bnpo", "gspo", "gspo_token", "sapo", "cispo")
    if not (c == "trl" and p == "gspo_token") and not (c == "verl" and p == "cispo")
]


@pytest.mark.parametrize(("preset", "convention"), SUPPORTED, ids=[f"{p}-{c}" for p, c in SUPPORTED])
def test_our_presets_pass_every_case_class_under_every_shipped_convention(preset, convention):
    name, variant = resolve_preset(preset)
    report = check_policy_loss(
        reference_policy_loss_fn(variant, convention, name), preset, convention=convention
    )
    assert report.ok, report.render()
    golden = {"golden_vectors"} if convention == "reference" else set()
    assert {c.case_class for c in report.by_class()} == REQUIRED_CLASSES | golden


def test_grpo_with_kl_passes_under_every_convention_including_the_kl_class():
    for convention in ("reference", "trl", "verl"):
        variant = dataclasses.replace(GRPO, kl_coef=0.04)
        report = check_policy_loss(
            reference_policy_loss_fn(variant, convention, "grpo"), variant, convention=convention
        )
        assert report.ok, report.render()
        assert "kl_penalty" in [c.case_class for c in report.by_class()]


def test_profiles_that_do_not_exist_are_refused():
    with pytest.raises(ValueError, match="no TRL"):
        profile("trl", "gspo_token")
    with pytest.raises(ValueError, match="no verl"):
        profile("verl", "cispo")
    with pytest.raises(ValueError, match="convention must be one of"):
        profile("megatron", "grpo")
    with pytest.raises(ValueError, match="empty_rows"):
        Convention(empty_rows="ignore")
    with pytest.raises(ValueError, match="log_ratio_clamp"):
        Convention(log_ratio_clamp=-1.0)


def test_every_flag_is_documented_with_a_reason():
    flags = {f.name for f in dataclasses.fields(Convention)} - {"name"}
    assert flags == set(FLAG_REASONS)


# ----------------------------------------------------------------------------------------------
# the cases are what their names say


def test_on_boundary_cases_sit_exactly_on_each_bound_with_both_advantage_signs():
    variant = get_preset("dapo")
    cases = policy_loss_cases(variant, Convention(), classes=("on_boundary",))
    lower, upper, _ = clip_bounds(variant)
    hits = {lower: set(), upper: set()}
    for case in cases:
        ratio = torch.exp(case.logp - case.old_logp)
        for bound in hits:
            rows = (ratio == bound).any(dim=-1)
            hits[bound] |= {math.copysign(1, float(a)) for a in case.advantages[rows]}
    assert hits == {lower: {1.0, -1.0}, upper: {1.0, -1.0}}


def test_sequence_level_boundary_cases_put_the_sequence_ratio_on_the_bound():
    variant = get_preset("gspo")
    (case, _) = policy_loss_cases(variant, Convention(), classes=("on_boundary",))
    m = case.mask.double()
    seq_ratio = torch.exp(((case.logp - case.old_logp) * m).sum(-1) / m.sum(-1))
    lower, upper, _ = clip_bounds(variant)
    assert bool((seq_ratio == lower).any()) and bool((seq_ratio == upper).any())


def test_case_classes_cover_their_edges():
    variant = get_preset("grpo")
    by_class = {}
    for case in policy_loss_cases(dataclasses.replace(variant, kl_coef=0.04), Convention()):
        by_class.setdefault(case.case_class, []).append(case)
    assert set(by_class) == set(POLICY_CASE_CLASSES) - {"golden_vectors"}  # read from specs/vectors
    extreme = max(float(((c.logp - c.old_logp) * c.mask).abs().max()) for c in by_class["extreme_log_ratio"])
    assert extreme == 50.0
    assert any(bool((~c.mask.any(-1)).any()) for c in by_class["empty_rows"])
    assert any(len(set(c.mask.sum(-1).tolist())) > 2 for c in by_class["ragged"])
    assert {c.logp.dtype for c in by_class["bf16"] + by_class["fp16"]} == {torch.bfloat16, torch.float16}
    for case in by_class["micro_batch"]:
        assert sorted(i for part in case.micro_batches for i in part) == list(range(case.logp.shape[0]))
    assert any(bool((c.advantages == 0).any()) for c in by_class["zero_variance_group"])
    assert any(
        min(c.group_ids.bincount()[c.group_ids.unique()].tolist()) == 1 for c in by_class["singleton_group"]
    )
    kl = by_class["kl_penalty"][0]
    assert float(((kl.ref_logp - kl.logp) * kl.mask).abs().max()) >= 22.0


def test_cases_are_deterministic():
    a = policy_loss_cases(get_preset("dapo"), Convention(), seed=3)
    b = policy_loss_cases(get_preset("dapo"), Convention(), seed=3)
    assert [c.case_id for c in a] == [c.case_id for c in b]
    def same(x, y):  # bit-equal, NaN included (masked_nonfinite)
        return torch.equal(torch.nan_to_num(x, nan=0.5), torch.nan_to_num(y, nan=0.5))

    assert all(same(x.logp, y.logp) and same(x.old_logp, y.old_logp) for x, y in zip(a, b, strict=True))


# ----------------------------------------------------------------------------------------------
# literal transcriptions of verl's public loss code (core_algos); TRL is checked against the
# installed TRL itself in tests/test_framework_trl.py


def test_trl_differences_are_the_documented_ones():
    assert convention_differences("dapo", "trl").failing_classes() == ["masked_nonfinite"]
    assert convention_differences("grpo", "trl").failing_classes() == [
        "empty_rows",
        "micro_batch",
        "masked_nonfinite",
        "padding_micro_batch",
    ]
    assert "micro_batch" in convention_differences("bnpo", "trl").failing_classes()


def low_var_kl(logprob, ref_logprob):
    """verl kl_penalty(..., "low_var_kl"), transcribed."""
    kl = ref_logprob - logprob
    kl = torch.clamp(kl, min=-20, max=20)
    ratio = torch.exp(kl)
    kld = ratio - kl - 1
    return torch.clamp(kld, min=-10, max=10)


def verl_masked_mean(values, mask):
    return (values * mask).sum() / (mask.sum() + 1e-8)


def verl_agg_loss(loss_mat, loss_mask, loss_agg_mode):
    if loss_agg_mode == "token-mean":
        return verl_masked_mean(loss_mat, loss_mask)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)
        return verl_masked_mean(seq_losses, (seq_mask > 0).to(loss_mat.dtype))
    # seq-mean-token-sum-norm with the per-sample global scaling (sum over sequences / (rows x width))
    return torch.sum(loss_mat * loss_mask) / (loss_mask.shape[-1] * loss_mask.shape[0])


def verl_actor_loss(call_fn, call):
    """verl compute_policy_loss_vanilla / _gspo / _sapo + the actor's KL loss, transcribed; the
    framework config comes in ``call.config``."""
    cfg = call.config["framework_config"]
    dtype = torch.promote_types(call.logp.dtype, torch.float32)
    mask = call.mask.to(dtype)
    log_prob, old_log_prob = call.logp.to(dtype), call.old_logp.to(dtype)
    advantages = call.advantages.to(dtype).unsqueeze(-1) * mask
    low, high = cfg["actor.clip_ratio_low"], cfg["actor.clip_ratio_high"]
    if cfg["actor.policy_loss.loss_mode"] == "vanilla":
        negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
        ratio = torch.exp(negative_approx_kl)
        pg_losses1 = -advantages * ratio
        pg_losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
        clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
        pg_losses3 = -advantages * cfg["actor.clip_ratio_c"]
        clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
        pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
        pg_loss = verl_agg_loss(pg_losses, mask, cfg["actor.loss_agg_mode"])
    elif cfg["actor.policy_loss.loss_mode"] == "sapo":
        tau_pos = torch.as_tensor(cfg["actor.tau_pos"], dtype=dtype)
        tau_neg = torch.as_tensor(cfg["actor.tau_neg"], dtype=dtype)
        ratio = (log_prob - old_log_prob).clamp(min=-20.0, max=20.0).exp()
        taus = torch.where(advantages > 0, tau_pos, tau_neg)
        gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
        pg_loss = verl_agg_loss(-gates * advantages, mask, "seq-mean-token-mean")
    else:  # gspo
        negative_approx_kl = log_prob - old_log_prob
        seq_lengths = torch.sum(mask, dim=-1).clamp(min=1)
        negative_approx_kl_seq = torch.sum(negative_approx_kl * mask, dim=-1) / seq_lengths
        log_seq_importance_ratio = (
            log_prob - log_prob.detach() + negative_approx_kl_seq.detach().unsqueeze(-1)
        )
        log_seq_importance_ratio = torch.clamp(log_seq_importance_ratio, max=10.0)
        seq_importance_ratio = torch.exp(log_seq_importance_ratio)
        pg_losses1 = -advantages * seq_importance_ratio
        pg_losses2 = -advantages * torch.clamp(seq_importance_ratio, 1 - low, 1 + high)
        pg_losses = torch.maximum(pg_losses1, pg_losses2)
        pg_loss = verl_agg_loss(pg_losses, mask, "seq-mean-token-mean")
    if cfg["actor.use_kl_loss"]:
        kld = low_var_kl(log_prob, call.ref_logp.to(dtype))
        pg_loss = pg_loss + verl_agg_loss(kld, mask, cfg["actor.loss_agg_mode"]) * cfg["actor.kl_loss_coef"]
    return pg_loss


VERL_PRESETS = ["ppo", "grpo", "dapo", "dr_grpo", "gspo", "gspo_token", "sapo"]


@pytest.mark.parametrize("preset", VERL_PRESETS)
def test_verl_transcription_passes_under_verl_profile(preset):
    # rtol 1e-6: verl's masked_mean divides by (count + 1e-8), a relative change of up to 1e-8.
    report = check_policy_loss(None, preset, convention="verl", adapter=verl_actor_loss, rtol=1e-6)
    assert report.ok, report.render()


def test_verl_transcription_with_low_var_kl_passes_under_verl_profile():
    report = check_policy_loss(
        None, "grpo", convention="verl", adapter=verl_actor_loss, rtol=1e-6, kl_coef=0.04
    )
    assert report.ok, report.render()
    plain = check_policy_loss(
        None,
        "grpo",
        convention="reference",
        adapter=lambda fn, call: verl_actor_loss(
            fn,
            dataclasses.replace(
                call,
                config={
                    **call.config,
                    "framework_config": framework_config(
                        "verl", "grpo", dataclasses.replace(GRPO, kl_coef=0.04)
                    ),
                },
            ),
        ),
        rtol=1e-6,
        kl_coef=0.04,
    )
    assert "kl_penalty" in plain.failing_classes()


def test_verl_differences_are_the_documented_ones():
    assert convention_differences("dapo", "verl").failing_classes() == [
        "on_boundary",
        "extreme_log_ratio",
        "micro_batch",
        "masked_nonfinite",
        "padding_micro_batch",
        "half_overflow",  # the dual clip (3) bounds the fp16 ratios of ~50 000 with A < 0
    ]
    dr = convention_differences("dr_grpo", "verl")
    assert "inside_clip" in dr.failing_classes()
    # Dr. GRPO: padded width T instead of L_max = 16 scales the loss by 16 / T on a case without empty rows
    name, variant = resolve_preset("dr_grpo")
    case = policy_loss_cases(variant, Convention(), classes=("inside_clip",))[0]
    from refimpl.conformance import effective_variant, expected_policy_loss

    spec_loss, _ = expected_policy_loss(case, variant, Convention())
    verl = profile("verl", "dr_grpo")
    verl_loss, _ = expected_policy_loss(case, effective_variant(variant, verl), verl)
    assert float(verl_loss / spec_loss) == pytest.approx(16 / case.logp.shape[1], rel=1e-12)


# ----------------------------------------------------------------------------------------------
# the other checkers


def test_kl_estimators_pass_and_verl_clamps_differ_only_at_large_log_ratios():
    for name, fn in (("k1", kl_k1), ("k2", kl_k2), ("k3", kl_k3)):
        assert check_kl(fn, name).ok
    assert check_kl(low_var_kl, "k3", convention="verl").ok
    report = check_kl(low_var_kl, "k3")
    assert report.failing_classes() == ["large_log_ratio", "extreme_log_ratio"]
    assert not check_kl(kl_k1, "k3").ok


def test_group_advantages_conventions():
    def ours(convention):
        conv = profile(convention)
        return lambda r, g: group_advantages(
            r,
            g,
            scale="group",
            std=conv.adv_std,
            eps=conv.adv_eps,
            eps_inside_sqrt=conv.adv_eps_inside_sqrt,
            zero_variance=conv.adv_zero_variance,
            singleton=conv.adv_singleton,
        )

    for convention in ("reference", "trl", "verl"):
        assert check_group_advantages(ours(convention), convention=convention).ok

    def trl_advantages(rewards, group_ids):  # TRL: torch.std (sample), + 1e-4; num_generations >= 2
        out = torch.empty_like(rewards)
        for g in torch.unique(group_ids):
            idx = group_ids == g
            if int(idx.sum()) < 2:
                raise ValueError("num_generations must be >= 2")
            r = rewards[idx]
            out[idx] = (r - r.mean()) / (r.std() + 1e-4)
        return out

    assert check_group_advantages(trl_advantages, convention="trl").ok
    report = check_group_advantages(trl_advantages)
    assert "singleton_group" in report.failing_classes() and "equal_groups" in report.failing_classes()


def test_token_logprobs_checker():
    assert check_token_logprobs(token_logprobs).ok, check_token_logprobs(token_logprobs).render()

    def naive(logits, tokens):  # softmax without the max shift: overflows on extreme logits
        p = torch.exp(logits.double())
        return torch.log(p / p.sum(-1, keepdim=True)).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    report = check_token_logprobs(naive)
    assert "extreme_logits" in report.failing_classes()
    assert "random_logits" not in report.failing_classes()

    def float32(logits, tokens):
        return torch.log_softmax(logits.float(), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    assert "random_logits" in check_token_logprobs(float32).failing_classes()


# ----------------------------------------------------------------------------------------------
# the report


def test_report_table_and_smallest_failing_case_in_full():
    def wrong_sign(logp, old_logp, advantages, mask, *, normalizer=None):
        return -reference_policy_loss_fn(get_preset("dapo"))(
            logp, old_logp, advantages, mask, normalizer=normalizer
        )

    report = check_policy_loss(wrong_sign, "dapo")
    text = report.render()
    header = text.splitlines()[2]
    assert header.split() == [
        "case",
        "class",
        "cases",
        "value",
        "ok",
        "gradient",
        "ok",
        "max",
        "value",
        "err",
        "max",
        "grad",
        "err",
        "departure",
    ]
    assert "golden_vectors" in report.failing_classes()  # the 50-digit vectors catch it too
    worst = report.smallest_failure()
    # the most diagnostic case: a generated float64 case, the smallest of those
    plain = [
        r for r in report.results if not r.ok and r.dtype == "float64" and r.case_class != "golden_vectors"
    ]
    assert worst.dtype == "float64" and worst.case_class != "golden_vectors"
    assert worst.size == min(r.size for r in plain)
    assert f"smallest failing case: {worst.case_id}" in text
    cases = policy_loss_cases(get_preset("dapo"), Convention()) + [
        g.case for g in golden_cases(get_preset("dapo"))
    ]
    case = next(c for c in cases if c.case_id == worst.case_id)
    assert repr(float(case.logp.flatten()[0])) in text  # inputs printed to round-trip precision
    assert "expected d loss / d logp" in text and "got d loss / d logp" in text


def test_a_function_that_raises_is_reported_not_crashed():
    def fragile(logp, old_logp, advantages, mask, *, normalizer=None):
        if logp.dtype != torch.float64:
            raise RuntimeError("only float64 supported")
        return reference_policy_loss_fn(get_preset("dapo"))(
            logp, old_logp, advantages, mask, normalizer=normalizer
        )

    report = check_policy_loss(fragile, "dapo")
    # one golden vector is bfloat16
    assert report.failing_classes() == ["bf16", "fp16", "half_overflow", "golden_vectors"]
    assert "RuntimeError: only float64 supported" in report.render()
