"""Contract details of issue 13's loss and advantage options that their first mutation run showed
untested: full error messages (errors name the argument), the float64 / dtype contracts, and the
one-kept-row edge of the upweighted denominator (tools/mutation.py --only, docs/mutation.md)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from refimpl.advantages import dynamic_sampling_weights, oversampled_advantages
from refimpl.losses import get_preset, loss_normalizer, policy_loss, upweighted_normalizer


def _mask(lengths: list[int], width: int = 4) -> torch.Tensor:
    return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]


@pytest.mark.parametrize("preset", ["dapo", "grpo"])
def test_upweighted_normalizer_with_one_kept_row(preset):
    # three non-empty rows, one kept: f = 2/3, so the denominator is D / 3 exactly (float64)
    variant = get_preset(preset)
    mask = _mask([3, 2, 4])
    keep = torch.tensor([False, True, False])
    got = upweighted_normalizer(mask, variant, keep)
    total = float(loss_normalizer(mask, variant))
    assert got.dtype == torch.float64
    assert float(got) == total / 3  # 9/3 tokens under token_mean, 3/3 sequences otherwise
    # a single non-empty row that is kept: f = 0, the denominator is unchanged
    single = _mask([0, 2, 0])
    assert float(upweighted_normalizer(single, variant, keep)) == float(loss_normalizer(single, variant))


def test_upweighted_normalizer_is_float64_where_the_quotient_is_not_an_integer():
    # token_mean: (1 - f) * 7 tokens with f = 1/3 is 14/3, not representable in float32
    mask = _mask([3, 2, 2])
    got = upweighted_normalizer(mask, get_preset("dapo"), torch.tensor([True, True, False]))
    assert got.dtype == torch.float64 and float(got) == 7 * 2 / 3


def test_dynamic_sampling_weights_dtype_follows_rewards():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    group_ids = torch.tensor([0, 0, 1, 1])
    weights = dynamic_sampling_weights(rewards, group_ids)
    assert weights.dtype == torch.float64
    assert weights.tolist() == [2.0, 2.0, 0.0, 0.0]  # f = 1/2: the kept group counts twice
    assert dynamic_sampling_weights(rewards.float(), group_ids).dtype == torch.float32


def test_seq_sqrt_token_mean_without_group_size_names_the_field():
    variant = dataclasses.replace(get_preset("grpo"), aggregation="seq_sqrt_token_mean", group_size=None)
    logp = torch.zeros(2, 3, requires_grad=True)
    message = ("variant.group_size (G) is required by aggregation 'seq_sqrt_token_mean'; "
               "use dataclasses.replace(variant, group_size=...)")
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        policy_loss(logp, logp.detach(), torch.ones(2), _mask([3, 2], 3), variant)


def test_sequence_kl_scale_with_a_token_normalizer_is_refused_in_full():
    variant = dataclasses.replace(get_preset("dapo"), kl_coef=0.1, kl_scale="sequence")
    logp = torch.zeros(2, 3, requires_grad=True)
    message = ("normalizer: variant.kl_scale='sequence' averages the KL over sequences, and a token_mean "
               "normalizer (a token count) does not give the batch's number of sequences; call without "
               "normalizer= or use kl_scale='token'")
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        policy_loss(logp, logp.detach(), torch.ones(2), _mask([3, 2], 3), variant,
                    ref_logp=torch.zeros(2, 3), normalizer=torch.tensor(5.0))


def test_oversampled_advantages_errors_in_full():
    rewards = torch.tensor([1.0, 0.0, 1.0])
    group_ids = torch.tensor([0, 0, 0])
    with pytest.raises(TypeError, match=r"^selected must be a bool torch\.Tensor, got dtype torch\.int64$"):
        oversampled_advantages(rewards, group_ids, torch.tensor([1, 0, 1]))
    with pytest.raises(TypeError, match=r"^selected must be a bool torch\.Tensor, got list$"):
        oversampled_advantages(rewards, group_ids, [True, False, True])
    with pytest.raises(ValueError, match=r"^selected must have the shape of rewards \(3,\), got \(2,\)$"):
        oversampled_advantages(rewards, group_ids, torch.tensor([True, False]))
    with pytest.raises(ValueError, match=r"^selected must have the shape of rewards \?, got \(3,\)$"):
        oversampled_advantages([1.0, 0.0, 1.0], group_ids, torch.tensor([True, False, True]))


def test_dynamic_sampling_weights_are_exact_in_float64():
    # a group of three with differing rewards kept, a singleton dropped: N / kept = 4/3, not dyadic,
    # so a float32 intermediate would show
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0], dtype=torch.float64)
    weights = dynamic_sampling_weights(rewards, torch.tensor([0, 0, 0, 1]))
    assert weights.tolist() == [4 / 3, 4 / 3, 4 / 3, 0.0]


def test_oversampled_advantages_device_error_in_full():
    rewards = torch.tensor([1.0, 0.0, 1.0])
    selected = torch.ones(3, dtype=torch.bool, device="meta")
    with pytest.raises(ValueError, match=r"^selected must be on the device of rewards \(cpu\), got meta$"):
        oversampled_advantages(rewards, torch.tensor([0, 0, 0]), selected)


def test_group_size_one_is_allowed_and_zero_refused():
    # G = 1 is a positive int (sqrt(1) = 1: the sqrt(G) aggregation is then GRPO's seq_mean_token_mean)
    grpo = get_preset("grpo")
    one = dataclasses.replace(grpo, aggregation="seq_sqrt_token_mean", group_size=1)
    logp = torch.tensor([[-1.0, -0.5, 0.0], [-2.0, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    old = logp.detach() + torch.tensor([[0.1, -0.2, 0.0], [0.3, 0.0, 0.0]], dtype=torch.float64)
    args = (old, torch.tensor([1.0, -0.5], dtype=torch.float64), _mask([3, 1], 3))
    assert float(policy_loss(logp, *args, one)[0]) == float(policy_loss(logp, *args, grpo)[0])
    with pytest.raises(ValueError, match=r"^variant\.group_size must be a positive int or None, got 0$"):
        dataclasses.replace(grpo, aggregation="seq_sqrt_token_mean", group_size=0)
