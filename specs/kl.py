"""Exact sympy forms of the KL estimators k1, k2, k3 and of the categorical KL (spec: specs/kl.md).

``k_estimator(name, logp, ref_logp)`` is the per-token estimator as a sympy expression (eq. (1)-(4));
``evaluate_estimator`` evaluates it at exact values to ``digits`` certain significant digits (50
by default), with its derivative in ``logp``; ``estimator_float64`` gives both correctly rounded to
float64 (``specs._exact``: working precision raised until certain, at any magnitude).
``categorical_kl_expr`` is eq. (5). The ``prove_*`` functions are
the symbolic facts of kl.md sections 2-3 on a categorical distribution with symbolic logits
(``prove_*`` symbolically; ``verify_*`` by exact evaluation of the symbolic identity at several
rational points to 60 digits); each returns True or raises AssertionError.
Imports neither ``refimpl`` nor ``tabular``.
"""

from __future__ import annotations

import functools

import mpmath
import sympy as sp

from specs._exact import exact as _exact
from specs._exact import to_digits, to_float64

__all__ = [
    "ESTIMATORS",
    "k_estimator",
    "evaluate_estimator",
    "estimator_float64",
    "categorical_kl_expr",
    "evaluate_categorical_kl",
    "categorical_kl_float64",
    "softmax_exprs",
    "token_logprob_exprs",
    "expected_estimator",
    "expected_loss_gradient",
    "prove_k3_nonnegative",
    "verify_unbiasedness",
    "verify_loss_gradients",
    "verify_erratum_000_sign",
]

ESTIMATORS = ("k1", "k2", "k3")


def k_estimator(name: str, logp: sp.Expr, ref_logp: sp.Expr) -> sp.Expr:
    """kl.md eq. (1)-(4): with ``log r = ref_logp - logp``, k1 = -log r, k2 = (log r)^2 / 2,
    k3 = exp(log r) - 1 - log r."""
    log_r = ref_logp - logp
    if name == "k1":
        return -log_r
    if name == "k2":
        return log_r**2 / 2
    if name == "k3":
        return sp.exp(log_r) - 1 - log_r
    raise ValueError(f"name must be one of {ESTIMATORS}, got {name!r}")


@functools.cache
def _estimator_and_derivative(name: str) -> tuple[sp.Symbol, sp.Symbol, sp.Expr, sp.Expr]:
    x, y = sp.symbols("logp ref_logp", real=True)
    expr = k_estimator(name, x, y)
    return x, y, expr, sp.diff(expr, x)


def _estimator_at(name: str, logp, ref_logp) -> tuple[sp.Expr, sp.Expr]:
    x, y, expr, deriv = _estimator_and_derivative(name)
    subs = {x: _exact(logp), y: _exact(ref_logp)}
    return expr.xreplace(subs), deriv.xreplace(subs)


def evaluate_estimator(name: str, logp, ref_logp, digits: int = 50) -> tuple[sp.Float, sp.Float]:
    """(value, d value / d logp) of estimator ``name`` at exact ``logp``, ``ref_logp`` (numbers or
    sympy expressions; floats are taken as their exact binary values), correctly rounded to
    ``digits`` digits (``specs._exact.to_digits``: certain, whatever the cancellation)."""
    return tuple(to_digits(v, digits) for v in _estimator_at(name, logp, ref_logp))


def estimator_float64(name: str, logp, ref_logp) -> tuple[float, float]:
    """(value, d value / d logp) correctly rounded to float64 (0 or a subnormal where the exact
    value underflows, +-inf where it overflows; kl.md section 1, "Range")."""
    return tuple(to_float64(v) for v in _estimator_at(name, logp, ref_logp))


def softmax_exprs(logits: list[sp.Expr]) -> list[sp.Expr]:
    """``softmax(logits)`` as sympy expressions."""
    denom = sum(sp.exp(z) for z in logits)
    return [sp.exp(z) / denom for z in logits]


def token_logprob_exprs(logits: list, token: int) -> tuple[sp.Expr, list[sp.Expr]]:
    """kl.md eqs. (14)-(15): ``(log p_y, [d log p_y / d z_v for v])`` for one row of logits and the
    chosen token ``y``. ``None`` entries are ``-inf`` logits (zero-probability tokens: they leave the
    sum and get derivative 0); the chosen token must have a finite logit."""
    if not 0 <= token < len(logits):
        raise ValueError(f"token must lie in [0, V={len(logits)}), got {token}")
    if logits[token] is None:
        raise ValueError("the chosen token has logit -inf (log p = -inf)")
    z = [None if v is None else _exact(v) for v in logits]
    lse = sp.log(sum(sp.exp(v) for v in z if v is not None))
    grad = [
        sp.Integer(0) if v is None else (1 if i == token else 0) - sp.exp(v - lse) for i, v in enumerate(z)
    ]
    return z[token] - lse, grad


def categorical_kl_expr(logits_p: list[sp.Expr], logits_q: list[sp.Expr]) -> sp.Expr:
    """kl.md eq. (5): ``KL(p || q) = sum_v p_v (log p_v - log q_v)`` with p, q softmaxes."""
    if len(logits_p) != len(logits_q) or not logits_p:
        raise ValueError("logits_p and logits_q must be non-empty and of equal length")
    lse_p = sp.log(sum(sp.exp(z) for z in logits_p))
    lse_q = sp.log(sum(sp.exp(z) for z in logits_q))
    p = softmax_exprs(logits_p)
    return sum(pv * ((zp - lse_p) - (zq - lse_q)) for pv, zp, zq in zip(p, logits_p, logits_q, strict=True))


