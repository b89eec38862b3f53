"""The flag value ``kl_value_clamp_scope="weighted"`` (refimpl/conformance/expected.py; Unsloth's
order, docs/conformance.md): the k3 term is clamped to [-c, c] after the importance weight, not
before it. One token whose k3 is below the clamp and whose weighted k3 is above it tells the two
orders apart, in value and gradient."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from refimpl.conformance import Convention
from refimpl.conformance.case_types import PolicyLossCase
from refimpl.conformance.expected import effective_variant, expected_policy_loss
from refimpl.losses import get_preset

X = 2.6  # log(ref / pi): k3 = e^x - x - 1 = 9.86..., below the clamp 10
LOG_R = 0.1  # log(pi / pi_old): r = 1.105..., inside the clip; k3 * r = 10.9..., above it
BETA = 0.5


def _case():
    t = lambda v: torch.tensor([[v]], dtype=torch.float64)  # noqa: E731
    return PolicyLossCase("kl_scope", 0, t(0.0), t(-LOG_R), torch.tensor([1.0], dtype=torch.float64),
                          torch.tensor([[True]]), torch.tensor([1.0], dtype=torch.float64),
                          torch.tensor([0]), ref_logp=t(X))


@pytest.mark.parametrize("scope", ["k3", "weighted"])
def test_the_clamp_acts_before_or_after_the_weight(scope):
    variant = dataclasses.replace(get_preset("grpo"), kl_coef=BETA, kl_estimator="k3")
    conv = Convention(kl_importance_weight=True, kl_value_clamp=10.0, kl_value_clamp_scope=scope)
    loss, grad = expected_policy_loss(_case(), effective_variant(variant, conv), conv)
    r, k3 = math.exp(LOG_R), math.exp(X) - X - 1
    assert k3 < 10 < k3 * r
    policy = -r  # A = 1 inside the clip: -r A
    kl = 10.0 if scope == "weighted" else k3 * r
    assert loss.item() == pytest.approx(policy + BETA * kl, rel=1e-14, abs=0.0)
    # d/dlogp: -r, plus the KL term's: clamped (weighted) 0, else d(k3(x) r)/dlogp = r (k3 + 1 - e^x)
    kl_grad = 0.0 if scope == "weighted" else r * (k3 + 1 - math.exp(X))
    assert grad.item() == pytest.approx(-r + BETA * kl_grad, rel=1e-12, abs=0.0)
