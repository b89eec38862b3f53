"""``refimpl report``: the exact tabular examples solved and printed readably.

Registered through the ``refimpl.commands`` entry point (``report = "tabular.report:register"``),
so the ``refimpl`` command offers it without ``refimpl`` importing ``tabular`` (import rule).
Sections: the 8x8 grid world (values and greedy arrows), policy iteration vs value
iteration, the examples of mdp.md sections 7.1 (exact rationals) and 7.2 (IS-weight variance), a CPI / TRPO
bound check on a random MDP. spec: specs/mdp.md sections 4, 5 and 7.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from tabular.control import greedy_policy, policy_iteration, value_iteration
from tabular.evaluation import advantages, expected_return, policy_evaluation
from tabular.exact import ExactMDP, exact_advantages, exact_expected_return, exact_state_occupancy
from tabular.examples import (
    distribution_shift_example,
    grid_world,
    is_weight_variance,
    random_mdp,
    random_policy,
)
from tabular.improvement import (
    cpi_epsilon,
    cpi_gain,
    cpi_lower_bound,
    cpi_step_size,
    mixture,
    policy_kl,
    policy_total_variation,
    trpo_lower_bound,
)

__all__ = ["register", "run_report", "format_value_grid", "format_policy_grid"]

UNICODE_ARROWS = ("↑", "→", "↓", "←")
ASCII_ARROWS = ("^", ">", "v", "<")


def _arrows(out) -> tuple[str, ...]:
    encoding = getattr(out, "encoding", None) or "utf-8"
    try:
        "".join(UNICODE_ARROWS).encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return ASCII_ARROWS
    return UNICODE_ARROWS


def format_value_grid(values: np.ndarray, size: int, goal, trap) -> str:
    """Rows of values (3 decimals), with the goal and trap cells shown as ``GOAL`` / ``TRAP``."""
    lines = []
    for row in range(size):
        cells = []
        for col in range(size):
            if (row, col) == tuple(goal):
                cells.append("  GOAL")
            elif (row, col) == tuple(trap):
                cells.append("  TRAP")
            else:
                cells.append(f"{values[row * size + col]:6.3f}")
        lines.append(" ".join(cells))
    return "\n".join(lines)


def format_policy_grid(policy: np.ndarray, size: int, goal, trap, arrows=UNICODE_ARROWS) -> str:
    """Rows of greedy actions as arrows (action order up, right, down, left), ``G`` / ``T`` marked."""
    lines = []
    for row in range(size):
        cells = []
        for col in range(size):
            if (row, col) == tuple(goal):
                cells.append("G")
            elif (row, col) == tuple(trap):
                cells.append("T")
            else:
                cells.append(arrows[int(np.argmax(policy[row * size + col]))])
        lines.append(" ".join(cells))
    return "\n".join(lines)


def _fraction_text(x) -> str:
    q = Fraction(int(x.p), int(x.q)) if hasattr(x, "p") else Fraction(x)
    return f"{q.numerator}/{q.denominator}" if q.denominator != 1 else f"{q.numerator}"


def _section(say: Callable[[str], None], title: str) -> None:
    say("")
    say(title)
    say("=" * len(title))


def _grid_sections(say, gamma: float, tol: float, arrows) -> None:
    world = grid_world(gamma=gamma)
    mdp = world.mdp
    pi_res = policy_iteration(mdp)
    vi_res = value_iteration(mdp, tol=tol)
    _section(
        say, f"Grid world 8x8 (mdp.md 7.3): goal +1 at {world.goal}, trap -1 at {world.trap}, gamma = {gamma}"
    )
    say("Reward on arrival R(s'); goal and trap are terminal. Optimal values V* (policy iteration, exact):")
    say(format_value_grid(pi_res.V, world.size, world.goal, world.trap))
    say("")
    say("Greedy policy w.r.t. Q* (ties -> first of up, right, down, left):")
    say(format_policy_grid(greedy_policy(pi_res.Q), world.size, world.goal, world.trap, arrows))

    _section(say, "Policy iteration vs value iteration")
    live = ~mdp.terminal
    same = np.all(pi_res.policy == vi_res.policy, axis=1)
    # An action differing from PI's is still optimal if it is tied for the max of Q*.
    chosen_vi = np.sum(vi_res.policy * pi_res.Q, axis=1)
    optimal_vi = chosen_vi >= pi_res.Q.max(axis=1) - 1e-12
    v_vi_policy = policy_evaluation(mdp, vi_res.policy)
    say(f"PI policy evaluations             : {pi_res.iterations}")
    say(f"VI Bellman backups (tol = {tol:.0e})  : {vi_res.iterations}")
    gap_values = np.max(np.abs(pi_res.V - vi_res.V))
    say(f"max |V_PI - V_VI|                 : {gap_values:.3e}  (guaranteed <= tol/2)")
    say(f"max (V* - V of VI's policy)       : {np.max(pi_res.V - v_vi_policy):.3e}  (guaranteed <= tol)")
    n_same, n_live = int(np.sum(same & live)), int(np.sum(live))
    say(f"same greedy action                : {n_same}/{n_live} non-terminal states")
    say(
        f"VI's actions optimal under Q*      : {'yes' if np.all(optimal_vi) else 'NO'} (differences are ties)"
    )


def _shift_section(say) -> None:
    ex = distribution_shift_example()
    emdp = ExactMDP.from_arrays(ex.exact.P, ex.exact.r, ex.exact.rho0, ex.exact.gamma, ex.exact.terminal)
    pi, pi_new = ex.exact.pi, ex.exact.pi_new
    J = exact_expected_return(emdp, pi)
    J_new = exact_expected_return(emdp, pi_new)
    adv = exact_advantages(emdp, pi)
    abar = [sum(pi_new[s, a] * adv[s, a] for a in range(2)) for s in range(3)]
    rho = exact_state_occupancy(emdp, pi, normalized=False)
    rho_new = exact_state_occupancy(emdp, pi_new, normalized=False)
    gain = sum(rho[s] * abar[s] for s in range(3))
    dsp = sum((rho_new[s] - rho[s]) * abar[s] for s in range(3))
    _section(say, "Distribution shift (mdp.md section 7.1): the surrogate predicts improvement, J collapses")
    say("gamma = 9/10, M = 100, eta = 1/10000, eta2 = 1/1000 (exact rationals; as first stated in brackets)")
    say(f"J(pi)             = {_fraction_text(J):>22} = {float(J):.6e}  [8.091e-5]")
    say(f"J(pi')            = {_fraction_text(J_new):>22} = {float(J_new):.6g}  [-90]")
    say(f"L_pi(pi') - J(pi) = {_fraction_text(gain):>22} = {float(gain):.8f}  [0.79994]")
    say(f"DSP_pi(pi')       = {_fraction_text(dsp):>22} = {float(dsp):.8f}")
    say(f"J(pi') - J(pi)    = {_fraction_text(J_new - J):>22} = {float(J_new - J):.8f}  (PDL, exact)")
    float_ok = abs(expected_return(ex.mdp, ex.pi) - float(J)) <= 1e-15
    say(f"float path agrees : {'yes' if float_ok else 'NO'}")


def _is_section(say) -> None:
    p, q = Fraction(1, 2), Fraction(9, 10)
    _section(
        say, "Trajectory IS (mdp.md section 7.2): importance weights, Var = (q^2/p + (1-q)^2/(1-p))^H - 1"
    )
    say("p = 1/2, q = 9/10: base 41/25 = 1.64")
    for H in (1, 2, 5, 10, 20, 50):
        var = is_weight_variance(p, q, H)
        exact = _fraction_text(var) if H <= 5 else "(exact rational, long)"
        say(f"H = {H:2d}: Var[w] = {float(var):.6e}  {exact}")
    say("Return when the absorbing state pays 1 per step: gamma^H / (1 - gamma) (erratum: not gamma^H).")


def _bounds_section(say, seed: int) -> None:
    rng = np.random.default_rng(seed)
    S, A, gamma = 10, 4, 0.9
    mdp = random_mdp(rng, num_states=S, num_actions=A, gamma=gamma, zero_fraction=0.3)
    pi = random_policy(rng, S, A)
    greedy = np.zeros((S, A))
    greedy[np.arange(S), np.argmax(advantages(mdp, pi), axis=1)] = 1.0
    J = expected_return(mdp, pi)
    alpha = cpi_step_size(mdp, pi, greedy)
    J_mix = expected_return(mdp, mixture(pi, greedy, alpha))
    bound = cpi_lower_bound(mdp, pi, greedy, alpha)
    bound_kl = cpi_lower_bound(mdp, pi, greedy, alpha, form="kakade_langford")
    _section(say, f"CPI and TRPO bounds on a random MDP (seed {seed}, S = {S}, A = {A}, gamma = {gamma})")
    say("pi: random; pi': greedy w.r.t. A_pi; CPI mixes them with the step size of mdp.md eq. (28).")
    say(f"J(pi)                        = {J:.10f}")
    say(f"g = L(pi') - J(pi)           = {cpi_gain(mdp, pi, greedy):.10f}")
    say(f"eps = max_s |E_pi' A_pi|     = {cpi_epsilon(mdp, pi, greedy):.10f}")
    say(f"alpha* (mdp.md eq. (28))     = {alpha:.10f}")
    say(f"CPI bound (mdp.md eq. (27))  = {bound:.10f}")
    say(f"CPI bound (Kakade-Langford)  = {bound_kl:.10f}")
    say(f"J(mixture)                   = {J_mix:.10f}  bound holds: {'yes' if J_mix >= bound_kl else 'NO'}")
    for step in (0.01, 0.1):
        pi_new = mixture(pi, greedy, step)
        J_new = expected_return(mdp, pi_new)
        b_tv = trpo_lower_bound(mdp, pi, pi_new, "tv")
        b_kl = trpo_lower_bound(mdp, pi, pi_new, "kl")
        ok = J_new >= b_tv and J_new >= b_kl
        say(
            f"TRPO, pi_new = mixture({step}): max TV = {np.max(policy_total_variation(pi, pi_new)):.4f}, "
            f"max KL(pi||pi_new) = {np.max(policy_kl(pi, pi_new)):.4f}"
        )
        holds = "yes" if ok else "NO"
        say(f"  J(pi_new) = {J_new:.10f}  TV bound = {b_tv:.10f}  KL bound = {b_kl:.10f}  holds: {holds}")


def run_report(gamma: float = 0.9, seed: int = 0, tol: float = 1e-8, out=None) -> int:
    """Print the report to ``out`` (default: sys.stdout); returns the exit code 0."""
    out = sys.stdout if out is None else out

    def say(line: str) -> None:
        print(line, file=out)

    say("rl-oracle report: exact tabular ground truth (spec: specs/mdp.md)")
    _grid_sections(say, gamma, tol, _arrows(out))
    _shift_section(say)
    _is_section(say)
    _bounds_section(say, seed)
    return 0


def _run(args: argparse.Namespace) -> int:
    return run_report(gamma=args.gamma, seed=args.seed, tol=args.tol)


def register(subparsers) -> None:
    """Add the ``report`` subcommand (the ``refimpl.commands`` entry-point protocol of refimpl/cli.py)."""
    parser = subparsers.add_parser(
        "report",
        help="solve the tabular examples exactly and print them",
        description="Grid world (values + greedy arrows), PI vs VI, mdp.md 7.1-7.2, CPI/TRPO bounds.",
    )
    parser.add_argument("--gamma", type=float, default=0.9, help="grid-world discount (default 0.9)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random MDP for the bound check")
    parser.add_argument("--tol", type=float, default=1e-8, help="value-iteration tolerance (default 1e-8)")
    parser.set_defaults(func=_run)
