"""Every convention branch of ``refimpl.conformance.expected`` against a closed form (issue 31).

The losses use the gate "none" (``r A``; policy_losses.md eq. (9)) so that each expected value is a
sum written out here in float64: ``-sum A r / D`` plus the KL term (kl.md eqs. (1)-(4)), with ``D``
the denominator a convention divides by (md eq. (11)); float32 roundings of the denominators are
reproduced with numpy's float32. Micro-batch counts are 3 (not a power of two), so that the
OpenRLHF (``gas * float32(count / gas)``) and AReaL (``own / float32(own / count)``) roundings and the
exact count all differ (by ~3e-8 relative: the comparisons are at 1e-13).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from refimpl.conformance.case_types import AdvantageCase, KLCase, LogprobCase, PolicyLossCase
from refimpl.conformance.conventions import Convention
from refimpl.conformance.expected import (
    convention_normalizer,
    effective_variant,
    expected_group_advantages,
    expected_kl,
    expected_policy_loss,
    expected_token_logprobs,
    masked_nonfinite_reaches_loss,
    rounded_normalizer,
)
from refimpl.losses import PolicyLossVariant, get_preset

NONE = PolicyLossVariant(gate="none", aggregation="token_mean")
F32 = np.float32


def case_of(rows, adv, *, ref_shift=None, parts=None) -> PolicyLossCase:
    """Rows of log-ratios (ragged, old_logp = -1 - 0.25 t); ref_logp = logp + ref_shift[i][t]."""
    width = max(len(r) for r in rows)
    logp = torch.full((len(rows), width), 5.0, dtype=torch.float64)
    old = torch.full_like(logp, -5.0)
    ref = torch.full_like(logp, 7.0)
    mask = torch.zeros_like(logp, dtype=torch.bool)
    for i, row in enumerate(rows):
        for j, x in enumerate(row):
            old[i, j] = -1.0 - 0.25 * j
            logp[i, j], mask[i, j] = old[i, j] + x, True
            if ref_shift is not None:
                ref[i, j] = logp[i, j] + ref_shift[i][j]
    a = torch.tensor(adv, dtype=torch.float64)
    return PolicyLossCase("judge", 0, logp, old, a, mask, a, torch.arange(len(rows)),
                          ref if ref_shift is not None else None, parts)


ROWS = [[0.1, -0.2], [0.3], [0.05, -0.15, 0.25], [], [-0.4]]  # 7 tokens
ADV = [0.9, -1.2, 0.6, 2.0, -0.3]
PARTS = ((0, 1), (2, 3), (4,))  # 3, 3 and 1 tokens
SHIFT = [[0.5, -0.25], [0.75], [-0.5, 0.125, 1.0], [], [0.375]]


def part_sum(p):
    """-sum A r over the rows of part ``p`` (the policy numerator)."""
    return sum(-ADV[i] * math.exp(x) for i in p for x in ROWS[i])


def part_kl(p, coef):
    """coef * sum of k2 = (log r)^2 / 2 over part ``p``."""
    return coef * sum(s * s / 2 for i in p for s in SHIFT[i])


def tokens(p):
    return sum(len(ROWS[i]) for i in p)


def openrlhf(count, gas=3):
    return gas * float(F32(count) / F32(gas))


def areal(own, total):
    return own / float(F32(own) / F32(total))


@pytest.mark.parametrize("micro_batch", ["global", "local_mean", "local_sum"])
@pytest.mark.parametrize("rounding", ["exact", "float32_per_micro_batch", "float32_weight"])
def test_micro_batch_normalisers_and_their_float32_roundings(micro_batch, rounding):
    """Kills (issue 31) the AReaL ("float32_weight") and OpenRLHF ("float32_per_micro_batch")
    roundings swapped in ``rounded_normalizer``: over 3 micro-batches all three differ."""
    conv = Convention(micro_batch=micro_batch, normalizer_rounding=rounding)
    loss, grad = expected_policy_loss(case_of(ROWS, ADV, parts=PARTS), NONE, conv)
    want, want_grad = 0.0, {}
    for p in PARTS:
        own = tokens(p)
        count = 7 if micro_batch == "global" else own
        d = {"exact": count, "float32_per_micro_batch": openrlhf(count),
             "float32_weight": areal(own, count) if own else count}[rounding]
        d = max(d, 1.0)
        want += part_sum(p) / d
        want_grad.update({(i, t): -ADV[i] * math.exp(x) / d for i in p for t, x in enumerate(ROWS[i])})
    scale = 1 / 3 if micro_batch == "local_mean" else 1.0
    assert float(loss) == pytest.approx(scale * want, rel=1e-13, abs=0.0)
    for (i, t), g in want_grad.items():
        assert float(grad[i, t]) == pytest.approx(scale * g, rel=1e-13, abs=0.0)
    assert float(grad[3].abs().sum()) == 0.0


def test_a_rounded_normaliser_below_one_is_not_raised_to_one():
    """One token over 25 micro-batches (24 of them empty) under OpenRLHF's rounding: the step divides by
    25 float32(1 / 25) = 1 - 2.2e-8 (openrlhf 0.11.2: loss_utils.py divides the float32 count by gas,
    loss.py divides by it unclamped), not by 1: the spec's D >= 1 (policy_losses.md, "Empty masks") is
    the count's. Kills ``convention_loss``'s clamp of the rounded normaliser (``max(normalizer, 1.0)``,
    the ast driver's 1.0 -> 0.5 survivor, was 2.2e-8 off; ``> 0`` -> ``> 1`` now)."""
    rows = [[0.3]] + [[]] * 24
    conv = Convention(normalizer_rounding="float32_per_micro_batch")
    d = openrlhf(1, gas=25)
    assert d < 1.0 - 2e-8
    loss, grad = expected_policy_loss(case_of(rows, [0.8] + [0.0] * 24, parts=tuple((i,) for i in range(25))),
                                      NONE, conv)
    assert float(loss) == pytest.approx(-0.8 * math.exp(0.3) / d, rel=1e-15, abs=0.0)
    assert float(grad[0, 0]) == pytest.approx(-0.8 * math.exp(0.3) / d, rel=1e-15, abs=0.0)


def test_the_roundings_differ_where_the_micro_batches_do_not_divide_the_count():
    assert len({7.0, openrlhf(7), areal(3, 7)}) == 3
    assert rounded_normalizer(7.0, 3, Convention()) == 7.0
    per_micro_batch = Convention(normalizer_rounding="float32_per_micro_batch")
    assert rounded_normalizer(7.0, 3, per_micro_batch) == openrlhf(7)
    weight = Convention(normalizer_rounding="float32_weight")
    assert rounded_normalizer(7.0, 3, weight, 3.0) == areal(3, 7)
    assert rounded_normalizer(7.0, 3, weight, 0.0) == 7.0 and rounded_normalizer(0.0, 3, weight, 3.0) == 0.0


@pytest.mark.parametrize("micro_batch", ["global", "local_mean"])
@pytest.mark.parametrize("rounding", ["exact", "float32_per_micro_batch"])
def test_a_token_mean_kl_term_over_micro_batches(micro_batch, rounding):
    """OpenRLHF's KL loss: a token mean over the step's tokens (the micro-batch's under local_mean),
    whose count is float32(count) / gas per micro-batch, added to a sequence-mean policy term.
    Kills (issue 31) ``_kl_denominator``'s micro-batch rounding removed (always the exact count)."""
    conv = Convention(micro_batch=micro_batch, normalizer_rounding=rounding, kl_aggregation="token_mean")
    v = dataclasses.replace(NONE, aggregation="seq_mean", kl_coef=0.5, kl_estimator="k2")
    loss, _ = expected_policy_loss(case_of(ROWS, ADV, ref_shift=SHIFT, parts=PARTS), v, conv)
    want = 0.0
    for p in PARTS:
        rows = sum(1 for i in p if ROWS[i])
        seq = {i: sum(-ADV[i] * math.exp(x) for x in ROWS[i]) for i in p if ROWS[i]}  # md eq. (10)
        count = {"global": (4, 7), "local_mean": (rows, tokens(p))}[micro_batch]
        if rounding == "exact":
            d_policy, d_kl = count
        else:
            d_policy, d_kl = openrlhf(count[0]), openrlhf(count[1])
        want += sum(seq.values()) / max(d_policy, 1.0) + part_kl(p, 0.5) / d_kl
    scale = 1 / 3 if micro_batch == "local_mean" else 1.0
    assert float(loss) == pytest.approx(scale * want, rel=1e-13, abs=0.0)


def test_convention_normalizer_of_every_aggregation():
    mask = torch.tensor([[True, True, True, False, False], [False] * 5, [True, True, False, False, False]])

    def norm(aggregation, max_length=None, **flags):
        v = dataclasses.replace(NONE, aggregation=aggregation, max_length=max_length)
        return convention_normalizer(mask, v, Convention(**flags))

    assert norm("token_mean") == 5.0
    for aggregation in ("seq_mean_token_mean", "seq_mean", "seq_sqrt_token_mean"):
        assert norm(aggregation) == 2.0 and norm(aggregation, empty_rows="keep") == 3.0
    assert norm("seq_mean_token_sum") == 2.0
    assert norm("seq_mean_token_sum", token_sum_rows="all") == 3.0
    assert norm("seq_mean_token_sum", token_sum_rows="none") == 1.0
    assert norm("seq_mean_token_sum", empty_rows="keep") == 2.0  # empty_rows is for the means only
    assert norm("seq_sum", 8) == 16.0 and norm("seq_sum", 8, token_sum_rows="all") == 24.0
    assert norm("seq_sum", 8, token_sum_rows="none") == 8.0
    assert norm("seq_sum", 8, seq_sum_width="padded_width") == 10.0
    assert norm("seq_sum", None, seq_sum_width="padded_width") == 10.0
    # SkyRL's Dr. GRPO: the budget is prompt + response, L_max + extra tokens (kills "+ extra" -> "-")
    assert norm("seq_sum", 8, seq_sum_extra=3) == 22.0
    with pytest.raises(ValueError, match=r"^variant.max_length \(L_max\) is required by aggregation "
                                         r"'seq_sum'$"):
        norm("seq_sum", None)


def test_effective_variant_of_every_flag():
    ppo, dapo, gspo, sapo, cispo = (get_preset(n) for n in ("ppo", "dapo", "gspo", "sapo", "cispo"))
    rep = dataclasses.replace
    assert effective_variant(dapo, Convention(fixed_aggregation="seq_mean_token_mean")) == rep(
        dapo, aggregation="seq_mean_token_mean")
    assert effective_variant(dapo, Convention(fixed_aggregation="token_mean")) == dapo
    assert effective_variant(cispo, Convention(cispo_clip_low=0.2)) == rep(cispo, eps_low=0.2)
    assert effective_variant(rep(cispo, eps_low=0.1), Convention(cispo_clip_low=0.2)).eps_low == 0.1
    assert effective_variant(ppo, Convention(cispo_clip_low=0.5)) == ppo
    assert effective_variant(ppo, Convention(dual_clip=3.0)) == rep(ppo, dual_clip=3.0)
    assert effective_variant(rep(ppo, eps_high=2.5), Convention(dual_clip=3.0)).dual_clip == 3.5
    assert effective_variant(rep(ppo, eps_high=None), Convention(dual_clip=3.0)).dual_clip == 3.0
    assert effective_variant(rep(ppo, dual_clip=4.0), Convention(dual_clip=3.0)).dual_clip == 4.0
    # without eps_high the floor is 1 (not 1 + 1): a convention's c = 1.5 stays (kills mutmut_46,
    # ``v.eps_high or 0.0`` -> ``or 1.0``, which max(3, 2) = 3 above cannot tell)
    assert effective_variant(rep(ppo, eps_high=None), Convention(dual_clip=1.5)).dual_clip == 1.5
    assert effective_variant(gspo, Convention(dual_clip=3.0)) == gspo
    assert effective_variant(sapo, Convention(dual_clip=3.0)) == sapo
    tau = effective_variant(rep(sapo, tau_pos=1.1), Convention(sapo_tau_float32=True))
    assert (tau.tau_pos, tau.tau_neg) == (float(F32(1.1)), float(F32(1.05)))
    assert tau.tau_neg != 1.05 and tau.tau_pos != 1.1
    assert effective_variant(ppo, Convention(sapo_tau_float32=True)) == ppo
    token = Convention(sequence_ratio_gradient="token")
    assert effective_variant(gspo, token) == rep(gspo, ratio="gspo_token", aggregation="seq_mean_token_mean")
    assert effective_variant(rep(gspo, aggregation="token_mean"), token) == rep(
        gspo, ratio="gspo_token", aggregation="token_mean")
    assert effective_variant(ppo, token) == ppo
    product = PolicyLossVariant(ratio="sequence_product", aggregation="seq_mean")
    assert effective_variant(product, token) == product


def test_log_ratio_clamps_of_the_ratio_of_cispo_and_of_the_sequence():
    rows, adv = [[1.5, -1.5, 0.5]], [0.8]
    case = case_of(rows, adv)
    loss, grad = expected_policy_loss(case, NONE, Convention(log_ratio_clamp=1.0))
    assert float(loss) == pytest.approx(-0.8 * (math.e + 1 / math.e + math.exp(0.5)) / 3, rel=1e-14, abs=0.0)
    assert grad[0].tolist()[:2] == [0.0, 0.0]
    assert float(grad[0, 2]) == pytest.approx(-0.8 * math.exp(0.5) / 3, rel=1e-14, abs=0.0)
    # CISPO: sg(clip(exp(clamp(x)), max=1.28)) A logp: the clamp reaches the weight only
    cispo = get_preset("cispo")
    loss, grad = expected_policy_loss(case, cispo, Convention(log_ratio_clamp=1.0))
    weights = [1.28, 1 / math.e, 1.28]  # e and e^0.5 capped at 1 + 0.28
    logp = case.logp[0, :3].tolist()
    assert float(loss) == pytest.approx(-0.8 * sum(w * q for w, q in zip(weights, logp, strict=True)) / 3,
                                        rel=1e-14, abs=0.0)
    for t, w in enumerate(weights):
        assert float(grad[0, t]) == pytest.approx(-0.8 * w / 3, rel=1e-14, abs=0.0)
    assert float(expected_policy_loss(case, cispo, Convention())[1][0, 1]) == pytest.approx(
        -0.8 * math.exp(-1.5) / 3, rel=1e-14, abs=0.0)
    # GSPO-token's sequence log-ratio capped at 1: row 0 (mean 2) capped, without gradient
    rows, adv = [[2.5, 1.5], [0.25, 0.75, 0.5]], [0.5, -2.0]
    v = PolicyLossVariant(ratio="gspo_token", gate="none", aggregation="seq_mean_token_mean")
    loss, grad = expected_policy_loss(case_of(rows, adv), v, Convention(sequence_log_ratio_cap=1.0))
    assert float(loss) == pytest.approx(-(0.5 * math.e - 2.0 * math.exp(0.5)) / 2, rel=1e-14, abs=0.0)
    assert grad[0].tolist() == [0.0, 0.0, 0.0]
    for t in range(3):
        assert float(grad[1, t]) == pytest.approx(2.0 * math.exp(0.5) / 3 / 2, rel=1e-14, abs=0.0)


def test_the_importance_weighted_kl_and_the_ratios_it_refuses():
    """Kills (issue 31) the deleted guard refusing ``kl_importance_weight`` with a sequence product
    or GSPO-token ratio (the message is matched whole)."""
    rows, adv, shift = [[0.2, -0.1], [0.3]], [1.0, -0.5], [[0.5, -0.25], [0.75]]
    conv = Convention(kl_importance_weight=True)
    v = dataclasses.replace(NONE, kl_coef=0.5, kl_estimator="k2")
    loss, grad = expected_policy_loss(case_of(rows, adv, ref_shift=shift), v, conv)
    terms = [(i, x, s) for i in range(2) for x, s in zip(rows[i], shift[i], strict=True)]
    want = sum(-adv[i] * math.exp(x) + 0.5 * s * s / 2 * math.exp(x) for i, x, s in terms) / 3
    assert float(loss) == pytest.approx(want, rel=1e-14, abs=0.0)
    # d/dlogp of k2 r = (logp - ref) r + k2 r, with logp - ref = -shift
    i, x, s = terms[0]
    want_grad = (-adv[i] * math.exp(x) + 0.5 * (-s + s * s / 2) * math.exp(x)) / 3
    assert float(grad[0, 0]) == pytest.approx(want_grad, rel=1e-14, abs=0.0)
    gspo = dataclasses.replace(v, ratio="sequence_mean")
    seq_loss, _ = expected_policy_loss(case_of(rows, adv, ref_shift=shift), gspo, conv)
    s_row = [math.exp(sum(r) / len(r)) for r in rows]
    want = sum(len(rows[i]) * -adv[i] * s_row[i] for i in range(2)) / 3
    want += sum(0.5 * s * s / 2 * s_row[i] for i, _, s in terms) / 3
    assert float(seq_loss) == pytest.approx(want, rel=1e-14, abs=0.0)
    for ratio in ("sequence_product", "gspo_token"):
        with pytest.raises(ValueError, match=rf"^kl_importance_weight supports ratio 'token' or "
                                             rf"'sequence_mean', got '{ratio}'$"):
            expected_policy_loss(case_of(rows, adv, ref_shift=shift), dataclasses.replace(v, ratio=ratio),
                                 conv)


def k3(lr: float) -> float:
    """r - 1 - log r from log r, by its series where it cancels (kl.md eq. (4))."""
    return math.expm1(lr) - lr if abs(lr) > 1e-3 else lr * lr / 2 + lr**3 / 6 + lr**4 / 24


def kl_of(log_r, estimator, **flags):
    logp = torch.zeros(len(log_r), dtype=torch.float64)
    case = KLCase("kl", 0, logp, torch.tensor(log_r, dtype=torch.float64))
    value, grad = expected_kl(case, estimator, Convention(**flags))
    return value.tolist(), grad.tolist()


def test_kl_clamps_forms_dtypes_and_gradients():
    lr = [3.0, -3.0, 0.5]
    value, grad = kl_of(lr, "k3", kl_log_ratio_clamp=2.0)
    assert value == pytest.approx([k3(2.0), k3(-2.0), k3(0.5)], rel=1e-14, abs=0.0)
    assert grad[:2] == [0.0, 0.0] and grad[2] == pytest.approx(1 - math.exp(0.5), rel=1e-14, abs=0.0)
    value, grad = kl_of(lr, "k3", kl_log_ratio_max=2.0)
    assert value == pytest.approx([k3(2.0), k3(-3.0), k3(0.5)], rel=1e-14, abs=0.0)
    assert grad[0] == 0.0 and grad[1] == pytest.approx(1 - math.exp(-3.0), rel=1e-14, abs=0.0)
    value, grad = kl_of(lr, "k3", kl_value_clamp=1.0)
    assert value == pytest.approx([1.0, 1.0, k3(0.5)], rel=1e-14, abs=0.0) and grad[:2] == [0.0, 0.0]
    assert kl_of(lr, "k1", kl_value_clamp=1.0)[0] == [-3.0, 3.0, -0.5]  # scope "k3": k1 not clamped
    value, grad = kl_of(lr, "k1", kl_value_clamp=1.0, kl_value_clamp_scope="all")
    assert value == [-1.0, 1.0, -0.5] and grad == [0.0, 0.0, 1.0]
    # the log-ratio clamps and the naive form are k3's: k1 and k2 stay as they are (kills ``_kl_tokens``'s
    # ``k3 and (...)`` changed to ``or``, fifth pass mutmut_30, which gives them k3 of the clamped log r)
    for flags in ({"kl_log_ratio_clamp": 2.0}, {"kl_log_ratio_max": 2.0}, {"kl_k3_form": "naive"}):
        assert kl_of(lr, "k1", **flags) == ([-3.0, 3.0, -0.5], [1.0, 1.0, 1.0])
        assert kl_of(lr, "k2", **flags) == ([4.5, 4.5, 0.125], [-3.0, 3.0, -0.5])
    value, grad = kl_of(lr, "k3", kl_gradient="k2")
    assert value == pytest.approx([k3(x) for x in lr], rel=1e-14, abs=0.0) and grad == [-3.0, 3.0, -0.5]
    value, grad = kl_of(lr, "k2", kl_gradient="none")
    assert value == [4.5, 4.5, 0.125] and grad == [0.0, 0.0, 0.0]
    # k3 at log r = 1e-9: ~5e-19; exp(log r) - 1 - log r keeps only float64 rounding (~1e-16)
    assert kl_of([1e-9], "k3")[0][0] == pytest.approx(k3(1e-9), rel=1e-14, abs=0.0)
    assert abs(kl_of([1e-9], "k3", kl_k3_form="naive")[0][0] - k3(1e-9)) > 5e-17
    assert kl_of([0.5], "k3", kl_k3_form="naive")[0][0] == pytest.approx(k3(0.5), rel=1e-14, abs=0.0)


def test_a_kl_in_float32_sees_the_float32_log_probs():
    logp, ref = -1.2345678901234, -1.2344678901234
    lr32 = float(F32(ref) - F32(logp))  # exact (Sterbenz)
    assert abs(k3(lr32) - k3(ref - logp)) > 1e-4 * k3(ref - logp)
    case = KLCase("kl", 0, torch.tensor([logp], dtype=torch.float64),
                  torch.tensor([ref], dtype=torch.float64))
    value, _ = expected_kl(case, "k3", Convention(kl_compute_dtype="float32"))
    # k3 evaluated in float32 on lr32: a few float32 roundings of a value ~lr^2 / 2
    assert float(value[0]) == pytest.approx(k3(lr32), rel=8 * 2.0**-24, abs=0.0)


def test_masked_nonfinite_reaches_the_loss_only_through_inputs_it_reads():
    case = case_of([[0.1, 0.2], [0.3]], [1.0, -1.0], ref_shift=[[0.1, 0.1], [0.1]])
    nan_ref = dataclasses.replace(case, ref_logp=torch.where(case.mask, case.ref_logp, math.nan))
    assert not masked_nonfinite_reaches_loss(nan_ref, NONE)
    assert masked_nonfinite_reaches_loss(nan_ref, dataclasses.replace(NONE, kl_coef=0.1))
    for field in ("logp", "old_logp"):
        bad = dataclasses.replace(case, **{field: torch.where(case.mask, getattr(case, field), -math.inf)})
        assert masked_nonfinite_reaches_loss(bad, NONE)
    inside = dataclasses.replace(case, logp=torch.where(case.mask, math.inf, case.logp))
    assert not masked_nonfinite_reaches_loss(inside, NONE)  # a non-finite value that counts is no padding
    assert not masked_nonfinite_reaches_loss(case, dataclasses.replace(NONE, kl_coef=0.1))


@pytest.mark.parametrize("flags", [{"adv_scale": "none"}, {"adv_leave_one_out": True},
                                   {"adv_eps_inside_sqrt": True}, {"adv_scale": "batch_rewards"}])
def test_float32_group_statistics_refuse_the_conventions_they_do_not_define(flags):
    conv = Convention(adv_compute_dtype="float32", **{"adv_eps_inside_sqrt": False, **flags})
    case = AdvantageCase("adv", 0, torch.tensor([1.0, 2.0, 4.0]), torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match=r"^adv_compute_dtype='float32' is defined for adv_scale 'group' "
                                         r"with std \+ eps$"):
        expected_group_advantages(case, conv)


REWARDS = [1.0, 2.0, 4.0, 3.0]  # group 0: 1, 2, 4 (mean 7/3, squared deviations 42/9); group 1: 3
GROUPS = [0, 0, 0, 1]


def advantages_of(**flags):
    case = AdvantageCase("adv", 0, torch.tensor(REWARDS, dtype=torch.float64), torch.tensor(GROUPS))
    return expected_group_advantages(case, Convention(**flags)).tolist()


def test_group_advantages_under_each_scale_std_and_singleton_flag():
    centred = [r - 7 / 3 for r in REWARDS[:3]]
    want = [c / math.sqrt(14 / 9 + 1e-6) for c in centred] + [0.0]  # float64: a few roundings of O(1)
    assert advantages_of() == pytest.approx(want, rel=1e-14, abs=1e-15)
    s = math.sqrt(7 / 3) + 1e-4  # TRL: sample std + eps
    assert advantages_of(adv_std="sample", adv_eps=1e-4, adv_eps_inside_sqrt=False) == pytest.approx(
        [c / s for c in centred] + [0.0], rel=1e-14, abs=1e-15)
    assert advantages_of(adv_scale="none") == pytest.approx(centred + [0.0], rel=1e-14, abs=1e-15)
    assert advantages_of(adv_scale="none", adv_singleton="raw") == pytest.approx(centred + [3.0], rel=1e-14,
                                                                                 abs=1e-15)
    # RLOO: R_i minus the mean of the group's other rewards
    assert advantages_of(adv_scale="none", adv_leave_one_out=True) == pytest.approx([-2.0, -0.5, 2.5, 0.0],
                                                                                   rel=1e-14, abs=1e-15)
    # TRL scale_rewards="batch": the group-centred reward over the sample std of all 4 rewards (eq. (14))
    batch_std = math.sqrt(sum((r - 2.5) ** 2 for r in REWARDS) / 3) + 1e-4
    assert advantages_of(adv_scale="batch_rewards", adv_std="sample", adv_eps=1e-4,
                         adv_eps_inside_sqrt=False) == pytest.approx([c / batch_std for c in centred] + [0.0],
                                                                     rel=1e-14, abs=1e-15)
    # verl: a singleton is R / (1 + eps), its divisor float32(1 + eps) under adv_singleton_float32
    verl = {"adv_std": "sample", "adv_eps_inside_sqrt": False, "adv_singleton": "raw"}
    assert advantages_of(**verl)[3] == pytest.approx(3.0 / (1 + 1e-6), rel=1e-15, abs=0.0)
    assert advantages_of(**verl, adv_singleton_float32=True)[3] == 3.0 / float(F32(1.0) + F32(1e-6))
    assert advantages_of(**verl, adv_singleton_float32=True)[:3] == advantages_of(**verl)[:3]
    inside = advantages_of(adv_singleton="raw", adv_singleton_float32=True)[3]
    assert inside == 3.0 / float(np.sqrt(F32(1.0) + F32(1e-6)))


def test_float32_group_statistics_as_verl_forms_them():
    """verl's group_mean_std: float32 rewards, sums accumulated in index order, mean = sum / n, the
    centred squares summed, sample std, then (R - mean) / float32(std + eps) on the float64 rewards."""
    rewards = [1000.1, 1000.3, 1000.2, 5.0]
    case = AdvantageCase("adv", 0, torch.tensor(rewards, dtype=torch.float64), torch.tensor(GROUPS))
    s = [F32(r) for r in rewards[:3]]
    mean = ((F32(0) + s[0]) + s[1]) + s[2]
    mean = mean / F32(3)
    squares = [(x - mean) * (x - mean) for x in s]
    std = np.sqrt((((F32(0) + squares[0]) + squares[1]) + squares[2]) / F32(2))
    divisor = float(F32(std + F32(1e-6)))
    want = [(r - float(mean)) / divisor for r in rewards[:3]]
    for singleton, last in (("raw", 5.0 / float(F32(1.0) + F32(1e-6))), ("zero", 0.0)):
        conv = Convention(adv_compute_dtype="float32", adv_std="sample", adv_eps_inside_sqrt=False,
                          adv_singleton=singleton)
        got = expected_group_advantages(case, conv).tolist()
        assert got[:3] == pytest.approx(want, rel=1e-12, abs=0.0) and got[3] == last
    population = Convention(adv_compute_dtype="float32", adv_eps_inside_sqrt=False)
    got = expected_group_advantages(case, population).tolist()
    std_pop = np.sqrt((((F32(0) + squares[0]) + squares[1]) + squares[2]) / F32(3))
    want = [(r - float(mean)) / float(F32(std_pop + F32(1e-6))) for r in rewards[:3]]
    assert got[:3] == pytest.approx(want, rel=1e-12, abs=0.0)


def test_float32_constants_are_host_numbers_whatever_the_default_device():
    """Under a meta (or CUDA) default device the float32 roundings are still host numbers."""
    sapo = get_preset("sapo")
    per_micro_batch = Convention(normalizer_rounding="float32_per_micro_batch")
    weight = Convention(normalizer_rounding="float32_weight")
    with torch.device("meta"):
        assert rounded_normalizer(7.0, 3, per_micro_batch) == openrlhf(7)
        assert rounded_normalizer(7.0, 3, weight, 3.0) == areal(3, 7)
        assert effective_variant(sapo, Convention(sapo_tau_float32=True)).tau_neg == float(F32(1.05))


def test_cispo_weighs_with_the_ratio_the_framework_evaluates():
    """SkyRL's CISPO on float64 inputs: sg(clip(float32 ratio, max=1.28)) A logp (its gradient the
    float32 weight times A over the tokens), against the exact float64 ratio of the spec."""
    rows, adv = [[0.1, -0.3, 0.7]], [0.8]
    case = case_of(rows, adv)
    r32 = torch.exp(torch.tensor([rows[0]], dtype=torch.float64).float()).double()[0].tolist()
    exact = [math.exp(x) for x in rows[0]]
    for conv, ratios in ((Convention(ratio_dtype="float32"), r32), (Convention(), exact)):
        _, grad = expected_policy_loss(case, get_preset("cispo"), conv)
        want = [-0.8 * min(r, 1.28) / 3 for r in ratios]
        assert grad[0].tolist() == pytest.approx(want, rel=1e-14, abs=0.0)  # a few float64 roundings
    assert abs(r32[0] - math.exp(0.1)) > 1e-12


def test_a_cispo_clamp_below_the_clip_sets_the_weight():
    """log_ratio_clamp 0.1 inside CISPO's clip (e^0.1 < 1.28): the weight is e^{+-0.1}, not e^{+-0.2}."""
    case = case_of([[0.2, -0.2, 0.05]], [0.8])
    _, grad = expected_policy_loss(case, get_preset("cispo"), Convention(log_ratio_clamp=0.1))
    want = [-0.8 * math.exp(x) / 3 for x in (0.1, -0.1, 0.05)]
    assert grad[0].tolist() == pytest.approx(want, rel=1e-14, abs=0.0)


def test_the_kl_term_with_a_value_clamp_or_a_clamped_ratio_reads_the_raw_log_probs():
    """kl_value_clamp alone clamps each k3 term (kl.md eq. (4)); log_ratio_clamp alone moves the
    ratio's logp but not the KL's (built from the raw logp)."""
    rows, adv, shift = [[0.25, 1.5]], [1.0], [[3.0, 0.5]]
    case = case_of(rows, adv, ref_shift=shift)
    v = dataclasses.replace(NONE, kl_coef=0.5, kl_estimator="k3")
    policy = -sum(math.exp(x) for x in rows[0]) / 2
    loss, _ = expected_policy_loss(case, v, Convention(kl_value_clamp=1.0))
    assert float(loss) == pytest.approx(policy + 0.5 * (1.0 + k3(0.5)) / 2, rel=1e-14, abs=0.0)
    loss, grad = expected_policy_loss(case, v, Convention(log_ratio_clamp=1.0))
    clamped = -(math.exp(0.25) + math.e) / 2
    assert float(loss) == pytest.approx(clamped + 0.5 * (k3(3.0) + k3(0.5)) / 2, rel=1e-14, abs=0.0)
    # d/dlogp of k3(ref - logp) = 1 - exp(ref - logp); the clamped token has no policy gradient
    assert float(grad[0, 1]) == pytest.approx(0.5 * (1 - math.exp(0.5)) / 2, rel=1e-14, abs=0.0)


def test_convention_loss_without_a_kl_denominator_is_one_batch():
    from refimpl.conformance.expected import convention_loss

    case = case_of(ROWS, ADV, ref_shift=SHIFT)
    conv = Convention(kl_aggregation="token_mean")
    v = dataclasses.replace(NONE, kl_coef=0.5, kl_estimator="k2")
    loss = convention_loss(case.logp, case.old_logp, case.advantages, case.mask, case.ref_logp, v, conv, 7.0)
    want = sum(part_sum((i,)) for i in range(5)) / 7 + part_kl(range(5), 0.5) / 7
    assert float(loss) == pytest.approx(want, rel=1e-14, abs=0.0)


def test_float32_inputs_have_their_ratio_evaluated_in_float32_in_every_term():
    """float32 inputs (a token-mean KL term beside, CISPO's weight): the ratio is float32(exp(x))."""
    rows, adv, shift = [[0.1, -0.15, 0.05]], [0.6], [[0.5, -0.25, 0.125]]
    case64 = case_of(rows, adv, ref_shift=shift)
    case = dataclasses.replace(case64, logp=case64.logp.float(), old_logp=case64.old_logp.float(),
                               ref_logp=case64.ref_logp.float())
    x = (case.logp.double() - case.old_logp.double())[0]
    r32 = torch.exp(x.float()).double().tolist()
    assert abs(r32[0] - math.exp(float(x[0]))) > 1e-12
    conv = Convention(kl_aggregation="token_mean")
    v = dataclasses.replace(get_preset("ppo"), kl_coef=0.5, kl_estimator="k2")
    loss, _ = expected_policy_loss(case, v, conv)
    log_r = (case.ref_logp.double() - case.logp.double())[0].tolist()
    want = -0.6 * sum(r32) / 3 + 0.5 * sum(s * s / 2 for s in log_r) / 3
    assert float(loss) == pytest.approx(want, rel=1e-14, abs=0.0)
    _, grad = expected_policy_loss(case, get_preset("cispo"), Convention())
    assert grad[0].tolist() == pytest.approx([-0.6 * r / 3 for r in r32], rel=1e-14, abs=0.0)


def test_expected_values_follow_the_cases_device_not_the_default_one():
    case = case_of(ROWS, ADV, ref_shift=SHIFT, parts=PARTS)
    v = dataclasses.replace(NONE, kl_coef=0.5, kl_estimator="k2")
    plain = expected_policy_loss(case, v, Convention())
    with torch.device("meta"):
        loss, grad = expected_policy_loss(case, v, Convention())
    assert loss.device.type == "cpu" and torch.equal(loss, plain[0]) and torch.equal(grad, plain[1])


def test_the_sequence_cap_of_a_row_of_one_token():
    """GSPO-token's cap on a row of one token (log s = its log-ratio 2.5, capped at 1) beside a row of
    two under the cap. Kills ``_capped_sequence_logp``'s length clamp ``min=1`` changed to ``min=2``."""
    v = PolicyLossVariant(ratio="gspo_token", gate="none", aggregation="seq_mean_token_mean")
    loss, grad = expected_policy_loss(case_of([[2.5], [0.25, 0.75]], [0.5, -2.0]), v,
                                      Convention(sequence_log_ratio_cap=1.0))
    assert float(loss) == pytest.approx(-(0.5 * math.e - 2.0 * math.exp(0.5)) / 2, rel=1e-14, abs=0.0)
    assert float(grad[0, 0]) == 0.0


def test_a_sequence_log_ratio_exactly_on_the_cap_is_not_capped():
    """GSPO-token's cap applies where ``log s_i`` exceeds c: a row whose mean log-ratio is exactly
    c = 1 ((0.5 + 1.5) / 2, exact in float64) keeps its gradient -A e / T per token. Kills
    ``_capped_sequence_logp``'s ``log_s > cap`` changed to ``>=`` (fifth pass, mutmut_18: the row
    would be detached, gradient 0, with the same value)."""
    v = PolicyLossVariant(ratio="gspo_token", gate="none", aggregation="seq_mean_token_mean")
    loss, grad = expected_policy_loss(case_of([[0.5, 1.5]], [0.5]), v, Convention(sequence_log_ratio_cap=1.0))
    assert float(loss) == pytest.approx(-0.5 * math.e, rel=1e-15, abs=0.0)
    assert grad[0].tolist() == pytest.approx([-0.5 * math.e / 2] * 2, rel=1e-15, abs=0.0)


def test_a_token_mean_kl_term_of_a_step_without_tokens_is_zero():
    """No token counts: the KL term's denominator is 1, not 0 (0 / 0 would be NaN). Kills
    ``_token_mean_kl_term``'s ``per_step > 0`` changed to ``>= 0``."""
    case = case_of([[0.1, 0.2]], [1.0], ref_shift=[[0.5, -0.5]])
    case = dataclasses.replace(case, mask=torch.zeros_like(case.mask))
    v = dataclasses.replace(NONE, aggregation="seq_mean", kl_coef=0.5, kl_estimator="k2")
    loss, grad = expected_policy_loss(case, v, Convention(kl_aggregation="token_mean"))
    assert float(loss) == 0.0 and float(grad.abs().sum()) == 0.0


def test_the_k2_straight_through_gradient_accepts_an_infinite_log_ratio():
    """verl's "+" estimators (``kl_gradient="k2"``) on a token the policy gives probability 0: the
    gradient is k2's slope (-inf), and the value ``v + (k2 - sg(k2))`` is NaN there, as the
    straight-through sum itself forms it (inf - inf), not a refusal of the input. Kills
    ``_k2_straight_through``'s ``check_finite=False`` dropped (kl_k2 would raise)."""
    case = KLCase("kl", 0, torch.tensor([-math.inf, -1.0], dtype=torch.float64),
                  torch.tensor([-1.0, -1.5], dtype=torch.float64))
    value, grad = expected_kl(case, "k1", Convention(kl_gradient="k2"))
    assert math.isnan(value[0]) and value[1] == 0.5
    assert grad.tolist() == [-math.inf, 0.5]


def test_rloo_advantages_scaled_by_the_group_std():
    """RLOO (R_i minus the mean of the others: -2, -0.5, 2.5) over the group's std with eps inside
    the square root; the singleton 0. Kills ``leave_one_out`` dropped when ``adv_scale`` is not "none"."""
    s = math.sqrt(14 / 9 + 1e-6)
    assert advantages_of(adv_leave_one_out=True) == pytest.approx([-2.0 / s, -0.5 / s, 2.5 / s, 0.0],
                                                                  rel=1e-14, abs=1e-15)


FLOAT32_STATS = {"adv_compute_dtype": "float32", "adv_std": "sample", "adv_eps_inside_sqrt": False}


def test_float32_group_statistics_of_pairs_singletons_and_no_rewards():
    """A pair is no singleton (its sample std |a - b| / sqrt 2); a singleton whose reward is not a
    float32 number is 0 under "zero" (not (R - float32(R)) / eps); no rewards give no advantages.
    Kills in ``_float32_group_advantages``: ``count <= 1`` changed to ``<= 2``, the "zero" branch
    skipped, ``groups`` taken from an empty index."""
    rewards = [0.5, 1.5, 0.1]
    case = AdvantageCase("adv", 0, torch.tensor(rewards, dtype=torch.float64), torch.tensor([0, 0, 1]))
    std = float(F32(np.sqrt(F32(0.5)) + F32(1e-6)))  # sqrt((0.5^2 + 0.5^2) / 1), then + eps in float32
    for singleton, last in (("zero", 0.0), ("raw", 0.1 / float(F32(1.0) + F32(1e-6)))):
        got = expected_group_advantages(case, Convention(adv_singleton=singleton, **FLOAT32_STATS)).tolist()
        assert got[:2] == pytest.approx([-0.5 / std, 0.5 / std], rel=1e-15, abs=0.0)
        assert got[2] == last
    empty = AdvantageCase("adv", 0, torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.long))
    assert expected_group_advantages(empty, Convention(**FLOAT32_STATS)).tolist() == []


