"""Expected group advantages under the flags about tokens and group blocks (``adv_weighting``,
``adv_leave_one_out_unit``, ``adv_trailing_partial``): each reduces to ``expected_group_advantages``
(the spec's ``group_advantages`` with the convention's other flags) on a rearranged batch.

* ``adv_weighting="token"``: the statistics count tokens. A response of T_i tokens is T_i samples of
  reward R_i in its group (its per-token advantages are R_i on every token, as a trainer broadcasts a
  sequence reward), so the expected advantage is the spec's on the batch with each reward repeated
  T_i times: mean_g = sum T_i R_i / sum T_i, the std about it likewise, and with
  ``adv_leave_one_out_unit="token"`` the leave-one-out baseline of a token (sum_g - R_i) / (W_g - 1).
  With ``adv_leave_one_out_unit="response"`` the baseline leaves out the whole response:
  (sum_g - T_i R_i) / (W_g - T_i), the token-weighted mean of the other responses.
* ``adv_output_float32``: the float64 result rounded to float32.
* ``adv_trailing_partial="unnormalised"``: when the groups are contiguous blocks of the first
  block's size G but the last, shorter, one, that last block keeps mean 0 and std 0: R / (0 + eps)
  (R / sqrt(eps) with eps inside the square root), or R with ``adv_scale="none"``.

(This module sits beside ``expected.py``, which holds the other conventions' expected values.)
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .case_types import AdvantageCase
from .conventions import Convention
from .expected import expected_group_advantages

__all__ = ["expected_advantages", "trailing_partial_block"]


def trailing_partial_block(group_ids: torch.Tensor) -> int | None:
    """The index where a trailing partial block starts, when ``group_ids`` are contiguous blocks of
    the first block's size except a shorter last one; None otherwise."""
    ids = group_ids.tolist()
    starts = [i for i in range(len(ids)) if i == 0 or ids[i] != ids[i - 1]]
    blocks = [ids[s] for s in starts]
    if len(starts) < 2 or len(set(blocks)) != len(blocks):
        return None
    sizes = [b - a for a, b in zip(starts, starts[1:] + [len(ids)], strict=True)]
    size = sizes[0]
    if all(s == size for s in sizes[:-1]) and sizes[-1] < size:
        return starts[-1]
    return None


def _token_weighted(case: AdvantageCase, conv: Convention) -> torch.Tensor:
    lengths = case.lengths.to(case.rewards.device)
    if bool((lengths < 1).any()):
        raise ValueError("adv_weighting='token' needs every response to have at least one token")
    if conv.adv_leave_one_out and conv.adv_leave_one_out_unit == "response":
        return _leave_response_out(case, lengths, conv)
    expanded = AdvantageCase(case.case_class, case.index, case.rewards.repeat_interleave(lengths),
                             case.group_ids.repeat_interleave(lengths))
    flat = dataclasses.replace(conv, adv_weighting="response", adv_trailing_partial="group")
    per_token = expected_group_advantages(expanded, flat)
    first = torch.cumsum(lengths, 0) - lengths  # every token of a response has the same advantage
    return per_token[first]


def _leave_response_out(case: AdvantageCase, lengths: torch.Tensor, conv: Convention) -> torch.Tensor:
    """c_i = R_i - (S_g - T_i R_i) / (W_g - T_i) (a singleton group: ``adv_singleton``)."""
    if conv.adv_scale != "none":
        raise ValueError("adv_leave_one_out_unit='response' with adv_weighting='token' is defined for "
                         "adv_scale='none'")
    rewards, weights = case.rewards.double(), lengths.double()
    _, index = torch.unique(case.group_ids, return_inverse=True)
    groups = int(index.max()) + 1
    zeros = torch.zeros(groups, dtype=torch.float64, device=rewards.device)
    total = zeros.clone().index_add_(0, index, weights * rewards)
    count = zeros.clone().index_add_(0, index, weights)
    size = torch.bincount(index, minlength=groups)[index]
    rest = (count[index] - weights).clamp_min(1.0)
    centred = rewards - (total[index] - weights * rewards) / rest
    if conv.adv_singleton == "error" and bool((size == 1).any()):
        raise ValueError("a singleton group has no leave-one-out baseline")
    single = rewards if conv.adv_singleton == "raw" else torch.zeros_like(rewards)
    return torch.where(size == 1, single, centred)


def expected_advantages(case: AdvantageCase, conv: Convention) -> torch.Tensor:
    """The expected advantages ``[N]`` of ``case`` under ``conv`` (module docstring): the spec's
    ``group_advantages`` with every flag of the convention (``adv_output_float32``: rounded to float32
    at the end)."""
    if conv.adv_output_float32:
        inner = dataclasses.replace(conv, adv_output_float32=False)
        return expected_advantages(case, inner).to(torch.float32).double()
    start = trailing_partial_block(case.group_ids)
    if conv.adv_trailing_partial == "unnormalised" and start is not None:
        head = AdvantageCase(case.case_class, case.index, case.rewards[:start], case.group_ids[:start],
                             None if case.lengths is None else case.lengths[:start])
        inner = dataclasses.replace(conv, adv_trailing_partial="group")
        tail = case.rewards[start:].double()
        if conv.adv_scale != "none":  # mean 0, std 0: the epsilon alone divides
            tail = tail / (math.sqrt(conv.adv_eps) if conv.adv_eps_inside_sqrt else conv.adv_eps)
        return torch.cat([expected_advantages(head, inner).double(), tail])
    if conv.adv_weighting == "token" and case.lengths is not None:
        return _token_weighted(case, conv)
    return expected_group_advantages(case, conv)
