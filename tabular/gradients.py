"""Exact gradients of the tabular softmax policy ``pi_theta(a|s) ∝ exp(theta[s, a])``.

spec: specs/mdp.md section 6, eq. (32)-(37); Sutton et al. 2000, Theorem 1; Kakade 2001. ``theta`` is an ``[S,
A]``
array; flattened parameters use row-major order, index ``s * A + a`` (``theta.reshape(-1)``).
The policy gradient uses the unnormalised occupancy (valid at gamma = 1 for proper policies);
the Fisher matrix uses the NORMALISED occupancy ``d_theta`` (TRPO's average-KL metric,
Schulman et al. 2015, section 4, Appendix C; Kakade 2001).
"""

from __future__ import annotations

import numpy as np

from tabular.evaluation import advantages, q_values, state_occupancy
from tabular.mdp import MDP

__all__ = [
    "softmax_policy",
    "softmax_score",
    "policy_gradient",
    "fisher_matrix",
    "natural_gradient",
    "natural_gradient_closed_form",
    "mean_kl",
]


def _theta(mdp: MDP | None, theta, name: str = "theta") -> np.ndarray:
    try:
        arr = np.asarray(theta, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a numeric array, got {type(theta).__name__}") from exc
    if arr.ndim != 2:
        raise ValueError(f"{name} must have shape [S, A], got {arr.shape}")
    if mdp is not None and arr.shape != (mdp.num_states, mdp.num_actions):
        expected = (mdp.num_states, mdp.num_actions)
        raise ValueError(f"{name} must have shape [S, A] = {expected}, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    return arr


def _log_softmax(theta: np.ndarray) -> np.ndarray:
    z = theta - theta.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def softmax_policy(theta) -> np.ndarray:
    """``pi_theta(a|s) = exp(theta[s, a]) / sum_b exp(theta[s, b])`` (mdp.md eq. (32)); ``[S, A]``."""
    theta = _theta(None, theta)
    z = theta - theta.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def softmax_score(theta) -> np.ndarray:
    """``[S, A, S, A]`` score ``d log pi_theta(a|s) / d theta[s', b] = 1[s'=s] (1[b=a] - pi(b|s))``
    (mdp.md eq. (33))."""
    pi = softmax_policy(theta)
    S, A = pi.shape
    score = np.zeros((S, A, S, A))
    idx = np.arange(S)
    score[idx, :, idx, :] = np.eye(A)[None, :, :] - pi[:, None, :]
    return score


def policy_gradient(mdp: MDP, theta) -> np.ndarray:
    """Exact ``grad_theta J(pi_theta)``, ``[S, A]``, by the policy-gradient theorem Sutton et al. 2000,
    Theorem 1:

        grad J = (1/(1-gamma)) E_{(s,a)~d_theta}[grad log pi(a|s) Q(s, a)]
               = sum_{s,a} rho_theta(s) pi(a|s) grad log pi(a|s) Q(s, a)        (mdp.md eq. (34))

    with the unnormalised occupancy ``rho_theta`` (so gamma = 1 episodic MDPs work too). For the
    softmax this is ``rho(s) pi(b|s) A(s, b)`` at ``theta[s, b]``.
    """
    theta = _theta(mdp, theta)
    pi = softmax_policy(theta)
    Q = q_values(mdp, pi)
    rho = state_occupancy(mdp, pi, normalized=False)
    score = softmax_score(theta)
    return np.einsum("s,sa,sa,sazb->zb", rho, pi, Q, score)


def fisher_matrix(mdp: MDP, theta) -> np.ndarray:
    """Fisher information ``F = E_{s~d_theta, a~pi}[grad log pi grad log pi^T]``, ``[S*A, S*A]``.

    mdp.md eq. (35); Kakade 2001; Schulman et al. 2015, Appendix C. Uses the NORMALISED occupancy ``d_theta``;
    F equals the Hessian
    in ``theta'`` at ``theta' = theta`` of :func:`mean_kl`. Block diagonal with blocks
    ``d(s) (diag pi(.|s) - pi(.|s) pi(.|s)^T)``; singular (each block annihilates the ones vector).
    """
    theta = _theta(mdp, theta)
    pi = softmax_policy(theta)
    d = state_occupancy(mdp, pi, normalized=True)
    score = softmax_score(theta).reshape(mdp.num_states, mdp.num_actions, -1)
    return np.einsum("s,sa,sai,saj->ij", d, pi, score, score)


def natural_gradient(mdp: MDP, theta) -> np.ndarray:
    """Minimum-norm solution ``F^+ grad J`` of ``F x = grad J`` (mdp.md eq. (36)); ``[S, A]``.

    F (:func:`fisher_matrix`) is singular for the softmax, so the Moore-Penrose pseudo-inverse
    picks the solution orthogonal to the null space (per state, to the ones vector; states with
    ``d = 0`` get 0). F is block diagonal with blocks ``d(s) M_s``, ``M_s = diag pi_s - pi_s pi_s^T``,
    and ``grad J`` has blocks ``rho(s) pi_s * A_s``; since ``rho(s) / d(s) = sum_s' rho(s')`` the
    blocks of ``F^+ grad J`` are ``(sum rho) M_s^+ (pi_s * A_s)``, computed so (no division by a
    possibly subnormal ``d(s)``), with eigenvalues of ``M_s`` below ``1e-12`` times its largest
    counted as zero. For gamma < 1 this equals :func:`natural_gradient_closed_form`; for gamma = 1
    it is ``(A - mean_a A)`` times the expected episode length.
    """
    theta = _theta(mdp, theta)
    S, A = theta.shape
    pi = softmax_policy(theta)
    rho = state_occupancy(mdp, pi, normalized=False)
    weighted_adv = pi * advantages(mdp, pi)  # grad J block / rho(s), see policy_gradient
    blocks = np.einsum("ab,sa->sab", np.eye(A), pi) - pi[:, :, None] * pi[:, None, :]
    result = np.zeros((S, A))
    for s in np.flatnonzero(rho > 0.0):
        result[s] = rho.sum() * (np.linalg.pinv(blocks[s], rcond=1e-12, hermitian=True) @ weighted_adv[s])
    return result


def natural_gradient_closed_form(mdp: MDP, theta) -> np.ndarray:
    """``(A_theta(s, a) - mean_a A_theta(s, a)) / (1 - gamma)`` on states with ``d(s) > 0``, else 0.

    mdp.md eq. (37) (Kakade 2001): the natural gradient of the tabular softmax. ``[S, A]``.
    Raises ``ValueError`` at gamma = 1 (``1 - gamma`` in the denominator).
    """
    if mdp.gamma >= 1.0:
        raise ValueError("natural_gradient_closed_form needs gamma < 1: it divides by (1 - gamma)")
    theta = _theta(mdp, theta)
    pi = softmax_policy(theta)
    adv = advantages(mdp, pi)
    d = state_occupancy(mdp, pi, normalized=True)
    centred = (adv - adv.mean(axis=1, keepdims=True)) / (1.0 - mdp.gamma)
    return np.where((d > 0.0)[:, None], centred, 0.0)


def mean_kl(mdp: MDP, theta, theta_new) -> float:
    """``E_{s ~ d_theta}[KL(pi_theta(.|s) || pi_theta_new(.|s))]`` with the normalised occupancy of
    the OLD parameters ``theta`` held fixed (mdp.md eq. (35); Schulman et al. 2015, section 4). Its Hessian in
    ``theta_new`` at ``theta_new = theta`` is :func:`fisher_matrix`."""
    theta = _theta(mdp, theta)
    theta_new = _theta(mdp, theta_new, "theta_new")
    pi = softmax_policy(theta)
    d = state_occupancy(mdp, pi, normalized=True)
    # In log space (exact for any theta_new; softmax probabilities never vanish in exact arithmetic).
    kl = np.einsum("sa,sa->s", pi, _log_softmax(theta) - _log_softmax(theta_new))
    return float(d @ kl)
