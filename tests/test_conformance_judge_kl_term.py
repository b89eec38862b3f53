"""The KL term of ``refimpl.conformance.expected.convention_loss`` pinned (issue 31): when it is
there at all (``kl_coef > 0`` with reference log-probs), a KL log-ratio clamp alone, and CISPO's
importance-weighted KL seeing the clamped ratio."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from refimpl.conformance.case_types import PolicyLossCase
from refimpl.conformance.conventions import Convention
from refimpl.conformance.expected import expected_policy_loss
from refimpl.losses import get_preset

PPO = get_preset("ppo")  # token_mean
KL = dataclasses.replace(PPO, kl_coef=0.1, kl_estimator="k3")


def _case(logp, old, ref, adv):
    t = lambda xs: torch.tensor([xs], dtype=torch.float64)  # noqa: E731
    return PolicyLossCase("kl", 0, t(logp), t(old), torch.tensor(adv, dtype=torch.float64),
                          torch.ones(1, len(logp), dtype=torch.bool), torch.tensor(adv, dtype=torch.float64),
                          torch.tensor([0]), ref_logp=t(ref))


def test_no_kl_term_without_a_kl_coefficient_even_beside_an_infinite_estimate():
    """``convention_loss`` mutmut_4 / 130 / 132: with ``kl_coef`` 0 the reference log-probs are not read
    (a k3 estimate that overflows to inf, log r = 800, would make 0 * inf = NaN), in either aggregation
    of the KL term."""
    case = _case([-1.0, -2.0], [-1.0, -2.0], [799.0, -2.0], [0.5])
    plain = dataclasses.replace(case, ref_logp=None)
    for conv in (Convention(), Convention(kl_aggregation="token_mean")):
        loss, grad = expected_policy_loss(case, PPO, conv)
        want_loss, want_grad = expected_policy_loss(plain, PPO, conv)
        assert float(loss) == float(want_loss) == -0.5 and torch.equal(grad, want_grad)


def test_a_kl_log_ratio_clamp_alone_clamps_the_k3_estimate():
    """``convention_loss`` mutmut_120: ``kl_log_ratio_clamp`` with no other KL flag, on float64 inputs
    whose ratio nothing rounds: k3 of log r = ref - logp clamped to [-1, 1], exp(lr) - 1 - lr, token-mean
    with coefficient 0.1, beside the policy term (ratio 1: -A)."""
    case = _case([-1.0, -2.0], [-1.0, -2.0], [4.0, -1.9], [0.5])
    loss, _ = expected_policy_loss(case, KL, Convention(kl_log_ratio_clamp=1.0))
    k3 = [math.exp(lr) - 1.0 - lr for lr in (1.0, 0.1)]
    assert math.isclose(float(loss), -0.5 + 0.1 * sum(k3) / 2, rel_tol=1e-14)
    unclamped, _ = expected_policy_loss(case, KL, Convention())
    assert math.isclose(float(unclamped), -0.5 + 0.1 * (math.exp(5.0) - 6.0 + k3[1]) / 2, rel_tol=1e-14)


def test_cispos_importance_weighted_kl_sees_the_clamped_ratio():
    """``convention_loss`` mutmut_146: under CISPO the log-ratio clamp acts inside the weights, the
    importance weight of the KL term included: log r = 3 clamped to 1 weighs k3(0.5) by e, not e^3
    (the term: 0.1 * mean(w * k3(ref - logp)), beside CISPO's own term with kl_coef 0)."""
    cispo = dataclasses.replace(get_preset("cispo"), kl_coef=0.1, kl_estimator="k3")
    case = _case([-1.0, -2.0], [-4.0, -2.0], [-0.5, -1.8], [0.5])
    conv = Convention(kl_importance_weight=True, log_ratio_clamp=1.0)
    loss, _ = expected_policy_loss(case, cispo, conv)
    policy, _ = expected_policy_loss(case, dataclasses.replace(cispo, kl_coef=0.0), conv)
    k3 = [math.exp(lr) - 1.0 - lr for lr in (0.5, 0.2)]
    assert math.isclose(float(loss - policy), 0.1 * (math.e * k3[0] + k3[1]) / 2, rel_tol=1e-12)


# SkyRL's KL loss (kl_aggregation="row_mean_all_rows"): rows of 1, 3, 0 and 2 tokens whose k1 values
# (logp - ref_logp) are [1], [1, 2, 3], [] and [4, 4]: row means 1, 2, 0 (the empty row) and 4, dyadic
# sums, so every aggregation below is one or two float64 roundings from its fraction.
_K1_ROWS = [[1.0], [1.0, 2.0, 3.0], [], [4.0, 4.0]]
_NONE = dataclasses.replace(PPO, gate="none", eps_low=None, eps_high=None, kl_coef=0.5, kl_estimator="k1")


def _k1_case(parts=None):
    """Advantages 0 (the policy term is 0: gate none, -A r), ratios 1; padding holds junk (logp 3,
    ref_logp -7) that no aggregation may read."""
    logp = torch.full((4, 3), 3.0, dtype=torch.float64)
    ref = torch.full_like(logp, -7.0)
    mask = torch.zeros_like(logp, dtype=torch.bool)
    for i, row in enumerate(_K1_ROWS):
        for t, k1 in enumerate(row):
            logp[i, t], ref[i, t], mask[i, t] = -1.0 - t, -1.0 - t - k1, True
    zeros = torch.zeros(4, dtype=torch.float64)
    return PolicyLossCase("kl", 0, logp, logp.clone(), zeros, mask, zeros, torch.arange(4), ref_logp=ref,
                          micro_batches=parts)


def test_the_row_mean_over_every_row_is_apart_from_every_other_kl_aggregation():
    """0.5 * (1 + 2 + 0 + 4) / 4 whatever the policy's aggregation; "token_mean" takes 0.5 * 15 / 6 and
    "policy" the variant's own: 15 / 6 (token_mean), 7 / 3 (seq_mean_token_mean over the 3 non-empty
    rows, eq. (11)), 15 / (3 * 4) (seq_sum, L_max 4). Only seq_mean_token_mean with empty_rows="keep"
    coincides with it (SkyRL's sequence_mean). The gradient of k1 is 1 per token: 0.5 / (4 T_i)."""
    case = _k1_case()
    rows = Convention(kl_aggregation="row_mean_all_rows")
    for aggregation, policy in (("token_mean", 15 / 6), ("seq_mean_token_mean", 7 / 3), ("seq_sum", 1.25)):
        v = dataclasses.replace(_NONE, aggregation=aggregation, max_length=4)
        for empty_rows in ("drop", "keep"):
            loss, grad = expected_policy_loss(case, v, dataclasses.replace(rows, empty_rows=empty_rows))
            assert math.isclose(float(loss), 0.5 * 7 / 4, rel_tol=1e-15)
            want = [0.5 / (4 * len(r)) if t < len(r) else 0.0 for r in _K1_ROWS for t in range(3)]
            assert grad.flatten().tolist() == pytest.approx(want, rel=1e-15, abs=0.0)
        spec = float(expected_policy_loss(case, v, Convention())[0])
        assert math.isclose(spec, 0.5 * policy, rel_tol=1e-15)
        token_mean = Convention(kl_aggregation="token_mean")
        assert math.isclose(float(expected_policy_loss(case, v, token_mean)[0]), 0.5 * 15 / 6, rel_tol=1e-15)
    keep = Convention(empty_rows="keep")
    v = dataclasses.replace(_NONE, aggregation="seq_mean_token_mean")
    assert math.isclose(float(expected_policy_loss(case, v, keep)[0]), 0.5 * 7 / 4, rel_tol=1e-15)


@pytest.mark.parametrize(("micro_batch", "want"), [
    ("global", 7 / 4),             # skyrl 0.4.0: each micro-batch's row mean weighed by its share of the rows
    ("local_sum", 7 / 4),          # a KL term apart divides by the step's count (as token_mean's)
    ("local_mean", (1 + 6 / 3) / 2),  # SkyRL-train 0.3.1: row means of 1 and 3 rows, / accumulation steps
])
def test_the_row_mean_over_micro_batches(micro_batch, want):
    """Micro-batches of 1 and 3 rows (the empty one in the second)."""
    case = _k1_case(parts=((0,), (1, 2, 3)))
    conv = Convention(kl_aggregation="row_mean_all_rows", micro_batch=micro_batch)
    loss, _ = expected_policy_loss(case, _NONE, conv)
    assert math.isclose(float(loss), 0.5 * want, rel_tol=1e-15)


def test_the_row_mean_of_a_batch_without_rows_is_zero():
    """No rows: the denominator is 1, not 0 (0 / 0 would be NaN; SkyRL's .mean() gives NaN there: its
    flag zero_rows). A batch of one row divides by 1. Kills ``_row_mean_kl_term``'s ``rows > 0`` changed
    to ``>= 0``, and its default count."""
    from refimpl.conformance.expected import convention_loss

    conv = Convention(kl_aggregation="row_mean_all_rows")
    empty = torch.zeros((0, 3), dtype=torch.float64)
    loss = convention_loss(empty, empty, torch.zeros(0, dtype=torch.float64), empty.bool(), empty, _NONE,
                           conv, 0.0)
    assert float(loss) == 0.0
    case = _k1_case()
    one = convention_loss(case.logp[1:2], case.old_logp[1:2], case.advantages[1:2], case.mask[1:2],
                          case.ref_logp[1:2], _NONE, conv, 3.0)
    assert float(one) == 0.5 * 2.0


def test_the_row_mean_count_is_exact_on_the_cases_device_and_divided_by_the_micro_batches():
    """The count ``(rows, micro_batches)`` divides as given: 2^24 + 1 rows (no float32 number) exactly
    in the KL's dtype, a fractional per-micro-batch count (OpenRLHF's float32(count) / gas form) not
    raised to 1, the micro-batches dividing in float64 after a float32 KL; under a meta default device
    the values stay on the CPU. Kills in ``_row_mean_kl_term``: ``dtype=`` / ``device=`` dropped or None,
    ``rows > 0`` changed to ``> 1``, ``/ micro_batches`` to ``*``, ``.to(float64)`` to ``.to(None)``."""
    from refimpl.conformance.expected import convention_loss

    case = _k1_case()
    conv = Convention(kl_aggregation="row_mean_all_rows")

    def term(convention, count):
        return convention_loss(case.logp, case.old_logp, case.advantages, case.mask, case.ref_logp, _NONE,
                               convention, 3.0, count)

    big = 2.0**24 + 1
    assert math.isclose(float(term(conv, (big, 1))), 0.5 * 7 / big, rel_tol=1e-15)  # 6e-8 off in float32
    assert float(term(conv, (0.5, 2))) == 0.5 * 7 / 0.5 / 2
    with torch.device("meta"):
        on_meta = term(conv, (4.0, 1))
    assert on_meta.device.type == "cpu" and float(on_meta) == 0.5 * 7 / 4
    f32 = Convention(kl_aggregation="row_mean_all_rows", kl_compute_dtype="float32")
    one = term(f32, (4.0, 1))
    assert one.dtype == torch.float64 and float(one) == 0.875
    assert float(term(f32, (4.0, 3))) == 0.875 / 3  # float32(0.875 / 3) is 1.6e-8 relative away


def test_a_float32_token_mean_kl_term_is_divided_by_the_micro_batches_in_float64():
    """``kl_aggregation="token_mean"`` with ``kl_compute_dtype="float32"``: the KL sum 0.5 * 15 over the
    count 6 is 1.25 in float32 (exact), then divided by 3 micro-batches in float64 (1.25 / 3; the
    float32 quotient is 1.6e-8 relative away). Kills ``_token_mean_kl_term``'s ``.to(torch.float64)``
    changed to ``.to(None)`` (fifth pass, mutmut_34), as ``_row_mean_kl_term``'s test above does."""
    from refimpl.conformance.expected import convention_loss

    case = _k1_case()
    conv = Convention(kl_aggregation="token_mean", kl_compute_dtype="float32")
    loss = convention_loss(case.logp, case.old_logp, case.advantages, case.mask, case.ref_logp, _NONE, conv,
                           3.0, (6.0, 3))
    assert loss.dtype == torch.float64 and float(loss) == 1.25 / 3
    assert float(torch.tensor(1.25, dtype=torch.float32) / 3) != 1.25 / 3
