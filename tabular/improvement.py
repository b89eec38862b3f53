"""Policy-improvement theory: performance difference, surrogate, CPI and TRPO lower bounds.

spec: specs/mdp.md section 5, eq. (20)-(31); Kakade & Langford 2002, Lemma 6.1 and Theorem 4.1;
Schulman et al. 2015, eq. (1)-(6) and Theorem 1.

Everything is written with the UNnormalised occupancy ``rho_pi(s) = sum_t gamma^t P(s_t = s)``
(``state_occupancy(..., normalized=False)``), so that ``(1 / (1 - gamma)) E_{s ~ d_pi}[f(s)]``
of the normalised form reads ``sum_s rho_pi(s) f(s)``; this is well defined for gamma = 1 episodic MDPs
with proper policies too. The bounds with ``1 - gamma`` in a denominator (CPI, TRPO) raise a
clear ``ValueError`` at gamma = 1. Total variation is ``0.5 ||p - q||_1``; "max" is over all
states. Expectations over ``pi_new`` are taken directly (``sum_a pi_new(a|s) A(s, a)``), which
equals the importance-weighted form of Schulman et al. 2015 section 5 whenever ``pi_new`` is absolutely
continuous w.r.t.
``pi``, and needs no division by probabilities.
"""

from __future__ import annotations

import numpy as np

from tabular.evaluation import advantages, expected_return, q_values, state_occupancy
from tabular.mdp import MDP, validate_policy

__all__ = [
    "policy_total_variation",
    "policy_kl",
    "expected_advantage",
    "performance_difference",
    "surrogate",
    "distribution_shift_penalty",
    "mixture",
    "cpi_gain",
    "cpi_epsilon",
    "cpi_lower_bound",
    "cpi_step_size",
    "trpo_epsilon",
    "trpo_lower_bound",
]


def _two_policies(pi, pi_new) -> tuple[np.ndarray, np.ndarray]:
    try:  # (numpy's own error would not name the argument)
        pi_arr = np.asarray(pi, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"pi must be a numeric array, got {type(pi).__name__}") from exc
    if pi_arr.ndim != 2:
        raise ValueError(f"pi must have shape [S, A], got {pi_arr.shape}")
    S, A = pi_arr.shape
    return validate_policy(pi, S, A, "pi"), validate_policy(pi_new, S, A, "pi_new")


def _require_discounted(mdp: MDP, what: str) -> None:
    if not isinstance(mdp, MDP):
        raise TypeError(f"mdp must be a tabular.MDP, got {type(mdp).__name__}")
    if mdp.gamma >= 1.0:
        raise ValueError(
            f"{what} needs gamma < 1: it has (1 - gamma) in a denominator and is infinite at gamma = 1"
        )


def policy_total_variation(pi, pi_new) -> np.ndarray:
    """``[S]`` total variation ``TV(pi(.|s), pi_new(.|s)) = 0.5 sum_a |pi - pi_new|`` (mdp.md eq. (20))."""
    pi, pi_new = _two_policies(pi, pi_new)
    return 0.5 * np.abs(pi - pi_new).sum(axis=1)


def policy_kl(pi, pi_new) -> np.ndarray:
    """``[S]`` KL divergence ``KL(pi(.|s) || pi_new(.|s)) = sum_a pi log(pi / pi_new)`` (mdp.md eq. (30)).

    Direction: the FIRST argument is the distribution the expectation is taken under (a common slip
    writes the log ratio upside down; specs/errata.md entry 5). Terms with
    ``pi(a|s) = 0`` are 0; a state where ``pi > 0 = pi_new`` gives ``inf``. Computed in log space.
    """
    pi, pi_new = _two_policies(pi, pi_new)
    support = pi > 0.0
    with np.errstate(divide="ignore"):
        log_ratio = np.where(support, np.log(np.where(support, pi, 1.0)) - np.log(pi_new), 0.0)
    terms = np.where(support, pi * log_ratio, 0.0)
    return terms.sum(axis=1)


def expected_advantage(mdp: MDP, pi, pi_new) -> np.ndarray:
    """``[S]`` ``abar(s) = sum_a pi_new(a|s) A_pi(s, a)`` (mdp.md eq. (21)), the advantage of
    ``pi_new`` over ``pi`` at each state (0 for ``pi_new = pi``, by Schulman et al. 2016, section 2)."""
    pi, pi_new = _two_policies(pi, pi_new)
    return np.einsum("sa,sa->s", pi_new, advantages(mdp, pi))