def test_float32_group_statistics_keep_the_singleton_error_and_the_constant_group_zero():
    """``adv_compute_dtype="float32"`` with the spec's other flags: ``adv_singleton="error"`` raises
    as ``group_advantages`` does (before, the singleton got a value), and under
    ``adv_zero_variance="zero"`` a constant group of two float32-inexact rewards is exactly 0, where
    "formula" keeps the float32 statistics' rounding noise ((0.1 - float32 mean) / float32(0 + eps)
    with the float32 mean 0.1 rounded: (0.1 - 0.10000000149) / 1e-6 = -1.49e-3); a group of distinct
    rewards is the formula under both."""
    case = AdvantageCase("adv", 0, torch.tensor([0.1, 0.1, 0.5, 1.5], dtype=torch.float64),
                         torch.tensor([0, 0, 1, 1]))
    zero = expected_group_advantages(case, Convention(**FLOAT32_STATS)).tolist()
    formula = expected_group_advantages(case, Convention(adv_zero_variance="formula", **FLOAT32_STATS))
    noise = (0.1 - float(F32(0.1))) / float(F32(0.0) + F32(1e-6))
    assert zero[:2] == [0.0, 0.0] and formula.tolist()[:2] == [noise, noise]
    assert noise == pytest.approx(-1.49e-3, rel=1e-2, abs=0.0)
    formula = formula.tolist()
    assert zero[2:] == formula[2:] and zero[2] < 0.0 < zero[3]
    single = AdvantageCase("adv", 0, torch.tensor([0.5, 1.5, 0.1], dtype=torch.float64),
                           torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match=r"^a group has a single sample \(singleton='error'\); pass "
                                         r"singleton='zero' to give such samples advantage 0$"):
        expected_group_advantages(single, Convention(adv_singleton="error", **FLOAT32_STATS))
    pair = AdvantageCase("adv", 0, torch.tensor([0.5, 1.5], dtype=torch.float64), torch.tensor([0, 0]))
    assert expected_group_advantages(pair, Convention(adv_singleton="error", **FLOAT32_STATS)).tolist() == \
        expected_group_advantages(pair, Convention(**FLOAT32_STATS)).tolist()


