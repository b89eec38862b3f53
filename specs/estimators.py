"""Exact sympy forms of the sampled return, advantage and importance-sampling estimators
(spec: specs/estimators.md).

Each ``*_exprs`` function builds, for ONE row of a rollout, the list of sympy expressions of an
estimator at every step t directly from its definition (explicit finite sums over the episode
segment, never the recursions used by fast code), from sympy (or plain number) rewards, values,
flags and discounts. ``evaluate`` turns them into certain 50-digit numbers, ``evaluate_float64``
into correctly rounded float64 (``specs._exact``). The ``prove_*`` / ``verify_*``
functions are the symbolic facts of estimators.md (and errata.md entries 2, 6 and 7); each returns True or
raises AssertionError.
Imports neither ``refimpl`` nor ``tabular``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import sympy as sp

from specs._exact import exact, to_digits, to_float64

__all__ = [
    "segment_end",
    "discounted_return_exprs",
    "n_step_return_exprs",
    "td_error_exprs",
    "gae_exprs",
    "lambda_return_exprs",
    "nstep_mixture_exprs",
    "evaluate",
    "evaluate_float64",
    "importance_weight_exprs",
    "is_estimate_expr",
    "snis_estimate_expr",
    "trajectory_weight_expr",
    "trajectory_is_expr",
    "per_decision_is_expr",
    "trajectory_weight_variance",
    "snis_expectation",
    "prove_gae_is_normalised_nstep_mixture",
    "prove_lambda_return_is_gae_plus_value",
    "verify_erratum_004_gae",
    "prove_seed_000_lambda_return_form",
    "prove_trajectory_weight_variance",
    "prove_is_unbiased",
]


_exact = exact  # floats become their exact binary value; sympy objects and ints are kept


def _row(xs, name: str) -> list[sp.Expr]:
    return [_exact(x) for x in xs]


def segment_end(t: int, terminated: Sequence[bool], truncated: Sequence[bool]) -> int:
    """estimators.md eq. (0): the last step ``j >= t`` of the episode segment containing t (the
    first terminated or truncated step from t, or the row's last step)."""
    T = len(terminated)
    for j in range(t, T):
        if terminated[j] or truncated[j]:
            return j
    return T - 1


def _tail(j: int, terminated, next_values) -> sp.Expr:
    """The bootstrap value after the segment end j: 0 if terminated, else next_values[j]."""
    return sp.Integer(0) if terminated[j] else next_values[j]


def discounted_return_exprs(rewards, terminated, truncated, gamma, next_values=None) -> list[sp.Expr]:
    """eq. (1)-(2): ``G_t = sum_{i=t}^{j} gamma^(i-t) r_i + gamma^(j-t+1) [not terminated_j] V'_j``
    with j the segment end. ``next_values`` may be None only if no step needs a bootstrap."""
    r, g = _row(rewards, "rewards"), _exact(gamma)
    nv = None if next_values is None else _row(next_values, "next_values")
    out = []
    for t in range(len(r)):
        j = segment_end(t, terminated, truncated)
        total = sum((g ** (i - t) * r[i] for i in range(t, j + 1)), sp.Integer(0))
        if not terminated[j]:
            if nv is None:
                raise ValueError("next_values is required: a segment ends without termination")
            total += g ** (j - t + 1) * nv[j]
        out.append(total)
    return out


def n_step_return_exprs(rewards, next_values, terminated, truncated, gamma, n: int) -> list[sp.Expr]:
    """eq. (3): ``G^(n)_t = sum_{i=t}^{e} gamma^(i-t) r_i + gamma^(e-t+1) [not terminated_e] V'_e``
    with ``e = min(t + n - 1, segment end)``."""
    r, nv, g = _row(rewards, "rewards"), _row(next_values, "next_values"), _exact(gamma)
    out = []
    for t in range(len(r)):
        e = min(t + n - 1, segment_end(t, terminated, truncated))
        total = sum((g ** (i - t) * r[i] for i in range(t, e + 1)), sp.Integer(0))
        out.append(total + g ** (e - t + 1) * _tail(e, terminated, nv))
    return out


def td_error_exprs(rewards, values, next_values, terminated, gamma) -> list[sp.Expr]:
    """eq. (4): ``delta_t = r_t + gamma [not terminated_t] V'_t - V_t``."""
    r, v, nv, g = _row(rewards, "r"), _row(values, "v"), _row(next_values, "nv"), _exact(gamma)
    return [r[t] + g * _tail(t, terminated, nv) - v[t] for t in range(len(r))]


def gae_exprs(rewards, values, next_values, terminated, truncated, gamma, lam) -> list[sp.Expr]:
    """eq. (5): ``A_t = sum_{i=t}^{j} (gamma lam)^(i-t) delta_i`` over the segment (Schulman et al. 2016,
    eq. (16))."""
    delta = td_error_exprs(rewards, values, next_values, terminated, gamma)
    gl = _exact(gamma) * _exact(lam)
    out = []
    for t in range(len(delta)):
        j = segment_end(t, terminated, truncated)
        out.append(sum((gl ** (i - t) * delta[i] for i in range(t, j + 1)), sp.Integer(0)))
    return out


def nstep_mixture_exprs(rewards, values, next_values, terminated, truncated, gamma, lam) -> list[sp.Expr]:
    """eq. (7): ``(1 - lam) sum_{n=1}^{m-1} lam^(n-1) A^(n)_t + lam^(m-1) A^(m)_t`` with
    ``A^(n)_t = G^(n)_t - V_t`` and ``m = j - t + 1`` the steps left in the segment (``A^(m)`` is
    the Monte-Carlo term); the (1 - lam)-normalised form of Schulman et al. 2016, eq. (16) (errata.md entry
    6)."""
    v, lam_ = _row(values, "values"), _exact(lam)
    T = len(v)
    adv = {n: n_step_return_exprs(rewards, next_values, terminated, truncated, gamma, n)
           for n in range(1, T + 1)}
    out = []
    for t in range(T):
        m = segment_end(t, terminated, truncated) - t + 1
        mix = sum(((1 - lam_) * lam_ ** (n - 1) * (adv[n][t] - v[t]) for n in range(1, m)), sp.Integer(0))
        out.append(mix + lam_ ** (m - 1) * (adv[m][t] - v[t]))
    return out


def lambda_return_exprs(rewards, next_values, terminated, truncated, gamma, lam) -> list[sp.Expr]:
    """eq. (6): ``G^lam_t = (1 - lam) sum_{n=1}^{m-1} lam^(n-1) G^(n)_t + lam^(m-1) G^(m)_t``."""
    zeros = [0] * len(rewards)
    return nstep_mixture_exprs(rewards, zeros, next_values, terminated, truncated, gamma, lam)


def evaluate(exprs, digits: int = 50) -> list[sp.Float]:
    """Each expression correctly rounded to ``digits`` significant digits (certain:
    ``specs._exact.to_digits``)."""
    evaluators: dict = {}
    return [to_digits(e, digits, evaluators) for e in exprs]


def evaluate_float64(exprs) -> list[float]:
    """Each expression correctly rounded to float64 (``specs._exact.to_float64``)."""
    evaluators: dict = {}
    return [to_float64(e, evaluators) for e in exprs]


def importance_weight_exprs(target_logp, behavior_logp) -> list[sp.Expr]:
    """eq. (8): ``w = exp(target_logp - behavior_logp)`` elementwise (one row)."""
    t, b = _row(target_logp, "target_logp"), _row(behavior_logp, "behavior_logp")
    if len(t) != len(b):
        raise ValueError("target_logp and behavior_logp must have the same length")
    return [sp.exp(x - y) for x, y in zip(t, b, strict=True)]


def is_estimate_expr(f, weights) -> sp.Expr:
    """eq. (9): ``(1/N) sum_i w_i f_i`` over N samples."""
    f, w = _row(f, "f"), _row(weights, "weights")
    if len(f) != len(w) or not f:
        raise ValueError("f and weights must be non-empty and of equal length")
    return sum((wi * fi for wi, fi in zip(w, f, strict=True)), sp.Integer(0)) / len(f)


def snis_estimate_expr(f, weights) -> sp.Expr:
    """eq. (10): ``sum_i w_i f_i / sum_i w_i`` (ValueError when the weights sum to 0 or one is < 0)."""
    f, w = _row(f, "f"), _row(weights, "weights")
    if len(f) != len(w) or not f:
        raise ValueError("f and weights must be non-empty and of equal length")
    if any(wi < 0 for wi in w) or sum(w) == 0:
        raise ValueError("weights must be >= 0 with a positive sum")
    return sum((wi * fi for wi, fi in zip(w, f, strict=True)), sp.Integer(0)) / sum(w)


def trajectory_weight_expr(target_logp, behavior_logp, mask) -> sp.Expr:
    """eq. (11): ``w(tau) = exp(sum_t mask_t (target_logp_t - behavior_logp_t))`` for one episode."""
    t, b = _row(target_logp, "target_logp"), _row(behavior_logp, "behavior_logp")
    return sp.exp(sum((x - y for x, y, m in zip(t, b, mask, strict=True) if m), sp.Integer(0)))


def trajectory_is_expr(rewards, target_logp, behavior_logp, mask, gamma) -> sp.Expr:
    """eq. (12): ``w(tau) sum_t mask_t gamma^t r_t`` (t the column index; the episode starts at 0)."""
    r, g = _row(rewards, "rewards"), _exact(gamma)
    ret = sum((g**t * r[t] for t in range(len(r)) if mask[t]), sp.Integer(0))
    return trajectory_weight_expr(target_logp, behavior_logp, mask) * ret


def per_decision_is_expr(rewards, target_logp, behavior_logp, mask, gamma) -> sp.Expr:
    """eq. (13): ``sum_t mask_t gamma^t (prod_{i <= t, mask_i} pi'(a_i|s_i) / pi(a_i|s_i)) r_t``."""
    r, g = _row(rewards, "rewards"), _exact(gamma)
    t_, b = _row(target_logp, "target_logp"), _row(behavior_logp, "behavior_logp")
    total, log_w = sp.Integer(0), sp.Integer(0)
    for t in range(len(r)):
        if mask[t]:
            log_w += t_[t] - b[t]
            total += g**t * sp.exp(log_w) * r[t]
    return total


def trajectory_weight_variance(p, q, H: int) -> sp.Expr:
    """eq. (11a); mdp.md section 7.2: ``Var_pi[w(tau)] = (q^2/p + (1-q)^2/(1-p))^H - 1``."""
    p, q = _exact(p), _exact(q)
    return (q**2 / p + (1 - q) ** 2 / (1 - p)) ** H - 1


def snis_expectation(p, q, f, N: int) -> sp.Expr:
    """eq. (10b): the exact ``E_{x_1..N ~ q}[sum w_i f_i / sum w_i]`` with ``w = p / q``, by summing
    over all ``K^N`` sample tuples (rational when the inputs are)."""
    p, q, f = _row(p, "p"), _row(q, "q"), _row(f, "f")
    total = sp.Integer(0)
    for tup in itertools.product(range(len(p)), repeat=N):
        prob = sp.Mul(*[q[i] for i in tup])
        w = [p[i] / q[i] for i in tup]
        total += prob * sum(wi * f[i] for wi, i in zip(w, tup, strict=True)) / sum(w)
    return sp.nsimplify(total) if all(x.is_Rational for x in p + q + f) else total


# ----------------------------------------------------------------------------------- symbolic facts


def _symbolic_row(T: int):
    r = sp.symbols(f"r0:{T}", real=True)
    v = sp.symbols(f"v0:{T + 1}", real=True)  # v_T is the value after the row's last step
    gamma, lam = sp.symbols("gamma lambda", positive=True)
    return list(r), list(v), gamma, lam


def prove_gae_is_normalised_nstep_mixture(T: int) -> bool:
    """eq. (7) = eq. (5) symbolically for one episode of T steps with consistent values
    (``next_values_t = V_{t+1}``): GAE is the ``(1 - lam)``-weighted mixture of n-step
    advantages with tail weight ``lam^(T - t - 1)`` on the Monte-Carlo term."""
    r, v, gamma, lam = _symbolic_row(T)
    flags = [False] * T
    for trunc_last in (False, True):
        truncated = flags[:-1] + [trunc_last]
        gae = gae_exprs(r, v[:T], v[1:], flags, truncated, gamma, lam)
        mix = nstep_mixture_exprs(r, v[:T], v[1:], flags, truncated, gamma, lam)
        for a, b in zip(gae, mix, strict=True):
            assert sp.expand(a - b) == 0, (a, b)
    return True


def prove_lambda_return_is_gae_plus_value(T: int) -> bool:
    """eq. (6) = eq. (5) + V: ``G^lam_t = A^GAE_t + V_t`` (Schulman et al. 2016; Sutton & Barto 2018,
    section 12.1) for one episode of T steps."""
    r, v, gamma, lam = _symbolic_row(T)
    flags = [False] * T
    gae = gae_exprs(r, v[:T], v[1:], flags, flags, gamma, lam)
    lr = lambda_return_exprs(r, v[1:], flags, flags, gamma, lam)
    for t in range(T):
        assert sp.expand(lr[t] - gae[t] - v[t]) == 0
    return True


def prove_seed_000_lambda_return_form(T: int) -> bool:
    """A closed form of the lambda-return, ``sum_k (gamma lam)^k (r_k + gamma (1 - lam)
    V(s_{k+1}))``, on an episode of T steps bootstrapped from ``V(s_T)`` at the end: it equals
    eq. (6) plus the tail ``(gamma lam)^T V(s_T)``, and its A3C(k) terms are the n-step returns
    with ``n = k + 1`` (eq. (3))."""
    r, v, gamma, lam = _symbolic_row(T)
    flags = [False] * T
    lr = lambda_return_exprs(r, v[1:], flags, flags, gamma, lam)[0]
    closed = sum((gamma * lam) ** k * (r[k] + gamma * (1 - lam) * v[k + 1]) for k in range(T))
    assert sp.expand(lr - closed - (gamma * lam) ** T * v[T]) == 0
    for k in range(T):
        a3c = sum(gamma**i * r[i] for i in range(k + 1)) + gamma ** (k + 1) * v[k + 1]
        assert sp.expand(n_step_return_exprs(r, v[1:], flags, flags, gamma, k + 1)[0] - a3c) == 0
    return True


def verify_erratum_004_gae(n: int = 4) -> bool:
    """The GAE derivation (Schulman et al. 2016, eq. (16); errata.md entries 6-7): (a) the plain sum
    ``sum_{k=1}^{n} lam^(k-1) A^(k)`` has weight
    ``(1 - lam^n) / (1 - lam)`` on ``delta_t`` (not 1), so it needs the ``(1 - lam)`` normalisation
    and, on a finite rollout, the tail weight ``lam^(n-1)`` on the longest term; (b) the third
    term of ``A^(3)`` is ``gamma^2 delta_{t+2}`` (errata.md entry 7); (c) the
    Monte-Carlo end is lam = 1, where eq. (7) is ``A^(n)`` (errata.md entry 6)."""
    delta = sp.symbols(f"delta0:{n}", real=True)
    gamma, lam = sp.symbols("gamma lambda", positive=True)

    def a_k(k):  # A^(k)_t = sum_{i<k} gamma^i delta_{t+i}
        return sum(gamma**i * delta[i] for i in range(k))

    plain = sum(lam ** (k - 1) * a_k(k) for k in range(1, n + 1))
    coeff0 = sp.expand(plain).coeff(delta[0])
    assert sp.simplify(coeff0 - (1 - lam**n) / (1 - lam)) == 0
    assert sp.simplify(coeff0 - 1) != 0
    normalised = (1 - lam) * sum(lam ** (k - 1) * a_k(k) for k in range(1, n)) + lam ** (n - 1) * a_k(n)
    gae = sum((gamma * lam) ** i * delta[i] for i in range(n))
    assert sp.expand(normalised - gae) == 0
    assert sp.expand(a_k(3) - delta[0] - gamma * delta[1]) == gamma**2 * delta[2]
    assert sp.expand(normalised.subs(lam, 1) - a_k(n)) == 0
    assert sp.expand(normalised.subs(lam, 0) - delta[0]) == 0
    return True


def prove_trajectory_weight_variance(H: int) -> bool:
    """eq. (11a) by summing over all ``2^H`` action sequences of the behaviour policy with
    symbolic p, q: ``E[w] = 1`` and ``E[w^2] - 1`` equals the closed form."""
    p, q = sp.symbols("p q", positive=True)
    mean, second = sp.Integer(0), sp.Integer(0)
    for actions in itertools.product((0, 1), repeat=H):
        prob = sp.Mul(*[p if a else 1 - p for a in actions])
        w = sp.Mul(*[q / p if a else (1 - q) / (1 - p) for a in actions])
        mean += prob * w
        second += prob * w**2
    assert sp.simplify(mean - 1) == 0
    assert sp.simplify(second - 1 - trajectory_weight_variance(p, q, H)) == 0
    return True


def prove_is_unbiased(K: int = 3) -> bool:
    """eq. (9), Sutton & Barto 2018, section 5.5: ``sum_x q(x) (p(x)/q(x)) f(x) = sum_x p(x) f(x)``
    symbolically."""
    p = sp.symbols(f"p0:{K}", positive=True)
    q = sp.symbols(f"q0:{K}", positive=True)
    f = sp.symbols(f"f0:{K}", real=True)
    lhs = sum(q[i] * (p[i] / q[i]) * f[i] for i in range(K))
    assert sp.simplify(lhs - sum(p[i] * f[i] for i in range(K))) == 0
    return True
