"""refimpl/advantages.py: checks that mutation testing (tools/mutation.py) showed missing: errors in
full, the documented contract of the zero-denominator helper, devices (the meta device exists on
every build) and overlong_penalty's float32 result whatever the default dtype."""

from __future__ import annotations

import pytest
import torch

from refimpl.advantages import _scaled_quotient, group_advantages, overlong_filter_mask, overlong_penalty

F64 = torch.float64


def test_group_ids_device_and_scale_none_messages_in_full():
    rewards = torch.tensor([1.0, 2.0], dtype=F64)
    with pytest.raises(ValueError, match=r"^group_ids must be on the device of rewards \(cpu\), got meta$"):
        group_advantages(rewards, torch.zeros(2, dtype=torch.long, device="meta"), scale="none",
                         singleton="zero")
    with pytest.raises(ValueError, match=r"^scale='none' divides by nothing; do not pass std, eps$"):
        group_advantages(rewards, torch.zeros(2, dtype=torch.long), scale="none", singleton="zero",
                         std="population", eps=0.0)


def test_scaled_quotient_with_a_zero_denominator_gives_the_numerator():
    """_scaled_quotient's contract: a zero denominator (a zero-variance group with eps = 0) gives the
    numerator, which the caller replaces or rejects; no 0 / 0."""
    numerator = torch.tensor([0.5, -2.0, 0.0], dtype=F64)
    denominator = torch.tensor([0.0, 4.0, 0.0], dtype=F64)
    out = _scaled_quotient(numerator, denominator, torch.ones(3, dtype=F64), 0.0, True)
    assert out.tolist() == [0.5, -0.5, 0.0]


def test_overlong_filter_mask_moves_truncated_to_the_device_of_mask():
    out = overlong_filter_mask(torch.ones(2, 3, device="meta"), torch.tensor([True, False]))
    assert out.device.type == "meta" and out.shape == (2, 3) and out.dtype == torch.float32


def test_overlong_penalty_is_float32_whatever_the_default_dtype():
    # advantages.md eq. (8): lengths 3 (inside), 5 (linear part), 9 (beyond max_len) with L_max 6, L_cache 2
    previous = torch.get_default_dtype()
    torch.set_default_dtype(F64)
    try:
        out = overlong_penalty(torch.tensor([3, 5, 9]), 6, 2)
    finally:
        torch.set_default_dtype(previous)
    assert out.dtype == torch.float32 and out.tolist() == [0.0, -0.5, -1.0]