def test_float32_statistics_follow_neither_the_default_device_nor_the_default_dtype():
    """The float32 group statistics, verl's float32 singleton divisor and a token-mean KL term made on
    the rewards' (case's) device in their own dtype, under a meta default device and a float64 default
    dtype. Kills dropped ``device=`` / ``dtype=`` arguments in ``_float32_group_advantages``,
    ``_float32_singleton_divisor`` and ``_token_mean_kl_term``."""
    case = AdvantageCase("adv", 0, torch.tensor([1000.1, 1000.3, 1000.2, 0.1], dtype=torch.float64),
                         torch.tensor(GROUPS))
    verl = Convention(adv_std="sample", adv_eps_inside_sqrt=False, adv_singleton="raw",
                      adv_singleton_float32=True)
    stats = Convention(adv_singleton="raw", **FLOAT32_STATS)
    policy = case_of(ROWS, ADV, ref_shift=SHIFT, parts=PARTS)
    v = dataclasses.replace(NONE, aggregation="seq_mean", kl_coef=0.5, kl_estimator="k2")
    token_mean = Convention(kl_aggregation="token_mean")
    plain = [expected_group_advantages(case, verl), expected_group_advantages(case, stats),
             *expected_policy_loss(policy, v, token_mean)]
    assert plain[0][3] == 0.1 / float(F32(1.0) + F32(1e-6))
    with torch.device("meta"):
        on_meta = [expected_group_advantages(case, verl), expected_group_advantages(case, stats),
                   *expected_policy_loss(policy, v, token_mean)]
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        in_float64 = [expected_group_advantages(case, verl), expected_group_advantages(case, stats)]
    finally:
        torch.set_default_dtype(default)
    for got in (*on_meta, *in_float64):
        assert got.device.type == "cpu"
    assert all(torch.equal(a, b) for a, b in zip(plain, on_meta, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(plain[:2], in_float64, strict=True))


def test_a_token_mean_kl_denominator_is_not_rounded_to_float32():
    """A per-step token count of 2^24 + 1 (no float32 number) divides the KL sum exactly, in the KL's
    dtype (float64 here). Kills ``_token_mean_kl_term``'s ``dtype=kl.dtype`` dropped (a float32
    denominator 2^24)."""
    from refimpl.conformance.expected import convention_loss

    case = case_of(ROWS, [0.0] * 5, ref_shift=SHIFT)  # advantages 0: the KL term alone
    v = dataclasses.replace(NONE, kl_coef=0.5, kl_estimator="k2")
    count = 2.0**24 + 1
    loss = convention_loss(case.logp, case.old_logp, case.advantages, case.mask, case.ref_logp, v,
                           Convention(kl_aggregation="token_mean"), 7.0, (count, 1))
    # 6e-8 relative from the float32 count's value: far outside a few float64 roundings
    assert float(loss) == pytest.approx(part_kl(range(5), 0.5) / count, rel=1e-14, abs=0.0)


def test_a_clamped_k3_accepts_infinite_log_ratios():
    """k3 with ``kl_log_ratio_max`` 10 on both infinities: log r = +inf (logp = -inf) is clamped to 10,
    log r = -inf (ref = -inf) keeps k3's limit inf with slope +1. Kills ``_k3_of_log_ratio``'s
    ``check_finite=False`` dropped or turned to True (kl_k3 would refuse the infinity)."""
    case = KLCase("kl", 0, torch.tensor([-math.inf, -1.0], dtype=torch.float64),
                  torch.tensor([-1.0, -math.inf], dtype=torch.float64))
    value, grad = expected_kl(case, "k3", Convention(kl_log_ratio_max=10.0))
    assert value.tolist() == [pytest.approx(k3(10.0), rel=1e-14, abs=0.0), math.inf]
    assert grad.tolist() == [0.0, 1.0]


def test_a_value_clamp_of_the_weighted_kl_term_clamps_after_the_weight():
    """``kl_value_clamp_scope="weighted"`` (Unsloth): the k3 term times the token's ratio, then clamped
    to [-c, c], c = 1.5: token 0 k3(1.5) e^-0.7 = 0.984 (k3 alone 1.98 > c: not clamped first),
    token 1 k3(2) e^0.1 = 4.85 -> 1.5. Kills the scope test ``!= "weighted"`` in ``_kl_tokens``
    broken (a clamp before the weight too), and in ``convention_loss`` the clamp after the weight
    skipped or applied under every scope (``and`` -> ``or``, ``== "weighted"`` -> ``!=``)."""
    rows, adv, shift = [[-0.7, 0.1]], [1.0], [[1.5, 2.0]]
    conv = Convention(kl_importance_weight=True, kl_value_clamp=1.5, kl_value_clamp_scope="weighted")
    v = dataclasses.replace(NONE, kl_coef=0.5, kl_estimator="k3")
    loss, _ = expected_policy_loss(case_of(rows, adv, ref_shift=shift), v, conv)
    weighted = [k3(1.5) * math.exp(-0.7), k3(2.0) * math.exp(0.1)]
    assert k3(1.5) > 1.5 and weighted[0] < 1.5 < weighted[1]
    want = -(math.exp(-0.7) + math.exp(0.1)) / 2 + 0.5 * (weighted[0] + 1.5) / 2
    assert float(loss) == pytest.approx(want, rel=1e-14, abs=0.0)
    # scope "k3" (the default): k3 clamped first, then weighted, never clamped after (1.5 e^0.1 > 1.5)
    loss, _ = expected_policy_loss(case_of(rows, adv, ref_shift=shift), v,
                                   dataclasses.replace(conv, kl_value_clamp_scope="k3"))
    want = -(math.exp(-0.7) + math.exp(0.1)) / 2 + 0.5 * 1.5 * (math.exp(-0.7) + math.exp(0.1)) / 2
    assert float(loss) == pytest.approx(want, rel=1e-14, abs=0.0)
    # k1 = logp - ref may be negative: -2 e^0.1 = -2.21 clamped to -1.5 (the clamp's lower side)
    k1 = dataclasses.replace(v, kl_estimator="k1")
    loss, _ = expected_policy_loss(case_of(rows, adv, ref_shift=shift), k1, conv)
    want = -(math.exp(-0.7) + math.exp(0.1)) / 2 + 0.5 * (-1.5 * math.exp(-0.7) - 1.5) / 2
    assert float(loss) == pytest.approx(want, rel=1e-14, abs=0.0)


def test_float32_constants_do_not_follow_the_default_dtype():
    """Under a float64 default dtype the float32 roundings stay float32. Kills ``_host32``'s
    ``dtype=torch.float32`` dropped."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert rounded_normalizer(7.0, 3, Convention(normalizer_rounding="float32_per_micro_batch")) == \
            openrlhf(7)
    finally:
        torch.set_default_dtype(default)


def test_kl_terms_built_here_follow_the_cases_device():
    """The KL terms ``expected.py`` builds itself (a value clamp, the importance-weighted KL) under a
    meta default device. Kills the dropped ``device=`` of ``_kl_tokens``'s and
    ``_importance_weighted_kl``'s zeros."""
    case = case_of(ROWS, ADV, ref_shift=SHIFT, parts=PARTS)
    v = dataclasses.replace(NONE, kl_coef=0.5, kl_estimator="k3")
    for conv in (Convention(kl_value_clamp=0.25), Convention(kl_importance_weight=True)):
        plain = expected_policy_loss(case, v, conv)
        with torch.device("meta"):
            loss, grad = expected_policy_loss(case, v, conv)
        assert torch.equal(loss, plain[0]) and torch.equal(grad, plain[1])


def test_expected_token_logprobs_and_their_gradient_in_closed_form():
    """Logits (0, log 3) and (log 2, 0, -inf): log p of token 1 is log(3/4), of token 0 log(2/3); the
    gradient of sum w log p_token in the logits is w (onehot - softmax), 0 at the -inf logit."""
    logits = torch.tensor([[0.0, math.log(3.0), -math.inf], [math.log(2.0), 0.0, -math.inf]],
                          dtype=torch.float64)
    case = LogprobCase("logprobs", 0, logits, torch.tensor([1, 0]), torch.tensor([0.5, -2.0]))
    out, grad = expected_token_logprobs(case)
    assert out.dtype == torch.float64
    assert out.tolist() == pytest.approx([math.log(0.75), math.log(2 / 3)], rel=1e-15, abs=0.0)
    want = [[0.5 * -0.25, 0.5 * 0.25, 0.0], [-2.0 * (1 / 3), -2.0 * (-1 / 3), 0.0]]
    for row, want_row in zip(grad.tolist(), want, strict=True):
        assert row == pytest.approx(want_row, rel=1e-14, abs=1e-16)


def test_expected_token_logprobs_of_the_kits_three_dimensional_logits():
    """The kit's logit cases are ``[N, T, V]`` (``cases.logprob_cases``): rows (0, log 3, log 4) and
    (log 2, 0, log 5) of one sequence, softmax (1, 3, 4) / 8 and (2, 1, 5) / 8, tokens 2 and 0: log p
    = log(1/2), log(1/4), out ``[1, 2]``; the gradient w (onehot - softmax). Kills in
    ``expected_token_logprobs`` (fifth pass, mutmut_14, 16, 19, 21) each ``-1`` dimension changed to
    ``+1`` (the softmax over T, the gather along T, the tokens' and the result's unit dimension), which
    2-D logits cannot tell apart."""
    logits = torch.tensor([[[0.0, math.log(3.0), math.log(4.0)], [math.log(2.0), 0.0, math.log(5.0)]]],
                          dtype=torch.float64)
    case = LogprobCase("logprobs", 0, logits, torch.tensor([[2, 0]]),
                       torch.tensor([[0.5, -2.0]], dtype=torch.float64))
    out, grad = expected_token_logprobs(case)
    assert out.shape == (1, 2) and grad.shape == (1, 2, 3)
    assert out.tolist() == [[pytest.approx(math.log(0.5), rel=1e-15, abs=0.0),
                             pytest.approx(math.log(0.25), rel=1e-15, abs=0.0)]]
    want = [[0.5 * -1 / 8, 0.5 * -3 / 8, 0.5 * 4 / 8], [-2.0 * 6 / 8, -2.0 * -1 / 8, -2.0 * -5 / 8]]
    for row, want_row in zip(grad[0].tolist(), want, strict=True):
        assert row == pytest.approx(want_row, rel=1e-14, abs=1e-16)


@pytest.mark.parametrize("flags", [{"kl_k3_form": "naive"}, {"kl_log_ratio_max": 0.5},
                                   {"kl_compute_dtype": "float32"}])
def test_the_policy_losss_kl_term_applies_every_kl_flag(flags):
    """A policy loss with a k3 term (advantages 0: the KL term alone) under each KL flag that needs the
    KL built here: its value is the token mean of ``expected_kl`` under the same flag (log r = 1e-9,
    where the naive form keeps only rounding; 0.75 past the max 0.5; float32 log-probs). Kills each
    flag dropped from ``convention_loss``'s ``clamps_kl`` (the spec's KL would be used instead)."""
    shift = [[1e-9, 1e-9, 1e-9]] if "kl_k3_form" in flags else [[1e-9, 0.75, -0.3]]
    case = case_of([[0.1, -0.2, 0.3]], [0.0], ref_shift=shift)
    # log-probs near -1000: float32 rounds each by up to 3e-5, far past float32 exp's last place
    case = dataclasses.replace(case, logp=case.logp - 1000.0, old_logp=case.old_logp - 1000.0,
                               ref_logp=case.ref_logp - 1000.0)
    v = dataclasses.replace(NONE, kl_coef=1.0, kl_estimator="k3")
    conv = Convention(**flags)
    loss, _ = expected_policy_loss(case, v, conv)
    kl_case = KLCase("kl", 0, case.logp[0], case.ref_logp[0])
    tokens, _ = expected_kl(kl_case, "k3", conv)
    plain, _ = expected_kl(kl_case, "k3", Convention())
    assert float(loss) == pytest.approx(float(tokens.sum()) / 3, rel=1e-15, abs=0.0)
    assert abs(float(tokens.sum()) - float(plain.sum())) > 1e-6 * float(plain.sum())  # the flag matters
