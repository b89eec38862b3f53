"""tabular/ (float64) against the exact rational spec specs/mdp.py, a third independent source
(spec: specs/mdp.md sections 2-5; Sutton & Barto 2018, section 3.5; Kakade & Langford 2002, Lemma 6.1), and
the golden tabular vectors.

1. The spec on its own, exactly: Bellman equations, centring of A (Schulman et al. 2016, section 2), total
   occupancy
   1/(1 - gamma), the performance-difference identity (Kakade & Langford 2002, Lemma 6.1;
   Schulman et al. 2015, eq. (1)-(2)) in both normalisations, V* equal
   to the best of all deterministic policies (brute force), the numbers of mdp.md section 7.1.
2. tabular against the spec on random rational MDPs drawn with a fixed seed (dyadic and "p/q"
   inputs, gamma from 0 to 255/256 and 1 on episodic MDPs).
3. tabular against every vector of ``specs.golden_tabular.tabular_vectors()`` (built by calling the
   function, not by reading a file), and every invalid vector rejected by both tabular and the spec.

**Tolerances** (float64 unit roundoff u = 2^-53). Policy evaluation solves ``M V = r_pi`` with
``M = I - gamma P_pi`` (n = S states solved). Forming ``P_pi``, ``r_pi`` (sums of A products, and
inputs rounded from "p/q" strings) perturbs them by at most (A + 1) u relative; LU with partial
pivoting has backward error ``|dM| <= 3 n u |L||U|`` with growth factor <= 2 for the row-diagonally
dominant ``M`` (``||M||_inf <= 1 + gamma <= 2``). Hence ``||dV||_inf <= kappa (||dM|| ||V|| + ||dr||)``
with ``kappa = ||M^-1||_inf``, which is exactly ``1/(1 - gamma)`` for gamma < 1 and the longest
expected episode length at gamma = 1 (computed exactly by the spec). We use

    eV   = 16 (S + A) u kappa (||V||_inf + ||r||_inf)          (V; Q, J: 2 eV; A = Q - V: 3 eV)
    eRho = 16 (S + A) u kappa (||rho||_1 + 1)                   (rho, in the 1-norm: ||M^-T||_1 = kappa)

(16 covers the constants above with a factor > 2 to spare) and propagate them through the
dot products of the performance-difference terms. Measured errors are at most 1/80 of these
(``test_tolerances_are_not_vacuous`` checks that a perturbation of 100 eV is detected); value
iteration is held to its proven bound tol/2 (mdp.md eq. (19)) plus eV, and nearly attains it.
"""

from __future__ import annotations

import functools
import itertools
import random
from fractions import Fraction

import numpy as np
import pytest
import sympy as sp

import tabular as T
from specs import mdp as spec
from specs.golden_tabular import (
    FLAGS,
    QUANTITIES,
    REASONS,
    random_rational_mdp,
    tabular_cases,
    tabular_vectors,
)

U = 2.0**-53  # float64 unit roundoff


# ---------------------------------------------------------------------------------------------
# Helpers


def to_float(x) -> np.ndarray:
    """Nested rationals / decimal or "p/q" strings -> float64 (each correctly rounded)."""
    def one(v):
        if isinstance(v, str):
            try:
                return float(Fraction(v))
            except ValueError:
                return float(v)  # "nan", "inf" in invalid vectors
        return float(Fraction(int(v.p), int(v.q))) if isinstance(v, sp.Rational) else float(Fraction(v))

    def rec(v):
        return [rec(item) for item in v] if isinstance(v, (list, tuple)) else one(v)

    return np.array(rec(x), dtype=np.float64)


def tabular_mdp(P, R, rho0, gamma, terminal) -> T.MDP:
    term = None if terminal is None else np.array(terminal, dtype=bool)
    return T.MDP(to_float(P), to_float(R), to_float(rho0), float(to_float(gamma)), terminal=term)


def spec_mdp_from_inputs(inputs: dict) -> spec.FiniteMDP:
    return spec.finite_mdp(inputs["P"], inputs["R"], inputs["rho0"], inputs["gamma"], inputs["terminal"])


