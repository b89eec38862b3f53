"""The case classes of the conformance kit: deterministic, small, every edge named.

Each generator returns a list of cases for one *case class* (the name a report shows). Inputs are
built in float64 from a fixed seed (``torch.Generator``), so a case id such as
``"on_boundary/2"`` always denotes the same tensors. Masked positions hold finite junk (the loss
must ignore them), except in ``masked_nonfinite`` (NaN, +inf, -inf there); ratios "exactly on a
boundary" are float64 log-ratios whose ``exp`` equals the
boundary exactly, so an implementation that computes ``exp(logp - old_logp)`` sees the tie.
"""

from __future__ import annotations

import math

import torch

from .case_types import (
    POLICY_CASE_CLASSES,
    AdvantageCase,
    KLCase,
    LogprobCase,
    PolicyLossCase,
    _gen,
    _uniform,
    clip_bounds,
    log_ratio_hitting,
)
from .policy_cases import policy_loss_cases

__all__ = [
    "PolicyLossCase",
    "KLCase",
    "AdvantageCase",
    "LogprobCase",
    "POLICY_CASE_CLASSES",
    "CASE_CLASSES",
    "policy_loss_cases",
    "kl_cases",
    "advantage_cases",
    "logprob_cases",
    "clip_bounds",
    "log_ratio_hitting",
]


# ----------------------------------------------------------------------------------------------
# KL estimator, group advantage and token log-prob cases


def kl_cases(*, seed: int = 0) -> list[KLCase]:
    """Per-token ``(logp, ref_logp)`` pairs by the size of ``log r = ref_logp - logp``."""
    g = _gen(seed + 77)
    logp = _uniform(g, (4, 6), -4.0, -0.05)
    spans = {
        "tiny_log_ratio": 1e-6,
        "small_log_ratio": 1e-2,
        "moderate_log_ratio": 2.0,
        "large_log_ratio": 20.0,
        "extreme_log_ratio": 50.0,
    }
    cases = []
    for name, span in spans.items():
        x = _uniform(g, (4, 6), -span, span)
        x[0, 0], x[0, 1] = span, -span
        cases.append(KLCase(name, 0, logp.clone(), logp + x))
    cases.append(KLCase("zero_log_ratio", 0, logp.clone(), logp.clone()))
    # a token the policy gives probability 0 (logp = -inf: log r = +inf) and one the reference gives 0
    # (ref = -inf: log r = -inf); exp(log r) - log r - 1 is inf - inf = NaN at log r = +inf unless the
    # log-ratio is clamped first (verl's low_var_kl clamps it to [-20, 20]). The expected value is the
    # limit (k3 -> +inf); an estimator that refuses the input with a one-line ValueError passes, named.
    inf_logp, inf_ref = logp.clone(), logp + _uniform(g, (4, 6), -1.0, 1.0)
    inf_logp[0, 0] = inf_logp[1, 2] = -math.inf
    inf_ref[2, 3] = -math.inf
    cases.append(KLCase("infinite_log_ratio", 0, inf_logp, inf_ref))
    return cases