def evaluate_categorical_kl(logits_p, logits_q, digits: int = 50) -> sp.Float:
    """eq. (5) at exact values (floats taken as their exact binary values), to ``digits`` certain
    digits."""
    exact = [[_exact(float(v)) for v in row] for row in (logits_p, logits_q)]
    return to_digits(categorical_kl_expr(*exact), digits)


def categorical_kl_float64(logits_p, logits_q) -> float:
    """eq. (5) at exact values, correctly rounded to float64."""
    exact = [[_exact(float(v)) for v in row] for row in (logits_p, logits_q)]
    return to_float64(categorical_kl_expr(*exact))


def expected_estimator(name: str, logits: list[sp.Expr], ref_logits: list[sp.Expr]) -> sp.Expr:
    """``E_{a ~ pi}[k(log pi(a), log pi_ref(a))]`` for pi = softmax(logits) (kl.md eq. (6))."""
    pi = softmax_exprs(logits)
    log_pi = [sp.log(p) for p in pi]
    log_ref = [sp.log(p) for p in softmax_exprs(ref_logits)]
    return sum(p * k_estimator(name, lp, lr) for p, lp, lr in zip(pi, log_pi, log_ref, strict=True))


def expected_loss_gradient(name: str, logits: list[sp.Expr], ref_logits: list[sp.Expr]) -> list[sp.Expr]:
    """``E_{a ~ pi}[grad_z k(log pi_z(a), ...)]`` with the sampling distribution held fixed: the
    expected gradient of the estimator used as a loss term (kl.md eq. (7))."""
    pi = softmax_exprs(logits)
    log_ref = [sp.log(p) for p in softmax_exprs(ref_logits)]
    grads = []
    for z in logits:
        grads.append(sum(p * sp.diff(k_estimator(name, sp.log(q), lr), z)
                         for p, q, lr in zip(pi, softmax_exprs(logits), log_ref, strict=True)))
    return grads


def _is_zero(expr: sp.Expr, symbols: list[sp.Symbol], trials: int = 3) -> bool:
    """Zero test by evaluation at ``trials`` distinct rational points to 60 digits (|value| < 1e-45).

    (sympy's ``simplify`` takes tens of seconds on these softmax expressions; an identity between
    analytic functions that holds at generic points to 45 digits is not a coincidence.)"""
    fn = sp.lambdify(symbols, expr, "mpmath")
    with mpmath.workdps(60):
        for k in range(trials):
            point = [mpmath.mpf((7 * i + 3 * k) % 11 - 5) / 3 for i in range(len(symbols))]
            if abs(fn(*point)) > mpmath.mpf(10) ** -45:
                return False
    return True


def prove_k3_nonnegative() -> bool:
    """k3 = r - 1 - log r >= 0 for r > 0, with equality only at r = 1 (convexity, eq. (4))."""
    r = sp.symbols("r", positive=True)
    f = r - 1 - sp.log(r)
    assert sp.solve(sp.diff(f, r), r) == [1]
    assert sp.simplify(sp.diff(f, r, 2) - 1 / r**2) == 0  # > 0: the critical point is the minimum
    assert f.subs(r, 1) == 0
    return True


def verify_unbiasedness(n: int = 3) -> bool:
    """On a categorical with n outcomes: E_pi[k1] = E_pi[k3] = KL(pi || ref) exactly, and
    E_pi[k2] - KL = E_pi[(log r)^2 / 2 + log r] (not 0 in general) (kl.md section 2)."""
    z = list(sp.symbols(f"z0:{n}", real=True))
    w = list(sp.symbols(f"w0:{n}", real=True))
    kl = categorical_kl_expr(z, w)
    for name in ("k1", "k3"):
        assert _is_zero(expected_estimator(name, z, w) - kl, z + w), name
    assert not _is_zero(expected_estimator("k2", z, w) - kl, z + w)
    return True


def verify_loss_gradients(n: int = 3) -> bool:
    """kl.md section 3, per state with the sampling distribution held fixed:
    E[grad k1] = 0, E[grad k2] = grad KL(pi || ref), E[grad k3] = grad KL(ref || pi)."""
    z = list(sp.symbols(f"z0:{n}", real=True))
    w = list(sp.symbols(f"w0:{n}", real=True))
    forward = categorical_kl_expr(z, w)
    reverse = categorical_kl_expr(w, z)
    for zi, g1, g2, g3 in zip(z, expected_loss_gradient("k1", z, w), expected_loss_gradient("k2", z, w),
                              expected_loss_gradient("k3", z, w), strict=True):
        assert _is_zero(g1, z + w)
        assert _is_zero(g2 - sp.diff(forward, zi), z + w)
        assert _is_zero(g3 - sp.diff(reverse, zi), z + w)
        assert not _is_zero(g3 - sp.diff(forward, zi), z + w)
    return True


def verify_erratum_000_sign(n: int = 3) -> bool:
    """The sign erratum (errata.md entry 5): E_pi[log pi'/pi] is -KL(pi || pi') <= 0 (kl.md eq. (9))."""
    z = list(sp.symbols(f"z0:{n}", real=True))
    w = list(sp.symbols(f"w0:{n}", real=True))
    pi, other = softmax_exprs(z), softmax_exprs(w)
    as_written = sum(p * sp.log(q / p) for p, q in zip(pi, other, strict=True))
    assert _is_zero(as_written + categorical_kl_expr(z, w), z + w)
    return True