def kappa(mdp: spec.FiniteMDP, pi) -> float:
    """``||(I - gamma P_pi)^-1||_inf`` on the solved states, exactly: the largest value of the reward
    that pays 1 at every non-terminal step (1/(1 - gamma) for gamma < 1)."""
    if mdp.gamma < 1:
        return float(1 / (1 - mdp.gamma))
    ones = [[0 if mdp.terminal[s] else 1] * mdp.num_actions for s in range(mdp.num_states)]
    unit = spec.finite_mdp(mdp.P, ones, mdp.rho0, mdp.gamma, list(mdp.terminal))
    return float(max(spec.values(unit, pi)))


def fl(x) -> np.ndarray:
    return to_float(x)


class Tol:
    """The tolerances of the module docstring for one MDP and policy (exact norms from the spec)."""

    def __init__(self, mdp: spec.FiniteMDP, pi):
        S, A = mdp.num_states, mdp.num_actions
        base = 16 * (S + A) * U * kappa(mdp, pi)
        self.V_norm = float(max(abs(v) for v in spec.values(mdp, pi)))
        r_norm = float(max(abs(x) for row in mdp.r for x in row))
        self.rho_norm = float(sum(spec.state_occupancy(mdp, pi)))
        self.V = base * (self.V_norm + r_norm)
        self.rho = base * (self.rho_norm + 1)
        self.d = 2 * self.rho / self.rho_norm if self.rho_norm else 0.0


def assert_close(name: str, got, expected, tol: float) -> None:
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    assert got.shape == expected.shape, f"{name}: shape {got.shape} != {expected.shape}"
    err = float(np.max(np.abs(got - expected))) if got.size else 0.0
    assert err <= tol, f"{name}: max error {err:.3e} > tolerance {tol:.3e}\n got {got}\n exp {expected}"


def assert_exact_zeros(name: str, got, expected_exact) -> None:
    """Where the spec's occupancy is exactly 0 (unreachable), tabular must return exactly 0."""
    zero = np.array([[x == 0 for x in row] if isinstance(row, tuple) else row == 0 for row in expected_exact])
    assert np.all(np.asarray(got)[zero] == 0.0), f"{name}: unreachable states not exactly 0"


# ---------------------------------------------------------------------------------------------
# Random rational MDPs (fixed seed)

GAMMAS = [Fraction(0), Fraction(1, 3), Fraction(1, 2), Fraction(9, 10), Fraction(99, 100), Fraction(255, 256)]


def random_cases(count: int = 18):
    rng = random.Random(20261123)
    out = []
    for i in range(count):
        S, A = rng.randint(1, 5), rng.randint(1, 3)
        gamma = GAMMAS[i % len(GAMMAS)]
        P, R, rho0, pi, pi_new = random_rational_mdp(
            f"test/{i}", S, A, dyadic=i % 3 != 2, zeros=i % 4 == 1, transition_reward=i % 5 == 4
        )
        out.append((f"random{i}_S{S}_A{A}_g{gamma}", P, R, rho0, gamma, None, pi, pi_new))
    # Episodic gamma = 1 MDPs: upper-triangular transitions into a terminal last state (a DAG).
    for i in range(4):
        S, A = rng.randint(2, 5), rng.randint(1, 3)
        P = []
        for s in range(S):
            rows = []
            for _ in range(A):
                if s == S - 1:
                    rows.append([Fraction(int(t == s)) for t in range(S)])
                    continue
                weights = [0] * (s + 1) + [rng.randint(0, 4) for _ in range(S - s - 1)]
                weights[-1] += 1  # always a way to the end
                rows.append([Fraction(w, sum(weights)) for w in weights])
            P.append(rows)
        R = [[Fraction(rng.randint(-8, 8), 8) if s < S - 1 else 0 for _ in range(A)] for s in range(S)]
        rho0 = [Fraction(1, S - 1)] * (S - 1) + [Fraction(0)]
        pi = [[Fraction(1, A)] * A for _ in range(S)]
        pi_new = [[Fraction(int(a == (s % A))) for a in range(A)] for s in range(S)]
        terminal = [False] * (S - 1) + [True]
        out.append((f"episodic{i}_S{S}_A{A}", P, R, rho0, Fraction(1), terminal, pi, pi_new))
    return out


RANDOM_CASES = random_cases()


@functools.cache
def exact_case(index: int):
    name, P, R, rho0, gamma, terminal, pi, pi_new = RANDOM_CASES[index]
    return spec.finite_mdp(P, R, rho0, gamma, terminal), tabular_mdp(P, R, rho0, gamma, terminal), pi, pi_new


# ---------------------------------------------------------------------------------------------
# 1. The spec on its own (exact)