def performance_difference(mdp: MDP, pi, pi_new) -> float:
    """Right side of the performance-difference lemma, Kakade & Langford 2002, Lemma 6.1;
    Schulman et al. 2015, eq. (1)-(2) (mdp.md eq. (22)):

        sum_s rho_{pi_new}(s) sum_a pi_new(a|s) A_pi(s, a)  ( = J(pi_new) - J(pi) ).

    Uses the unnormalised occupancy of ``pi_new``: ``(1/(1-gamma)) E_{s~d_{pi_new}}``.
    """
    abar = expected_advantage(mdp, pi, pi_new)
    rho_new = state_occupancy(mdp, pi_new, normalized=False)
    return float(rho_new @ abar)


def surrogate(mdp: MDP, pi, pi_new) -> float:
    """Local surrogate ``L_pi(pi_new)``, Schulman et al. 2015, eq. (3) (mdp.md eq. (23)):

        J(pi) + sum_s rho_pi(s) sum_a pi_new(a|s) A_pi(s, a).

    The old occupancy ``rho_pi`` replaces ``rho_{pi_new}`` of the performance-difference lemma.
    """
    abar = expected_advantage(mdp, pi, pi_new)
    rho = state_occupancy(mdp, pi, normalized=False)
    return expected_return(mdp, pi) + float(rho @ abar)


def distribution_shift_penalty(mdp: MDP, pi, pi_new) -> float:
    """``DSP_pi(pi_new) = sum_s (rho_{pi_new}(s) - rho_pi(s)) sum_a pi_new(a|s) A_pi(s, a)``,
    Schulman et al. 2015, eq. (2) minus eq. (3) (mdp.md eq. (24)); ``surrogate + distribution_shift_penalty =
    J(pi_new)`` (Schulman et al. 2015, eq. (2) minus eq. (3))."""
    abar = expected_advantage(mdp, pi, pi_new)
    rho = state_occupancy(mdp, pi, normalized=False)
    rho_new = state_occupancy(mdp, pi_new, normalized=False)
    return float((rho_new - rho) @ abar)


def mixture(pi, pi_new, alpha: float) -> np.ndarray:
    """Conservative mixture ``(1 - alpha) pi + alpha pi_new``, Kakade & Langford 2002; Schulman et al. 2015,
    eq. (5) (mdp.md eq. (25)); ``[S, A]``."""
    pi, pi_new = _two_policies(pi, pi_new)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating, np.integer)):
        raise TypeError(f"alpha must be a real number, got {type(alpha).__name__}")
    if not (0.0 <= float(alpha) <= 1.0):
        raise ValueError(f"alpha must lie in [0, 1], got {alpha!r}")
    return (1.0 - alpha) * pi + alpha * pi_new


def cpi_gain(mdp: MDP, pi, pi_new) -> float:
    """``g = L_pi(pi_new) - J(pi) = sum_s rho_pi(s) sum_a pi_new A_pi``, Schulman et al. 2015, eq. (6) (mdp.md
    eq. (26))."""
    abar = expected_advantage(mdp, pi, pi_new)
    return float(state_occupancy(mdp, pi, normalized=False) @ abar)


def cpi_epsilon(mdp: MDP, pi, pi_new) -> float:
    """``eps = max_s |sum_a pi_new(a|s) A_pi(s, a)|`` over the TARGET policy ``pi_new``, Schulman et al. 2015,
    eq. (6).

    Not over the mixture (alpha times smaller, which breaks the bound; errata.md entry 1).
    """
    return float(np.max(np.abs(expected_advantage(mdp, pi, pi_new))))


