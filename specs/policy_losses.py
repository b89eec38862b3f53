"""Exact sympy specs of the policy-loss family (spec: specs/policy_losses.md).

``LossSpec`` mirrors the parts of the family (ratio level, gate, aggregation, regularisers,
behaviour correction) with the same field names as the implementation's variant, but this module
is written from the equations of policy_losses.md alone (it imports nothing from ``refimpl``).

``build_policy_loss(spec, lengths, per_token_advantages, ...)`` returns the loss of a batch with
the given sequence lengths (ragged; padding is not part of the spec) as a sympy expression of
symbols, plus its gradient with respect to every ``logp`` symbol. Stop-gradient ``sg(.)`` is
modelled by a second set of symbols ``logp_sg`` that take the same values as ``logp`` but are not
differentiated. Hard gates are ``Piecewise`` expressions with the inclusive conditions of policy_losses.md
eq. (6), so the symbolic derivative exactly on a clip boundary is the convention of md eq. (6).

``evaluate`` substitutes exact values (sympy numbers, e.g. ``old + log(5/4)`` to sit exactly on
a boundary) and evaluates to ``digits`` certain significant digits; ``evaluate_float64`` rounds
each number correctly to float64 (``specs._exact``). Builds are cached per shape.

The ``prove_*`` functions are the sympy proofs of md section 6; each returns True or raises.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import sympy as sp

from specs._exact import decisions, exact, to_digits, to_float64

__all__ = [
    "LossSpec",
    "PolicyLossExpression",
    "build_policy_loss",
    "evaluate",
    "evaluate_float64",
    "min_clip_identity_cases",
    "prove_min_clip_identity",
    "prove_piecewise_gate_equals_min_clip",
    "prove_sapo_gate_derivative",
    "prove_gspo_gradient",
    "prove_gradient_at_ratio_one",
]


#: the aggregations of md eq. (10) under which a sequence-level term counts once per token
_PER_TOKEN_COPIES = ("token_mean", "seq_sum", "seq_mean_token_sum")


@dataclass(frozen=True)
class LossSpec:
    """The parts of md table 1 (same field names as refimpl's PolicyLossVariant)."""

    ratio: str = "token"
    gate: str = "clip"
    eps_low: float | None = 0.2
    eps_high: float | None = 0.2
    dual_clip: float | None = None
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    aggregation: str = "token_mean"
    max_length: int | None = None
    group_size: int | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_scale: str = "token"
    entropy_coef: float = 0.0
    behavior_correction: str = "none"
    behavior_cap: float = 2.0


@dataclass(frozen=True)
class PolicyLossExpression:
    """A built loss: ``loss`` and ``gradient[i][t] = d loss / d logp[i][t]`` as sympy expressions,
    the symbol tables (ragged: ``logp[i]`` has ``lengths[i]`` symbols), and ``abs_scale``, the
    sum of absolute values of the summed per-sequence contributions over the denominator (for the
    absolute tolerance floor of docs/architecture.md)."""

    loss: sp.Expr
    gradient: tuple[tuple[sp.Expr, ...], ...]
    abs_scale: sp.Expr
    logp: tuple[tuple[sp.Symbol, ...], ...]
    logp_sg: tuple[tuple[sp.Symbol, ...], ...]
    old_logp: tuple[tuple[sp.Symbol, ...], ...]
    advantages: tuple  # [N] symbols or ragged [N][T_i]
    ref_logp: tuple[tuple[sp.Symbol, ...], ...]
    behavior_logp: tuple[tuple[sp.Symbol, ...], ...]
    entropy: tuple[tuple[sp.Symbol, ...], ...]
    kl: tuple[tuple[sp.Symbol, ...], ...]
    normalizer: sp.Symbol


def _exact(x: float | int | None) -> sp.Expr | None:
    """The exact rational value of a float (no decimal rounding): the implementation computes
    with the same binary number."""
    return None if x is None else sp.Rational(x)


def _exact_number(v) -> sp.Expr:
    return v if isinstance(v, sp.Basic) else exact(v)


def _ragged(prefix: str, lengths: tuple[int, ...]) -> tuple[tuple[sp.Symbol, ...], ...]:
    return tuple(tuple(sp.Symbol(f"{prefix}_{i}_{t}", real=True) for t in range(n))
                 for i, n in enumerate(lengths))


def hard_clip_term(r: sp.Expr, a: sp.Expr, eps_low, eps_high, dual_clip) -> sp.Expr:
    """md eqs. (6)-(7): ``min(r a, clip(r, 1 - eps_low, 1 + eps_high) a)`` (with ``max(., c a)``
    for a < 0 under dual clip) as ``r a`` where the inclusive gate of policy_losses.md eq. (6) is open and
    the clipped constant elsewhere. ``None`` removes a side."""
    upper = None if eps_high is None else 1 + eps_high
    lower = None if eps_low is None else 1 - eps_low
    open_pos = sp.And(a > 0, r <= upper) if upper is not None else (a > 0)
    open_neg = sp.And(a <= 0, r >= lower) if lower is not None else (a <= 0)
    pieces = []
    if dual_clip is not None:
        open_neg = sp.And(open_neg, r <= dual_clip)
    pieces.append((r * a, sp.Or(open_pos, open_neg)))
    if upper is not None:
        pieces.append((upper * a, a > 0))
    if dual_clip is not None:
        pieces.append((dual_clip * a, r > dual_clip))
    if lower is not None:
        pieces.append((lower * a, True))
    else:
        pieces.append((r * a, True))  # unreachable: without a lower bound the gate is open for a <= 0
    return sp.Piecewise(*pieces)


def min_clip_term(r: sp.Expr, a: sp.Expr, eps_low, eps_high, dual_clip=None) -> sp.Expr:
    """The literal form of Schulman et al. 2017, eq. (7) / Yu et al. 2025, section 3.1, ``min(r a, clip(r, 1 -
    eps_low, 1 + eps_high) a)``
    (plus ``max(., c a)`` for a < 0 under dual clip), used to prove md eq. (6)'s Piecewise."""
    clipped = sp.Min(sp.Max(r, 1 - eps_low), 1 + eps_high)
    term = sp.Min(r * a, clipped * a)
    if dual_clip is not None:
        term = sp.Piecewise((sp.Max(term, dual_clip * a), a < 0), (term, True))
    return term


def sapo_term(r: sp.Expr, a: sp.Expr, tau_pos, tau_neg) -> sp.Expr:
    """md eq. (8); Gao et al. 2025: ``4 / tau * sigmoid(tau (r - 1)) * a``."""
    tau = sp.Piecewise((tau_pos, a > 0), (tau_neg, True))
    return 4 / tau / (1 + sp.exp(-tau * (r - 1))) * a


def log_clip_term(log_r: sp.Expr, a: sp.Expr, eps_low, eps_high) -> sp.Expr:
    """md eq. (18) (GMPO): a token's log-ratio clipped on the pessimistic side, ``min(l, eps_high)``
    for a > 0 and ``max(l, -eps_low)`` for a <= 0, as ``l`` where the inclusive gate is open and the
    bound elsewhere (so the derivative on a bound is 1). ``None`` removes a side."""
    open_pos = sp.And(a > 0, log_r <= eps_high) if eps_high is not None else (a > 0)
    open_neg = sp.And(a <= 0, log_r >= -eps_low) if eps_low is not None else (a <= 0)
    pieces = [(log_r, sp.Or(open_pos, open_neg))]
    if eps_high is not None:
        pieces.append((eps_high, a > 0))
    pieces.append((-eps_low, True) if eps_low is not None else (log_r, True))
    return sp.Piecewise(*pieces)


def _clip_value(x: sp.Expr, lower, upper) -> sp.Expr:
    if lower is not None:
        x = sp.Max(x, lower)
    if upper is not None:
        x = sp.Min(x, upper)
    return x


def _policy_unit_terms(spec: LossSpec, lp, lp_sg, old, adv, beh, lengths):
    """(level, terms): per-token terms ``terms[i][t]`` (level "token") or per-sequence terms
    ``terms[i]`` (level "sequence") of the surrogate (md eqs. (2)-(9), (13))."""
    eps_low, eps_high, c = _exact(spec.eps_low), _exact(spec.eps_high), _exact(spec.dual_clip)
    lower = None if eps_low is None else 1 - eps_low
    upper = None if eps_high is None else 1 + eps_high
    tau_pos, tau_neg, cap = _exact(spec.tau_pos), _exact(spec.tau_neg), _exact(spec.behavior_cap)

    def gate(r, r_sg, a, unit_logp):
        if spec.gate == "clip":
            return hard_clip_term(r, a, eps_low, eps_high, c)
        if spec.gate == "sapo":
            return sapo_term(r, a, tau_pos, tau_neg)
        if spec.gate == "cispo":
            return _clip_value(r_sg, lower, upper) * a * unit_logp
        return r * a

    def behavior(log_w):
        if spec.behavior_correction == "none":
            return sp.Integer(1)
        w = sp.exp(log_w)
        if spec.behavior_correction == "truncate":
            return sp.Min(w, cap)
        return sp.Piecewise((w, w <= cap), (0, True))

    per_token_adv = len(adv) > 0 and isinstance(adv[0], tuple)
    log_clip = spec.gate == "log_clip"
    if log_clip and spec.ratio == "gspo_token":
        raise ValueError("gate 'log_clip' needs ratio 'token', 'sequence_mean' or 'sequence_product'")

    def clipped(log_r, a):  # md eq. (18): GMPO clips each token's log-ratio before the ratio level
        return log_clip_term(log_r, a, eps_low, eps_high) if log_clip else log_r

    terms = []
    for i, n in enumerate(lengths):
        if spec.ratio in ("token", "gspo_token"):
            row = []
            log_s_sg = sum((lp_sg[i][t] - old[i][t] for t in range(n)), sp.Integer(0)) / max(n, 1)
            for t in range(n):
                a = adv[i][t] if per_token_adv else adv[i]
                if spec.ratio == "token":
                    log_r, log_r_sg = clipped(lp[i][t] - old[i][t], a), lp_sg[i][t] - old[i][t]
                else:  # exp(logp - sg(logp) + sg(log s))
                    log_r, log_r_sg = lp[i][t] - lp_sg[i][t] + log_s_sg, log_s_sg
                term = gate(sp.exp(log_r), sp.exp(log_r_sg), a, lp[i][t])
                row.append(term * behavior(old[i][t] - beh[i][t]))
            terms.append(tuple(row))
        else:
            total = sum((clipped(lp[i][t] - old[i][t], adv[i]) for t in range(n)), sp.Integer(0))
            total_sg = sum((lp_sg[i][t] - old[i][t] for t in range(n)), sp.Integer(0))
            total_lp = sum(lp[i][:n], sp.Integer(0))
            log_w = sum((old[i][t] - beh[i][t] for t in range(n)), sp.Integer(0))
            if spec.ratio == "sequence_mean":
                scale = sp.Integer(1) / max(n, 1)
                total, total_sg, total_lp, log_w = (x * scale for x in (total, total_sg, total_lp, log_w))
            term = gate(sp.exp(total), sp.exp(total_sg), adv[i], total_lp) * behavior(log_w)
            terms.append(term if n else 0)
    level = "token" if spec.ratio in ("token", "gspo_token") else "sequence"
    return level, terms


def _kl_term(spec: LossSpec, lp, ref, kl_sym, use_exact_kl: bool):
    if use_exact_kl:
        return kl_sym
    log_r = ref - lp  # log r = log pi_ref - log pi_theta (kl.md convention)
    if spec.kl_estimator == "k1":
        return -log_r
    if spec.kl_estimator == "k2":
        return log_r**2 / 2
    return sp.exp(log_r) - 1 - log_r


@functools.lru_cache(maxsize=512)
def build_policy_loss(spec: LossSpec, lengths: tuple[int, ...], per_token_advantages: bool = False,
                      kl_source: str = "none", with_entropy: bool = False,
                      global_normalizer: bool = False) -> PolicyLossExpression:
    """The loss of md eq. (12) for a batch with the given (ragged) lengths.

    kl_source: "none", "ref" (estimator ``spec.kl_estimator`` on ``ref_logp``) or "exact" (``kl``).
    global_normalizer: use the symbol ``normalizer`` as D instead of md eq. (11)'s local value.
    The KL (entropy) term enters only when kl_coef (entropy_coef) > 0. With ``spec.kl_scale ==
    "sequence"`` the KL is md eq. (19): ``beta (1/S) sum_i sum_t KL_{i,t}``, S the number of
    non-empty sequences, given globally as D (sequence means, seq_mean_token_sum), D / L_max
    (seq_sum) or D (seq_sqrt_token_mean counts sequences); with token_mean it needs the local S.
    seq_sum's L_max must bound every length (md eq. (11)); ValueError otherwise.
    """
    lp, lp_sg, old = _ragged("lp", lengths), _ragged("lpsg", lengths), _ragged("old", lengths)
    ref, beh = _ragged("ref", lengths), _ragged("beh", lengths)
    ent, kls = _ragged("ent", lengths), _ragged("kl", lengths)
    if per_token_advantages:
        adv = _ragged("A", lengths)
    else:
        adv = tuple(sp.Symbol(f"A_{i}", real=True) for i in range(len(lengths)))
    level, terms = _policy_unit_terms(spec, lp, lp_sg, old, adv, beh, lengths)
    beta, alpha = _exact(spec.kl_coef), _exact(spec.entropy_coef)
    agg = spec.aggregation
    sequence_kl = kl_source != "none" and beta != 0 and spec.kl_scale == "sequence"
    sequence_kls = []  # sum_t KL_{i,t} of each non-empty sequence, for md eq. (19)
    contributions = []
    for i, n in enumerate(lengths):
        if n == 0:
            contributions.append(sp.Integer(0))
            continue
        token_values = [sp.Integer(0)] * n
        if level == "token":
            token_values = [-terms[i][t] for t in range(n)]
        if kl_source != "none" and beta != 0:
            exact_kl = kl_source == "exact"
            kl_values = [_kl_term(spec, lp[i][t], ref[i][t], kls[i][t], exact_kl) for t in range(n)]
            if sequence_kl:
                sequence_kls.append(sum(kl_values, sp.Integer(0)))
            else:
                token_values = [v + beta * k for v, k in zip(token_values, kl_values, strict=True)]
        if with_entropy and alpha != 0:
            token_values = [v - alpha * ent[i][t] for t, v in enumerate(token_values)]
        token_sum = sum(token_values, sp.Integer(0))
        c_i = token_sum / n if agg in ("seq_mean_token_mean", "seq_sqrt_token_mean") else token_sum
        if level == "sequence":  # a sequence term counts once per token (md eq. (10))
            c_i += -terms[i] * (n if agg in _PER_TOKEN_COPIES else 1)
        if agg == "seq_sqrt_token_mean":  # each group's sum over sqrt(G), not G (md eq. (10), (27))
            if spec.group_size is None:
                raise ValueError("spec.group_size is required by aggregation 'seq_sqrt_token_mean'")
            c_i *= sp.sqrt(spec.group_size)
        contributions.append(c_i)
    nonempty = sum(1 for n in lengths if n > 0)
    if agg == "seq_sum" and spec.max_length is None:
        raise ValueError("spec.max_length is required by aggregation 'seq_sum'")
    if agg == "seq_sum" and max(lengths, default=0) > spec.max_length:
        raise ValueError(f"spec.max_length (L_max = {spec.max_length}) must be >= every length, got "
                         f"{max(lengths)}: for no L_max use aggregation 'seq_mean_token_sum'")
    normalizer = sp.Symbol("D", positive=True)
    if global_normalizer:
        denominator = normalizer
    elif agg == "token_mean":
        denominator = sp.Integer(max(sum(lengths), 1))
    elif agg == "seq_sum":
        denominator = sp.Integer(max(nonempty * spec.max_length, 1))
    else:
        denominator = sp.Integer(max(nonempty, 1))
    loss = sum(contributions, sp.Integer(0)) / denominator
    if sequence_kl:  # md eq. (19): the number of sequences S, from D where D carries it
        if not global_normalizer:
            sequences = sp.Integer(max(nonempty, 1))
        elif agg == "seq_sum":
            sequences = normalizer / spec.max_length
        elif agg == "token_mean":
            raise ValueError("kl_scale 'sequence' with token_mean needs the local number of sequences")
        else:
            sequences = normalizer
        loss = loss + beta * sum(sequence_kls, sp.Integer(0)) / sequences
        # each sequence's KL term enters abs_scale as a contribution of its own
        contributions += [beta * k / sequences * denominator for k in sequence_kls]
    gradient = tuple(tuple(sp.diff(loss, s) for s in row) for row in lp)
    abs_scale = sum((sp.Abs(c) for c in contributions), sp.Integer(0)) / denominator
    return PolicyLossExpression(loss, gradient, abs_scale, lp, lp_sg, old, adv, ref, beh, ent, kls,
                                normalizer)


def _substitution(built: PolicyLossExpression, values: dict[str, object]) -> dict[sp.Symbol, sp.Expr]:
    subs: dict[sp.Symbol, sp.Expr] = {}

    def put(symbols, vals):
        for s, v in zip(symbols, vals, strict=True):
            if isinstance(s, tuple):
                put(s, v)
            else:
                subs[s] = _exact_number(v)

    put(built.logp, values["logp"])
    put(built.logp_sg, values["logp"])
    put(built.old_logp, values["old_logp"])
    put(built.advantages, values["advantages"])
    for key, symbols in (("ref_logp", built.ref_logp), ("behavior_logp", built.behavior_logp),
                         ("entropy", built.entropy), ("kl", built.kl)):
        if key in values and values[key] is not None:
            put(symbols, values[key])
    if values.get("normalizer") is not None:
        subs[built.normalizer] = _exact_number(values["normalizer"])
    return subs


@functools.lru_cache(maxsize=512)
def _nonsmooth_atoms(built: PolicyLossExpression) -> frozenset:
    """The Min / Max / Abs / relational atoms of the loss, its gradient and abs_scale."""
    kinds = (sp.Min, sp.Max, sp.Abs, sp.core.relational.Relational)
    atoms = set(built.loss.atoms(*kinds)) | set(built.abs_scale.atoms(*kinds))
    for row in built.gradient:
        for g in row:
            atoms |= g.atoms(*kinds)
    return frozenset(atoms)


def _evaluate_with(built: PolicyLossExpression, values: dict[str, object], rounding):
    subs = _substitution(built, values)
    evaluators: dict = {}  # shared by the loss and every gradient entry (common sub-expressions)
    # gates and clips decided by proven signs (exact ties included) before substitution
    subs.update(decisions(_nonsmooth_atoms(built), subs, evaluators))

    def num(expr):
        # unevaluated: sympy's automatic evaluation would query assumptions of exp(exp(1e300))
        # (OverflowError deep inside sympy); the gates are decided, _exact evaluates the rest
        with sp.evaluate(False):
            value = expr.xreplace(subs)
        if value.free_symbols:
            raise ValueError(f"missing input values for {sorted(map(str, value.free_symbols))}")
        return rounding(value, evaluators)

    gradient = tuple(tuple(num(g) for g in row) for row in built.gradient)
    return num(built.loss), gradient, num(built.abs_scale)


def evaluate(built: PolicyLossExpression, values: dict[str, object], digits: int = 50):
    """Loss, gradient (ragged) and abs_scale at the given inputs, correctly rounded to ``digits``
    digits (``specs._exact.to_digits``: the working precision is raised until they are certain).

    values: ``logp``, ``old_logp`` (ragged [N][T_i] of exact sympy numbers, or floats which are
    taken exactly), ``advantages`` ([N] or ragged), optionally ``ref_logp``, ``behavior_logp``,
    ``entropy``, ``kl`` (ragged) and ``normalizer``. ``logp_sg`` takes the values of ``logp``.
    Returns (loss, gradient, abs_scale) as sympy Floats.
    """
    return _evaluate_with(built, values, lambda v, ev: to_digits(v, digits, ev))


def evaluate_float64(built: PolicyLossExpression, values: dict[str, object]):
    """As ``evaluate``, each number correctly rounded to float64 (0 or a subnormal on underflow,
    +-inf on overflow; policy_losses.md "Range"). Returns (loss, gradient, abs_scale) as floats."""
    return _evaluate_with(built, values, to_float64)


# ----------------------------------------------------------------------------------------------
# proofs (md section 6)


def min_clip_identity_cases():
    """The cases of md eq. (14): (a sign, ratio region, r expressed with positive offsets)."""
    k, d, a = sp.symbols("k d a", positive=True)
    e = 1 / (1 + k)  # e in (0, 1)
    regions = {"below": 1 - e - d * (1 - e) / (1 + d), "at_low": 1 - e, "inside": 1 - e + 2 * e / (2 + d),
               "at_high": 1 + e, "above": 1 + e + d}
    return e, d, a, regions


def _decided_min(x: sp.Expr, y: sp.Expr) -> sp.Expr:
    """min(x, y) decided from the sign of the factored difference under the symbols' assumptions
    (raises if sympy cannot decide it, so the proof never passes by default)."""
    diff = sp.factor(sp.simplify(x - y))
    if diff.is_nonpositive:
        return x
    if diff.is_nonnegative:
        return y
    raise AssertionError(f"cannot decide the sign of {diff}")


def _decided_max(x: sp.Expr, y: sp.Expr) -> sp.Expr:
    return x if _decided_min(x, y) == y else y


def prove_min_clip_identity() -> bool:
    """md eq. (14): ``min(r a, clip(r, 1-e, 1+e) a) = min(r a, (1 + sgn(a) e) a)`` for e in (0, 1),
    both signs of a and every region of r (below, on, inside, on, above the band), with symbols
    that carry the assumptions (e = 1 / (1 + k), offsets d > 0, |a| > 0); every min / max is
    decided from the sign of a factored difference. The a = 0 case is 0 = 0."""
    e, d, a_abs, regions = min_clip_identity_cases()
    for a in (a_abs, -a_abs):
        for name, r in regions.items():
            clipped = _decided_min(_decided_max(r, 1 - e), 1 + e)
            lhs = _decided_min(r * a, clipped * a)
            rhs = _decided_min(r * a, (1 + sp.sign(a) * e) * a)
            if sp.simplify(lhs - rhs) != 0:
                raise AssertionError(f"min-clip identity fails for sign(a)={sp.sign(a)}, region {name}")
    return True


def prove_piecewise_gate_equals_min_clip(eps_low=None, eps_high=None, dual_clip=None) -> bool:
    """md eq. (6)-(7): the Piecewise with the inclusive gate equals the literal min-clip (and
    dual-clip) value in every region (exact rationals at, between and beyond the boundaries).
    Defaults: DAPO's eps_low = 1/5, eps_high = 7/25 and c = 3."""
    eps_low = sp.Rational(1, 5) if eps_low is None else sp.Rational(eps_low)
    eps_high = sp.Rational(7, 25) if eps_high is None else sp.Rational(eps_high)
    dual_clip = sp.Integer(3) if dual_clip is None else sp.Rational(dual_clip)
    a_values = (sp.Rational(3, 2), sp.Rational(-3, 2), sp.Integer(0))
    points = sorted({1 - eps_low, 1 + eps_high, dual_clip, sp.Integer(1)})
    grid = set(points)
    for lo, hi in zip([sp.Integer(0), *points], [*points, dual_clip + 2], strict=True):
        grid.add((lo + hi) / 2)
    for c in (None, dual_clip):
        for a in a_values:
            for r in sorted(grid):
                lhs = hard_clip_term(r, a, eps_low, eps_high, c)
                rhs = min_clip_term(r, a, eps_low, eps_high, c)
                if sp.simplify(lhs - rhs) != 0:
                    raise AssertionError(f"gate Piecewise != min-clip at r={r}, a={a}, c={c}")
    return True


def prove_sapo_gate_derivative() -> bool:
    """md eq. (15); errata.md entry 14: ``d/dr [4 / tau sigmoid(tau (r - 1))] =
    4 sigma (1 - sigma) = sech^2(tau (r - 1) / 2)``; it equals 1 at r = 1."""
    r, tau = sp.symbols("r tau", positive=True)
    sigma = 1 / (1 + sp.exp(-tau * (r - 1)))
    f = 4 / tau * sigma
    g = sp.diff(f, r)
    if sp.simplify(g - 4 * sigma * (1 - sigma)) != 0:
        raise AssertionError("d f / d r != 4 sigma (1 - sigma)")
    sech2 = sp.sech(tau * (r - 1) / 2) ** 2
    if sp.simplify((4 * sigma * (1 - sigma) - sech2).rewrite(sp.exp)) != 0:
        raise AssertionError("4 sigma (1 - sigma) != sech^2(tau (r - 1) / 2)")
    if sp.simplify(g.subs(r, 1)) != 1:
        raise AssertionError("SAPO gate at r = 1 is not 1")
    return True


def prove_gspo_gradient(length: int = 3) -> bool:
    """md eq. (16); Zheng et al. 2025, section 4.2, where the clip is inactive: ``d (s A) / d logp_t =
    s A / |y|`` for every token t, i.e. ``grad (s A) = s A grad log s`` and
    ``grad log s = (1 / |y|) sum_t grad log pi(y_t)``."""
    lp = sp.symbols(f"lp0:{length}", real=True)
    old = sp.symbols(f"old0:{length}", real=True)
    a = sp.Symbol("A", real=True)
    log_s = sum(l - o for l, o in zip(lp, old, strict=True)) / length
    s = sp.exp(log_s)
    for t in range(length):
        if sp.simplify(sp.diff(s * a, lp[t]) - s * a * sp.diff(log_s, lp[t])) != 0:
            raise AssertionError("the GSPO gradient identity fails")
        if sp.simplify(sp.diff(log_s, lp[t]) - sp.Rational(1, length)) != 0:
            raise AssertionError("d log s / d logp_t = 1/|y| fails")
    return True


def prove_gradient_at_ratio_one(spec: LossSpec, lengths: tuple[int, ...] = (2, 1)) -> bool:
    """md eq. (17): at logp = old_logp (every ratio 1), with beta = entropy_coef = 0, no
    behaviour correction and per-sequence advantages A_i, the gradient of every surrogate w.r.t.
    logp[i][t] is ``-A_i * u_i / D`` (the policy-gradient term: ``-A grad log pi`` with the
    aggregation weight ``u_i``: 1/T_i (seq_mean_token_mean; GSPO-token), 1 (token_mean, seq_sum,
    seq_mean_token_sum, token-level seq_mean), 1/T_i for GSPO's sequence ratio under seq_mean, 1 for
    the sequence product under seq_mean). Symbolic in A_i and old_logp; needs eps_low, eps_high >= 0."""
    built = build_policy_loss(spec, lengths)
    subs = {s: o for row_l, row_s, row_o in zip(built.logp, built.logp_sg, built.old_logp, strict=True)
            for lsym, ssym, o in zip(row_l, row_s, row_o, strict=True) for s in (lsym, ssym)}
    nonempty = sum(1 for n in lengths if n)
    agg = spec.aggregation
    d = {"token_mean": sum(lengths), "seq_sum": nonempty * (spec.max_length or 1)}.get(agg, nonempty)
    for i, n in enumerate(lengths):
        for t in range(n):
            a = built.advantages[i]
            copies = n if agg in _PER_TOKEN_COPIES else 1  # a sequence term counts per token
            if spec.ratio == "sequence_mean":
                weight = sp.Rational(copies, n)
            elif spec.ratio == "sequence_product":
                weight = sp.Integer(copies)
            else:
                weight = sp.Rational(1, n) if agg in ("seq_mean_token_mean", "seq_sqrt_token_mean") else 1
            if agg == "seq_sqrt_token_mean":  # sqrt(G) times GRPO's weight (md eq. (27))
                weight = weight * sp.sqrt(spec.group_size or 1)
            expected = -a * weight / d
            got = built.gradient[i][t].xreplace(subs)
            for sign in (1, -1):
                concrete = {a: sign * sp.Rational(3, 7)}
                if sp.simplify((got - expected).xreplace(concrete)) != 0:
                    raise AssertionError(f"gradient at ratio 1 for {spec} at ({i},{t}): {got} != {expected}")
    return True
