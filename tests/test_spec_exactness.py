"""Exact means exact (issue 11): the specs' numerical evaluation (``specs._exact``) is correctly
rounded to float64 at every magnitude, and refimpl behaves as the "Range" paragraphs of kl.md,
policy_losses.md and advantages.md say where the exact value underflows or overflows float64.

Arguments sweep 1e-300 .. 1e300 plus the exact boundaries (0, +-the smallest subnormal, the
largest subnormal, the smallest normal, the series threshold of k3, the overflow threshold of
exp, clip bounds and the dual-clip constant). The independent references below never call
``specs._exact``: rationals (``fractions.Fraction``) where the value is rational, a Taylor series
in rationals with a proven remainder bound for ``exp(x) - 1 - x`` at small |x|, and plain mpmath
at 4000 bits (about 70 times float64's precision) elsewhere; they are rounded to float64 through
``Fraction`` (Python's int / int division is correctly rounded, subnormals included).
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction

import mpmath
import pytest
import sympy as sp
import torch

from refimpl.advantages import group_advantages
from refimpl.kl import kl_k1, kl_k2, kl_k3
from refimpl.losses import PolicyLossVariant, policy_loss
from specs import PrecisionExhausted, sign, to_digits, to_float64
from specs.advantages import group_advantages_float64
from specs.estimators import discounted_return_exprs, evaluate_float64, gae_exprs
from specs.kl import estimator_float64
from specs.policy_losses import LossSpec, build_policy_loss
from specs.policy_losses import evaluate_float64 as loss_float64

F64 = torch.float64
TINY = 2.0**-1074  # smallest subnormal
MIN_NORMAL = 2.0**-1022
MAX = sys.float_info.max
INF = math.inf
REF_PREC = 4000  # bits of the mpmath references
# Each float64 rounding in the gradual-underflow range adds at most half a unit of TINY (IEEE 754);
# 4 units bound the few roundings of refimpl's formulas there.
SUBNORMAL_FLOOR = 4 * TINY

MAGNITUDES = [10.0**k for k in range(-300, 301, 20)]
SPECIAL = [TINY, 3 * TINY, MIN_NORMAL - TINY, MIN_NORMAL, 1e-170, 1e-8, 0.00999, 0.01, 0.5, 1.0, 20.0,
           709.78, 709.79, 745.2, 1e4, MAX]
LOG_RATIOS = sorted({0.0} | {s * m for m in MAGNITUDES + SPECIAL for s in (1.0, -1.0)})


# ---------------------------------------------------------------------------------- references


def round_mpf(x: mpmath.mpf) -> float:
    """An mpf correctly rounded to float64, through an exact Fraction."""
    if x == 0:
        return 0.0
    if mpmath.isinf(x):
        return float(x)
    exponent = int(mpmath.floor(mpmath.log(abs(x), 2)))
    if exponent > 1030:
        return math.copysign(INF, x)
    if exponent < -1100:
        return math.copysign(0.0, x)
    sign_bit, man, exp, _ = x._mpf_  # (x.man_exp drops the sign)
    return round_fraction((-1) ** sign_bit * Fraction(int(man)) * Fraction(2) ** int(exp))


def round_fraction(q: Fraction) -> float:
    try:
        return float(q)
    except OverflowError:
        return INF if q > 0 else -INF


def to_mpf(q: Fraction) -> mpmath.mpf:
    return mpmath.mpf(q.numerator) / q.denominator


def exp_series(x: Fraction, start: int) -> float:
    """``sum_{n >= start} x^n / n!`` for |x| <= 1/2, correctly rounded: partial sums in rationals
    with the remainder bound ``|x|^(N+1) / (N+1)! * 2``, more terms until both ends of the
    enclosure round to the same float."""
    total, term, n = Fraction(0), Fraction(1), 0
    while True:
        if n >= start:
            total += term
        n += 1
        term = term * x / n
        if n > start + 2:
            bound = 2 * abs(term)
            lo, hi = round_fraction(total - bound), round_fraction(total + bound)
            if lo == hi:
                return lo


def k_reference(name: str, logp: float, ref: float) -> tuple[float, float]:
    """(value, d/d logp) of k1, k2, k3 at the exact floats (kl.md eqs. (1)-(4))."""
    x = Fraction(ref) - Fraction(logp)
    if name == "k1":
        return round_fraction(-x), 1.0
    if name == "k2":
        return round_fraction(x * x / 2), round_fraction(-x)
    if abs(x) <= Fraction(1, 2):
        return exp_series(x, 2), -exp_series(x, 1)
    with mpmath.workprec(REF_PREC):  # exp(x) - 1 - x loses at most 2 bits here
        xm = to_mpf(x)
        return round_mpf(mpmath.expm1(xm) - xm), round_mpf(-mpmath.expm1(xm))


# ------------------------------------------------------------------------------ specs._exact


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_kl_estimators_are_correctly_rounded_at_every_magnitude(name):
    pairs = [(0.0, x) for x in LOG_RATIOS] + [(-1.0, -1.0 + 2.0**-52), (-MAX, MAX), (MAX, -MAX), (-30.0, 0.0)]
    for logp, ref in pairs:
        got = estimator_float64(name, logp, ref)
        want = k_reference(name, logp, ref)
        assert got == want, (name, logp, ref, got, want)


def test_the_issue_11_case_needs_more_than_50_digits():
    """k3 at log r = 9.867920525191241e-177: a fixed 50-digit evaluation gave 2.85e-160; the exact
    value is x^2/2 (1 + x/3 + ...) = 4.87e-353 (checked here to 40 digits by the series)."""
    x = 9.867920525191241e-177
    value = to_digits(sp.exp(sp.Rational(x)) - 1 - sp.Rational(x), 50)
    q = Fraction(x)
    series = q * q / 2 + q**3 / 6
    assert abs(Fraction(str(value)) / series - 1) < Fraction(1, 10**45)
    assert estimator_float64("k3", 0.0, x) == (0.0, -x)  # 4.9e-353 underflows; -expm1(x) = -x
    assert abs(sp.N(sp.exp(sp.Rational(x)) - 1 - sp.Rational(x), 50) - value) > 1e-161  # sympy's N is not


@pytest.mark.parametrize("digits", [15, 50, 120])
def test_to_digits_is_correctly_rounded(digits):
    prec = mpmath.libmp.dps_to_prec(digits)
    cases = [sp.exp(sp.Rational(1, 3)), sp.log(sp.Rational(5, 4)), sp.sqrt(2) - sp.Rational(99, 70),
             sp.exp(sp.Rational(-700)) * 3, 1 / (1 + sp.exp(-sp.Rational(7, 2))), sp.Integer(10) ** -400]
    for expr in cases:
        with mpmath.workprec(REF_PREC):
            want = mpmath.mpf(sp.N(expr, 1200)._mpf_)  # 1200 digits: ~4000 bits, no cancellation here
            want = mpmath.libmp.mpf_pos(want._mpf_, prec, "n")
        assert to_digits(expr, digits)._mpf_ == want, expr


def test_exact_zero_ties_and_signs():
    assert to_float64((1 + sp.sqrt(2)) ** 2 - 3 - 2 * sp.sqrt(2)) == 0.0  # zero, not rational in form
    assert to_digits((1 + sp.sqrt(2)) ** 2 - 3 - 2 * sp.sqrt(2)) == 0
    assert to_float64(sp.Rational(1) + sp.Rational(2) ** -53) == 1.0  # a tie, to even
    assert to_float64(sp.Rational(1) + 3 * sp.Rational(2) ** -53) == 1.0 + 2.0**-51
    assert to_float64(sp.Rational(TINY) / 2) == 0.0 and to_float64(sp.Rational(TINY) * 3 / 4) == TINY
    assert to_float64(sp.Rational(MAX) * 2) == INF and to_float64(-sp.exp(sp.Integer(10) ** 300)) == -INF
    assert to_float64(sp.exp(-sp.Integer(10) ** 300)) == 0.0
    assert sign(sp.sqrt(2) - sp.Rational(665857, 470832)) == -1  # a convergent, 1.6e-12 above sqrt(2)
    assert sign(sp.exp(sp.Rational(1, 10**100)) - 1 - sp.Rational(1, 10**100)) == 1
    assert sign(sp.log(sp.Rational(5, 4)) - sp.log(5) + sp.log(4)) == 0


def test_unsupported_functions_raise_instead_of_guessing():
    with pytest.raises(PrecisionExhausted, match="cannot evaluate gamma"):
        to_float64(sp.gamma(sp.Rational(1, 3)))
    with pytest.raises(ValueError, match="free symbols"):
        to_float64(sp.Symbol("x") + 1)


# ------------------------------------------------------------------- policy-loss terms and gates

GATES = {
    "clip": LossSpec(gate="clip", eps_low=0.2, eps_high=0.28, aggregation="token_mean"),
    "dual_clip": LossSpec(gate="clip", eps_low=0.25, eps_high=0.25, dual_clip=2.5, aggregation="token_mean"),
    "sapo": LossSpec(gate="sapo", eps_low=None, eps_high=None, tau_pos=1.0, tau_neg=1.05,
                     aggregation="token_mean"),
    "cispo": LossSpec(gate="cispo", eps_low=None, eps_high=0.28, aggregation="token_mean"),
    "none": LossSpec(gate="none", eps_low=None, eps_high=None, aggregation="token_mean"),
}
ADVANTAGES = [1.0, -1.0, 0.0, 1e-300, -1e300]


def gate_reference(spec: LossSpec, log_r: Fraction, a: Fraction) -> tuple[float, float]:
    """(loss, d loss / d logp) of one token with logp = 0 (policy_losses.md eqs. (6)-(9)): the loss
    is minus the surrogate; ``log_r = logp - old_logp`` exact."""
    if spec.gate == "cispo":  # sg(clip(r)) * A * logp at logp = 0: value 0, gradient -clip(r) A
        upper = 1 + Fraction(spec.eps_high)
        with mpmath.workprec(REF_PREC):
            if log_r >= 1 or to_mpf(log_r) > mpmath.log(to_mpf(upper)):
                return 0.0, round_fraction(-upper * a)
            return 0.0, round_mpf(-mpmath.exp(to_mpf(log_r)) * to_mpf(a))
    if spec.gate == "sapo":
        tau = Fraction(spec.tau_pos) if a > 0 else Fraction(spec.tau_neg)
        if log_r > 800:
            # r > e^800, tau >= 1: sigma = 1 - e with 0 < e < exp(-tau (r - 1)) < 2^-(2^1000), so the
            # value rounds as 4 A / tau (not a rounding tie: a float times 4 / tau) and the derivative
            # 4 sigma (1 - sigma) r A is below 4 r e |A| < 2^-1075 in magnitude
            return round_fraction(-4 * a / tau), 0.0
        with mpmath.workprec(REF_PREC):
            r, am, t = mpmath.exp(to_mpf(log_r)), to_mpf(a), to_mpf(tau)
            sigma = 1 / (1 + mpmath.exp(-t * (r - 1)))
            return round_mpf(-4 / t * sigma * am), round_mpf(-4 * sigma * (1 - sigma) * r * am)
    with mpmath.workprec(REF_PREC):
        r, am = mpmath.exp(to_mpf(log_r)), to_mpf(a)
        if spec.gate == "none":
            return round_mpf(-r * am), round_mpf(-r * am)
        lower, upper = 1 - Fraction(spec.eps_low), 1 + Fraction(spec.eps_high)
        if a > 0 and r > to_mpf(upper):
            return round_fraction(-upper * a), 0.0
        if a <= 0 and r < to_mpf(lower):
            return round_fraction(-lower * a), 0.0
        if a <= 0 and spec.dual_clip is not None and r > to_mpf(Fraction(spec.dual_clip)):
            return round_fraction(-Fraction(spec.dual_clip) * a), 0.0
        return round_mpf(-r * am), round_mpf(-r * am)


def spec_one_token(spec: LossSpec, old_logp, a: float) -> tuple[float, float]:
    built = build_policy_loss(spec, (1,))
    loss, grad, _ = loss_float64(built, {"logp": [[0.0]], "old_logp": [[old_logp]], "advantages": [a]})
    return loss, grad[0][0]


@pytest.mark.parametrize("gate", sorted(GATES))
def test_policy_gates_are_correctly_rounded_at_every_magnitude(gate):
    spec = GATES[gate]
    for log_r in LOG_RATIOS:
        for a in ADVANTAGES:
            got = spec_one_token(spec, -log_r, a)
            want = gate_reference(spec, Fraction(log_r), Fraction(a))
            assert got == want, (gate, log_r, a, got, want)


@pytest.mark.parametrize("gate", ["clip", "dual_clip", "cispo"])
def test_policy_gates_exactly_on_each_boundary(gate):
    """Exact ties: logp - old_logp = log(b) exactly (sympy), so r = b; every hard gate is inclusive
    (policy_losses.md eq. (6)): the token is inside, its gradient is -b A."""
    spec = GATES[gate]
    bounds = {"clip": [(Fraction(4, 5), -1), (Fraction(32, 25), 1)],
              "dual_clip": [(Fraction(3, 4), -1), (Fraction(5, 4), 1), (Fraction(5, 2), -1)],
              "cispo": [(Fraction(32, 25), 1), (Fraction(32, 25), -1)]}[gate]
    for b, a in bounds:
        old = -sp.log(sp.Rational(b.numerator, b.denominator))
        loss, grad = spec_one_token(spec, old, float(a))
        assert grad == round_fraction(-b * a), (gate, b, a)
        assert loss == (0.0 if gate == "cispo" else round_fraction(-b * a))


# ------------------------------------------------------------------------------ advantages

CONVENTIONS = {
    "reference": dict(scale="group", std="population", eps=1e-6, eps_inside_sqrt=True),
    "trl": dict(scale="group", std="sample", eps=1e-4, eps_inside_sqrt=False),
    "no_eps": dict(scale="group", std="population", eps=0.0, eps_inside_sqrt=True),
    "batch": dict(scale="batch", std="sample", eps=1e-6, eps_inside_sqrt=True),
    "batch_rewards": dict(scale="batch_rewards", std="population", eps=0.0, eps_inside_sqrt=False),
    "dr_grpo": dict(scale="none"),
    "rloo": dict(scale="none", leave_one_out=True),
}
REWARD_MAGNITUDES = MAGNITUDES + [TINY, 7 * TINY, MIN_NORMAL, MAX / 4]
GROUP_IDS = [0, 1, 0, 1, 0]


def rewards_at(m: float) -> list[float]:
    """Two non-constant groups whose centred values are not all equal, at magnitude m."""
    return [m, -m, -m / 2, 0.0, m / 4]


def advantage_reference(rewards: list[float], conv: dict) -> list[tuple[float, mpmath.mpf]]:
    """advantages.md eqs. (1)-(5), (14) from the exact rewards: (A_i correctly rounded, s_i)."""
    r = [Fraction(x) for x in rewards]
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(GROUP_IDS):
        groups.setdefault(g, []).append(i)
    centred = [Fraction(0)] * len(r)
    for members in groups.values():
        n = len(members)
        total = sum(r[i] for i in members)
        for i in members:
            centred[i] = (r[i] - (total - r[i]) / (n - 1)) if conv.get("leave_one_out") else r[i] - total / n

    def std(values: list[Fraction]) -> mpmath.mpf:
        n = len(values)
        mean = sum(values) / n
        var = sum((v - mean) ** 2 for v in values) / (n if conv["std"] == "population" else n - 1)
        eps = Fraction(conv["eps"])
        if conv["eps_inside_sqrt"]:
            return mpmath.sqrt(to_mpf(var + eps))
        return mpmath.sqrt(to_mpf(var)) + to_mpf(eps)

    out = []
    with mpmath.workprec(REF_PREC):
        for i in range(len(r)):
            if conv["scale"] == "none":
                out.append((round_fraction(centred[i]), mpmath.mpf(1)))
                continue
            if conv["scale"] == "group":
                s = std([r[j] for j in groups[GROUP_IDS[i]]])
            elif conv["scale"] == "batch":
                s = std(centred)
            else:
                s = std(r)
            out.append((round_mpf(to_mpf(centred[i]) / s), s))
    return out


@pytest.mark.parametrize("name", sorted(CONVENTIONS))
def test_group_advantages_are_correctly_rounded_at_every_magnitude(name):
    conv = dict(CONVENTIONS[name], singleton="zero")
    if conv["scale"] != "none":
        conv["zero_variance"] = "formula"
    for m in REWARD_MAGNITUDES:
        rewards = rewards_at(m)
        got = group_advantages_float64(rewards, GROUP_IDS, **conv)
        want = [a for a, _ in advantage_reference(rewards, conv)]
        assert got == want, (name, m, got, want)


# ------------------------------------------------------------------------------ estimators


@pytest.mark.parametrize("gamma,lam", [(0.5, 0.75), (0.99, 1.0)])
def test_returns_and_gae_are_correctly_rounded_at_every_magnitude(gamma, lam):
    """estimators.md eqs. (1)-(5) are rational in their inputs: the exact value is a Fraction."""
    terminated, truncated = [False, False, True], [False, False, False]
    for m in REWARD_MAGNITUDES:
        rewards, values, next_values = [m, -m / 4, 3.0], [m / 2, 0.0, -m], [0.0, -m, m / 8]
        got = evaluate_float64(discounted_return_exprs(rewards, terminated, truncated, gamma))
        g, r = Fraction(gamma), [Fraction(x) for x in rewards]
        want = [round_fraction(sum(g ** (i - t) * r[i] for i in range(t, 3))) for t in range(3)]
        assert got == want, m
        got = evaluate_float64(gae_exprs(rewards, values, next_values, terminated, truncated, gamma, lam))
        v, nv, gl = [Fraction(x) for x in values], [Fraction(x) for x in next_values], g * Fraction(lam)
        delta = [r[t] + (0 if terminated[t] else g * nv[t]) - v[t] for t in range(3)]
        want = [round_fraction(sum(gl ** (i - t) * delta[i] for i in range(t, 3))) for t in range(3)]
        assert got == want, m


# ------------------------------------------------------------------------ refimpl's range
# refimpl against the correctly rounded spec at the same magnitudes (the "Range" paragraphs):
# relative 1e-10 (a few roundings of well-conditioned formulas: the log-ratio is exact here) plus
# SUBNORMAL_FLOOR; where the exact value overflows, the documented +-inf.


def close(got: float, want: float, rel: float = 1e-10, floor: float = SUBNORMAL_FLOOR) -> bool:
    if math.isinf(want) or math.isinf(got):
        return got == want
    return abs(got - want) <= rel * abs(want) + floor  # False for NaN


def refimpl_k(name: str, logp: float, ref: float) -> tuple[float, float]:
    x = torch.tensor([logp], dtype=F64, requires_grad=True)
    value = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}[name](x, torch.tensor([ref], dtype=F64))
    (grad,) = torch.autograd.grad(value.sum(), x)
    return value.item(), grad.item()


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_refimpl_kl_estimators_follow_the_documented_range(name):
    # Where the exact value overflows float64, refimpl raises one line naming the arguments
    # (kl.md, Range: no silent inf); elsewhere it returns the correctly rounded value.
    pairs = [(0.0, x) for x in LOG_RATIOS] + [(MAX, -MAX), (-MAX, MAX)]
    overflowed = 0
    for logp, ref in pairs:
        want = estimator_float64(name, logp, ref)
        if math.isinf(want[0]):
            with pytest.raises(ValueError, match=rf"^logp, ref_logp: {name} overflows torch.float64 at "):
                refimpl_k(name, logp, ref)
            overflowed += 1
            continue
        got = refimpl_k(name, logp, ref)
        assert close(got[0], want[0]) and close(got[1], want[1]), (name, logp, ref, got, want)
    assert overflowed >= 2  # both extremes (and k3's log r > 709.78) are exercised


def test_refimpl_k3_when_the_log_ratio_overflows():
    # ref_logp - logp itself overflows (|.| >= 2^1024): log r = +inf, expm1(inf) - inf = NaN in
    # IEEE arithmetic; the exact k3 overflows to +inf. refimpl raises instead of returning either.
    assert estimator_float64("k3", -MAX, MAX) == (INF, -INF)
    message = r"^logp, ref_logp: k3 overflows torch.float64 at ref_logp - logp = inf"
    with pytest.raises(ValueError, match=message):
        refimpl_k("k3", -MAX, MAX)


OVERFLOW_ERROR = "overflow error"


def refimpl_one_token(spec: LossSpec, old_logp: float, a: float) -> tuple[float, float] | str:
    """(loss, d loss / d logp) of one token, or OVERFLOW_ERROR where policy_loss raises its
    documented ValueError (a ratio in the loss exceeds float64: policy_losses.md, Range)."""
    variant = PolicyLossVariant(**{f: getattr(spec, f) for f in spec.__dataclass_fields__})
    logp = torch.zeros(1, 1, dtype=F64, requires_grad=True)
    try:
        loss, _ = policy_loss(logp, torch.tensor([[old_logp]], dtype=F64), torch.tensor([a], dtype=F64),
                              torch.ones(1, 1, dtype=torch.bool), variant)
    except ValueError as exc:
        assert str(exc).startswith("the loss overflows torch.float64"), exc
        return OVERFLOW_ERROR
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.item(), grad.item()


EXP_OVERFLOW = 709.78  # log(MAX) = 709.7827...: exp(log r) overflows float64 above it


def _policy_params():
    for gate in sorted(GATES):
        yield pytest.param(gate, False, id=f"{gate}-finite-ratio")
        yield pytest.param(gate, True, id=f"{gate}-overflowing-ratio")


@pytest.mark.parametrize("gate,overflowing", list(_policy_params()))
def test_refimpl_policy_gates_follow_the_documented_range(gate, overflowing):
    spec = GATES[gate]
    for log_r in LOG_RATIOS:
        if (log_r > EXP_OVERFLOW) != overflowing:
            continue
        # with r beyond float64 only |a| >= 1 (the exact r a overflows too; see the xfail below)
        for a in ADVANTAGES if not overflowing else [x for x in ADVANTAGES if abs(x) >= 1]:
            got, want = refimpl_one_token(spec, -log_r, a), spec_one_token(spec, -log_r, a)
            if got == OVERFLOW_ERROR:  # documented: raised exactly where the exact loss overflows
                assert math.isinf(want[0]), (gate, log_r, a, want)
                continue
            # r = exp(log r) may underflow (absolute error <= TINY / 2) before it is multiplied by a
            floor = SUBNORMAL_FLOOR * max(1.0, abs(a))
            assert close(got[0], want[0], floor=floor) and close(got[1], want[1], floor=floor), (
                gate, log_r, a, got, want)


@pytest.mark.parametrize("gate", ["clip", "none"])
def test_refimpl_open_gate_with_an_overflowing_ratio_and_a_zero_advantage(gate):
    want = spec_one_token(GATES[gate], -800.0, 0.0)
    got = refimpl_one_token(GATES[gate], -800.0, 0.0)
    assert want == (0.0, 0.0) and got == (0.0, 0.0)


@pytest.mark.parametrize("gate", ["clip", "none"])
def test_refimpl_open_gate_with_an_overflowing_ratio_and_a_tiny_advantage_raises(gate):
    """A documented limit (policy_losses.md, Range): the ratio is formed before it is multiplied by
    the advantage, so r = exp(709.79) overflows although the exact r a = -1.8e8 at a = -1e-300 is
    finite; policy_loss raises its clear overflow error there instead of returning -inf."""
    want = spec_one_token(GATES[gate], -709.79, -1e-300)
    assert math.isfinite(want[0]) and math.isfinite(want[1])
    assert refimpl_one_token(GATES[gate], -709.79, -1e-300) == OVERFLOW_ERROR


@pytest.mark.parametrize("log_r", [-20.0, -709.79])
def test_refimpl_sapo_gradient_at_small_ratios(log_r):
    """The gradient 4 sigma (1 - sigma) r A keeps r's relative accuracy: with autograd's derivative of
    expm1 (expm1(x) + 1) it was off by 2e-8 relative at log r = -20 and returned -0.0 for the exact
    -4.3e-309 at -709.79 (a pinned known limit until the gate took exp(log r) for r's derivative)."""
    want = spec_one_token(GATES["sapo"], -log_r, 1.0)
    got = refimpl_one_token(GATES["sapo"], -log_r, 1.0)
    assert close(got[1], want[1]), (got, want)


def _advantage_params():
    for name in sorted(CONVENTIONS):
        for m in REWARD_MAGNITUDES:
            yield pytest.param(name, m, id=f"{name}-{m:.0e}")


@pytest.mark.parametrize("name,m", list(_advantage_params()))
def test_refimpl_group_advantages_follow_the_documented_range(name, m):
    conv = dict(CONVENTIONS[name], singleton="zero")
    if conv["scale"] != "none":
        conv["zero_variance"] = "formula"
    rewards = rewards_at(m)
    got = group_advantages(torch.tensor(rewards, dtype=F64), torch.tensor(GROUP_IDS), **conv).tolist()
    for i, (want, s) in enumerate(advantage_reference(rewards, conv)):
        # docs/architecture.md floor 1e-12 x the summed terms, plus the subnormal floor, over the scale
        group = [abs(r) for r, g in zip(rewards, GROUP_IDS, strict=True) if conv["scale"] != "group"
                 or g == GROUP_IDS[i]]
        floor = float((1e-12 * sum(group) + SUBNORMAL_FLOOR) / s)
        assert close(got[i], want, floor=floor), (name, m, i, got, want)


def test_refimpl_group_mean_when_the_reward_sum_overflows():
    rewards = [1.5e308, 1.0e308]
    for conv in (dict(scale="none"), dict(scale="group", std="population", eps=1e-6, eps_inside_sqrt=True,
                                           zero_variance="formula")):
        want = group_advantages_float64(rewards, [0, 0], singleton="zero", **conv)
        got = group_advantages(torch.tensor(rewards, dtype=F64), torch.tensor([0, 0]), singleton="zero",
                               **conv)
        assert got.tolist() == pytest.approx(want, rel=1e-10, abs=0.0), conv