@pytest.mark.parametrize("index", range(len(RANDOM_CASES)), ids=[c[0] for c in RANDOM_CASES])
def test_spec_bellman_centring_and_occupancy_identities(index):
    mdp, _, pi, _ = exact_case(index)
    pi_q = spec.check_policy(mdp, pi)
    V, Q, A = spec.values(mdp, pi), spec.q_values(mdp, pi), spec.advantages(mdp, pi)
    P_pi, r_pi = spec.policy_transition_matrix(mdp, pi), spec.policy_reward_vector(mdp, pi)
    V_col = sp.Matrix(V)
    solved = [s for s in range(mdp.num_states) if mdp.gamma < 1 or not mdp.terminal[s]]
    residual = V_col - r_pi - mdp.gamma * P_pi * V_col  # mdp.md eq. (7); Sutton & Barto 2018, section 3.5
    assert all(residual[s] == 0 for s in solved)
    for s in range(mdp.num_states):
        assert sum(p * q for p, q in zip(pi_q[s], Q[s], strict=True)) == V[s]  # Sutton & Barto 2018,
        # section 3.5
        assert sum(p * a for p, a in zip(pi_q[s], A[s], strict=True)) == 0  # Schulman et al. 2016, section 2
    rho, d = spec.state_occupancy(mdp, pi), spec.state_occupancy(mdp, pi, normalized=True)
    d_sa = spec.state_action_occupancy(mdp, pi, normalized=True)
    assert sum(d) == 1
    pairs = list(itertools.product(range(mdp.num_states), range(mdp.num_actions)))
    assert sum(d_sa[s][a] * A[s][a] for s, a in pairs) == 0  # Schulman et al. 2016, section 2
    rho_sa = spec.state_action_occupancy(mdp, pi)
    J = spec.expected_return(mdp, pi)
    assert J == sum(rho_sa[s][a] * mdp.r[s][a] for s, a in pairs)  # mdp.md section 3
    if mdp.gamma < 1:
        assert sum(rho) == 1 / (1 - mdp.gamma)  # mdp.md eq. (12)
        assert all(x == (1 - mdp.gamma) * y for x, y in zip(d, rho, strict=True))  # Kakade & Langford 2002;
        # Schulman et al. 2015, section 2


@pytest.mark.parametrize("index", range(len(RANDOM_CASES)), ids=[c[0] for c in RANDOM_CASES])
def test_spec_performance_difference_identity_is_exact(index):
    """Kakade & Langford 2002, Lemma 6.1; Schulman et al. 2015, eq. (1)-(2): J(pi') - J(pi) = sum_s rho_pi'(s)
    abar(s), and for gamma < 1 equally
    1/(1 - gamma) E_{s ~ d_pi'}[abar(s)] with the normalised occupancy; J(pi') = L + DSP
    (Schulman et al. 2015, eq. (2) minus eq. (3))."""
    mdp, _, pi, pi_new = exact_case(index)
    pd = spec.performance_difference(mdp, pi, pi_new)
    assert pd.difference == pd.pdl_sum == spec.expected_return(mdp, pi_new) - spec.expected_return(mdp, pi)
    assert pd.J_pi_new == pd.surrogate + pd.distribution_shift_penalty
    if mdp.gamma < 1:
        d_new = spec.state_occupancy(mdp, pi_new, normalized=True)
        normalised = sum(x * a for x, a in zip(d_new, pd.expected_advantage, strict=True)) / (1 - mdp.gamma)
        assert normalised == pd.difference
    same = spec.performance_difference(mdp, pi, pi)
    assert same.difference == same.pdl_sum == 0 and all(a == 0 for a in same.expected_advantage)


def test_spec_pdl_identity_on_every_catalogue_case():
    for case in tabular_cases():
        pd = spec.performance_difference(case.mdp(), case.pi, case.pi_new)
        assert pd.difference == pd.pdl_sum, case.name


SMALL = [i for i, c in enumerate(RANDOM_CASES) if len(c[6][0]) ** len(c[6]) <= 27]  # A^S <= 27


