"""The conformance kit: our presets pass every case class under every shipped convention; literal
transcriptions of verl's public loss code pass under its profile (so the profile reproduces those
numerics) and differ from the spec exactly where ``convention_differences`` says (TRL: the installed
code itself, tests/test_framework_trl.py);
the cases are what their names promise; reports name the failing class and print the smallest
failing case in full."""

from __future__ import annotations

import dataclasses
import functools
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
    policy_loss_cases,
    profile,
    reference_policy_loss_fn,
    resolve_preset,
)
from refimpl.conformance.golden import golden_cases
from refimpl.conformance.simple_checks import REFUSES_INFINITE
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
    "empty_step",
    "ratio_overflow",
    "zero_rows",
}
SUPPORTED = [
    (p, c)
    for c in ("reference", "trl", "verl")
    for p in ("ppo", "grpo", "dr_grpo", "dapo", "bnpo", "gspo", "gspo_token", "sapo", "cispo")
    if not (c == "trl" and p == "gspo_token")
]


@pytest.mark.parametrize(("preset", "convention"), SUPPORTED, ids=[f"{p}-{c}" for p, c in SUPPORTED])
def test_our_presets_pass_every_case_class_under_every_shipped_convention(preset, convention):
    name, variant = resolve_preset(preset)
    report = check_policy_loss(
        reference_policy_loss_fn(variant, convention, name), preset, convention=convention
    )
    assert report.ok, report.render()
    golden = {"golden_vectors"} if convention == "reference" else set()
    # float32 ratios exactly at the dual clip: no preset has one, verl's profile adds clip_ratio_c = 3
    # to its token-ratio clip presets
    clipped = convention == "verl" and preset in ("ppo", "grpo", "dr_grpo", "dapo", "bnpo")
    tie = {"dual_clip_tie"} if clipped else set()
    assert {c.case_class for c in report.by_class()} == REQUIRED_CLASSES | golden | tie


def test_grpo_with_kl_passes_under_every_convention_including_the_kl_class():
    for convention in ("reference", "trl", "verl"):
        variant = dataclasses.replace(GRPO, kl_coef=0.04)
        report = check_policy_loss(
            reference_policy_loss_fn(variant, convention, "grpo"), variant, convention=convention
        )
        assert report.ok, report.render()
        assert "kl_penalty" in [c.case_class for c in report.by_class()]


def test_profiles_that_do_not_exist_are_refused():
    with pytest.raises(ValueError, match="has no trl equivalent"):
        profile("trl", "gspo_token")
    with pytest.raises(ValueError, match="no verl"):
        profile("verl", "trpo")
    with pytest.raises(ValueError, match="convention must be one of"):
        profile("megatron", "grpo")
    with pytest.raises(ValueError, match="empty_rows"):
        Convention(empty_rows="ignore")
    with pytest.raises(ValueError, match="log_ratio_clamp"):
        Convention(log_ratio_clamp=-1.0)


def test_every_flag_is_documented_with_a_reason():
    flags = set(Convention().flags())
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
    # golden vectors are read from specs/vectors; dual_clip_tie needs a dual clip (below)
    assert set(by_class) == set(POLICY_CASE_CLASSES) - {"golden_vectors", "dual_clip_tie"}
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
    assert by_class["empty_step"] and not any(bool(c.mask.any()) for c in by_class["empty_step"])
    assert any(c.micro_batches for c in by_class["empty_step"])
    # with a dual clip c = 3: float32 inputs whose float32 ratio is exactly 3 on a token with A < 0
    dual = dataclasses.replace(variant, dual_clip=3.0)
    (tie,) = policy_loss_cases(dual, Convention(), classes=("dual_clip_tie",))
    assert tie.logp.dtype == torch.float32
    ratio = torch.exp(tie.logp - tie.old_logp)
    at_c = (ratio == 3.0) & tie.mask & (tie.advantages < 0).unsqueeze(-1)
    assert bool(at_c.any()) and float(torch.exp((tie.logp - tie.old_logp).double()).max()) != 3.0


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
    # ratio_overflow / zero_rows: TRL's NaN gradient of a closed gate on an inf ratio, its NaN mean
    # over 0 rows (named non-finite results, issue 27)
    assert convention_differences("dapo", "trl").failing_classes() == ["masked_nonfinite", "ratio_overflow"]
    assert convention_differences("grpo", "trl").failing_classes() == [
        "empty_rows",
        "micro_batch",
        "masked_nonfinite",
        "padding_micro_batch",
        "ratio_overflow",
        "zero_rows",
    ]
    assert "micro_batch" in convention_differences("bnpo", "trl").failing_classes()


# verl: tests/test_framework_verl.py drives the installed verl 0.9.1 (its own core_algos) under the
# verl profile; the transcriptions that stood here upcast bf16 / fp16 where verl does not.


