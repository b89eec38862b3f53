"""Exact trajectory distributions, finite-horizon values and return moments.

spec: specs/estimators.md section 5 (the enumeration oracle). An episode starts in ``s_0 ~ rho0``
and ends when it arrives in a terminal state (*terminated*) or after ``horizon`` steps
(*truncated*, the finite-horizon objective ``J_H = E[sum_{t<H} gamma^t r(s_t, a_t)]``). Rewards are
the MDP's expected rewards ``r(s, a)``, i.e. deterministic given (s, a).

Enumerating every trajectory with its probability turns the expectation (and variance) of any
estimator into a finite sum: the central oracle for unbiasedness proofs by computation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tabular.mdp import MDP

__all__ = [
    "TrajectoryDistribution",
    "enumerate_trajectories",
    "FiniteHorizonValues",
    "finite_horizon_values",
    "finite_horizon_return",
    "state_distributions",
    "finite_horizon_softmax_gradient",
    "return_moments",
]


@dataclass(frozen=True)
class TrajectoryDistribution:
    """Every trajectory of at most ``horizon`` steps with its probability (``K`` trajectories).

    Arrays ``[K, H]``: ``states``, ``actions``, ``next_states`` (int64), ``rewards`` (float64),
    ``mask`` (step belongs to the episode), ``terminated``, ``truncated`` (bool); steps after the
    episode's end are padded with state/action 0 and reward 0 and have ``mask = False``.
    ``prob [K]`` sums to 1 and ``length [K]`` is the number of steps.
    """

    states: np.ndarray
    actions: np.ndarray
    next_states: np.ndarray
    rewards: np.ndarray
    mask: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    prob: np.ndarray
    length: np.ndarray

    @property
    def num_trajectories(self) -> int:
        return self.prob.shape[0]

    def expectation(self, values) -> np.ndarray:
        """``sum_k prob_k values_k`` over the first axis of ``values [K, ...]``."""
        values = np.asarray(values, dtype=np.float64)
        if values.shape[:1] != self.prob.shape:
            raise ValueError(f"values must have leading dimension K = {self.prob.shape[0]}, "
                             f"got {values.shape}")
        return np.tensordot(self.prob, values, axes=(0, 0))

    def variance(self, values) -> np.ndarray:
        """``E[(values - E values)^2]`` elementwise over the trailing axes."""
        values = np.asarray(values, dtype=np.float64)
        mean = self.expectation(values)
        return self.expectation((values - mean) ** 2)

    def discounted_returns(self, gamma: float) -> np.ndarray:
        """``[K, H]`` exact reward-to-go ``G_t = sum_{j >= t} gamma^(j - t) r_j`` inside each
        trajectory (0 after its end), by direct summation (not a recursion)."""
        K, H = self.rewards.shape
        out = np.zeros((K, H))
        for t in range(H):
            disc = gamma ** np.arange(H - t)
            out[:, t] = (self.rewards[:, t:] * disc).sum(1)
        return out * self.mask


def _check_policy_sequence(mdp: MDP, pi, horizon: int) -> np.ndarray:
    """``pi [S, A]`` (stationary) or ``[H, S, A]`` (time-dependent) as ``[H, S, A]``."""
    if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
        raise ValueError(f"horizon must be an integer >= 1, got {horizon!r}")
    arr = np.asarray(pi, dtype=np.float64)
    if arr.ndim == 3:
        if arr.shape[0] != horizon:
            raise ValueError(f"a time-dependent pi must be [H, S, A] with H = {horizon}, got {arr.shape}")
        return np.stack([mdp.validate_policy(p, f"pi[{t}]") for t, p in enumerate(arr)])
    return np.broadcast_to(mdp.validate_policy(pi), (horizon, mdp.num_states, mdp.num_actions))


def enumerate_trajectories(
    mdp: MDP, pi, horizon: int, max_trajectories: int = 200_000
) -> TrajectoryDistribution:
    """All trajectories of ``pi`` (``[S, A]`` or ``[H, S, A]``) of at most ``horizon`` steps.

    spec: estimators.md eq. (20). Zero-probability branches are pruned. Raises ValueError when more
    than ``max_trajectories`` would be produced (the count grows like ``(A S)^horizon``).
    """
    pis = _check_policy_sequence(mdp, pi, horizon)
    H = int(horizon)
    # each live prefix: (prob, states, actions, next_states); finished ones go to `done`
    rho0 = mdp.rho0
    done = [(float(p), [s], [], [], True) for s, p in enumerate(rho0) if p > 0 and mdp.terminal[s]]
    live = [(float(p), [s], [], []) for s, p in enumerate(rho0) if p > 0 and not mdp.terminal[s]]
    for t in range(H):
        new_live = []
        for p, ss, aa, nn in live:
            s = ss[-1]
            for a in np.flatnonzero(pis[t, s] > 0):
                pa = p * pis[t, s, a]
                for s2 in np.flatnonzero(mdp.P[s, a] > 0):
                    item = (pa * mdp.P[s, a, s2], ss + [int(s2)], aa + [int(a)], nn + [int(s2)])
                    if mdp.terminal[s2]:
                        done.append((*item, True))
                    elif t == H - 1:
                        done.append((*item, False))
                    else:
                        new_live.append(item)
            if len(done) + len(new_live) > max_trajectories:
                raise ValueError(f"more than max_trajectories = {max_trajectories} trajectories; "
                                 "use a smaller horizon or MDP")
        live = new_live
    K = len(done)
    states = np.zeros((K, H), dtype=np.int64)
    actions = np.zeros((K, H), dtype=np.int64)
    next_states = np.zeros((K, H), dtype=np.int64)
    mask = np.zeros((K, H), dtype=bool)
    terminated = np.zeros((K, H), dtype=bool)
    truncated = np.zeros((K, H), dtype=bool)
    prob = np.zeros(K)
    length = np.zeros(K, dtype=np.int64)
    for k, (p, ss, aa, nn, term) in enumerate(done):
        L = len(aa)
        prob[k], length[k] = p, L
        states[k, :L], actions[k, :L], next_states[k, :L] = ss[:L], aa, nn
        mask[k, :L] = True
        if L:
            terminated[k, L - 1] = term
            truncated[k, L - 1] = not term
    rewards = np.where(mask, mdp.r[states, actions], 0.0)
    return TrajectoryDistribution(states, actions, next_states, rewards, mask, terminated, truncated,
                                  prob, length)


@dataclass(frozen=True)
class FiniteHorizonValues:
    """``V [H + 1, S]`` and ``Q [H, S, A]``: ``V[t, s] = E[sum_{j=t}^{H-1} gamma^(j-t) r_j | s_t = s]``
    (``V[H] = 0``; terminal states have value 0) and ``Q[t, s, a]`` likewise given ``a_t = a``."""

    V: np.ndarray
    Q: np.ndarray


def finite_horizon_values(mdp: MDP, pi, horizon: int) -> FiniteHorizonValues:
    """Backward induction ``Q_t = r + gamma P V_{t+1}``, ``V_t = sum_a pi_t Q_t``, ``V_H = 0``
    (spec: estimators.md eq. (21)). ``pi`` is ``[S, A]`` or time-dependent ``[H, S, A]``."""
    pis = _check_policy_sequence(mdp, pi, horizon)
    H, S, A = pis.shape
    V = np.zeros((H + 1, S))
    Q = np.zeros((H, S, A))
    for t in range(H - 1, -1, -1):
        Q[t] = mdp.r + mdp.gamma * np.einsum("sat,t->sa", mdp.P, V[t + 1])
        Q[t][mdp.terminal] = 0.0
        V[t] = np.einsum("sa,sa->s", pis[t], Q[t])
    return FiniteHorizonValues(V, Q)


def finite_horizon_return(mdp: MDP, pi, horizon: int) -> float:
    """``J_H(pi) = rho0 . V_0`` (spec: estimators.md eq. (22))."""
    return float(mdp.rho0 @ finite_horizon_values(mdp, pi, horizon).V[0])


def state_distributions(mdp: MDP, pi, horizon: int) -> np.ndarray:
    """``[H, S]`` with ``d_t(s) = P(s_t = s)``: ``d_0 = rho0``, ``d_{t+1} = d_t P_pi_t`` (terminal
    states absorb, so a row keeps summing to 1)."""
    pis = _check_policy_sequence(mdp, pi, horizon)
    d = np.zeros((pis.shape[0], mdp.num_states))
    d[0] = mdp.rho0
    for t in range(1, pis.shape[0]):
        d[t] = d[t - 1] @ np.einsum("sa,sat->st", pis[t - 1], mdp.P)
    return d


def finite_horizon_softmax_gradient(mdp: MDP, pi, horizon: int) -> np.ndarray:
    """Exact ``grad_theta J_H`` for the stationary softmax policy ``pi = softmax(theta)`` (rows).

    spec: estimators.md eq. (23): ``dJ_H / dtheta[s, a] = sum_{t<H} gamma^t d_t(s) pi(a|s)
    (Q_t(s, a) - V_t(s))`` (the policy-gradient theorem for a finite horizon; terminal states
    contribute 0). Takes the policy ``pi [S, A]`` the logits map to; returns ``[S, A]``.
    """
    pi = mdp.validate_policy(pi)
    fh = finite_horizon_values(mdp, pi, horizon)
    d = state_distributions(mdp, pi, horizon)
    disc = mdp.gamma ** np.arange(horizon)
    adv = fh.Q - fh.V[:-1, :, None]
    return np.einsum("t,ts,sa,tsa->sa", disc, d, pi, adv)


def return_moments(mdp: MDP, pi, horizon: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact first and second moments of the discounted return from each start state.

    spec: estimators.md eq. (24). ``(mean [S], second_moment [S])`` of ``G = sum_t gamma^t r_t``
    given ``s_0 = s``, for the finite horizon ``horizon`` (backward recursion) or, with
    ``horizon=None`` and gamma < 1, the infinite horizon (linear solve of
    ``M = sum_a pi (r^2 + 2 gamma r P V) + gamma^2 P_pi M``). The variance is
    ``second_moment - mean**2``.
    """
    pi = mdp.validate_policy(pi)
    P_pi = np.einsum("sa,sat->st", pi, mdp.P)
    if horizon is None:
        if mdp.gamma >= 1.0:
            raise ValueError("return_moments with horizon=None needs gamma < 1; give a horizon")
        S = mdp.num_states
        V = np.linalg.solve(np.eye(S) - mdp.gamma * P_pi, np.einsum("sa,sa->s", pi, mdp.r))
        PV = np.einsum("sat,t->sa", mdp.P, V)
        b = np.einsum("sa,sa->s", pi, mdp.r**2 + 2 * mdp.gamma * mdp.r * PV)
        M = np.linalg.solve(np.eye(S) - mdp.gamma**2 * P_pi, b)
        return V, M
    pis = _check_policy_sequence(mdp, pi, horizon)
    V = np.zeros(mdp.num_states)
    M = np.zeros(mdp.num_states)
    for t in range(horizon - 1, -1, -1):
        PV = np.einsum("sat,t->sa", mdp.P, V)
        PM = np.einsum("sat,t->sa", mdp.P, M)
        M = np.einsum("sa,sa->s", pis[t], mdp.r**2 + 2 * mdp.gamma * mdp.r * PV + mdp.gamma**2 * PM)
        V = np.einsum("sa,sa->s", pis[t], mdp.r + mdp.gamma * PV)
        V[mdp.terminal], M[mdp.terminal] = 0.0, 0.0
    return V, M
