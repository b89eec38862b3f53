"""Golden vectors of small finite MDPs from the exact spec ``specs.mdp`` (spec: specs/mdp.md).

``tabular_vectors()`` returns a list of dicts, one per (case, quantity), deterministic (the random
cases come from ``random.Random`` with fixed string seeds; no other randomness). ``tabular_cases()``
and ``invalid_tabular_cases()`` are the catalogue they are built from (also used by the tests).
Imports neither ``refimpl`` nor ``tabular``.

**Vector keys.**

``id``
    ``tabular/<case>/<quantity>``, unique and stable.
``quantity``
    what is asked for: ``values`` (V_pi and J(pi)), ``q_values``, ``advantages``,
    ``state_occupancy``, ``state_action_occupancy``, ``optimal`` (V*, Q*, pi*),
    ``performance_difference``.
``flags``
    the edges the vector exercises, sorted, from the vocabulary below (derived from the data).
``result``
    ``"valid"``, or ``"invalid"``: the input must be rejected (with an error), and ``reason``
    (from the reason vocabulary below) says why; ``expected`` is then ``null`` and ``flags`` empty.
``inputs``
    ``P`` ``[S][A][S]``; ``R`` ``[S][A]`` (expected reward of taking a in s) or ``[S][A][S]``
    (reward paid on the transition s -a-> s', mdp.md eq. (2)); ``gamma``; ``rho0`` ``[S]``, the
    initial state distribution; ``terminal`` ``[S]`` JSON booleans (absorbing zero-reward states,
    mdp.md eq. (3)); ``pi`` ``[S][A]`` (the policy evaluated; absent for ``optimal``); ``pi_new``
    ``[S][A]`` (only for ``performance_difference``: the new policy pi'). Numbers are strings:
    a dyadic rational (denominator a power of 2, every one here exact in float64) as its exact
    decimal expansion (``"0.375"``, ``"-1"``); any other rational as ``"p/q"`` in lowest terms
    (``"1/3"``, ``"99/100"``): the spec uses the exact rational, and a float64 implementation
    receives it correctly rounded (e.g. ``Fraction("1/3")`` -> float), an input perturbation of
    one unit roundoff that the tolerance rule below absorbs. Invalid vectors may also hold
    ``"nan"`` / ``"inf"``.
``comment``
    the purpose of the case (free text).
``expected``
    decimal strings with 50 significant digits (the exact rational correctly rounded,
    ``specs._exact.to_digits``; ``"0"`` is an exact zero), except action indices (JSON ints):

    - ``values``: ``V [S]`` (mdp.md eq. (7); Sutton & Barto 2018, section 3.5) and ``J`` = sum_s rho0(s) V(s)
      (eq. (10); Sutton & Barto 2018, section 3.3);
    - ``q_values``: ``Q [S][A]`` (eq. (8); Sutton & Barto 2018, section 3.5);
    - ``advantages``: ``A [S][A]`` = Q - V (eq. (9); Schulman et al. 2016, section 2);
    - ``state_occupancy``: ``rho [S]`` unnormalised, ``rho(s) = sum_t gamma^t P(s_t = s)`` (eq. (11)),
      and ``d [S]`` = rho / sum(rho), for gamma < 1 Kakade & Langford 2002's ``(1 - gamma) rho`` (eq. (12);
      Kakade & Langford 2002; Schulman et al. 2015, section 2);
      at gamma = 1 rho counts expected visits of non-terminal states (terminal states: 0);
    - ``state_action_occupancy``: ``rho [S][A]`` = rho(s) pi(a|s), ``d [S][A]`` = d(s) pi(a|s)
      (eq. (13); Kakade & Langford 2002; Schulman et al. 2015, section 2);
    - ``optimal``: ``V_star [S]``, ``Q_star [S][A]`` (eq. (15)-(16)), ``optimal_actions [S]`` (every
      action attaining max_a Q*(s, a), exactly), ``pi_star [S]`` (the lowest index among them; an
      implementation with another tie rule should accept any action of ``optimal_actions``);
    - ``performance_difference``: ``J_pi``, ``J_pi_new``, ``difference`` = J(pi') - J(pi),
      ``expected_advantage [S]`` = sum_a pi'(a|s) A_pi(s, a) (eq. (21)), ``rho_pi``, ``rho_pi_new``
      ``[S]`` (unnormalised), ``pdl_sum`` = sum_s rho_pi_new(s) expected_advantage(s), equal to
      ``difference`` (eq. (22); Kakade & Langford 2002, Lemma 6.1, whose ``1/(1 - gamma) E_{d_pi'}`` is this
      unnormalised
      sum), ``surrogate`` = J_pi + sum_s rho_pi(s) expected_advantage(s) (eq. (23); Schulman et al. 2015,
      eq. (3)),
      ``distribution_shift_penalty`` = difference of the two sums (eq. (24); Schulman et al. 2015, eq. (2)
      minus eq. (3)).

**Tolerance rule** (float64). Policy evaluation solves ``(I - gamma P_pi) V = r_pi``, whose
inverse has infinity norm ``kappa = 1/(1 - gamma)`` (at gamma = 1: the largest expected episode
length), so a backward-stable float64 solve is accurate to about ``n u kappa (|r| + |V|)``
absolute (u = 2^-53, n = S + A); ``tests/test_mdp_spec.py`` states the exact constants it uses.

**Flags** (an edge the vector exercises; every flag occurs in at least one vector):

- ``gamma_zero``: gamma = 0 (V = r_pi, rho = rho0).
- ``gamma_near_one``: 99/100 <= gamma < 1 (kappa >= 100).
- ``gamma_one_episodic``: gamma = 1, every policy involved proper (mdp.md eq. (6)).
- ``absorbing_state``: some state s has P(s|s, a) = 1 for every a.
- ``terminal_state``: some state is marked terminal.
- ``single_state``: S = 1.
- ``sparse_transitions``: a row P(.|s, a) of a non-absorbing state has an exact zero.
- ``transition_reward``: R is given per transition, ``[S][A][S]``.
- ``non_dyadic_input``: some input is a ``"p/q"`` rational not exact in float64.
- ``deterministic_policy``: pi (or pi') is one-hot in every state.
- ``unreachable_state``: an occupancy is exactly 0 at a state never reached from rho0 (not
  counting terminal states at gamma = 1, whose occupancy is 0 by convention).
- ``tie_in_optimal_policy``: a non-terminal state has more than one optimal action.
- ``identical_policies``: pi' = pi (expected advantage and difference exactly 0).
- ``worked_example``: the distribution-shift example of mdp.md section 7.1 (eq. (38):
  J(pi) = 8091/10^8, J(pi') = -90).

**Reasons** (``result = "invalid"``): ``P_row_sum_not_one``, ``P_negative_probability``,
``pi_row_sum_not_one``, ``pi_negative_probability``, ``rho0_sum_not_one``, ``gamma_above_one``,
``gamma_negative``, ``gamma_one_non_terminating_mdp`` (gamma = 1 and no terminal state: no policy
terminates), ``gamma_one_improper_policy`` (gamma = 1 and pi loops forever among non-terminal
states although a terminal state exists), ``terminal_not_absorbing``, ``terminal_reward_nonzero``,
``shape_mismatch``, ``non_finite_input``. Deviations are large (row sums 7/8, 3/4, 1/2; gamma
5/4, -1/2), so an implementation that accepts row sums within a tolerance (``tabular``: 1e-9)
must still reject them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from fractions import Fraction

import sympy as sp

from specs import mdp as spec
from specs._exact import to_digits

__all__ = [
    "DIGITS",
    "FLAGS",
    "REASONS",
    "QUANTITIES",
    "TabularCase",
    "InvalidTabularCase",
    "random_rational_mdp",
    "input_string",
    "tabular_cases",
    "invalid_tabular_cases",
    "tabular_vectors",
]

DIGITS = 50
QUANTITIES = (
    "values",
    "q_values",
    "advantages",
    "state_occupancy",
    "state_action_occupancy",
    "optimal",
    "performance_difference",
)
FLAGS = (
    "gamma_zero",
    "gamma_near_one",
    "gamma_one_episodic",
    "absorbing_state",
    "terminal_state",
    "single_state",
    "sparse_transitions",
    "transition_reward",
    "non_dyadic_input",
    "deterministic_policy",
    "unreachable_state",
    "tie_in_optimal_policy",
    "identical_policies",
    "worked_example",
)
REASONS = (
    "P_row_sum_not_one",
    "P_negative_probability",
    "pi_row_sum_not_one",
    "pi_negative_probability",
    "rho0_sum_not_one",
    "gamma_above_one",
    "gamma_negative",
    "gamma_one_non_terminating_mdp",
    "gamma_one_improper_policy",
    "terminal_not_absorbing",
    "terminal_reward_nonzero",
    "shape_mismatch",
    "non_finite_input",
)
GAMMA_NEAR_ONE = Fraction(99, 100)

F = Fraction  # exact inputs are written as Fractions (F(1, 3))


@dataclass(frozen=True)
class TabularCase:
    """One small MDP with the policies its vectors use (exact Fractions; nested lists).

    ``quantities``: the vectors made from it; ``extra_flags``: flags not derivable from the data
    (``worked_example``); ``purpose``: why the case exists."""

    name: str
    purpose: str
    P: list
    R: list
    rho0: list
    gamma: Fraction
    pi: list
    pi_new: list
    terminal: list | None = None
    quantities: tuple[str, ...] = QUANTITIES
    extra_flags: tuple[str, ...] = ()

    def mdp(self) -> spec.FiniteMDP:
        return spec.finite_mdp(self.P, self.R, self.rho0, self.gamma, self.terminal)


@dataclass(frozen=True)
class InvalidTabularCase:
    """Input that must be rejected: ``reason`` from ``REASONS``; ``inputs`` as written in the vector
    (strings), ``quantity`` the request that must fail."""

    name: str
    reason: str
    inputs: dict = field(default_factory=dict)
    quantity: str = "values"


# ----------------------------------------------------------------------------------------------
# Random rational MDPs


def _composition(rng: random.Random, total: int, parts: int) -> list[int]:
    """``parts`` non-negative integers summing to ``total`` (gaps between sorted random cut points)."""
    cuts = sorted(rng.randint(0, total) for _ in range(parts - 1))
    bounds = [0, *cuts, total]
    return [b - a for a, b in zip(bounds, bounds[1:], strict=False)]


def _distribution(rng: random.Random, size: int, dyadic: bool, grid: int, zeros: bool = False) -> list:
    """A rational distribution: multiples of 1/grid (grid a power of 2) when dyadic, every entry
    positive unless ``zeros``; else positive integer weights 1..6 over their sum (denominators
    such as 3, 5, 7, 11)."""
    if dyadic:
        if zeros:
            return [F(k, grid) for k in _composition(rng, grid, size)]
        return [F(k + 1, grid) for k in _composition(rng, grid - size, size)]
    weights = [rng.randint(1, 6) for _ in range(size)]
    return [F(w, sum(weights)) for w in weights]


def _reward(rng: random.Random) -> Fraction:
    return F(rng.randint(-8, 8), 8)  # multiples of 1/8 in [-1, 1]


def random_rational_mdp(seed: str, S: int, A: int, *, dyadic: bool = True, grid: int = 16,
                        zeros: bool = False, transition_reward: bool = False) -> tuple[list, ...]:
    """``(P, R, rho0, pi, pi_new)`` drawn from ``random.Random(seed)``: rational rows (see
    :func:`_distribution`; exact zeros in P only if ``zeros``), rewards in multiples of 1/8 in
    [-1, 1], policies in quarters (dyadic) or rational weights."""
    rng = random.Random(f"golden_tabular/{seed}")
    P = [[_distribution(rng, S, dyadic, grid, zeros) for _ in range(A)] for _ in range(S)]
    if transition_reward:
        R = [[[_reward(rng) for _ in range(S)] for _ in range(A)] for _ in range(S)]
    else:
        R = [[_reward(rng) for _ in range(A)] for _ in range(S)]
    rho0 = _distribution(rng, S, dyadic, grid)
    pi = [_distribution(rng, A, dyadic, 4 if A <= 4 else 8) for _ in range(S)]
    pi_new = pi
    while pi_new == pi and A > 1:  # a different new policy (redrawn from the same stream)
        pi_new = [_distribution(rng, A, dyadic, 4 if A <= 4 else 8) for _ in range(S)]
    return P, R, rho0, pi, pi_new


def _random_case(name: str, purpose: str, S: int, A: int, gamma: Fraction, **kwargs) -> TabularCase:
    P, R, rho0, pi, pi_new = random_rational_mdp(name, S, A, **kwargs)
    return TabularCase(name, purpose, P, R, rho0, gamma, pi, pi_new)


def _one_hot(actions: list[int], A: int) -> list[list[Fraction]]:
    return [[F(int(a == b)) for b in range(A)] for a in actions]


# ----------------------------------------------------------------------------------------------
# The catalogue


def tabular_cases() -> list[TabularCase]:
    """Every valid case (hand-picked edges plus random rational MDPs with fixed seeds)."""
    half, quarter = F(1, 2), F(1, 4)
    cases = [
        _random_case("random_s3_a2", "generic dyadic MDP, mid discount", 3, 2, F(1, 2)),
        _random_case("random_s4_a3", "generic dyadic MDP, larger, gamma 7/8", 4, 3, F(7, 8)),
        _random_case("random_s4_a2_sparse", "rows with exact zeros (1/4 grid over 4 states)", 4, 2,
                     F(3, 4), grid=4, zeros=True),
        _random_case("random_s3_a3_rational", "non-dyadic rational P, pi, gamma 2/3", 3, 3, F(2, 3),
                     dyadic=False),
        _random_case("random_s3_a2_transition_reward", "reward per transition r(s, a, s')", 3, 2,
                     F(3, 4), transition_reward=True),
        _random_case("gamma_zero", "gamma = 0: V = r_pi, rho = rho0, one step", 3, 2, F(0)),
        _random_case("gamma_near_one", "gamma = 99/100 (not dyadic): kappa = 100", 3, 2, F(99, 100)),
        _random_case("gamma_near_one_dyadic", "gamma = 1023/1024: kappa = 1024, exact float input",
                     3, 2, F(1023, 1024)),
    ]
    # An absorbing terminal state (zero reward) next to two transient states.
    cases.append(TabularCase(
        "absorbing_terminal", "terminal absorbing state: discounted occupancy accumulates there",
        P=[[[quarter, half, quarter], [0, quarter, F(3, 4)]],
           [[half, 0, half], [F(1, 8), F(3, 8), half]],
           [[0, 0, 1], [0, 0, 1]]],
        R=[[1, F(-1, 2)], [F(1, 4), F(3, 4)], [0, 0]],
        rho0=[half, half, 0], gamma=F(9, 10),
        pi=[[quarter, F(3, 4)], [half, half], [1, 0]], pi_new=[[1, 0], [0, 1], [half, half]],
        terminal=[False, False, True],
    ))
    # An absorbing, NON-terminal state that pays a reward for ever: V there is r / (1 - gamma).
    cases.append(TabularCase(
        "absorbing_rewarding", "absorbing non-terminal state paying 1/2 per step for ever",
        P=[[[half, half], [0, 1]], [[0, 1], [0, 1]]],
        R=[[F(-1, 4), -1], [half, half]],
        rho0=[1, 0], gamma=F(3, 4),
        pi=[[F(3, 4), quarter], [half, half]], pi_new=[[0, 1], [1, 0]],
    ))
    # gamma = 1 on a DAG (every policy proper): occupancy counts visits.
    cases.append(TabularCase(
        "gamma_one_episodic", "undiscounted episodic DAG: values are expected totals, rho visits",
        P=[[[0, half, half, 0], [0, 0, quarter, F(3, 4)]],
           [[0, 0, half, half], [0, 0, 0, 1]],
           [[0, 0, 0, 1], [0, 0, 0, 1]],
           [[0, 0, 0, 1], [0, 0, 0, 1]]],
        R=[[0, F(1, 8)], [1, F(-1, 2)], [F(3, 4), F(-1, 4)], [0, 0]],
        rho0=[F(3, 4), quarter, 0, 0], gamma=F(1),
        pi=[[half, half], [quarter, F(3, 4)], [F(1, 8), F(7, 8)], [half, half]],
        pi_new=[[1, 0], [half, half], [1, 0], [0, 1]],
        terminal=[False, False, False, True],
    ))
    P_det, R_det, rho0_det, _, _ = random_rational_mdp("deterministic_policy", 3, 3)
    cases.append(TabularCase(
        "deterministic_policy", "one-hot pi and pi': V solves a permutation-free system, A(s, pi(s)) = 0",
        P=P_det, R=R_det, rho0=rho0_det, gamma=F(5, 8),
        pi=_one_hot([2, 0, 1], 3), pi_new=_one_hot([0, 0, 2], 3),
    ))
    # Actions 1 and 2 identical everywhere and better than action 0 at state 0: an exact tie.
    row_a, row_b = [quarter, F(3, 4), 0], [half, 0, half]
    cases.append(TabularCase(
        "tie_in_optimal_policy", "duplicated optimal action: pi* needs a tie rule (lowest index)",
        P=[[[1, 0, 0], row_a, row_a], [row_b, [0, 0, 1], [0, 0, 1]], [[0, 1, 0], row_b, row_b]],
        R=[[-1, half, half], [quarter, quarter, quarter], [half, 0, 0]],
        rho0=[half, quarter, quarter], gamma=F(3, 4),
        pi=[[0, half, half], [quarter, half, quarter], [1, 0, 0]],
        pi_new=[[0, 0, 1], [0, 1, 0], [0, half, half]],
    ))
    # State 3 is never reached from rho0 (a point mass on 0): its occupancy is exactly 0.
    cases.append(TabularCase(
        "unreachable_state", "a state outside the reachable set: occupancy exactly 0, V still defined",
        P=[[[half, half, 0, 0], [0, half, half, 0]],
           [[quarter, 0, F(3, 4), 0], [0, 0, 1, 0]],
           [[1, 0, 0, 0], [0, half, half, 0]],
           [[0, 0, 0, 1], [quarter, quarter, quarter, quarter]]],
        R=[[half, 0], [-1, 1], [quarter, F(-3, 4)], [1, 1]],
        rho0=[1, 0, 0, 0], gamma=F(7, 8),
        pi=[[half, half], [quarter, F(3, 4)], [F(3, 4), quarter], [half, half]],
        pi_new=[[0, 1], [half, half], [1, 0], [0, 1]],
    ))
    cases.append(TabularCase(
        "single_state", "one state, two actions: V = r_pi / (1 - gamma), rho = 1 / (1 - gamma)",
        P=[[[1], [1]]], R=[[1, F(-1, 2)]], rho0=[1], gamma=F(15, 16),
        pi=[[quarter, F(3, 4)]], pi_new=[[1, 0]],
    ))
    P_id, R_id, rho0_id, pi_id, _ = random_rational_mdp("identical_policies", 3, 2)
    cases.append(TabularCase(
        "identical_policies", "pi' = pi: expected advantage and difference exactly 0 (mdp.md eq. (9))",
        P=P_id, R=R_id, rho0=rho0_id, gamma=F(7, 8), pi=pi_id, pi_new=pi_id,
        quantities=("performance_difference",),
    ))
    cases.append(_seed_001_distribution_shift())
    return cases


def _seed_001_distribution_shift() -> TabularCase:
    """The distribution-shift example of mdp.md section 7.1 (eq. (38)): s0 -a1-> s1 -b-> loses M."""
    gamma, M, eta, eta2 = F(9, 10), 100, F(1, 10**4), F(1, 10**3)
    to_end = [0, 0, 1]
    return TabularCase(
        "seed_001_distribution_shift",
        "a large distribution-shift penalty (mdp.md section 7.1, eq. (38))",
        P=[[to_end, [0, 1, 0]], [to_end, to_end], [to_end, to_end]],
        R=[[0, 0], [1, -M], [0, 0]],
        rho0=[1, 0, 0], gamma=gamma,
        pi=[[1 - eta, eta], [1 - eta2, eta2], [F(1, 2), F(1, 2)]],
        pi_new=[[0, 1], [0, 1], [1, 0]],
        terminal=[False, False, True],
        extra_flags=("worked_example",),
    )


def invalid_tabular_cases() -> list[InvalidTabularCase]:
    """Inputs that must be rejected, one per reason of ``REASONS``."""
    base = dict(
        P=[[["0.5", "0.5"], ["0.25", "0.75"]], [["1", "0"], ["0", "1"]]],
        R=[["1", "0"], ["-0.5", "0.25"]],
        gamma="0.5", rho0=["0.5", "0.5"], terminal=[False, False],
        pi=[["0.5", "0.5"], ["1", "0"]],
    )
    episodic = dict(  # state 1 terminal; action 0 at state 0 loops, action 1 terminates
        P=[[["1", "0"], ["0", "1"]], [["0", "1"], ["0", "1"]]],
        R=[["0.5", "1"], ["0", "0"]],
        gamma="1", rho0=["1", "0"], terminal=[False, True],
        pi=[["1", "0"], ["0.5", "0.5"]],
    )

    def variant(name, reason, source=base, **changes):
        inputs = {k: v for k, v in source.items()}
        inputs.update(changes)
        return InvalidTabularCase(name, reason, inputs)

    return [
        variant("invalid_P_row_sum", "P_row_sum_not_one",
                P=[[["0.5", "0.375"], ["0.25", "0.75"]], [["1", "0"], ["0", "1"]]]),
        variant("invalid_P_negative", "P_negative_probability",
                P=[[["-0.25", "1.25"], ["0.25", "0.75"]], [["1", "0"], ["0", "1"]]]),
        variant("invalid_pi_row_sum", "pi_row_sum_not_one", pi=[["0.5", "0.25"], ["1", "0"]]),
        variant("invalid_pi_negative", "pi_negative_probability", pi=[["-0.5", "1.5"], ["1", "0"]]),
        variant("invalid_rho0_sum", "rho0_sum_not_one", rho0=["0.25", "0.25"]),
        variant("invalid_gamma_above_one", "gamma_above_one", gamma="1.25"),
        variant("invalid_gamma_negative", "gamma_negative", gamma="-0.5"),
        variant("invalid_gamma_one_non_terminating", "gamma_one_non_terminating_mdp", gamma="1"),
        variant("invalid_gamma_one_improper_policy", "gamma_one_improper_policy", source=episodic),
        variant("invalid_terminal_not_absorbing", "terminal_not_absorbing", terminal=[True, False]),
        variant("invalid_terminal_reward", "terminal_reward_nonzero", source=episodic,
                R=[["0.5", "1"], ["0", "0.25"]], pi=[["0", "1"], ["1", "0"]]),
        variant("invalid_shape_rho0", "shape_mismatch", rho0=["0.5", "0.25", "0.25"]),
        variant("invalid_non_finite_reward", "non_finite_input", R=[["1", "nan"], ["-0.5", "0.25"]]),
    ]


# ----------------------------------------------------------------------------------------------
# Formatting


def _is_dyadic(q: Fraction) -> bool:
    return q.denominator & (q.denominator - 1) == 0


def input_string(x) -> str:
    """An exact input as a string: the exact decimal expansion of a dyadic rational (asserted
    exact in float64), else ``"p/q"`` in lowest terms."""
    q = Fraction(x)
    if not _is_dyadic(q):
        return f"{q.numerator}/{q.denominator}"
    if Fraction(float(q)) != q:
        raise ValueError(f"input {q} is dyadic but not exact in float64")
    k = q.denominator.bit_length() - 1  # q = n / 2^k = n 5^k / 10^k
    digits = str(abs(q.numerator) * 5**k).rjust(k + 1, "0")
    body = digits if k == 0 else f"{digits[:-k]}.{digits[-k:]}"
    return ("-" if q < 0 else "") + body


def _strings(x):
    if isinstance(x, (list, tuple)):
        return [_strings(item) for item in x]
    return input_string(x)


def _digits(x) -> str:
    """An exact rational correctly rounded to DIGITS significant digits; ``"0"`` for exact zero."""
    value = sp.Rational(x)
    return "0" if value == 0 else str(to_digits(value, DIGITS))


def _expected_strings(x):
    if isinstance(x, (list, tuple)):
        return [_expected_strings(item) for item in x]
    return _digits(x)


# ----------------------------------------------------------------------------------------------
# Flags and vectors


def _leaves(x):
    if isinstance(x, (list, tuple)):
        for item in x:
            yield from _leaves(item)
    else:
        yield Fraction(x)


def _is_deterministic(pi) -> bool:
    return all(sorted(Fraction(p) for p in row)[-1] == 1 for row in pi)


def _case_flags(case: TabularCase, mdp: spec.FiniteMDP, quantity: str) -> set[str]:
    S, A = mdp.num_states, mdp.num_actions
    flags = set(case.extra_flags)
    gamma = Fraction(case.gamma)
    flags |= {"gamma_zero"} if gamma == 0 else set()
    flags |= {"gamma_near_one"} if GAMMA_NEAR_ONE <= gamma < 1 else set()
    flags |= {"gamma_one_episodic"} if gamma == 1 else set()
    absorbing = [all(mdp.P[s][a][s] == 1 for a in range(A)) for s in range(S)]
    flags |= {"absorbing_state"} if any(absorbing) else set()
    flags |= {"terminal_state"} if case.terminal and any(case.terminal) else set()
    flags |= {"single_state"} if S == 1 else set()
    if any(p == 0 for s in range(S) if not absorbing[s] for a in range(A) for p in mdp.P[s][a]):
        flags.add("sparse_transitions")
    if isinstance(case.R[0][0], (list, tuple)):
        flags.add("transition_reward")
    policies = {"optimal": [], "performance_difference": [case.pi, case.pi_new]}.get(quantity, [case.pi])
    inputs = [case.P, case.R, case.rho0, case.gamma, *policies]
    if not all(_is_dyadic(q) for q in _leaves(inputs)):
        flags.add("non_dyadic_input")
    if any(_is_deterministic(pi) for pi in policies):
        flags.add("deterministic_policy")
    if quantity == "performance_difference" and case.pi == case.pi_new:
        flags.add("identical_policies")
    return flags


def _unvisited(mdp: spec.FiniteMDP, rho) -> set[str]:
    """``unreachable_state`` when the occupancy is exactly 0 at a state never reached from rho0 (a
    terminal state at gamma = 1 has occupancy 0 by convention, mdp.md section 1: not counted)."""
    never = [x == 0 and not (mdp.gamma == 1 and mdp.terminal[s]) for s, x in enumerate(rho)]
    return {"unreachable_state"} if any(never) else set()


def _expected(case: TabularCase, mdp: spec.FiniteMDP, quantity: str) -> tuple[dict, set[str]]:
    """The exact expected values of one quantity, and the flags they reveal."""
    pi = case.pi
    if quantity == "values":
        return {"V": spec.values(mdp, pi), "J": spec.expected_return(mdp, pi)}, set()
    if quantity == "q_values":
        return {"Q": spec.q_values(mdp, pi)}, set()
    if quantity == "advantages":
        return {"A": spec.advantages(mdp, pi)}, set()
    if quantity == "state_occupancy":
        rho = spec.state_occupancy(mdp, pi)
        flags = _unvisited(mdp, rho)
        return {"rho": rho, "d": spec.state_occupancy(mdp, pi, normalized=True)}, flags
    if quantity == "state_action_occupancy":
        rho = spec.state_occupancy(mdp, pi)
        flags = _unvisited(mdp, rho)
        return {
            "rho": spec.state_action_occupancy(mdp, pi),
            "d": spec.state_action_occupancy(mdp, pi, normalized=True),
        }, flags
    if quantity == "optimal":
        opt = spec.optimal_control(mdp)
        ties = any(len(acts) > 1 for s, acts in enumerate(opt.optimal_actions) if not mdp.terminal[s])
        return {
            "V_star": opt.V,
            "Q_star": opt.Q,
            "pi_star": list(opt.policy),
            "optimal_actions": [list(acts) for acts in opt.optimal_actions],
        }, {"tie_in_optimal_policy"} if ties else set()
    if quantity == "performance_difference":
        pd = spec.performance_difference(mdp, pi, case.pi_new)
        if pd.difference != pd.pdl_sum or pd.J_pi_new != pd.surrogate + pd.distribution_shift_penalty:
            raise AssertionError(f"{case.name}: the performance-difference identity fails exactly")
        values = {name: getattr(pd, name) for name in (
            "J_pi", "J_pi_new", "difference", "expected_advantage", "rho_pi", "rho_pi_new", "pdl_sum",
            "surrogate", "distribution_shift_penalty")}
        flags = _unvisited(mdp, pd.rho_pi) | _unvisited(mdp, pd.rho_pi_new)
        return values, flags
    raise ValueError(f"quantity must be one of {QUANTITIES}, got {quantity!r}")


def _format_expected(values: dict) -> dict:
    out = {}
    for key, value in values.items():
        if key in ("pi_star", "optimal_actions"):
            out[key] = value  # action indices: JSON ints
        else:
            out[key] = _expected_strings(value)
    return out


def _inputs(case: TabularCase, quantity: str) -> dict:
    inputs = {
        "P": _strings(case.P),
        "R": _strings(case.R),
        "gamma": input_string(case.gamma),
        "rho0": _strings(case.rho0),
        "terminal": list(case.terminal) if case.terminal else [False] * len(case.P),
    }
    if quantity != "optimal":
        inputs["pi"] = _strings(case.pi)
    if quantity == "performance_difference":
        inputs["pi_new"] = _strings(case.pi_new)
    return inputs


def tabular_vectors() -> list[dict]:
    """Every tabular golden vector (module docstring): valid ones from :func:`tabular_cases`, one
    per case and quantity, then the invalid ones from :func:`invalid_tabular_cases`."""
    out = []
    for case in tabular_cases():
        mdp = case.mdp()
        for quantity in case.quantities:
            values, revealed = _expected(case, mdp, quantity)
            out.append({
                "id": f"tabular/{case.name}/{quantity}",
                "quantity": quantity,
                "flags": sorted(_case_flags(case, mdp, quantity) | revealed),
                "result": "valid",
                "comment": case.purpose,
                "inputs": _inputs(case, quantity),
                "expected": _format_expected(values),
            })
    for bad in invalid_tabular_cases():
        out.append({
            "id": f"tabular/{bad.name}/{bad.quantity}",
            "quantity": bad.quantity,
            "flags": [],
            "result": "invalid",
            "reason": bad.reason,
            "comment": f"must be rejected: {bad.reason}",
            "inputs": bad.inputs,
            "expected": None,
        })
    return out
