"""Case class ``ratio_overflow`` for gate ``none`` (f = r A, nothing to close): the overflowing tokens
sit in rows with A = 0, whose exact value and gradient are 0 (policy_losses.md, gate none; §5 Numerics),
while ``A * exp(log r)`` in float32 is ``0 * inf = NaN``; the judge names it under ``ratio_overflow``
(SkyRL's kl_cov and importance_sampling: skyrl_common.py)."""

from __future__ import annotations

import dataclasses
import math

import torch

from refimpl.conformance.conventions import Convention
from refimpl.conformance.edge_cases import ratio_overflows
from refimpl.conformance.expected import expected_policy_loss
from refimpl.conformance.policy_cases import policy_loss_cases
from refimpl.conformance.policy_check import judge_policy
from refimpl.losses import get_preset

NONE = dataclasses.replace(get_preset("ppo"), gate="none", eps_low=None, eps_high=None)


def test_gate_none_overflows_only_where_the_advantage_is_zero_and_the_exact_is_zero():
    cases = policy_loss_cases(NONE, Convention(), classes=("ratio_overflow",))
    assert [c.logp.dtype for c in cases] == [torch.float32, torch.bfloat16, torch.float16]
    for case in cases:
        x = torch.where(case.mask, case.logp.double() - case.old_logp.double(), 0.0)
        big = x > math.log(torch.finfo(case.logp.dtype).max)
        assert bool(big.any()) and ratio_overflows(case, case.logp.dtype)
        assert bool((case.advantages.double().unsqueeze(-1).expand_as(x)[big] == 0).all())
        loss, grad = expected_policy_loss(case, NONE, Convention())
        assert math.isfinite(float(loss)) and bool((grad[big] == 0).all())
        assert bool(torch.isfinite(grad).all()) and float(grad.abs().sum()) > 0  # row 1 (A = 0.5) counts


def test_a_nan_from_zero_times_inf_fails_the_spec_and_is_named_under_its_flag():
    case = policy_loss_cases(NONE, Convention(), classes=("ratio_overflow",))[0]
    logp = case.logp.detach().requires_grad_(True)
    a = case.advantages.unsqueeze(-1)
    per_token = -torch.exp(logp - case.old_logp) * a  # SkyRL's kl_cov / importance_sampling
    loss = torch.where(case.mask, per_token, 0.0).sum() / case.mask.sum()
    (grad,) = torch.autograd.grad(loss, logp)
    assert math.isnan(float(loss.detach()))
    exp_loss, exp_grad = expected_policy_loss(case, NONE, Convention())
    assert judge_policy(case, loss.detach(), grad, exp_loss, exp_grad, NONE, Convention(), 1e-8)[2] is False
    named = Convention(compute_dtype="input", ratio_overflow="nan")
    assert judge_policy(case, loss.detach(), grad, exp_loss, exp_grad, NONE, named, 1e-8)[2:] == (
        True, True, "ratio_overflow='nan'")