@pytest.mark.parametrize("index", SMALL, ids=[RANDOM_CASES[i][0] for i in SMALL])
def test_spec_optimal_control_beats_every_deterministic_policy(index):
    """V*(s) = max over the A^S deterministic policies of V_pi(s), attained by pi* at every state at
    once; V* = max_a Q* (mdp.md eq. (15)); pi* the lowest optimal index."""
    mdp, _, _, _ = exact_case(index)
    S, A = mdp.num_states, mdp.num_actions
    opt = spec.optimal_control(mdp)
    best = [max(column) for column in zip(*(
        spec.values(mdp, [[int(a == b) for b in range(A)] for a in actions])
        for actions in itertools.product(range(A), repeat=S)
    ), strict=True)]
    assert list(opt.V) == best
    assert spec.values(mdp, [[int(a == b) for b in range(A)] for a in opt.policy]) == opt.V
    for s in range(S):
        assert opt.V[s] == max(opt.Q[s]) and opt.policy[s] == min(opt.optimal_actions[s])


def test_spec_seed_001_distribution_shift_numbers():
    """mdp.md eq. (38) (section 7.1): J(pi) = 8091/10^8, J(pi') = -90, L - J = 39996909/50000000."""
    case = next(c for c in tabular_cases() if c.name == "seed_001_distribution_shift")
    pd = spec.performance_difference(case.mdp(), case.pi, case.pi_new)
    assert pd.J_pi == sp.Rational(8091, 10**8) and pd.J_pi_new == -90
    assert pd.surrogate - pd.J_pi == sp.Rational(39996909, 50000000)


def test_spec_tie_rule_takes_the_lowest_optimal_action():
    case = next(c for c in tabular_cases() if c.name == "tie_in_optimal_policy")
    opt = spec.optimal_control(case.mdp())
    assert opt.optimal_actions[0] == (1, 2) and opt.policy[0] == 1


def test_spec_properness_agrees_with_tabular_graph_search():
    """Two independent definitions of mdp.md eq. (6): the spec's det(I - Q_pi) != 0 and tabular's
    support-graph search, on random sparse episodic supports."""
    rng = random.Random(7)
    for _ in range(40):
        S, A = rng.randint(2, 5), 2
        terminal = [s == S - 1 for s in range(S)]
        P = []
        for s in range(S):
            if terminal[s]:
                P.append([[int(t == s) for t in range(S)] for _ in range(A)])
                continue
            rows = []
            for _ in range(A):
                weights = [rng.choice([0, 0, 1, 2]) for _ in range(S)]
                if not any(weights):
                    weights[rng.randrange(S)] = 1
                rows.append([Fraction(w, sum(weights)) for w in weights])
            P.append(rows)
        R = [[0] * A for _ in range(S)]
        rho0 = [Fraction(1, S)] * S
        pi = [[Fraction(1, 2)] * 2 if rng.random() < 0.5 else [1, 0] for _ in range(S)]
        exact = spec.finite_mdp(P, R, rho0, 1, terminal)
        floats = tabular_mdp(P, R, rho0, 1, terminal)
        assert spec.is_proper(exact, pi) == bool(np.all(T.reaches_terminal_surely(floats, to_float(pi))))


# ---------------------------------------------------------------------------------------------
# 2. tabular against the spec on random rational MDPs


@pytest.mark.parametrize("index", range(len(RANDOM_CASES)), ids=[c[0] for c in RANDOM_CASES])
def test_tabular_evaluation_matches_spec(index):
    mdp, fmdp, pi, pi_new = exact_case(index)
    pi_f = to_float(pi)
    tol = Tol(mdp, pi)
    assert_close("V", T.policy_evaluation(fmdp, pi_f), fl(spec.values(mdp, pi)), tol.V)
    assert_close("Q", T.q_values(fmdp, pi_f), fl(spec.q_values(mdp, pi)), 2 * tol.V)
    assert_close("A", T.advantages(fmdp, pi_f), fl(spec.advantages(mdp, pi)), 3 * tol.V)
    assert_close("J", T.expected_return(fmdp, pi_f), float(spec.expected_return(mdp, pi)), 2 * tol.V)
    for normalized, t in ((False, tol.rho), (True, tol.d)):
        rho = spec.state_occupancy(mdp, pi, normalized)
        got = T.state_occupancy(fmdp, pi_f, normalized=normalized)
        assert_close(f"rho normalized={normalized}", got, fl(rho), t)
        assert_exact_zeros("rho", got, rho)
        assert_close("rho_sa", T.state_action_occupancy(fmdp, pi_f, normalized=normalized),
                     fl(spec.state_action_occupancy(mdp, pi, normalized)), t)
    check_performance_difference(mdp, fmdp, pi, pi_new)


