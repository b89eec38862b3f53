"""Trust-region policy updates: conjugate gradient, Fisher-vector products, natural step, TRPO.

spec: specs/trust_region.md; Schulman et al. 2015, sections 4-6 and Appendix C; Kakade 2001.

A policy is given as a function ``log_prob_fn(params) -> [N, A]``: the action log-probabilities
at N states (tabular: all S states; otherwise a batch of visited states), differentiable in a
floating-point tensor ``params`` of any shape (a neural network's parameters flattened with
``torch.nn.utils.parameters_to_vector`` and read back with ``torch.func.functional_call`` work).
States are weighted by ``state_weights [N]`` (non-negative, summing to 1: the exact normalised
occupancy d, or ``1/N`` for an empirical mean over visited states).

The trust region uses ``KL(pi_old || pi_new)`` (Schulman et al. 2015, sections 4, 5, the TRPO paper): it is an
expectation under the old policy, so it is estimable from the data that pi_old generated, and its
Hessian in the new parameters at ``params_old`` is the Fisher matrix (spec: trust_region.md
section 2). The line search uses the exact mean KL, not its quadratic model.

Everything is device-agnostic (tensors are created on the input's device) and runs in
``promote_types(dtype, float32)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from refimpl._checks import as_int, check_float_tensor, check_real
from refimpl.kl import categorical_kl

__all__ = [
    "CGResult",
    "conjugate_gradient",
    "FisherResolution",
    "UnresolvableFisherError",
    "fisher_resolution",
    "mean_kl",
    "fisher_vector_product_fn",
    "fisher_vector_product",
    "trust_region_step_scale",
    "NaturalGradientStep",
    "natural_gradient_direction",
    "natural_gradient_step",
    "TRPOCandidate",
    "TRPOSearchRecord",
    "trpo_step",
]

LogProbFn = Callable[[torch.Tensor], torch.Tensor]
SurrogateFn = Callable[[torch.Tensor], torch.Tensor]


# ----------------------------------------------------------------------------- validation helpers
def _work_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def _dot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x * y).sum()


def _check_positive_int(x, name: str, minimum: int = 1) -> int:
    if as_int(x) is None:
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    x = as_int(x)
    if x < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {x}")
    return x


def _check_nonnegative_real(x, name: str) -> float:
    x = check_real(x, name)
    if not math.isfinite(x) or x < 0.0:
        raise ValueError(f"{name} must be finite and >= 0, got {x!r}")
    return x


def _check_state_weights(state_weights, num_states: int, ref: torch.Tensor) -> torch.Tensor:
    check_float_tensor(state_weights, "state_weights")
    if state_weights.shape != (num_states,):
        raise ValueError(f"state_weights must have shape [N] = ({num_states},) matching log_prob_fn's "
                         f"output, got {tuple(state_weights.shape)}")
    if state_weights.device != ref.device:
        raise ValueError(f"state_weights must be on {ref.device}, got {state_weights.device}")
    if bool((state_weights < 0).any()):
        raise ValueError("state_weights must be non-negative")
    total = float(state_weights.double().sum())
    # Weights rounded to a low-precision dtype sum to 1 only up to about N rounding errors.
    if abs(total - 1.0) > max(1e-6, num_states * torch.finfo(state_weights.dtype).eps):
        raise ValueError(f"state_weights must sum to 1 (a distribution over states), got {total!r}")
    return state_weights.to(_work_dtype(ref))


def _log_probs(log_prob_fn: LogProbFn, params: torch.Tensor) -> torch.Tensor:
    logp = log_prob_fn(params)
    if not isinstance(logp, torch.Tensor) or logp.ndim != 2:
        shape = tuple(logp.shape) if isinstance(logp, torch.Tensor) else type(logp).__name__
        raise ValueError(f"log_prob_fn must return a [N, A] tensor of log-probabilities, got {shape}")
    return logp


def _policy_log_probs(log_prob_fn: LogProbFn, params: torch.Tensor) -> torch.Tensor:
    """``log_prob_fn(params)`` checked to be a policy: no NaN and a finite entry in every row."""
    logp = _log_probs(log_prob_fn, params)
    if bool(torch.isnan(logp).any()) or not bool(torch.isfinite(logp).any(dim=-1).all()):
        raise ValueError("log_prob_fn(params) must have no NaN and a finite entry in every row")
    return logp


def _check_preconditioner(preconditioner, b: torch.Tensor) -> torch.Tensor | None:
    """The diagonal preconditioner of :func:`conjugate_gradient` in b's dtype (None: plain CG)."""
    if preconditioner is None:
        return None
    check_float_tensor(preconditioner, "preconditioner")
    if preconditioner.shape != b.shape:
        raise ValueError(f"preconditioner must have b's shape {tuple(b.shape)}, "
                         f"got {tuple(preconditioner.shape)}")
    if preconditioner.device != b.device:
        raise ValueError(f"preconditioner must be on b's device {b.device}, got {preconditioner.device}")
    if not bool((preconditioner > 0).all()):
        raise ValueError("preconditioner must be positive (a diagonal D > 0)")
    return preconditioner.to(b.dtype)


