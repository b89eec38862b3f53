"""Per-token KL estimators k1, k2, k3 and the exact categorical KL (spec: specs/kl.md).

With samples ``y_t ~ pi_theta(.|s_t)`` from the *current* policy, ``logp = log pi_theta(y_t|s_t)``,
``ref_logp = log pi_ref(y_t|s_t)`` and ``log r = ref_logp - logp`` (spec: kl.md eq. (1)):

- ``k1 = -log r``                  unbiased for ``KL(pi_theta || pi_ref)`` at ``s_t`` (kl.md eq. (2));
- ``k2 = (log r)^2 / 2``           biased, low variance; its *gradient* is the one of the per-state
                                   ``KL(pi_theta || pi_ref)`` (kl.md eq. (3), section 3);
- ``k3 = r - 1 - log r >= 0``      unbiased for ``KL(pi_theta || pi_ref)`` (kl.md eq. (4); Schulman 2020;
                                   Shao et al. 2024, eq. (4); ``pi_ref / pi`` with the behaviour policy is an
                                   erratum, errata.md entry 12: the denominator is the current policy).

Which gradient each estimator follows when used as a loss term is stated in specs/kl.md section 3.

Dtypes: inputs may be float16/bfloat16/float32/float64 (``logp`` and ``ref_logp`` may differ);
the result is computed and returned in ``promote_types(input dtypes, float32)``.
"""

from __future__ import annotations

import math

import torch

from refimpl._checks import check_float_tensor

__all__ = ["kl_log_ratio", "kl_k1", "kl_k2", "kl_k3", "categorical_kl"]

# |log r| below this uses the Taylor series of exp(x) - 1 - x through x^7 (truncation x^8 / 8!, at most
# 2 |x|^6 / 8! < 5e-17 relative; with Horner's rounding < 1e-15 relative in float64), where
# expm1(x) - x loses ~2 eps / |x| relative accuracy to cancellation. (Through x^6 only, the truncation
# was 2 |x|^5 / 7! ~ 4e-14 relative just below the threshold.)
_K3_SERIES_THRESHOLD = 1e-2


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def kl_log_ratio(logp: torch.Tensor, ref_logp: torch.Tensor, *, check_finite: bool = True) -> torch.Tensor:
    """``log r = ref_logp - logp`` in ``promote_types(dtypes, float32)`` (spec: kl.md eq. (1)).

    Args:
        logp: log-probabilities of the sampled tokens under the current policy, any shape.
        ref_logp: log-probabilities of the same tokens under the reference policy, same shape
            (no broadcasting) and device.
        check_finite: raise ValueError on NaN/inf inputs (a host synchronisation; callers that
            validated their inputs already may pass False).
    Returns:
        ``log r``, same shape as the inputs.
    """
    check_float_tensor(logp, "logp", finite=False)
    check_float_tensor(ref_logp, "ref_logp", finite=False)
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp and ref_logp must have the same shape, got {tuple(logp.shape)} "
                         f"and {tuple(ref_logp.shape)}")
    if logp.device != ref_logp.device:
        raise ValueError(f"logp and ref_logp must be on the same device, got {logp.device} "
                         f"and {ref_logp.device}")
    if check_finite:
        for x, name in ((logp, "logp"), (ref_logp, "ref_logp")):
            if not bool(torch.isfinite(x).all()):
                raise ValueError(f"{name} contains NaN or inf")
    dtype = _compute_dtype(logp, ref_logp)
    return ref_logp.to(dtype) - logp.to(dtype)


def _in_range(value: torch.Tensor, log_r: torch.Tensor, estimator: str, check_finite: bool) -> torch.Tensor:
    """``value``, or ValueError where an estimator of finite inputs exceeds its dtype's range
    (kl.md, Range): no silent inf or NaN. Skipped (IEEE inf returned) when not ``check_finite``."""
    if check_finite and not bool(torch.isfinite(value).all()):
        at = float(log_r[~torch.isfinite(value)].flatten()[0])
        hint = "" if value.dtype == torch.float64 else "; pass float64 log-probabilities"
        raise ValueError(f"logp, ref_logp: {estimator} overflows {value.dtype} at ref_logp - logp = {at:.6g} "
                         f"(its exact value is beyond the dtype's range){hint}")
    return value


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor, *, check_finite: bool = True) -> torch.Tensor:
    """k1 = ``-log r = logp - ref_logp`` per token (spec: kl.md eq. (2)).

    Unbiased for the per-state ``KL(pi_theta || pi_ref)`` when the token is sampled from pi_theta.
    Shapes: inputs any matching shape; returns the same shape (see kl_log_ratio for arguments).
    A value beyond the dtype's range raises ValueError when ``check_finite`` (kl.md, Range).
    """
    log_r = kl_log_ratio(logp, ref_logp, check_finite=check_finite)
    return _in_range(-log_r, log_r, "k1", check_finite)


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor, *, check_finite: bool = True) -> torch.Tensor:
    """k2 = ``(log r)^2 / 2`` per token (spec: kl.md eq. (3)).

    Biased for the KL value (exact to second order in log r); as a loss term its expected gradient
    is the gradient of the per-state ``KL(pi_theta || pi_ref)`` (kl.md section 3).
    """
    log_r = kl_log_ratio(logp, ref_logp, check_finite=check_finite)
    return _in_range(0.5 * log_r * log_r, log_r, "k2", check_finite)