def check_performance_difference(mdp, fmdp, pi, pi_new) -> None:
    """tabular's PDL terms (mdp.md eq. (21)-(24)) against the spec's, with the tolerances of the
    module docstring carried through the dot products ``rho . abar``."""
    pd = spec.performance_difference(mdp, pi, pi_new)
    pi_f, new_f = to_float(pi), to_float(pi_new)
    old, new = Tol(mdp, pi), Tol(mdp, pi_new)
    abar = fl(pd.expected_advantage)
    abar_tol = 4 * old.V  # sum_a pi' A with A to 3 eV
    assert_close("abar", T.expected_advantage(fmdp, pi_f, new_f), abar, abar_tol)
    amax = float(np.max(np.abs(abar))) if abar.size else 0.0
    pdl_tol = new.rho_norm * abar_tol + new.rho * amax
    assert_close("pdl", T.performance_difference(fmdp, pi_f, new_f), float(pd.pdl_sum), pdl_tol)
    assert_close("difference", T.expected_return(fmdp, new_f) - T.expected_return(fmdp, pi_f),
                 float(pd.difference), 2 * old.V + 2 * new.V)
    sur_tol = 2 * old.V + old.rho_norm * abar_tol + old.rho * amax
    assert_close("surrogate", T.surrogate(fmdp, pi_f, new_f), float(pd.surrogate), sur_tol)
    assert_close("dsp", T.distribution_shift_penalty(fmdp, pi_f, new_f),
                 float(pd.distribution_shift_penalty), pdl_tol + sur_tol)


@pytest.mark.parametrize("index", range(len(RANDOM_CASES)), ids=[c[0] for c in RANDOM_CASES])
def test_tabular_control_matches_spec(index):
    """policy_iteration: V* to eV and a policy inside the spec's exact optimal sets; value_iteration
    (gamma < 1): V within tol/2 of V* and its greedy policy tol-optimal, judged exactly by the spec
    (mdp.md eq. (19))."""
    mdp, fmdp, _, _ = exact_case(index)
    opt = spec.optimal_control(mdp)
    A = mdp.num_actions
    pi_star = [[int(a == b) for b in range(A)] for a in opt.policy]
    tol = Tol(mdp, pi_star)
    pi_result = T.policy_iteration(fmdp)
    assert_close("V* (PI)", pi_result.V, fl(opt.V), tol.V)
    chosen = np.argmax(pi_result.policy, axis=1)
    assert all(int(a) in opt.optimal_actions[s] for s, a in enumerate(chosen)), (chosen, opt.optimal_actions)
    if mdp.gamma < 1:
        vi_tol = 1e-8
        vi = T.value_iteration(fmdp, tol=vi_tol)
        assert_close("V* (VI)", vi.V, fl(opt.V), vi_tol / 2 + tol.V)
        greedy = [[int(x) for x in row] for row in vi.policy]
        gap = max(v_star - v for v_star, v in zip(opt.V, spec.values(mdp, greedy), strict=True))
        assert gap <= vi_tol + tol.V, float(gap)


def test_tolerances_are_not_vacuous():
    """A perturbation of 100 eV (a wrong last digit far above the roundoff) is caught."""
    mdp, fmdp, pi, _ = exact_case(3)
    tol = Tol(mdp, pi)
    V = T.policy_evaluation(fmdp, to_float(pi))
    assert tol.V < 1e-12
    with pytest.raises(AssertionError, match="max error"):
        assert_close("V", V + 100 * tol.V, fl(spec.values(mdp, pi)), tol.V)


# ---------------------------------------------------------------------------------------------
# 3. The golden tabular vectors


@functools.cache
def vectors() -> tuple[dict, ...]:
    return tuple(tabular_vectors())


def test_vector_catalogue_is_well_formed():
    vs = vectors()
    ids = [v["id"] for v in vs]
    assert len(ids) == len(set(ids)) and 30 <= len(vs) <= 150
    used_flags = {f for v in vs for f in v["flags"]}
    assert used_flags == set(FLAGS)  # every documented flag exercised, none undocumented
    assert {v["reason"] for v in vs if v["result"] == "invalid"} == set(REASONS)
    for v in vs:
        assert v["id"].startswith("tabular/") and v["id"].endswith("/" + v["quantity"])
        assert v["quantity"] in QUANTITIES and v["result"] in ("valid", "invalid")
        assert v["flags"] == sorted(v["flags"])
        assert (v["expected"] is None) == (v["result"] == "invalid")