def _sqrt_unit_roundoff(dtype: torch.dtype) -> float:
    """``sqrt(u)``, ``u = eps / 2``: the relative accuracy the natural-gradient routines promise
    (half the digits of the working dtype; trust_region.md eq. (18))."""
    return math.sqrt(torch.finfo(dtype).eps / 2.0)


# ----------------------------------------------------------------------------- conjugate gradient
class CGResult(NamedTuple):
    """Result of :func:`conjugate_gradient`.

    ``solution`` has the shape of ``b``; ``iterations`` counts matrix-vector products;
    ``residual_norm`` is the recursively updated ``||b - M x||`` (equal to the true residual in
    exact arithmetic); ``relative_residual = residual_norm / ||b||``; ``converged`` says whether
    ``relative_residual <= tol`` was reached within ``iters``.
    """

    solution: torch.Tensor
    iterations: int
    residual_norm: float
    relative_residual: float
    converged: bool


def conjugate_gradient(
    matvec: Callable[[torch.Tensor], torch.Tensor],
    b: torch.Tensor,
    iters: int,
    tol: float = 1e-10,
    *,
    curvature_floor: float | None = None,
    preconditioner: torch.Tensor | None = None,
) -> CGResult:
    """Solve ``M x = b`` for symmetric positive (semi-)definite M by (preconditioned) conjugate gradient.

    spec: trust_region.md eq. (1); Schulman et al. 2015, Appendix C ("solved with conjugate gradient"). Starts
    from
    ``x = 0`` and stops as soon as the relative residual ``||b - M x|| / ||b|| <= tol`` or after
    ``iters`` products. For a singular PSD M with b in its range (the softmax Fisher), the iterates
    stay in the Krylov space of b, so the limit is the minimum-norm solution. A search direction
    p whose curvature ``p^T M p`` is ``<= 0`` or ``<= curvature_floor`` times the largest Rayleigh
    quotient ``p^T M p / p^T p`` met so far times ``p^T p`` stops the iteration (``converged=False``
    unless within tol): M is not positive definite there, or its curvature along p is below what
    the caller can resolve, where the step ``1 / p^T M p`` would amplify rounding errors (or the
    part of b outside M's range) without bound (trust_region.md sections 1 and 6). The default
    floor is ``64 eps`` of the working dtype (rounding level); the natural-gradient routines pass
    ``sqrt(u)`` (eq. (18)).
    ``b = 0`` returns ``x = 0`` after 0 iterations. A product with a NaN or inf entry raises
    ``ValueError`` (never a silent zero or NaN solution).

    With a ``preconditioner`` D (a positive diagonal, given as a tensor of b's shape) this is
    preconditioned CG (trust_region.md eq. (1')): ``z = r / D`` replaces r as the search residual,
    residual norms are ``||r||_{D^-1} = sqrt(r^T D^-1 r)`` (so ``relative_residual`` is
    ``||r||_{D^-1} / ||b||_{D^-1}``) and the curvature floor applies to the Rayleigh quotients
    ``p^T M p / p^T D p`` of the preconditioned matrix. D is only divided by, never inverted, so
    a subnormal entry does not overflow.

    Args:
        matvec: ``x -> M x``, shape-preserving.
        b: right-hand side of any shape (inner products run over all entries).
        iters: maximum number of iterations (>= 1).
        tol: relative-residual tolerance (>= 0).
        curvature_floor: relative curvature floor in [0, 1) (default ``64 eps``).
        preconditioner: positive, finite diagonal D of b's shape, or None (plain CG).
    Returns:
        :class:`CGResult` (solution in ``promote_types(b.dtype, float32)``).
    """
    check_float_tensor(b, "b")
    iters = _check_positive_int(iters, "iters")
    tol = _check_nonnegative_real(tol, "tol")
    b = b.to(_work_dtype(b))
    if curvature_floor is None:
        curvature_floor = 64.0 * torch.finfo(b.dtype).eps
    curvature_floor = _check_nonnegative_real(curvature_floor, "curvature_floor")
    if curvature_floor >= 1.0:
        raise ValueError(f"curvature_floor must lie in [0, 1), got {curvature_floor!r}")
    diagonal = _check_preconditioner(preconditioner, b)
    x = torch.zeros_like(b)
    r = b.clone()
    z = r if diagonal is None else r / diagonal
    p = z.clone()
    rs = float(_dot(r, z))
    b_norm = math.sqrt(rs)
    if b_norm == 0.0:
        return CGResult(x, 0, 0.0, 0.0, True)
    done = 0
    largest_rayleigh = 0.0
    while done < iters and math.sqrt(rs) > tol * b_norm:
        mp = matvec(p)
        if not isinstance(mp, torch.Tensor) or mp.shape != p.shape:
            raise ValueError(f"matvec must return a tensor of shape {tuple(p.shape)}")
        mp = mp.to(p.dtype)
        p_m_p = float(_dot(p, mp))
        if not (math.isfinite(p_m_p) and bool(torch.isfinite(mp).all())):
            raise ValueError(f"matvec returned a non-finite product (NaN or inf) at iteration {done + 1}")
        p_p = float(_dot(p, p if diagonal is None else diagonal * p))
        # Stop on a direction without (resolvable) curvature: p^T M p <= 0, or below the floor
        # relative to the largest Rayleigh quotient seen, where 1 / p^T M p would blow x up.
        largest_rayleigh = max(largest_rayleigh, p_m_p / p_p)
        if not p_m_p > curvature_floor * largest_rayleigh * p_p:
            break
        step = rs / p_m_p
        x = x + step * p
        r = r - step * mp
        z = r if diagonal is None else r / diagonal
        rs_new = float(_dot(r, z))
        p = z + (rs_new / rs) * p
        rs = rs_new
        done += 1
    residual = math.sqrt(rs)
    return CGResult(x, done, residual, residual / b_norm, residual <= tol * b_norm)