def _exp_minus_one_minus_identity(x: torch.Tensor) -> torch.Tensor:
    """``exp(x) - 1 - x`` without cancellation for small |x| and without overflow of the unused branch."""
    small = x.abs() < _K3_SERIES_THRESHOLD
    xs = torch.where(small, x, torch.zeros_like(x))  # keeps the series finite where it is not used
    poly = 1.0 / 720 + xs / 5040  # Horner: x^2 (1/2! + x (1/3! + ... + x (1/6! + x / 7!)))
    for inverse_factorial in (1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5):
        poly = inverse_factorial + xs * poly
    series = xs * xs * poly
    xl = torch.where(small, torch.ones_like(x), x)  # keeps expm1's gradient free of the small branch
    # at x = +inf the value and slope are their limits, +inf (expm1(x) - x would be inf - inf = NaN)
    direct = torch.expm1(xl) - torch.where(x == math.inf, 0.0, xl)
    return torch.where(small, series, direct)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, *, check_finite: bool = True) -> torch.Tensor:
    """k3 = ``r - 1 - log r = expm1(log r) - log r >= 0`` per token (spec: kl.md eq. (4)).

    Unbiased for the per-state ``KL(pi_theta || pi_ref)`` with tokens sampled from pi_theta
    (Schulman 2020; Shao et al. 2024, eq. (4): r = pi_ref / pi_theta, the *current* policy). Computed
    without cancellation: a Taylor series for |log r| < 1e-2, ``expm1`` otherwise; finite for
    log r up to ~88.7 in float32 and ~709.8 in float64. Beyond, where the exact k3 exceeds the
    dtype's range, ValueError when ``check_finite`` (else IEEE inf, or NaN where ``ref_logp -
    logp`` itself overflows; kl.md, Range).
    """
    log_r = kl_log_ratio(logp, ref_logp, check_finite=check_finite)
    return _in_range(_exp_minus_one_minus_identity(log_r), log_r, "k3", check_finite)


def categorical_kl(
    logits_p: torch.Tensor, logits_q: torch.Tensor, *, check_finite: bool = True
) -> torch.Tensor:
    """Exact ``KL(p || q) = sum_v p_v (log p_v - log q_v)`` over the last dim (spec: kl.md eq. (5)).

    ``p = softmax(logits_p)``, ``q = softmax(logits_q)``. A ``-inf`` logit is a zero-probability
    entry: terms with ``p_v = 0`` contribute 0 (and no gradient), so masked vocabularies work; an
    entry with ``p_v > 0`` and ``q_v = 0`` gives ``+inf`` (the true value). NaN or ``+inf`` logits,
    or a row that is all ``-inf``, raise ValueError (when ``check_finite``).

    Args:
        logits_p, logits_q: ``[..., V]`` of the same shape (no broadcasting).
    Returns:
        ``[...]`` in ``promote_types(dtypes, float32)``. For the reverse direction
        ``KL(q || p)`` swap the arguments.
    """
    check_float_tensor(logits_p, "logits_p", finite=False)
    check_float_tensor(logits_q, "logits_q", finite=False)
    if logits_p.shape != logits_q.shape:
        raise ValueError(f"logits_p and logits_q must have the same shape, got {tuple(logits_p.shape)} "
                         f"and {tuple(logits_q.shape)}")
    if logits_p.ndim == 0 or logits_p.shape[-1] == 0:
        raise ValueError("logits must have a non-empty last (vocabulary) dim, got shape "
                         f"{tuple(logits_p.shape)}")
    if logits_p.device != logits_q.device:
        raise ValueError(f"logits_p and logits_q must be on the same device, got {logits_p.device} "
                         f"and {logits_q.device}")
    if check_finite:
        for x, name in ((logits_p, "logits_p"), (logits_q, "logits_q")):
            if bool(torch.isnan(x).any()) or bool((x == float("inf")).any()):
                raise ValueError(f"{name} contains NaN or +inf")
            if bool((x == float("-inf")).all(dim=-1).any()):
                raise ValueError(f"{name} has a row whose logits are all -inf")
    dtype = _compute_dtype(logits_p, logits_q)
    log_p = torch.log_softmax(logits_p.to(dtype), dim=-1)
    log_q = torch.log_softmax(logits_q.to(dtype), dim=-1)
    support = log_p > float("-inf")
    # Mask before multiplying: 0 * (-inf) would be NaN in the value and in the gradient.
    diff = torch.where(support, log_p - torch.where(support, log_q, torch.zeros_like(log_q)),
                       torch.zeros_like(log_p))
    return (log_p.exp() * diff).sum(dim=-1)