def cpi_lower_bound(mdp: MDP, pi, pi_new, alpha: float, form: str = "schulman2015") -> float:
    """Lower bound on ``J(mixture(pi, pi_new, alpha))`` (mdp.md eq. (27)).

    ``form="schulman2015"`` (the default): the form of Schulman et al. 2015, eq. (6),
    ``J(pi) + alpha g - 2 gamma eps alpha^2 / (1 - gamma)^2``.
    ``form="kakade_langford"``: the tighter exact form of Kakade & Langford (2002) Thm 4.1,
    ``J(pi) + alpha g - 2 gamma eps alpha^2 / ((1 - gamma)(1 - gamma (1 - alpha)))``.
    ``g`` from :func:`cpi_gain`, ``eps`` from :func:`cpi_epsilon` (target policy). Raises at gamma = 1.
    """
    _require_discounted(mdp, "cpi_lower_bound")
    if form not in ("schulman2015", "kakade_langford"):
        raise ValueError(f"form must be 'schulman2015' or 'kakade_langford', got {form!r}")
    mixture(pi, pi_new, alpha)  # validates alpha and the policies
    gamma = mdp.gamma
    g = cpi_gain(mdp, pi, pi_new)
    eps = cpi_epsilon(mdp, pi, pi_new)
    if form == "schulman2015":
        penalty = 2.0 * gamma * eps * alpha**2 / (1.0 - gamma) ** 2
    else:
        penalty = 2.0 * gamma * eps * alpha**2 / ((1.0 - gamma) * (1.0 - gamma * (1.0 - alpha)))
    return expected_return(mdp, pi) + alpha * g - penalty


def cpi_step_size(mdp: MDP, pi, pi_new) -> float:
    """Step size maximising the CPI bound (60): ``min(1, (1 - gamma)^2 g / (4 gamma eps))``,
    Kakade & Langford 2002; mdp.md eq. (28).

    mdp.md eq. (28). Returns 0 when ``g <= 0`` (no guaranteed improvement; this also covers
    ``eps = 0``, which forces ``g = 0``), and 1 when ``gamma = 0`` and ``g > 0`` (no penalty).
    The guaranteed improvement ``alpha g - 2 gamma eps alpha^2 / (1 - gamma)^2`` is then
    ``>= alpha g / 2 >= 0``. Raises at gamma = 1.

    Guard against rounding: ``eps <= 1e-12 max |Q_pi|`` and ``g <= 1e-12 max |Q_pi| / (1 - gamma)``
    count as 0 (otherwise ``g / eps`` is a ratio of two rounding errors, e.g. for ``pi_new = pi``).
    """
    _require_discounted(mdp, "cpi_step_size")
    g = cpi_gain(mdp, pi, pi_new)
    eps = cpi_epsilon(mdp, pi, pi_new)
    noise = 1e-12 * float(np.max(np.abs(q_values(mdp, pi))))
    if g <= noise / (1.0 - mdp.gamma) or eps <= noise:
        return 0.0
    # compared before dividing: 4 gamma eps underflows to 0 for a subnormal gamma, and is 0 at gamma = 0
    # (the step is then 1); at equality the quotient would be exactly 1 too
    numerator, denominator = (1.0 - mdp.gamma) ** 2 * g, 4.0 * mdp.gamma * eps
    return 1.0 if numerator >= denominator else float(numerator / denominator)


def trpo_epsilon(mdp: MDP, pi) -> float:
    """``eps = max_{s,a} |A_pi(s, a)|`` of the TRPO paper's Theorem 1 (mdp.md eq. (31))."""
    return float(np.max(np.abs(advantages(mdp, pi))))


def trpo_lower_bound(mdp: MDP, pi, pi_new, divergence: str = "tv") -> float:
    """Lower bound on ``J(pi_new)``: TRPO paper Theorem 1 (mdp.md eq. (31)).

        divergence="tv":  L_pi(pi_new) - 4 eps gamma / (1 - gamma)^2 * (max_s TV(pi, pi_new))^2
        divergence="kl":  L_pi(pi_new) - 4 eps gamma / (1 - gamma)^2 * max_s KL(pi || pi_new)

    with ``eps = max_{s,a} |A_pi(s, a)|``. The KL form follows from ``TV^2 <= KL`` (Pinsker); the
    project fixes the direction ``KL(old || new)`` as the TRPO paper and Schulman et al. 2015, section 4 do.
    The KL
    form is ``-inf`` when ``pi_new`` puts zero mass where ``pi`` does not. Raises at gamma = 1.
    """
    _require_discounted(mdp, "trpo_lower_bound")
    if divergence == "tv":
        div = float(np.max(policy_total_variation(pi, pi_new))) ** 2
    elif divergence == "kl":
        div = float(np.max(policy_kl(pi, pi_new)))
    else:
        raise ValueError(f"divergence must be 'tv' or 'kl', got {divergence!r}")
    coeff = 4.0 * trpo_epsilon(mdp, pi) * mdp.gamma / (1.0 - mdp.gamma) ** 2
    penalty = coeff * div if coeff > 0.0 else 0.0  # 0 * inf (identical advantages, KL = inf) is 0
    return surrogate(mdp, pi, pi_new) - penalty
