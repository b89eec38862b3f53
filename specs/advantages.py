"""Exact forms of the group-relative advantages and of their exact expected-gradient factors
(spec: specs/advantages.md).

``group_advantages_exact`` evaluates advantages.md eq. (1)-(6), (14)-(15) with sympy numbers (rationals and
square roots), group by group, straight from the equations. ``binary_reward_gradient_factor``
is eq. (13): for 0/1 rewards the expected gradient of the group-advantage policy-gradient term is
``c_G(p) grad J`` with the factor ``c_G(p) = E[A_1 | R_1 = 1] - E[A_1 | R_1 = 0]`` a polynomial
(in p, times constants) obtained from binomial sums. Imports neither ``refimpl`` nor ``tabular``.
"""

from __future__ import annotations

import itertools

import sympy as sp

from specs._exact import exact, to_float64

__all__ = [
    "group_advantages_exact",
    "group_advantages_float64",
    "binary_reward_gradient_factor",
    "conditional_binary_advantage",
    "signal_probability",
    "upweighted_group_weight",
    "upweighted_gradient_scale",
    "atypical_selection_gradient_factor",
]


_exact = exact  # floats become their exact binary value


def group_advantages_float64(rewards, group_ids, **conventions) -> list[float]:
    """``group_advantages_exact`` correctly rounded to float64 (``specs._exact.to_float64``: 0 or
    a subnormal on underflow; advantages.md "Range")."""
    evaluators: dict = {}
    return [to_float64(v, evaluators) for v in group_advantages_exact(rewards, group_ids, **conventions)]


def _std(values: list[sp.Expr], std: str, eps, eps_inside_sqrt: bool) -> sp.Expr:
    """eq. (3)-(4): sqrt(var + eps) or sqrt(var) + eps, var over n (population) or n - 1 (sample)."""
    n = len(values)
    mean = sum(values) / n
    sum_sq = sum((v - mean) ** 2 for v in values)
    var = sum_sq / (n if std == "population" else n - 1)
    eps = _exact(eps)
    return sp.sqrt(var + eps) if eps_inside_sqrt else sp.sqrt(var) + eps


def _centred(values: list[sp.Expr], leave_one_out: bool) -> list[sp.Expr]:
    """eq. (1)-(2): R_i - mean(R), or R_i - mean_{j != i} R_j."""
    n = len(values)
    if leave_one_out:
        return [v - (sum(values) - v) / (n - 1) for v in values]
    mean = sum(values) / n
    return [v - mean for v in values]


def group_advantages_exact(
    rewards, group_ids, *, scale: str, singleton: str, std: str | None = None, eps=None,
    eps_inside_sqrt: bool | None = None, zero_variance: str | None = None, leave_one_out: bool = False,
) -> list[sp.Expr]:
    """advantages.md eq. (1)-(6), (14)-(15) exactly (floats are taken as their exact binary values).

    Same arguments and degenerate-case rules as ``refimpl.advantages.group_advantages``; returns
    one sympy number per sample. Raises ValueError where eq. (6) says "error".
    """
    r = [_exact(v) for v in rewards]
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(int(g), []).append(i)
    centred: list[sp.Expr] = [sp.Integer(0)] * len(r)
    is_singleton = [False] * len(r)
    constant = [False] * len(r)
    if singleton == "raw" and scale not in ("group", "none"):
        raise ValueError("singleton='raw' needs scale 'group' or 'none'")
    for members in groups.values():
        values = [r[i] for i in members]
        if len(members) == 1:
            if singleton == "error":
                raise ValueError("singleton group")
            is_singleton[members[0]] = True
            if singleton == "raw":  # eq. (15): mean 0
                centred[members[0]] = values[0]
            continue
        for i, c in zip(members, _centred(values, leave_one_out), strict=True):
            centred[i] = c
            constant[i] = len(set(values)) == 1
    if scale == "none":
        return centred
    if scale == "group":
        out = []
        for members in groups.values():
            if len(members) == 1:
                if singleton == "raw":  # eq. (15): std 1, so s = eq. (4) at var = 1
                    e = _exact(eps)
                    unit = sp.sqrt(1 + e) if eps_inside_sqrt else 1 + e
                    out.append((members[0], centred[members[0]], unit))
                continue
            s = _std([r[i] for i in members], std, eps, eps_inside_sqrt)
            out.extend((i, centred[i], s) for i in members)
    elif scale == "batch":
        s = _std(centred, std, eps, eps_inside_sqrt)
        batch_constant = all(constant[i] or is_singleton[i] for i in range(len(r)))
        constant = [batch_constant and not is_singleton[i] for i in range(len(r))]
        out = [(i, centred[i], s) for i in range(len(r)) if not is_singleton[i]]
    elif scale == "batch_rewards":
        # eq. (14): the std (3)-(4) of all N rewards about the batch mean (TRL scale_rewards="batch");
        # zero variance means every reward of the batch is equal.
        s = _std(r, std, eps, eps_inside_sqrt) if len(r) > 1 else _std(r, "population", eps, eps_inside_sqrt)
        constant = [len(set(r)) == 1 and not is_singleton[i] for i in range(len(r))]
        out = [(i, centred[i], s) for i in range(len(r)) if not is_singleton[i]]
    else:
        raise ValueError(f"unknown scale {scale!r}")
    result: list[sp.Expr] = [sp.Integer(0)] * len(r)
    for i, c, s in out:
        if constant[i]:
            if zero_variance == "error" or (zero_variance == "formula" and s == 0):
                raise ValueError("zero-variance group")
            if zero_variance == "zero":
                continue
        result[i] = c / s
    return result


