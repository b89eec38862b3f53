"""Tabular solvers: direct vs iterative policy evaluation, policy vs value iteration.

Prints, for S in {100, 500, 2000} and A = 8 (random dense MDPs, gamma = 0.9), times measured in
one run and their ratios:
  * policy evaluation of a random policy: one direct linear solve (tabular.policy_evaluation)
    vs successive approximation V <- r_pi + gamma P_pi V stopped when its a-posteriori bound
    gamma delta / (1 - gamma) guarantees the same accuracy ACCURACY in sup norm (the direct
    solution's actual error is checked to be below it too);
  * control: policy_iteration (exact) vs value_iteration(tol=1e-8).
Run: .venv/bin/python benchmarks/tabular.py   (about a minute on one core)
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

# Run as a script, this file's folder comes first on sys.path and the file itself would shadow the
# ``tabular`` package it benchmarks; drop that entry before importing.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

from tabular import (  # noqa: E402
    policy_evaluation,
    policy_iteration,
    random_mdp,
    random_policy,
    value_iteration,
)

STATES = (100, 500, 2000)
ACTIONS = 8
GAMMA = 0.9
ACCURACY = 1e-10
VI_TOL = 1e-8


def iterative_evaluation(
    P_pi: np.ndarray, r_pi: np.ndarray, gamma: float, accuracy: float
) -> tuple[np.ndarray, int]:
    """Successive approximation; stops when ||V_k+1 - V_pi|| <= gamma delta / (1 - gamma) <= accuracy."""
    V = np.zeros_like(r_pi)
    threshold = accuracy * (1.0 - gamma) / gamma
    k = 0
    while True:
        k += 1
        V_next = r_pi + gamma * (P_pi @ V)
        delta = np.max(np.abs(V_next - V))
        V = V_next
        if delta <= threshold:
            return V, k


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main() -> None:
    print(f"Tabular benchmark: A = {ACTIONS}, gamma = {GAMMA}, random dense MDPs (one run each)")
    print()
    print(f"Policy evaluation to sup-norm accuracy {ACCURACY:g}")
    header = f"{'S':>6} {'direct [s]':>11} {'iterative [s]':>14} {'sweeps':>7}"
    print(header + f" {'iter/direct':>12} {'direct err':>11}")
    rows = []
    for S in STATES:
        mdp = random_mdp(S, num_states=S, num_actions=ACTIONS, gamma=GAMMA)
        pi = random_policy(S + 1, S, ACTIONS)
        V_direct, t_direct = timed(lambda mdp=mdp, pi=pi: policy_evaluation(mdp, pi))

        def iterative(mdp=mdp, pi=pi):
            P_pi = np.einsum("sa,sat->st", pi, mdp.P)
            r_pi = np.einsum("sa,sa->s", pi, mdp.r)
            return iterative_evaluation(P_pi, r_pi, GAMMA, ACCURACY)

        (V_iter, sweeps), t_iter = timed(iterative)
        # both are within ACCURACY of V_pi; the direct solve's residual error bounds its own error
        P_pi = np.einsum("sa,sat->st", pi, mdp.P)
        residual = np.max(np.abs(V_direct - (np.einsum("sa,sa->s", pi, mdp.r) + GAMMA * P_pi @ V_direct)))
        direct_err = residual / (1 - GAMMA)
        assert direct_err <= ACCURACY and np.max(np.abs(V_iter - V_direct)) <= ACCURACY + direct_err
        line = f"{S:>6} {t_direct:>11.4f} {t_iter:>14.4f} {sweeps:>7d}"
        print(line + f" {t_iter / t_direct:>12.2f} {direct_err:>11.1e}")
        rows.append((S, mdp))
    print()
    print(f"Control: policy iteration (exact) vs value iteration (tol = {VI_TOL:g})")
    header = f"{'S':>6} {'PI [s]':>9} {'PI evals':>9} {'VI [s]':>9} {'VI backups':>11}"
    print(header + f" {'VI/PI':>7} {'max|V_PI-V_VI|':>15}")
    for S, mdp in rows:
        pi_res, t_pi = timed(lambda mdp=mdp: policy_iteration(mdp))
        vi_res, t_vi = timed(lambda mdp=mdp: value_iteration(mdp, tol=VI_TOL))
        gap = np.max(np.abs(pi_res.V - vi_res.V))
        assert gap <= VI_TOL / 2
        print(
            f"{S:>6} {t_pi:>9.3f} {pi_res.iterations:>9d} {t_vi:>9.3f} {vi_res.iterations:>11d} "
            f"{t_vi / t_pi:>7.2f} {gap:>15.1e}"
        )


if __name__ == "__main__":
    main()
