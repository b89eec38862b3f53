"""refimpl/losses/policy.py: checks that mutation testing (tools/mutation.py) showed missing: the
overflow message in full (its float64 hint only below float64), GMPO's log-space clip without a
lower bound, the gate side of a zero advantage, CISPO's sequence-level log-probability in float32
for half-precision input, and the gspo_token / log_clip message."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from refimpl.losses import CISPO, PPO, PolicyLossVariant, policy_loss

F64 = torch.float64
OVERFLOW = (r"^the loss overflows {} \(a ratio exp\(logp - old_logp\), a KL term from ref_logp / kl, or "
            r"their sum exceeds its range at unmasked positions\){}$")


@pytest.mark.parametrize(("dtype", "log_ratio", "hint"), [(torch.float32, 100.0, "; pass float64 logp"),
                                                          (F64, 1000.0, "")])
def test_overflow_message_in_full_with_the_float64_hint_only_below_float64(dtype, log_ratio, hint):
    # A < 0 keeps the PPO gate open above 1 - eps_low, so the ratio exp(log_ratio) itself overflows
    logp, old = torch.tensor([[log_ratio]], dtype=dtype), torch.zeros(1, 1, dtype=dtype)
    message = OVERFLOW.format(str(dtype).replace(".", r"\."), hint.replace(".", r"\."))
    with pytest.raises(ValueError, match=message):
        policy_loss(logp, old, torch.tensor([-1.0], dtype=dtype), torch.ones(1, 1, dtype=torch.bool), PPO)


def test_log_clip_without_a_lower_bound_leaves_negative_advantages_unclipped():
    """md eq. (18) with eps_low = None: max(l, -inf) = l for A <= 0, so the term is exp(l) A; for
    A > 0, min(l, eps_high) with the bound 0.2 in float64 (not rounded through float32)."""
    variant = dataclasses.replace(PPO, gate="log_clip", eps_low=None, eps_high=0.2)
    logp = torch.tensor([[-3.0, 0.5], [1.0, 0.0]], dtype=F64)
    mask = torch.tensor([[True, True], [True, False]])
    loss, _ = policy_loss(logp, torch.zeros(2, 2, dtype=F64), torch.tensor([-1.0, 1.0], dtype=F64), mask,
                          variant)
    # token mean of -(exp(l) A) = (e^-3 + e^0.5 - e^0.2) / 3: a few roundings (float64 eps 2.2e-16,
    # no cancellation: e^-3 + e^0.5 - e^0.2 = 0.48); float32(0.2) would change e^0.2 by 3e-9
    assert float(loss) == pytest.approx(
        (math.exp(-3.0) + math.exp(0.5) - math.exp(0.2)) / 3, rel=1e-15, abs=0.0
    )


def test_tau_neg_is_required():
    with pytest.raises(ValueError, match=r"^variant.tau_neg must be a finite real number, got None$"):
        dataclasses.replace(PPO, tau_neg=None)


@pytest.mark.parametrize("advantages", [torch.tensor([0.0], dtype=F64), torch.tensor([[0.0]], dtype=F64)])
@pytest.mark.parametrize(("ratio", "closed"), [(0.5, 1.0), (1.5, 0.0)])
def test_a_zero_advantage_takes_the_negative_side_of_the_gate(advantages, ratio, closed):
    """The gate's sign test is A > 0 (md eq. (6)); A = 0 is on the A <= 0 side, whose PPO gate is
    open for r >= 1 - eps_low: r = 0.5 counts as clipped, r = 1.5 (above 1 + eps_high) does not."""
    logp = torch.tensor([[math.log(ratio)]], dtype=F64)
    loss, metrics = policy_loss(logp, torch.zeros(1, 1, dtype=F64), advantages,
                                torch.ones(1, 1, dtype=torch.bool), PPO)
    assert float(loss) == 0.0 and float(metrics["clip_fraction"]) == closed


def test_cispo_sequence_mean_log_probability_is_summed_in_float32_for_half_input():
    """The compute dtype is promote_types(logp.dtype, float32) (policy_losses.md): float16 logp
    -1000 and -0.25 sum to -1000.25 in float32, which float16 would round to -1000."""
    variant = dataclasses.replace(CISPO, ratio="sequence_mean")
    logp = torch.tensor([[-1000.0, -0.25]], dtype=torch.float16)
    loss, _ = policy_loss(logp, logp, torch.tensor([1.0], dtype=torch.float16),
                          torch.ones(1, 2, dtype=torch.bool), variant)
    # ratio 1: the loss is -(mean log-prob) * A = 500.125 per sequence, token-mean copies of it
    assert loss.dtype == torch.float32 and float(loss) == 500.125


def test_log_clip_with_the_gspo_token_ratio_message_in_full():
    message = (r"^variant.gate='log_clip' clips token log-ratios before the ratio level; it needs ratio "
               r"'token', 'sequence_mean' or 'sequence_product', got 'gspo_token'$")
    with pytest.raises(ValueError, match=message):
        PolicyLossVariant(ratio="gspo_token", gate="log_clip", eps_low=0.2, eps_high=0.2,
                          aggregation="token_mean")