def advantage_cases(*, seed: int = 0) -> list[AdvantageCase]:
    """Groups of unequal sizes (non-contiguous ids), zero-variance and singleton groups, a trailing
    partial group, constant groups on a large offset (one-pass variance)."""
    g = _gen(seed + 91)

    def case(name, index, rewards, ids, lengths=None):
        return AdvantageCase(name, index, torch.tensor(rewards, dtype=torch.float64), torch.tensor(ids),
                             None if lengths is None else torch.tensor(lengths))

    r = [float(v) for v in _uniform(g, (10,), -1.0, 2.0)]
    return [
        case("equal_groups", 0, r[:8], [0, 0, 0, 0, 1, 1, 1, 1]),
        case("unequal_groups", 0, r, [3, 1, 3, 1, 1, 7, 7, 3, 7, 7]),
        case("binary_rewards", 0, [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0], [0, 0, 0, 0, 1, 1, 1, 1]),
        case("zero_variance_group", 0, [0.5, 0.5, 0.5, 1.0, 0.0, 1.0], [0, 0, 0, 1, 1, 1]),
        case("singleton_group", 0, [1.0, 0.0, 1.0, 0.25], [0, 1, 1, 2]),
        case("two_samples", 0, [0.0, 1.0, 3.0, -1.0], [0, 0, 1, 1]),
        # rewards near 1000.1-1000.3: differences of ~0.1 on a large offset, which float32 rounds
        # (ulp(1000) = 6e-5): a float32 mean / variance moves the advantages by ~1e-4
        case("large_offset_rewards", 0, [1000.1, 1000.3, 1000.2, 1000.25, 1000.15, 1000.1],
             [0, 0, 0, 1, 1, 1]),
        # a trailing partial group (10 samples in groups of 4: the last has 2), which a reshape to
        # (-1, group_size) misgroups or rejects
        case("partial_group", 0, r, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]),
        # constant groups on a large offset and a small spread on it: a one-pass variance
        # E[x^2] - E[x]^2 cancels (1e6^2 = 1e12: float64 keeps ~1e-4 of it, float32 nothing) where the
        # two-pass variance of the centred rewards is exact
        case("constant_large_offset", 0,
             [1e6 + 0.1] * 4 + [1e6 + 0.125, 1e6 + 0.375, 1e6 + 0.125, 1e6 + 0.375],
             [0, 0, 0, 0, 1, 1, 1, 1]),
        # responses of unequal lengths in each group (contiguous groups of 4): statistics over responses
        # (the spec) differ from statistics over tokens (a response weighing its length)
        case("ragged_lengths", 0, [1.0, 0.0, 0.0, 1.0, 0.5, 1.0, 0.0, 0.25], [0, 0, 0, 0, 1, 1, 1, 1],
             [3, 1, 2, 5, 4, 1, 2, 6]),
    ]


def logprob_cases(*, seed: int = 0) -> list[LogprobCase]:
    """Logits ``[N, T, V]`` and tokens ``[N, T]``: random, large vocabulary, extreme logits,
    ``-inf`` (masked-vocabulary) entries, half precision."""
    g = _gen(seed + 5)

    def case(name, logits, index=0):
        n, t, v = logits.shape
        tokens = torch.randint(0, v, (n, t), generator=g)
        if name == "masked_vocabulary":  # -inf everywhere except the sampled token and one more
            keep = torch.zeros_like(logits, dtype=torch.bool)
            keep.scatter_(-1, tokens.unsqueeze(-1), True)
            keep[..., 0] = True
            logits = torch.where(keep, logits, torch.full_like(logits, -math.inf))
        weights = _uniform(g, (n, t), -1.0, 1.0)
        return LogprobCase(name, index, logits, tokens, weights)

    base = torch.randn((3, 4, 11), generator=g, dtype=torch.float64)
    return [
        case("random_logits", base * 2.0),
        case("large_vocabulary", torch.randn((2, 3, 4099), generator=g, dtype=torch.float64) * 3.0),
        case("extreme_logits", base * 1e4),
        case("masked_vocabulary", base.clone()),
        case("single_token_vocabulary", torch.randn((2, 3, 1), generator=g, dtype=torch.float64)),
        case("bf16", (base * 2.0).to(torch.bfloat16)),
        case("fp16", (base * 2.0).to(torch.float16)),
    ]


#: the case classes of each kind, in report order (``policy_loss``: those that apply to a variant
#: are chosen by ``policy_loss_cases``)
CASE_CLASSES = {
    "policy_loss": POLICY_CASE_CLASSES,
    "kl": tuple(c.case_class for c in kl_cases()),
    "group_advantages": tuple(c.case_class for c in advantage_cases()),
    "token_logprobs": tuple(c.case_class for c in logprob_cases()),
}
