"""Exact policy evaluation and occupancy measures by direct linear solves.

spec: specs/mdp.md sections 2-3; Kakade & Langford 2002; Sutton & Barto 2018, section 3.5. For ``gamma = 1``
the policy must
reach a terminal state with probability 1 from every state (otherwise a clear ``ValueError``);
terminal states have value 0 and are excluded from the unnormalised occupancy.
"""

from __future__ import annotations

import numpy as np

from tabular.mdp import MDP, policy_reward_vector, policy_transition_matrix, reaches_terminal_surely

__all__ = [
    "policy_evaluation",
    "q_values",
    "advantages",
    "expected_return",
    "state_occupancy",
    "state_action_occupancy",
]


def _nonterminal_states(mdp: MDP, pi) -> np.ndarray:
    """The non-terminal states, where values and occupancies are solved for at every gamma; at
    gamma = 1 first the episodic condition (mdp.md eq. (6)). A terminal state's value is 0 by mdp.md
    eq. (3) and its occupancy follows from the others' (``state_occupancy``); leaving terminal states
    out keeps ``I - gamma P_pi`` well conditioned as gamma nears 1, where with them it is singular to
    within rounding (gamma = 1 - 2**-53 and a policy row summing to 1 + 2**-52 made it exactly so; at
    gamma = 1 it is singular)."""
    if mdp.gamma >= 1.0:
        ok = reaches_terminal_surely(mdp, pi)
        if not np.all(ok):
            bad = np.flatnonzero(~ok).tolist()
            raise ValueError(
                "gamma = 1 requires a policy that reaches a terminal state with probability 1 from every "
                f"state; from states {bad} it does not (use gamma < 1 or mark terminal states)"
            )
    return np.flatnonzero(~mdp.terminal)


def _reachable_from_start(mdp: MDP, P_pi: np.ndarray) -> np.ndarray:
    """``[S]`` bool: states visited with positive probability at some step (support of rho0, closed
    under the edges ``P_pi > 0`` when gamma > 0); exactly the support of the occupancy."""
    reached = mdp.rho0 > 0.0
    if mdp.gamma == 0.0:
        return reached
    edges = P_pi > 0.0  # (a terminal state only leads to itself, so it reaches nothing new)
    while True:
        new = reached | (edges & reached[:, None]).any(axis=0)
        if np.array_equal(new, reached):
            return reached
        reached = new


def policy_evaluation(mdp: MDP, pi) -> np.ndarray:
    """``V_pi [S]`` solving ``V = r_pi + gamma P_pi V`` (spec: mdp.md eq. (7); Sutton & Barto 2018,
    section 3.5).

    Direct solve of ``(I - gamma P_pi) V = r_pi`` on the non-terminal states, with ``V = 0`` on terminal
    states (absorbing and paying 0, mdp.md eq. (3)), at every gamma.
    """
    pi = mdp.validate_policy(pi)
    P_pi = policy_transition_matrix(mdp, pi)
    r_pi = policy_reward_vector(mdp, pi)
    idx = _nonterminal_states(mdp, pi)
    V = np.zeros(mdp.num_states)
    if idx.size:
        M = np.eye(idx.size) - mdp.gamma * P_pi[np.ix_(idx, idx)]
        V[idx] = np.linalg.solve(M, r_pi[idx])
    return V


def q_values(mdp: MDP, pi) -> np.ndarray:
    """``Q_pi [S, A] = r(s, a) + gamma sum_s' P(s'|s, a) V_pi(s')`` (spec: mdp.md eq. (8);
    Sutton & Barto 2018, section 3.5)."""
    V = policy_evaluation(mdp, pi)
    return mdp.r + mdp.gamma * np.einsum("sat,t->sa", mdp.P, V)


def advantages(mdp: MDP, pi) -> np.ndarray:
    """``A_pi [S, A] = Q_pi(s, a) - V_pi(s)`` (spec: mdp.md eq. (9); Schulman et al. 2016, section 2).

    Centred under pi: ``sum_a pi(a|s) A_pi(s, a) = 0`` (Schulman et al. 2016, section 2).
    """
    pi = mdp.validate_policy(pi)
    V = policy_evaluation(mdp, pi)
    return mdp.r + mdp.gamma * np.einsum("sat,t->sa", mdp.P, V) - V[:, None]


def expected_return(mdp: MDP, pi) -> float:
    """``J(pi) = sum_s rho0(s) V_pi(s)`` (spec: mdp.md eq. (10))."""
    return float(mdp.rho0 @ policy_evaluation(mdp, pi))


def state_occupancy(mdp: MDP, pi, normalized: bool = True) -> np.ndarray:
    """State occupancy ``[S]`` (spec: mdp.md eq. (11)-(12); Kakade & Langford 2002; Schulman et al. 2015,
    section 2).

    ``normalized=False``: TRPO's ``rho_pi(s) = sum_t gamma^t P(s_t = s)``, the solution of the flow
    equation ``rho = rho0 + gamma P_pi^T rho``. For gamma = 1 this is the expected number of visits
    to each non-terminal state (terminal states get 0: they are excluded).
    ``normalized=True``: ``rho_pi`` divided by its total, which is ``1 / (1 - gamma)`` for
    gamma < 1 and the expected episode length (non-terminal steps) for gamma = 1.

    The flow equation is solved on the non-terminal states (no flow leaves a terminal state for
    another); a terminal state T then holds, for gamma < 1, ``rho(T) = (rho0(T) + gamma sum_s P_pi(s,
    T) rho(s)) / (1 - gamma)`` over the non-terminal s (its row of the flow equation, its self-loop
    moved to the left).
    """
    pi = mdp.validate_policy(pi)
    P_pi = policy_transition_matrix(mdp, pi)
    idx = _nonterminal_states(mdp, pi)
    rho = np.zeros(mdp.num_states)
    if idx.size:
        M = np.eye(idx.size) - mdp.gamma * P_pi[np.ix_(idx, idx)].T
        rho[idx] = np.linalg.solve(M, mdp.rho0[idx])
    if mdp.gamma < 1.0 and mdp.terminal.any():
        ends = np.flatnonzero(mdp.terminal)
        inflow = P_pi[np.ix_(idx, ends)].T @ rho[idx]
        rho[ends] = (mdp.rho0[ends] + mdp.gamma * inflow) / (1.0 - mdp.gamma)
    # States that cannot be reached get exactly 0 (the solve may leave rounding noise there).
    rho[~_reachable_from_start(mdp, P_pi)] = 0.0
    if not normalized:
        return rho
    total = rho.sum()
    if total <= 0.0:
        raise ValueError("the normalised occupancy is undefined: every start state is terminal")
    return rho / total


def state_action_occupancy(mdp: MDP, pi, normalized: bool = True) -> np.ndarray:
    """``[S, A]`` occupancy ``rho_pi(s) pi(a|s)`` (spec: mdp.md eq. (13); Kakade & Langford 2002;
    Schulman et al. 2015, section 2);
    ``normalized`` as in :func:`state_occupancy`."""
    pi = mdp.validate_policy(pi)
    return state_occupancy(mdp, pi, normalized)[:, None] * pi