# ----------------------------------------------------------------------------- KL and Fisher
def mean_kl(
    log_prob_fn: LogProbFn, old_log_probs: torch.Tensor, params: torch.Tensor, state_weights: torch.Tensor
) -> torch.Tensor:
    """Exact mean KL ``sum_s w_s KL(pi_old(.|s) || pi_params(.|s))`` (spec: trust_region.md eq. (2);
    Schulman et al. 2015, sections 4, 5).

    ``old_log_probs [N, A]`` are pi_old's log-probabilities (treated as constants; ``-inf`` marks a
    zero-probability action, which contributes 0). Differentiable in ``params``. Returns a scalar.
    """
    check_float_tensor(params, "params")
    logp = _log_probs(log_prob_fn, params)
    if logp.shape != old_log_probs.shape:
        raise ValueError(f"log_prob_fn(params) has shape {tuple(logp.shape)} but old_log_probs has "
                         f"shape {tuple(old_log_probs.shape)}")
    weights = _check_state_weights(state_weights, logp.shape[0], logp)
    per_state = categorical_kl(old_log_probs.detach(), logp, check_finite=False)
    return (weights * per_state).sum()


def fisher_vector_product_fn(
    log_prob_fn: LogProbFn, params: torch.Tensor, state_weights: torch.Tensor, *, damping: float = 0.0
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Return ``v -> (F + damping I) v`` with F the Hessian of the mean KL at ``params``.

    spec: trust_region.md eq. (3)-(4); Kakade 2001; Schulman et al. 2015, Appendix C. ``F = grad^2_theta sum_s
    w_s KL(pi_params(.|s)
    || pi_theta(.|s))`` at ``theta = params``, which equals the Fisher information
    ``sum_s w_s E_{a ~ pi}[grad log pi grad log pi^T]``. Computed by double backprop: the gradient
    of the KL is built once with ``create_graph=True`` and each product is one more backward pass
    through ``grad(KL) . v`` (the matrix is never formed).
    """
    check_float_tensor(params, "params")
    damping = _check_nonnegative_real(damping, "damping")
    theta = params.detach().to(_work_dtype(params)).requires_grad_(True)
    with torch.enable_grad():
        logp = _policy_log_probs(log_prob_fn, theta)
        kl = mean_kl(log_prob_fn, logp.detach(), theta, state_weights)
        (grad_kl,) = torch.autograd.grad(kl, theta, create_graph=True)

    def fvp(vector: torch.Tensor) -> torch.Tensor:
        if not isinstance(vector, torch.Tensor) or vector.shape != theta.shape:
            raise ValueError(f"vector must be a tensor of the parameters' shape {tuple(theta.shape)}")
        v = vector.detach().to(theta.dtype)
        with torch.enable_grad():
            (hv,) = torch.autograd.grad(_dot(grad_kl, v), theta, retain_graph=True)
        return hv.detach() + damping * v

    return fvp


def fisher_vector_product(
    log_prob_fn: LogProbFn,
    params: torch.Tensor,
    vector: torch.Tensor,
    state_weights: torch.Tensor,
    *,
    damping: float = 0.0,
) -> torch.Tensor:
    """``(F + damping I) v`` for one vector (see :func:`fisher_vector_product_fn`; spec:
    trust_region.md eq. (3)-(4)). Returns a tensor of the parameters' shape."""
    check_float_tensor(vector, "vector")
    return fisher_vector_product_fn(log_prob_fn, params, state_weights, damping=damping)(vector)


def trust_region_step_scale(direction: torch.Tensor, fisher_direction: torch.Tensor, max_kl: float) -> float:
    """``beta = sqrt(2 delta / (s^T F s))`` so that ``0.5 (beta s)^T F (beta s) = delta``.

    spec: trust_region.md eq. (6); Schulman et al. 2015, Appendix C. Some texts write
    ``sqrt(2 delta / (g^T F g))`` for the step ``beta F^-1 g``: an erratum (trust_region.md
    section 4). Raises ValueError when ``s^T F s <= 0`` (no curvature along s).
    """
    max_kl = _check_nonnegative_real(max_kl, "max_kl")
    curvature = float(_dot(direction, fisher_direction))
    if not curvature > 0.0:
        raise ValueError(f"direction, fisher_direction: s^T F s must be > 0 to scale the step, "
                         f"got {curvature!r}")
    return math.sqrt(2.0 * max_kl / curvature)


# ----------------------------------------------------------------------------- natural gradient
class UnresolvableFisherError(ValueError):
    """The policy is too close to deterministic for the working precision to resolve the Fisher
    matrix (trust_region.md eq. (18), or eq. (19) for a tabular softmax policy): no
    natural-gradient step is returned."""


class FisherResolution(NamedTuple):
    """Whether the working precision resolves the (damped) Fisher matrix (trust_region.md section 6).

    ``min_weighted_prob`` is ``m = min w_s pi(a|s)`` over states with ``w_s > 0`` and actions with
    a finite log-probability (0 when it underflows); ``resolvable`` is ``m >= threshold``.
    ``tabular_softmax`` says whether the policy is the row-wise softmax of its ``[N, A]``
    parameters (checked by value at ``params``). Then the solver knows the Fisher's structure and the
    threshold is eq. (19), ``sqrt(u) f_min - damping`` (``f_min`` the smallest normal number of the
    working dtype: the weighted probabilities must carry half of its digits); otherwise it is
    eq. (18), ``sqrt(u) (max_s w_s + damping) - damping``. ``u`` is the working dtype's unit roundoff.
    """

    min_weighted_prob: float
    threshold: float
    resolvable: bool
    tabular_softmax: bool


def _is_tabular_softmax(theta: torch.Tensor, log_probs: torch.Tensor) -> bool:
    """Is the policy the tabular softmax, ``log_softmax(theta, dim=-1)`` of ``[N, A]`` logits?
    (trust_region.md eq. (19).) Checked by value at ``theta`` (working dtype): a ``log_prob_fn``
    that adds an action mask, or parameters passed flattened, make a general policy."""
    return (theta.ndim == 2 and log_probs.shape == theta.shape and log_probs.dtype == theta.dtype
            and torch.equal(log_probs, torch.log_softmax(theta, dim=-1)))


def _counted(log_probs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``[N, A]`` bool: the Fisher's support, states with ``w_s > 0`` and actions of the policy."""
    return (weights > 0)[:, None] & torch.isfinite(log_probs)


def _resolution(log_probs: torch.Tensor, weights: torch.Tensor, damping: float,
                tabular: bool) -> FisherResolution:
    """:class:`FisherResolution` of ``log_probs [N, A]`` (working dtype) and checked ``weights [N]``."""
    counted = _counted(log_probs, weights)
    # In log space, so that a probability below the dtype's range still counts (as 0).
    log_weighted = torch.where(counted, torch.log(weights)[:, None] + log_probs.detach(),
                               torch.full_like(log_probs, math.inf))
    min_weighted_prob = math.exp(float(log_weighted.min()))
    root_u = _sqrt_unit_roundoff(log_probs.dtype)
    if tabular:
        threshold = root_u * torch.finfo(log_probs.dtype).tiny - damping
    else:
        threshold = root_u * (float(weights.max()) + damping) - damping
    return FisherResolution(min_weighted_prob, threshold, min_weighted_prob >= threshold, tabular)


def fisher_resolution(
    log_prob_fn: LogProbFn, params: torch.Tensor, state_weights: torch.Tensor, *, damping: float = 0.0
) -> FisherResolution:
    """Is ``F + damping I`` at ``params`` resolvable in the working precision? (trust_region.md
    section 6, eq. (18)-(19).)

    With ``m = min_{s: w_s > 0, a: pi(a|s) > 0} w_s pi(a|s)``, ``W = max_s w_s``, ``lambda =
    damping`` and ``u`` the unit roundoff (float64: ``2^-53``):

    - a tabular softmax policy (``log_prob_fn(params) == log_softmax(params, dim=-1)``, ``[N, A]``)
      is solved with the preconditioner ``diag(w_s pi(a|s)) + lambda``, under which its Fisher is
      a projector, so the only limit is the representation of the weighted probabilities
      themselves: resolvable when ``m + lambda >= sqrt(u) f_min`` (eq. (19); float64:
      ``2^-1048.5 = 2.3e-316``, where a subnormal ``w_s pi(a|s)`` keeps half of the digits);
    - any other ``log_prob_fn`` when ``m + lambda >= sqrt(u) (W + lambda)`` (eq. (18)): the
      rounding of a floating-point gradient (about ``u w_s |Q|``), in directions the solver cannot
      know, is amplified by ``1 / (m + lambda)``.

    :func:`natural_gradient_direction` and :func:`natural_gradient_step` refuse unresolvable
    policies (:class:`UnresolvableFisherError`); :func:`trpo_step` returns status
    ``"unresolvable_fisher"``.
    """
    check_float_tensor(params, "params")
    damping = _check_nonnegative_real(damping, "damping")
    theta = params.detach().to(_work_dtype(params))
    with torch.no_grad():
        logp = _policy_log_probs(log_prob_fn, theta)
    weights = _check_state_weights(state_weights, logp.shape[0], logp)
    return _resolution(logp, weights, damping, _is_tabular_softmax(theta, logp))


def _require_resolvable(resolution: FisherResolution, damping: float) -> None:
    if resolution.resolvable:
        return
    if resolution.tabular_softmax:
        raise UnresolvableFisherError(
            f"params: the policy is too close to deterministic for the working precision: "
            f"min_s,a w_s pi(a|s) = {resolution.min_weighted_prob:.3g} is below the threshold "
            f"{resolution.threshold:.3g} = sqrt(u) f_min - damping (trust_region.md eq. (19)), where "
            f"the weighted probabilities lose half of their digits; add damping (now {damping!r})")
    raise UnresolvableFisherError(
        f"params: the policy is too close to deterministic for the working precision: "
        f"min_s,a w_s pi(a|s) = {resolution.min_weighted_prob:.3g} is below the threshold "
        f"{resolution.threshold:.3g} = sqrt(u) (max_s w_s + damping) - damping (trust_region.md "
        f"eq. (18)), so the natural gradient is not resolvable; add damping (now {damping!r}), or "
        f"pass a tabular softmax policy as log_softmax of its [N, A] logits (eq. (19))")


class _NaturalSystem(NamedTuple):
    """The system ``(F + lambda I) s = rhs`` that the natural-gradient routines solve at ``theta``
    (trust_region.md section 6): the products, the right-hand side, the preconditioner (None:
    plain CG), the resolution check and ``finish``, which maps CG's solution to the direction."""

    theta: torch.Tensor
    fvp: Callable[[torch.Tensor], torch.Tensor]
    rhs: torch.Tensor
    preconditioner: torch.Tensor | None
    resolution: FisherResolution
    finish: Callable[[torch.Tensor], torch.Tensor]


def _natural_system(log_prob_fn, params, gradient, state_weights, damping) -> _NaturalSystem:
    """Build :class:`_NaturalSystem`. For a tabular softmax policy (eq. (19)): D = ``w_s pi(a|s) +
    lambda`` on the Fisher's support; undamped, the gradient's part outside F's range (its
    per-state sums, rounding level for any float64 gradient) is removed along pi, and the solution
    is centred per state (the minimum-norm one); damped, the regular system is solved as given.
    A general policy is solved by plain CG in the gradient's working dtype, a tabular softmax one in
    the wider of the parameters' and the gradient's."""
    damping = _check_nonnegative_real(damping, "damping")
    theta = params.detach().to(_work_dtype(params))
    with torch.no_grad():
        logp = _policy_log_probs(log_prob_fn, theta)
    weights = _check_state_weights(state_weights, logp.shape[0], logp)
    tabular = _is_tabular_softmax(theta, logp)
    resolution = _resolution(logp, weights, damping, tabular)
    fvp = fisher_vector_product_fn(log_prob_fn, theta, state_weights, damping=damping)
    if not tabular:  # plain CG in the gradient's working dtype
        return _NaturalSystem(theta, fvp, gradient.detach(), None, resolution, lambda x: x)
    # In the wider of the two working dtypes, so that the diagonal underflows no earlier than eq. (19).
    dtype = torch.promote_types(theta.dtype, _work_dtype(gradient))
    g, logp, weights = gradient.detach().to(dtype), logp.to(dtype), weights.to(dtype)
    counted = _counted(logp, weights)
    weighted = torch.exp(torch.log(weights)[:, None] + logp)  # w_s pi(a|s), 0 off the support
    diagonal = torch.where(counted, weighted + damping, torch.full_like(weighted, damping or 1.0))
    diagonal = torch.where(diagonal > 0, diagonal, torch.ones_like(diagonal))  # only when refused
    if damping > 0.0:
        return _NaturalSystem(theta, fvp, g, diagonal, resolution, lambda x: x)
    zero = torch.zeros_like(g)
    on_support = torch.where(counted, g, zero)
    rhs = torch.where(counted, on_support - torch.exp(logp) * on_support.sum(-1, keepdim=True), zero)
    count = counted.sum(-1, keepdim=True).clamp(min=1)

    def centred(x: torch.Tensor) -> torch.Tensor:
        kept = torch.where(counted, x, zero)
        return torch.where(counted, kept - kept.sum(-1, keepdim=True) / count, zero)

    return _NaturalSystem(theta, fvp, rhs, diagonal, resolution, centred)


def _solve(system: _NaturalSystem, cg_iters: int, cg_tol: float) -> CGResult:
    """CG on the system with the curvature floor ``sqrt(u)`` (trust_region.md section 6)."""
    floor = _sqrt_unit_roundoff(system.theta.dtype)
    cg = conjugate_gradient(system.fvp, system.rhs, cg_iters, cg_tol, curvature_floor=floor,
                            preconditioner=system.preconditioner)
    return cg._replace(solution=system.finish(cg.solution))


class NaturalGradientStep(NamedTuple):
    """``params = params_old + step_size * direction`` with ``direction ~ F^-1 gradient``;
    ``resolution`` is the check of trust_region.md eq. (18) or (19) that the step passed."""

    params: torch.Tensor
    direction: torch.Tensor
    cg: CGResult
    resolution: FisherResolution


def _natural_direction(log_prob_fn, params, gradient, state_weights, cg_iters, cg_tol, damping):
    cg_iters = _check_positive_int(cg_iters, "cg_iters")
    cg_tol = _check_nonnegative_real(cg_tol, "cg_tol")
    check_float_tensor(params, "params")
    check_float_tensor(gradient, "gradient")
    if gradient.shape != params.shape:
        raise ValueError(f"gradient must have the parameters' shape {tuple(params.shape)}, "
                         f"got {tuple(gradient.shape)}")
    system = _natural_system(log_prob_fn, params, gradient, state_weights, damping)
    _require_resolvable(system.resolution, damping)
    return _solve(system, cg_iters, cg_tol), system.resolution


def natural_gradient_direction(
    log_prob_fn: LogProbFn,
    params: torch.Tensor,
    gradient: torch.Tensor,
    state_weights: torch.Tensor,
    *,
    cg_iters: int = 50,
    cg_tol: float = 1e-10,
    damping: float = 0.0,
) -> CGResult:
    """Solve ``(F + damping I) s = gradient`` by CG with Fisher-vector products.

    spec: trust_region.md eq. (5); Schulman et al. 2015, Appendix C. For a tabular softmax policy with the
    exact
    gradient of J and F weighted by the normalised occupancy, the (minimum-norm) solution is
    ``(A - mean_a A) / (1 - gamma)`` on states with d > 0 (trust_region.md eq. (8)).

    A tabular softmax policy (``log_prob_fn(params)`` equal to ``log_softmax(params, dim=-1)``,
    ``[N, A]``) is solved by CG preconditioned with ``diag(w_s pi(a|s)) + damping``, which resolves
    it down to eq. (19) (probabilities near float64's underflow); undamped, the gradient's
    component outside F's range is removed along pi and the centred solution returned, so the CG
    record describes that consistent system. Any other
    ``log_prob_fn`` is solved by plain CG and resolved down to eq. (18). Below the threshold it
    raises :class:`UnresolvableFisherError` (a ``ValueError``, :func:`fisher_resolution`); CG runs
    with the relative curvature floor ``sqrt(u)`` of trust_region.md section 6.
    """
    cg, _ = _natural_direction(log_prob_fn, params, gradient, state_weights, cg_iters, cg_tol, damping)
    return cg


def natural_gradient_step(
    log_prob_fn: LogProbFn,
    params: torch.Tensor,
    gradient: torch.Tensor,
    state_weights: torch.Tensor,
    step_size: float,
    *,
    cg_iters: int = 50,
    cg_tol: float = 1e-10,
    damping: float = 0.0,
) -> NaturalGradientStep:
    """One natural-gradient ascent step ``params + step_size * F^-1 gradient``.

    spec: trust_region.md eq. (7); Kakade (2001). For tabular softmax with exact advantages this is
    ``pi_new(a|s) ∝ pi(a|s) exp(step_size A(s, a) / (1 - gamma))`` (trust_region.md eq. (9)).
    Solved as in :func:`natural_gradient_direction`; refuses policies too close to deterministic
    for the working precision (:class:`UnresolvableFisherError`, trust_region.md eq. (18)-(19))
    instead of returning a wrong step.
    """
    step_size = _check_nonnegative_real(step_size, "step_size")
    cg, resolution = _natural_direction(log_prob_fn, params, gradient, state_weights, cg_iters, cg_tol,
                                        damping)
    # In promote(params, solution): float64 parameters are not rounded to a float32 solution's dtype.
    new_params = (params.detach() + step_size * cg.solution).to(params.dtype)
    return NaturalGradientStep(new_params, cg.solution, cg, resolution)


# ----------------------------------------------------------------------------- TRPO
class TRPOCandidate(NamedTuple):
    """One point ``params_old + fraction * beta * s`` tried by the line search."""

    fraction: float
    improvement: float  # surrogate(candidate) - surrogate(params_old)
    kl: float  # exact mean KL(pi_old || pi_candidate)


@dataclass(frozen=True)
class TRPOSearchRecord:
    """What :func:`trpo_step` did (spec: trust_region.md section 3).

    ``status`` is ``"accepted"``, ``"no_acceptable_step"`` (every candidate broke the KL limit or
    did not improve: the parameters are returned unchanged), ``"zero_gradient"``,
    ``"unresolvable_fisher"`` (the policy is too close to deterministic for the working precision,
    trust_region.md eq. (18) or (19): no CG, no step; ``cg`` then reports 0 iterations, not converged) or
    ``"no_curvature"`` (``s^T F s <= 0``; no step). ``backtracks`` is the number of shrinks
    before the accepted candidate (``max_backtracks`` when none was accepted), ``step_fraction``
    the accepted ``xi^backtracks`` (0 when none). ``expected_improvement`` is the linear model
    ``g^T (params_new - params_old)``, ``actual_improvement`` the surrogate's change and ``kl`` the
    exact mean KL at the accepted point (all 0 without a step). ``quadratic_kl`` is
    ``0.5 step^T F step`` (``= step_fraction^2 * max_kl``). ``candidates`` lists every point tried.
    ``resolution`` is the check of eq. (18) or (19) at ``params`` (with the damping).
    """

    status: str
    backtracks: int
    step_fraction: float
    full_step_scale: float
    expected_improvement: float
    actual_improvement: float
    kl: float
    quadratic_kl: float
    max_kl: float
    cg: CGResult
    candidates: tuple[TRPOCandidate, ...]
    resolution: FisherResolution

    @property
    def accepted(self) -> bool:
        return self.status == "accepted"


def trpo_step(
    surrogate_fn: SurrogateFn,
    log_prob_fn: LogProbFn,
    params: torch.Tensor,
    state_weights: torch.Tensor,
    max_kl: float,
    *,
    cg_iters: int = 10,
    cg_tol: float = 1e-10,
    damping: float = 0.0,
    backtrack_ratio: float = 0.5,
    max_backtracks: int = 10,
) -> tuple[torch.Tensor, TRPOSearchRecord]:
    """One TRPO update (spec: trust_region.md eq. (11); Schulman et al. 2015, sections 5-6 and Appendix C).

    1. ``g = grad surrogate_fn`` at ``params`` (Schulman et al. 2015, Appendix C);
    2. ``s`` solves ``(F + damping I) s = g`` by CG with Fisher-vector products (Schulman et al. 2015,
    Appendix C);
    3. ``beta = sqrt(2 max_kl / s^T F s)`` with the undamped F (Schulman et al. 2015, Appendix C), so the full
       step's
       quadratic KL is exactly ``max_kl``;
    4. backtracking along ``xi^k beta s``, ``k = 0..max_backtracks``, ``xi = backtrack_ratio``:
       accept the first (largest) candidate whose surrogate improvement is ``> 0`` and whose
       *exact* mean KL ``sum_s w_s KL(pi_old || pi_new) <= max_kl`` (Schulman et al. 2015, Appendix C, with a
       strict improvement so that a zero step is never "accepted"; a candidate whose KL is NaN,
       e.g. where ``log_prob_fn`` overflows, fails the limit and is recorded).
    No CG runs and no step is taken when the gradient is 0 (``"zero_gradient"``) or the policy is
    too close to deterministic for the working precision (``"unresolvable_fisher"``,
    trust_region.md eq. (18)-(19); damping lifts it); CG runs with the curvature floor ``sqrt(u)``,
    preconditioned for a tabular softmax policy as in :func:`natural_gradient_direction`.

    Args:
        surrogate_fn: ``params -> scalar`` objective to maximise, e.g. the importance-weighted
            surrogate (Schulman et al. 2015, section 5) built from ``log_prob_fn``; differentiable.
        log_prob_fn: ``params -> [N, A]`` action log-probabilities.
        params: current parameters (any shape, floating point).
        state_weights: ``[N]`` weights of the mean KL (a distribution over the N states).
        max_kl: the trust-region radius delta (> 0).
    Returns:
        ``(new_params, record)``: new parameters (the old ones, cloned, when no step is accepted)
        and a :class:`TRPOSearchRecord`.
    """
    check_float_tensor(params, "params")
    max_kl = _check_nonnegative_real(max_kl, "max_kl")
    if max_kl == 0.0:
        raise ValueError("max_kl must be > 0")
    ratio = _check_nonnegative_real(backtrack_ratio, "backtrack_ratio")
    if not 0.0 < ratio < 1.0:
        raise ValueError(f"backtrack_ratio must lie in (0, 1), got {ratio!r}")
    max_backtracks = _check_positive_int(max_backtracks, "max_backtracks", minimum=0)
    cg_iters = _check_positive_int(cg_iters, "cg_iters")
    cg_tol = _check_nonnegative_real(cg_tol, "cg_tol")

    theta = params.detach().to(_work_dtype(params)).requires_grad_(True)
    with torch.enable_grad():
        surrogate_old = surrogate_fn(theta)
        if not isinstance(surrogate_old, torch.Tensor) or surrogate_old.numel() != 1:
            raise ValueError("surrogate_fn must return a scalar tensor")
        (g,) = torch.autograd.grad(surrogate_old.reshape(()), theta)
    surrogate_old = float(surrogate_old.detach())
    theta = theta.detach()
    system = _natural_system(log_prob_fn, theta, g, state_weights, damping)
    resolution = system.resolution
    with torch.no_grad():
        old_log_probs = _log_probs(log_prob_fn, theta)

    def no_step(status: str, cg: CGResult, scale: float = 0.0, candidates=()):
        record = TRPOSearchRecord(status, max_backtracks if candidates else 0, 0.0, scale, 0.0, 0.0, 0.0,
                                  0.0, max_kl, cg, tuple(candidates), resolution)
        return params.detach().clone(), record

    g_norm = math.sqrt(float(_dot(g, g)))
    if g_norm == 0.0:
        return no_step("zero_gradient", CGResult(torch.zeros_like(g), 0, 0.0, 0.0, True))
    if not resolution.resolvable:
        return no_step("unresolvable_fisher", CGResult(torch.zeros_like(g), 0, g_norm, 1.0, False))
    cg = _solve(system, cg_iters, cg_tol)
    direction = cg.solution
    undamped = fisher_vector_product_fn(log_prob_fn, theta, state_weights)(direction)
    if not float(_dot(direction, undamped)) > 0.0:
        return no_step("no_curvature", cg)
    scale = trust_region_step_scale(direction, undamped, max_kl)
    full_step = scale * direction
    expected_full = float(_dot(g, full_step))

    candidates = []
    for k in range(max_backtracks + 1):
        fraction = ratio**k
        candidate = theta + fraction * full_step
        with torch.no_grad():
            improvement = float(surrogate_fn(candidate)) - surrogate_old
            kl = float(mean_kl(log_prob_fn, old_log_probs, candidate, state_weights))
        candidates.append(TRPOCandidate(fraction, improvement, kl))
        if improvement > 0.0 and kl <= max_kl:
            record = TRPOSearchRecord("accepted", k, fraction, scale, fraction * expected_full, improvement,
                                      kl, fraction**2 * max_kl, max_kl, cg, tuple(candidates), resolution)
            return candidate.to(params.dtype), record
    return no_step("no_acceptable_step", cg, scale, candidates)
