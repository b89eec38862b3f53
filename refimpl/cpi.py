"""Conservative policy iteration for tabular policies (torch).

spec: specs/trust_region.md section 5; Kakade & Langford 2002; Schulman et al. 2015, eq. (5)-(6).

One CPI iteration, given (estimated) advantages ``A_hat [S, A]`` of the current policy pi and
(estimated) normalised state occupancy ``d [S]``:

1. greedy improvement (Kakade & Langford 2002; trust_region.md eq. (15)): ``pi'(.|s)`` puts all mass on
``argmax_a A_hat(s, a)``;
2. bound parameters (Schulman et al. 2015, eq. (6); Kakade & Langford 2002; trust_region.md eq. (16)-(17)):
   ``g = sum_s d(s) sum_a pi'(a|s) A_hat(s, a) / (1 - gamma)``,
   ``eps = max_s |sum_a pi'(a|s) A_hat(s, a)|``;
3. step size (Kakade & Langford 2002; trust_region.md eq. (16)-(17)): ``alpha = min(1, (1 - gamma)^2 g / (4
   gamma eps))``, ``alpha = 0`` when
   ``g <= 0`` (no guaranteed improvement: CPI stops);
4. mixture update (Kakade & Langford 2002; Schulman et al. 2015, eq. (5)): ``pi_new = (1 - alpha) pi + alpha
pi'``.

With exact A and d, ``J(pi_new) - J(pi) >= alpha g - 2 gamma eps alpha^2 / (1 - gamma)^2``
(Kakade & Langford 2002, Theorem 4.1; Schulman et al. 2015, eq. (6)), the quantity
:func:`cpi_improvement_bound` returns.

Shapes: policies and advantages ``[S, A]``, state weights ``[S]``; all on one device; computed in
``promote_types(dtype, float32)``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from refimpl._checks import as_real, check_discount, check_float_tensor, check_rows_stochastic

__all__ = [
    "greedy_policy",
    "cpi_bound_parameters",
    "cpi_step_size",
    "cpi_improvement_bound",
    "mixture_policy",
    "CPIStep",
    "cpi_step",
]

_CPI_GAMMA = "the CPI bound has (1 - gamma) in a denominator"
_ROW_SUM_ATOL = 1e-6


def _check_policy(policy, name: str) -> None:
    check_float_tensor(policy, name, ndim=2)
    check_rows_stochastic(policy, name, _ROW_SUM_ATOL)


def _dtype(*tensors: torch.Tensor) -> torch.dtype:
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def greedy_policy(advantages: torch.Tensor) -> torch.Tensor:
    """Deterministic ``[S, A]`` policy maximising ``sum_a pi'(a|s) A_hat(s, a)`` in every state.

    spec: trust_region.md eq. (15); Kakade & Langford 2002: the maximiser over all policies of the
    importance-weighted surrogate ``E_{a ~ pi}[pi'(a|s) / pi(a|s) A_hat(s, a)]`` is greedy in
    ``A_hat``. Ties go to the lowest action index (deterministic). Returns a one-hot tensor.
    """
    check_float_tensor(advantages, "advantages", ndim=2)
    best = advantages.argmax(dim=-1)  # first maximal index on ties
    return torch.nn.functional.one_hot(best, advantages.shape[-1]).to(_dtype(advantages))


def cpi_bound_parameters(
    target_policy: torch.Tensor, advantages: torch.Tensor, state_weights: torch.Tensor, gamma: float
) -> tuple[float, float]:
    """``(g, eps)`` of Schulman et al. 2015, eq. (6) / step 3 of (63) (spec: trust_region.md eq. (16)).

    ``g = sum_s d(s) sum_a pi'(a|s) A(s, a) / (1 - gamma)`` (the surrogate gain ``L_pi(pi') - J(pi)``),
    ``eps = max_s |sum_a pi'(a|s) A(s, a)|`` over the *target* policy pi' (the erratum of errata.md entry 1
    uses
    the mixture, which is alpha times smaller and breaks the bound).

    Args:
        target_policy: ``[S, A]`` pi'. advantages: ``[S, A]`` (estimated) ``A_pi``.
        state_weights: ``[S]`` (estimated) normalised occupancy ``d_pi``. gamma: in [0, 1).
    """
    _check_policy(target_policy, "target_policy")
    check_float_tensor(advantages, "advantages", ndim=2)
    check_float_tensor(state_weights, "state_weights", ndim=1)
    check_rows_stochastic(state_weights, "state_weights", _ROW_SUM_ATOL)
    gamma = check_discount(gamma, allow_one=False, why=_CPI_GAMMA)
    if advantages.shape != target_policy.shape:
        raise ValueError(f"advantages must have the policy's shape {tuple(target_policy.shape)}, "
                         f"got {tuple(advantages.shape)}")
    if state_weights.shape != (target_policy.shape[0],):
        raise ValueError(f"state_weights must have shape [S] = ({target_policy.shape[0]},), "
                         f"got {tuple(state_weights.shape)}")
    dtype = _dtype(target_policy, advantages, state_weights)
    per_state = (target_policy.to(dtype) * advantages.to(dtype)).sum(dim=-1)
    g = float((state_weights.to(dtype) * per_state).sum()) / (1.0 - gamma)
    eps = float(per_state.abs().max())
    return g, eps


def cpi_step_size(g: float, eps: float, gamma: float) -> float:
    """``alpha = min(1, (1 - gamma)^2 g / (4 gamma eps))`` (spec: trust_region.md eq. (17);
    Kakade & Langford 2002), the maximiser over [0, 1] of the bound, trust_region.md eq. (14).

    ``g <= 0`` gives 0 (no guaranteed improvement). ``gamma = 0`` or ``eps = 0`` (with ``g > 0``)
    give 1: the penalty term of eq. (14) vanishes.
    """
    gamma = check_discount(gamma, allow_one=False, why=_CPI_GAMMA)
    values = []
    for value, name in ((g, "g"), (eps, "eps")):
        number = as_real(value)
        if number is None or not math.isfinite(number):
            raise ValueError(f"{name} must be a finite real number, got {value!r}")
        values.append(number)
    g, eps = values
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    if g <= 0.0:
        return 0.0
    if gamma == 0.0 or eps == 0.0:
        return 1.0
    # g / eps first: 4 gamma eps underflows to 0 where eps is subnormal (g = eps = 1e-323, gamma = 0.05)
    return min(1.0, (1.0 - gamma) ** 2 * (g / eps) / (4.0 * gamma))


def cpi_improvement_bound(g: float, eps: float, alpha: float, gamma: float) -> float:
    """Right side of Kakade & Langford 2002, Theorem 4.1; Schulman et al. 2015, eq. (6): ``alpha g - 2 gamma
    eps alpha^2 / (1 - gamma)^2``
    (spec: trust_region.md eq. (14)), a lower bound on ``J(pi_alpha) - J(pi)`` for exact g, eps."""
    gamma = check_discount(gamma, allow_one=False, why=_CPI_GAMMA)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha!r}")
    return alpha * g - 2.0 * gamma * eps * alpha**2 / (1.0 - gamma) ** 2


def mixture_policy(policy: torch.Tensor, target_policy: torch.Tensor, alpha: float) -> torch.Tensor:
    """``(1 - alpha) pi + alpha pi'`` (spec: trust_region.md eq. (13); Kakade & Langford 2002;
    Schulman et al. 2015, eq. (5))."""
    _check_policy(policy, "policy")
    _check_policy(target_policy, "target_policy")
    if policy.shape != target_policy.shape:
        raise ValueError(f"policy and target_policy must have the same shape, got {tuple(policy.shape)} "
                         f"and {tuple(target_policy.shape)}")
    if policy.device != target_policy.device:
        raise ValueError(f"policy and target_policy must be on one device, got {policy.device} "
                         f"and {target_policy.device}")
    if as_real(alpha) is None or not 0.0 <= as_real(alpha) <= 1.0:
        raise ValueError(f"alpha must be a real number in [0, 1], got {alpha!r}")
    alpha = as_real(alpha)
    dtype = _dtype(policy, target_policy)
    return (1.0 - alpha) * policy.to(dtype) + alpha * target_policy.to(dtype)


class CPIStep(NamedTuple):
    """One CPI iteration: the new policy, the greedy target pi', the step size, the bound
    parameters, the guaranteed improvement (Kakade & Langford 2002, Theorem 4.1; Schulman et al. 2015, eq. (6)
    at alpha) and whether CPI stopped (g <= 0:
    the policy is returned unchanged)."""

    policy: torch.Tensor
    target_policy: torch.Tensor
    alpha: float
    g: float
    eps: float
    improvement_bound: float
    stopped: bool


def cpi_step(
    policy: torch.Tensor,
    advantages: torch.Tensor,
    state_weights: torch.Tensor,
    gamma: float,
    *,
    min_gain: float = 0.0,
) -> CPIStep:
    """One iteration of conservative policy iteration (spec: trust_region.md section 5;
    Kakade & Langford 2002) from (estimated) advantages ``[S, A]`` and normalised occupancy
    ``[S]`` of ``policy``. Stops cleanly (``stopped=True``, alpha 0, policy unchanged) when
    ``g <= min_gain``. The default 0 is trust_region.md eq. (17) as written; with floating-point advantages of
    an
    optimal policy, g is rounding noise of either sign, so a caller that wants CPI to stop there
    passes a ``min_gain`` at the rounding level of its values (e.g. ``1e-12 max|V| / (1 - gamma)``).
    """
    _check_policy(policy, "policy")
    check_float_tensor(advantages, "advantages", ndim=2)
    if advantages.shape != policy.shape:
        raise ValueError(f"advantages must have the policy's shape {tuple(policy.shape)}, "
                         f"got {tuple(advantages.shape)}")
    target = greedy_policy(advantages)
    g, eps = cpi_bound_parameters(target, advantages, state_weights, gamma)
    if as_real(min_gain) is None or not as_real(min_gain) >= 0.0:
        raise ValueError(f"min_gain must be a real number >= 0, got {min_gain!r}")
    min_gain = as_real(min_gain)
    alpha = cpi_step_size(g, eps, gamma) if g > min_gain else 0.0
    if alpha == 0.0:
        return CPIStep(policy.to(_dtype(policy)).clone(), target, 0.0, g, eps, 0.0, True)
    new_policy = mixture_policy(policy, target, alpha)
    return CPIStep(new_policy, target, alpha, g, eps, cpi_improvement_bound(g, eps, alpha, gamma), False)