def test_verl_differences_are_the_documented_ones():
    """The verl profile (the driver's mode flags) departs from the spec only where its flags say:
    the +-20 log-ratio clamp and dual clip 3 (boundary / extreme classes), empty rows counted in the
    row means (the trainer's global_batch_size), CISPO's default lower clip."""
    # the kit's newer classes where they exist: NaN at masked positions propagates, and the dual
    # clip / the clamps bound fp16 ratios that overflow in the spec's view
    def existing(*classes):
        return [c for c in classes if c in POLICY_CASE_CLASSES]

    # dual_clip_tie: verl's torch.min with clip_ratio_c A halves the gradient at r == 3 (dual_clip_tie='half')
    assert convention_differences("dapo", "verl").failing_classes() == existing(
        "on_boundary", "extreme_log_ratio", "masked_nonfinite", "half_overflow", "dual_clip_tie",
        "ratio_overflow",
    )
    # CISPO: verl clips the weight below at 1 - 0.2 (cispo_clip_low, M2), which every class with a
    # ratio below 0.8 shows; without that flag only the NaN at masked positions remains
    assert {"outside_clip", "extreme_log_ratio", "ragged"} <= set(
        convention_differences("cispo", "verl").failing_classes()
    )
    no_low = dataclasses.replace(profile("verl", "cispo"), cispo_clip_low=None)
    assert convention_differences("cispo", no_low).failing_classes() == existing("masked_nonfinite")
    assert convention_differences("gspo", "verl").failing_classes() == existing(
        "extreme_log_ratio", "empty_rows", "micro_batch", "masked_nonfinite", "padding_micro_batch",
        "half_overflow", "zero_rows",
    )
    # Dr. GRPO: every row counts (N = 4 rows, 3 non-empty), L_max stays the constant 16
    name, variant = resolve_preset("dr_grpo")
    case = policy_loss_cases(variant, Convention(), classes=("empty_rows",))[0]
    from refimpl.conformance import effective_variant, expected_policy_loss

    spec_loss, _ = expected_policy_loss(case, variant, Convention())
    verl = profile("verl", "dr_grpo")
    verl_loss, _ = expected_policy_loss(case, effective_variant(variant, verl), verl)
    rows, nonempty = case.mask.shape[0], int(case.mask.any(-1).sum())
    assert float(verl_loss / spec_loss) == pytest.approx(nonempty / rows, rel=1e-12, abs=0.0)


# ----------------------------------------------------------------------------------------------
# the other checkers


def test_kl_estimators_pass():
    """Our estimators pass every class; by default they refuse an infinite log-probability in one line
    (check_finite), which the infinite_log_ratio class accepts as a named departure. Without the check
    all three pass it on their values and gradients (k3's at log r = +inf: the limits, +inf)."""
    for name, fn in (("k1", kl_k1), ("k2", kl_k2), ("k3", kl_k3)):
        report = check_kl(functools.partial(fn, check_finite=False), name)
        assert "infinite_log_ratio" in {c.case_class for c in report.by_class()}
        assert report.ok, report.render()
        report = check_kl(fn, name)
        assert report.ok, report.render()
        assert [(r.case_class, r.departure) for r in report.departures()] == [
            ("infinite_log_ratio", REFUSES_INFINITE)
        ]
    # another exception on the infinite class is a failure

    def breaks_on_infinity(logp, ref_logp):
        if bool(torch.isinf(logp).any() | torch.isinf(ref_logp).any()):
            raise RuntimeError("inf")
        return kl_k3(logp, ref_logp)

    assert check_kl(breaks_on_infinity, "k3").failing_classes() == ["infinite_log_ratio"]
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

    # (verl's advantages are checked against the installed verl: tests/test_framework_verl.py)
    for convention in ("reference", "trl"):
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
    assert report.failing_classes() == ["bf16", "fp16", "half_overflow", "ratio_overflow", "golden_vectors"]
    assert "RuntimeError: only float64 supported" in report.render()


def test_a_case_line_is_python_that_rebuilds_the_case_and_its_numbers():
    """``case_line``: the inputs and the extra numbers (expected / got loss) as one line of Python;
    floats stay numbers (non-finite ones too), other values their repr."""
    from refimpl.conformance.engine import case_line

    case = policy_loss_cases(get_preset("dapo"), Convention(), classes=("ragged",))[0]
    line = case_line(case, {"expected_loss": 0.25, "got_loss": float("nan"), "worst": -math.inf, "note": "x"})
    namespace: dict = {}
    exec("import torch\n" + line, namespace)
    assert torch.equal(namespace["logp"], case.logp) and torch.equal(namespace["mask"], case.mask)
    assert namespace["expected_loss"] == 0.25 and math.isnan(namespace["got_loss"])
    assert namespace["worst"] == -math.inf and namespace["note"] == "x"
