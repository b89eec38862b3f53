"""PPO-RLHF's pieces (refimpl.lm.rlhf): the KL-shaped token reward by hand, and masked whitening
against the moments of the counted entries and across simulated ranks."""

import pytest
import torch

from refimpl.lm.rlhf import kl_shaped_token_rewards, masked_whiten


def test_kl_shaped_token_rewards_by_hand():
    """Ouyang et al. 2022, eq. (2); Shao et al. 2024, eq. (2): r_t = -beta (logp_t - ref_t) on counted tokens,
    + R at t = L - 1. Dyadic
    values, so float64 arithmetic is exact and the comparison is equality."""
    logp = torch.tensor([[-0.5, -1.0, -0.25], [-2.0, -0.5, -1.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.0, -1.0, -0.75], [-1.0, -0.5, -3.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)  # lengths 2 and 3
    rewards = torch.tensor([1.0, 0.5], dtype=torch.float64)
    lengths = torch.tensor([2, 3])
    out, last = kl_shaped_token_rewards(rewards, lengths, logp, ref, mask, kl_coef=0.25)
    expected = torch.tensor(
        [
            [-0.25 * 0.5, -0.25 * 0.0 + 1.0, 0.0],
            [-0.25 * -1.0, -0.25 * 0.0, -0.25 * 2.0 + 0.5],
        ],
        dtype=torch.float64,
    )
    assert torch.equal(out, expected)
    assert last.tolist() == [[False, True, False], [False, False, True]]
    with pytest.raises(ValueError, match="rewards, lengths"):
        kl_shaped_token_rewards(rewards[:1], lengths, logp, ref, mask, 0.25)


def test_masked_whiten_uses_only_counted_entries():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, generator=g, dtype=torch.float64) * 3 + 2
    mask = (torch.rand(5, 7, generator=g) < 0.6).to(torch.float64)
    out = masked_whiten(x, mask, eps=0.0)
    counted = x[mask.bool()]
    expected = (counted - counted.mean()) / counted.std(unbiased=False)  # population std
    # float64, ~35 entries, a few operations each: 1e-12 is ~1e4 unit roundoffs
    torch.testing.assert_close(out[mask.bool()], expected, rtol=0, atol=1e-12)
    assert torch.all(out[~mask.bool()] == 0)


def test_masked_whiten_across_ranks_equals_whitening_the_whole_batch():
    """Two 'ranks' whose moments are summed (the all-reduce) whiten as the concatenated batch."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 4, generator=g, dtype=torch.float64)
    mask = (torch.rand(6, 4, generator=g) < 0.7).to(torch.float64)
    halves = [(x[:3], mask[:3]), (x[3:], mask[3:])]

    def moments(xi, mi):
        return torch.stack([mi.sum(), (xi * mi).sum(), (xi.square() * mi).sum()])

    total = moments(*halves[0]) + moments(*halves[1])
    parts = [masked_whiten(xi, mi, all_reduce_sum=lambda _: total) for xi, mi in halves]
    torch.testing.assert_close(torch.cat(parts), masked_whiten(x, mask), rtol=0, atol=1e-12)
    alone = masked_whiten(*halves[0])  # without the all-reduce each rank would whiten differently
    assert (alone - parts[0]).abs().max() > 1e-3