def test_vectors_are_deterministic():
    spec._values.cache_clear()  # regenerate from scratch, not from the spec's cache
    spec._occupancy.cache_clear()
    assert tabular_vectors() == list(vectors())


VALID_IDS = [v["id"] for v in vectors() if v["result"] == "valid"]
INVALID_IDS = [v["id"] for v in vectors() if v["result"] == "invalid"]


def vector(vector_id: str) -> dict:
    return next(v for v in vectors() if v["id"] == vector_id)


@pytest.mark.parametrize("vector_id", VALID_IDS)
def test_tabular_matches_vector(vector_id):
    v = vector(vector_id)
    inputs, exp, quantity = v["inputs"], v["expected"], v["quantity"]
    mdp = spec_mdp_from_inputs(inputs)  # exact, for the tolerances' norms and kappa only
    fmdp = tabular_mdp(inputs["P"], inputs["R"], inputs["rho0"], inputs["gamma"], inputs["terminal"])
    if quantity == "optimal":
        A = mdp.num_actions
        pi_star = [[int(a == b) for b in range(A)] for a in exp["pi_star"]]
        tol = Tol(mdp, pi_star)
        result = T.policy_iteration(fmdp)
        assert_close("V_star", result.V, fl(exp["V_star"]), tol.V)
        assert_close("Q_star", result.Q, fl(exp["Q_star"]), 2 * tol.V)
        chosen = np.argmax(result.policy, axis=1).tolist()
        assert all(a in exp["optimal_actions"][s] for s, a in enumerate(chosen))
        assert exp["pi_star"] == [min(acts) for acts in exp["optimal_actions"]]
        return
    pi = to_float(inputs["pi"])
    tol = Tol(mdp, inputs["pi"])
    if quantity == "values":
        assert_close("V", T.policy_evaluation(fmdp, pi), fl(exp["V"]), tol.V)
        assert_close("J", T.expected_return(fmdp, pi), fl(exp["J"]), 2 * tol.V)
    elif quantity == "q_values":
        assert_close("Q", T.q_values(fmdp, pi), fl(exp["Q"]), 2 * tol.V)
    elif quantity == "advantages":
        assert_close("A", T.advantages(fmdp, pi), fl(exp["A"]), 3 * tol.V)
    elif quantity in ("state_occupancy", "state_action_occupancy"):
        fn = T.state_occupancy if quantity == "state_occupancy" else T.state_action_occupancy
        for key, normalized, t in (("rho", False, tol.rho), ("d", True, tol.d)):
            got = fn(fmdp, pi, normalized=normalized)
            assert_close(key, got, fl(exp[key]), t)
            assert np.all(got[fl(exp[key]) == 0.0] == 0.0), f"{key}: unreachable states not exactly 0"
    elif quantity == "performance_difference":
        new = to_float(inputs["pi_new"])
        old_tol, new_tol = tol, Tol(mdp, inputs["pi_new"])
        abar = fl(exp["expected_advantage"])
        abar_tol = 4 * old_tol.V
        amax = float(np.max(np.abs(abar)))
        assert_close("expected_advantage", T.expected_advantage(fmdp, pi, new), abar, abar_tol)
        assert_close("rho_pi", T.state_occupancy(fmdp, pi, normalized=False), fl(exp["rho_pi"]), old_tol.rho)
        assert_close("rho_pi_new", T.state_occupancy(fmdp, new, normalized=False), fl(exp["rho_pi_new"]),
                     new_tol.rho)
        assert_close("J_pi", T.expected_return(fmdp, pi), fl(exp["J_pi"]), 2 * old_tol.V)
        assert_close("J_pi_new", T.expected_return(fmdp, new), fl(exp["J_pi_new"]), 2 * new_tol.V)
        pdl_tol = new_tol.rho_norm * abar_tol + new_tol.rho * amax
        assert_close("pdl_sum", T.performance_difference(fmdp, pi, new), fl(exp["pdl_sum"]), pdl_tol)
        sur_tol = 2 * old_tol.V + old_tol.rho_norm * abar_tol + old_tol.rho * amax
        assert_close("surrogate", T.surrogate(fmdp, pi, new), fl(exp["surrogate"]), sur_tol)
        assert_close("distribution_shift_penalty", T.distribution_shift_penalty(fmdp, pi, new),
                     fl(exp["distribution_shift_penalty"]), pdl_tol + sur_tol)
        assert exp["difference"] == exp["pdl_sum"]  # the identity, digit for digit
    else:
        raise AssertionError(f"unknown quantity {quantity}")


