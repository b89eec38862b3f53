"""The KL term of ``refimpl.conformance.expected.convention_loss`` pinned (issue 31): when it is
there at all (``kl_coef > 0`` with reference log-probs), a KL log-ratio clamp alone, and CISPO's
importance-weighted KL seeing the clamped ratio."""

from __future__ import annotations

import dataclasses
import math

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