def conditional_binary_advantage(
    reward: int, group_size: int, p: sp.Expr, *, scale: str, std: str | None = None, eps=0,
    eps_inside_sqrt: bool = True, leave_one_out: bool = False,
) -> sp.Expr:
    """eq. (12): ``a(R) = E[A_1 | R_1 = R]`` for 0/1 rewards, the other G - 1 rewards i.i.d.
    Bernoulli(p): a binomial sum over the number k of other successes. Zero-variance groups (all
    rewards equal) have advantage 0 (their centred value is 0 whatever the convention)."""
    G = group_size
    total = sp.Integer(0)
    for k in range(G):
        values = [sp.Integer(reward)] + [sp.Integer(1)] * k + [sp.Integer(0)] * (G - 1 - k)
        weight = sp.binomial(G - 1, k) * p**k * (1 - p) ** (G - 1 - k)
        if len(set(values)) == 1:
            continue
        centred = _centred(values, leave_one_out)[0]
        if scale == "group":
            centred = centred / _std(values, std, eps, eps_inside_sqrt)
        elif scale != "none":
            raise ValueError("scale must be 'group' or 'none' (the batch std couples all prompts)")
        total += weight * centred
    return sp.expand(total)


def binary_reward_gradient_factor(group_size: int, p: sp.Expr, **conventions) -> sp.Expr:
    """eq. (13): ``c_G(p) = a(1) - a(0)``: for 0/1 rewards ``E[A_i grad log pi(y_i)] = c_G(p) grad J``
    with ``J = p`` the success probability (``conventions`` as in ``conditional_binary_advantage``)."""
    return sp.simplify(conditional_binary_advantage(1, group_size, p, **conventions)
                       - conditional_binary_advantage(0, group_size, p, **conventions))


def signal_probability(group_size: int, p: sp.Expr) -> sp.Expr:
    """eq. (17): ``q = 1 - p^G - (1 - p)^G``, the probability that a group of G 0/1 rewards with
    success probability p is not constant (is kept by dynamic sampling)."""
    return 1 - p**group_size - (1 - p) ** group_size


def upweighted_group_weight(other_signal_probabilities) -> sp.Expr:
    """eq. (17): ``w_b = E[1 / (1 + K_{-b})] = int_0^1 prod_{c != b} (1 - q_c + q_c x) dx`` with
    ``K_{-b}`` the number of kept groups among the others (independent Bernoulli(q_c)); since
    ``E[x^K] = prod_c (1 - q_c + q_c x)`` and ``1 / (1 + k) = int_0^1 x^k dx``."""
    x = sp.Symbol("x")
    generating = sp.Integer(1)
    for q in other_signal_probabilities:
        generating *= 1 - q + q * x
    return sp.integrate(sp.expand(generating), (x, 0, 1))


def upweighted_gradient_scale(q: sp.Expr, num_groups: int) -> sp.Expr:
    """eq. (17), B groups of one prompt (all with signal probability q): the dynamic-sampling
    estimator upweighted by 1 / (1 - f) has expected gradient ``(1 - (1 - q)^B) / q`` times the
    unfiltered one (``B w`` with ``w = upweighted_group_weight([q] * (B - 1))``, summed in closed
    form: ``B int_0^1 (1 - q + q x)^(B - 1) dx``)."""
    return (1 - (1 - q) ** num_groups) / q


def atypical_selection_gradient_factor(oversampled: int, selected: int, p: sp.Expr) -> sp.Expr:
    """eq. (19): for 0/1 rewards with success probability p, G' = ``oversampled`` i.i.d. responses
    mean-centred over all G', and the G = ``selected`` of largest ``|R_i - mean|`` (ties to the
    lower index) in the loss, ``E[(1/G) sum_{i selected} c_i grad log pi(y_i)] = factor * grad J``.

    Every advantage and the selection see a response only through its reward, and for 0/1 rewards
    ``E[grad log pi(y) | R = 1] = grad J / p``, ``E[grad log pi(y) | R = 0] = -grad J / (1 - p)``, so
    the sum over the 2^G' reward patterns is a multiple of grad J (e.g. G' = 3, G = 1:
    ``2 (2 p^2 - 2 p + 1)``)."""
    total = sp.Integer(0)
    for pattern in itertools.product((0, 1), repeat=oversampled):
        successes = sum(pattern)
        centred = [sp.Integer(r) - sp.Rational(successes, oversampled) for r in pattern]
        order = sorted(range(oversampled), key=lambda i: (-abs(centred[i]), i))[:selected]
        probability = p**successes * (1 - p) ** (oversampled - successes)
        total += sum(probability * centred[i] * (1 / p if pattern[i] else -1 / (1 - p)) for i in order)
    return sp.factor(sp.simplify(total / selected))
