"""Optimal control of finite MDPs: value iteration and policy iteration.

spec: specs/mdp.md section 4, eq. (16)-(19); Sutton & Barto 2018, sections 4.3-4.4 (8x8 grid world: mdp.md
section 7.3).
Both solvers return a :class:`ControlResult` (numpy arrays). Greedy policies are one-hot
``[S, A]`` arrays with deterministic tie-breaking (the lowest action index among the maximisers;
policy iteration keeps its current action when that action is still a maximiser).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tabular.evaluation import policy_evaluation
from tabular.mdp import MDP

__all__ = [
    "ControlResult",
    "bellman_optimality_backup",
    "greedy_policy",
    "value_iteration",
    "policy_iteration",
]

#: Relative tolerance under which two action values count as tied (floating-point noise of a
#: linear solve); an action switch in policy iteration must beat the current action by more.
TIE_RTOL = 1e-12


@dataclass(frozen=True)
class ControlResult:
    """Result of :func:`value_iteration` or :func:`policy_iteration`.

    Attributes:
        V: ``[S]`` state values (VI: within ``tol / 2`` of ``V*``; PI: ``V`` of the returned policy).
        policy: ``[S, A]`` one-hot deterministic policy, greedy with respect to ``Q``.
        Q: ``[S, A]`` action values ``r + gamma P V`` from which the policy was read.
        iterations: VI: number of Bellman backups; PI: number of policy evaluations.
    """

    V: np.ndarray
    policy: np.ndarray
    Q: np.ndarray
    iterations: int


def bellman_optimality_backup(mdp: MDP, V) -> np.ndarray:
    """``Q(s, a) = r(s, a) + gamma sum_s' P(s'|s, a) V(s')`` for any ``V [S]`` (spec: mdp.md eq. (16)).

    ``max_a Q(s, a)`` is the Bellman optimality operator ``(T V)(s)``. Returns ``[S, A]``.
    """
    V = np.asarray(V, dtype=np.float64)
    if V.shape != (mdp.num_states,):
        raise ValueError(f"V must have shape [S] = ({mdp.num_states},), got {V.shape}")
    if not np.all(np.isfinite(V)):
        raise ValueError("V contains NaN or inf")
    return mdp.r + mdp.gamma * np.einsum("sat,t->sa", mdp.P, V)


def _tie_tolerance(Q: np.ndarray) -> np.ndarray:
    return TIE_RTOL * (1.0 + np.abs(Q).max(axis=1))


def greedy_policy(Q, current=None) -> np.ndarray:
    """One-hot ``[S, A]`` policy choosing ``argmax_a Q(s, a)`` (spec: mdp.md eq. (18)).

    Ties (within ``TIE_RTOL (1 + max_a |Q(s, a)|)``) go to ``current`` (an ``[S]`` int array of
    actions in ``[0, A)``; ValueError otherwise, no negative-index wrap) when given and still tied
    for the maximum, otherwise to the lowest action index.
    """
    Q = np.asarray(Q, dtype=np.float64)
    if Q.ndim != 2:
        raise ValueError(f"Q must have shape [S, A], got {Q.shape}")
    if not np.all(np.isfinite(Q)):
        raise ValueError("Q contains NaN or inf")
    S, A = Q.shape
    is_max = Q >= Q.max(axis=1, keepdims=True) - _tie_tolerance(Q)[:, None]
    actions = np.argmax(is_max, axis=1)  # first maximiser
    if current is not None:
        current = np.asarray(current)
        if current.shape != (S,) or not np.issubdtype(current.dtype, np.integer):
            raise ValueError(f"current must be an int array of shape [S] = ({S},), got {current.shape}")
        outside = (current < 0) | (current >= A)
        if np.any(outside):
            s = int(np.flatnonzero(outside)[0])
            raise ValueError(f"current must hold actions in [0, A) = [0, {A}), "
                             f"got current[{s}] = {int(current[s])}")
        keep = is_max[np.arange(S), current]
        actions = np.where(keep, current, actions)
    policy = np.zeros((S, A))
    policy[np.arange(S), actions] = 1.0
    return policy


def _check_iterations(max_iterations) -> None:
    """``max_iterations`` is an int >= 1 (a solver that may not iterate returns nothing)."""
    if isinstance(max_iterations, (bool, np.bool_)) or not isinstance(max_iterations, (int, np.integer)):
        raise TypeError(f"max_iterations must be an int, got {type(max_iterations).__name__}")
    if max_iterations < 1:
        raise ValueError(f"max_iterations must be >= 1, got {max_iterations}")


def value_iteration(mdp: MDP, tol: float = 1e-8, max_iterations: int = 1_000_000) -> ControlResult:
    """Value iteration ``V_{k+1} = T V_k`` from ``V_0 = 0`` with a guaranteed stopping rule.

    spec: mdp.md eq. (16)-(17), (19). With ``delta_k = ||V_{k+1} - V_k||_inf`` and ``pi_k`` greedy
    w.r.t. ``Q_k = r + gamma P V_k`` (so ``T_{pi_k} V_k = T V_k = V_{k+1}``), the contraction of
    ``T`` and ``T_{pi_k}`` in sup norm gives

        ||V_{k+1} - V*||_inf <= gamma delta_k / (1 - gamma),
        ||V_{pi_k} - V_{k+1}||_inf <= gamma delta_k / (1 - gamma),

    hence ``||V_{pi_k} - V*||_inf <= 2 gamma delta_k / (1 - gamma)``. Iteration stops at the first k
    with ``2 gamma delta_k / (1 - gamma) <= tol``, so the returned ``V = V_{k+1}`` is within
    ``tol / 2`` of ``V*`` and the returned greedy policy ``pi_k`` is ``tol``-optimal at every state:
    ``V_{pi_k}(s) >= V*(s) - tol``. (Up to floating-point rounding of the backups, ~1e-16 |V|.)

    ``gamma = 1`` raises ``ValueError`` (the bound has ``1 - gamma`` in its denominator; use
    :func:`policy_iteration` for episodic MDPs). ``gamma = 0`` stops after one backup (exact).
    Returns :class:`ControlResult` with ``iterations`` = number of backups.
    """
    if not isinstance(mdp, MDP):
        raise TypeError(f"mdp must be a tabular.MDP, got {type(mdp).__name__}")
    if not (isinstance(tol, (int, float)) and np.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a positive finite number, got {tol!r}")
    _check_iterations(max_iterations)
    if mdp.gamma >= 1.0:
        raise ValueError(
            "value_iteration needs gamma < 1: its stopping bound gamma delta / (1 - gamma) is infinite "
            "at gamma = 1 (use policy_iteration for episodic MDPs)"
        )
    gamma = mdp.gamma
    threshold = np.inf if gamma == 0.0 else tol * (1.0 - gamma) / (2.0 * gamma)
    V = np.zeros(mdp.num_states)
    for k in range(1, max_iterations + 1):
        Q = bellman_optimality_backup(mdp, V)
        V_next = Q.max(axis=1)
        delta = float(np.max(np.abs(V_next - V)))
        if delta <= threshold:
            return ControlResult(V=V_next, policy=greedy_policy(Q), Q=Q, iterations=k)
        V = V_next
    raise RuntimeError(f"value_iteration did not reach tol={tol} within {max_iterations} backups")


def policy_iteration(mdp: MDP, initial_policy=None, max_iterations: int = 10_000) -> ControlResult:
    """Exact policy iteration (spec: mdp.md eq. (18); Sutton & Barto 2018, section 4.3).

    Evaluate the current policy by a direct linear solve (:func:`policy_evaluation`), improve
    greedily with deterministic tie-breaking (keep the current action while it is tied for the
    maximum, else the lowest index). Each switch strictly improves the value, so with finitely many
    deterministic policies the loop terminates; on return the policy is greedy w.r.t. its own
    ``Q``, i.e. ``V`` satisfies the Bellman optimality equation ``V = max_a Q``.

    ``initial_policy``: ``[S, A]`` policy (default: greedy w.r.t. ``r``); a stochastic one is first
    improved greedily. At ``gamma = 1`` every policy evaluated must be proper (reach a terminal
    state surely), as in a DAG such as a token tree; otherwise ``policy_evaluation`` raises.
    Returns :class:`ControlResult` with ``iterations`` = number of policy evaluations.
    """
    if not isinstance(mdp, MDP):
        raise TypeError(f"mdp must be a tabular.MDP, got {type(mdp).__name__}")
    _check_iterations(max_iterations)
    S = mdp.num_states
    if initial_policy is None:
        policy = greedy_policy(mdp.r)
    else:
        policy = mdp.validate_policy(initial_policy, "initial_policy")
    current = None
    for k in range(1, max_iterations + 1):
        V = policy_evaluation(mdp, policy)
        Q = bellman_optimality_backup(mdp, V)
        deterministic = np.all((policy == 0.0) | (policy == 1.0))
        current = np.argmax(policy, axis=1) if deterministic else None
        improved = greedy_policy(Q, current=current)
        if current is not None and np.array_equal(improved, policy):
            return ControlResult(V=V, policy=policy, Q=Q, iterations=k)
        policy = improved
    raise RuntimeError(f"policy_iteration did not converge within {max_iterations} evaluations (S={S})")