#: How tabular and the spec word each rejection (the reason vocabulary of specs/golden_tabular.py).
TABULAR_MESSAGES = {
    "P_row_sum_not_one": "P rows must sum to 1",
    "P_negative_probability": "P has a negative probability",
    "pi_row_sum_not_one": "pi rows must sum to 1",
    "pi_negative_probability": "pi has a negative probability",
    "rho0_sum_not_one": "rho0 rows must sum to 1",
    "gamma_above_one": r"gamma must lie in \[0, 1\], got 1.25",
    "gamma_negative": r"gamma must lie in \[0, 1\], got -0.5",
    "gamma_one_non_terminating_mdp": "gamma = 1 requires a policy that reaches a terminal state",
    "gamma_one_improper_policy": r"gamma = 1 requires a policy .* from states \[0\]",
    "terminal_not_absorbing": "terminal state 0 must be absorbing",
    "terminal_reward_nonzero": "terminal state 1 must pay zero reward",
    "shape_mismatch": r"rho0 must have shape \[S\]",
    "non_finite_input": "r contains NaN or inf",
}
SPEC_MESSAGES = {
    "P_row_sum_not_one": r"P\[0\]\[0\] must sum to exactly 1, sums to 7/8",
    "P_negative_probability": r"P\[0\]\[0\]\[0\] is a negative probability -1/4",
    "pi_row_sum_not_one": r"pi\[0\] must sum to exactly 1, sums to 3/4",
    "pi_negative_probability": r"pi\[0\]\[0\] is a negative probability -1/2",
    "rho0_sum_not_one": "rho0 must sum to exactly 1, sums to 1/2",
    "gamma_above_one": r"gamma must lie in \[0, 1\], got 5/4",
    "gamma_negative": r"gamma must lie in \[0, 1\], got -1/2",
    "gamma_one_non_terminating_mdp": "pi must reach a terminal state with probability 1",
    "gamma_one_improper_policy": "pi must reach a terminal state with probability 1",
    "terminal_not_absorbing": "terminal state 0 must be absorbing",
    "terminal_reward_nonzero": "terminal state 1 must pay zero reward",
    "shape_mismatch": r"rho0 must have shape \[2\]",
    "non_finite_input": r"r\[0\]\[1\] contains NaN or inf",
}


@pytest.mark.parametrize("vector_id", INVALID_IDS)
def test_invalid_vector_is_rejected_by_tabular_and_spec(vector_id):
    v = vector(vector_id)
    inputs, reason = v["inputs"], v["reason"]
    assert v["quantity"] == "values"
    with pytest.raises(ValueError, match=TABULAR_MESSAGES[reason]):
        fmdp = tabular_mdp(inputs["P"], inputs["R"], inputs["rho0"], inputs["gamma"], inputs["terminal"])
        T.policy_evaluation(fmdp, to_float(inputs["pi"]))
    with pytest.raises(ValueError, match=SPEC_MESSAGES[reason]):
        spec.values(spec_mdp_from_inputs(inputs), inputs["pi"])


def test_spec_rejects_non_rational_and_misshapen_input():
    good = next(c for c in tabular_cases() if c.name == "single_state")
    with pytest.raises(TypeError, match=r"P\[0\]\[0\]\[0\] must hold numbers, got a bool"):
        spec.finite_mdp([[[True], [1]]], good.R, good.rho0, good.gamma)
    with pytest.raises(ValueError, match="not a decimal or 'p/q' string"):
        spec.finite_mdp(good.P, [["one", 0]], good.rho0, good.gamma)
    with pytest.raises(ValueError, match=r"rho0\[0\] must be a number, got a sequence"):
        spec.finite_mdp(good.P, good.R, [[1]], good.gamma)
    with pytest.raises(ValueError, match=r"terminal must be 1 bools"):
        spec.finite_mdp(good.P, good.R, good.rho0, good.gamma, [1])
    with pytest.raises(ValueError, match=r"pi must have shape \[1, 2\]"):
        spec.values(good.mdp(), [[1, 0, 0]])
