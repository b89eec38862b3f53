"""Golden vectors of the estimators (specs/estimators.md) and of token log-probabilities (kl.md
section 6): the ``returns``, ``importance`` and ``logprobs`` files of ``python -m specs.golden``.

Returns and GAE come from the explicit finite sums of ``specs.estimators`` (never the recursions of
fast code), importance weights from eqs. (8)-(13), log-probabilities from ``specs.kl.
token_logprob_exprs``; every value correctly rounded to 50 digits (``specs._exact``). Inputs are
dyadic; gamma = 0.99 and lambda = 0.95 are the exact binary values of those float64 literals.
Imports neither ``refimpl`` nor ``tabular``.
"""

from __future__ import annotations

import random
from fractions import Fraction

import sympy as sp

from specs.estimators import (
    discounted_return_exprs,
    gae_exprs,
    importance_weight_exprs,
    is_estimate_expr,
    lambda_return_exprs,
    n_step_return_exprs,
    per_decision_is_expr,
    snis_estimate_expr,
    td_error_exprs,
    trajectory_is_expr,
    trajectory_weight_expr,
)
from specs.golden_values import NAN, NEG_INF, POS_INF, _digits, _dyadic, _num, _subnormal, vector
from specs.kl import token_logprob_exprs

__all__ = ["returns_vectors", "importance_vectors", "logprob_vectors"]


# ---------------------------------------------------------------------------------------------
# returns and GAE (estimators.md eqs. (0)-(6))

#: batch name -> (terminated rows, truncated rows): the episode-end patterns of the returns vectors
_PATTERNS: dict[str, tuple[list[list[int]], list[list[int]]]] = {
    "terminated_at_end": ([[0, 0, 0, 1], [0, 0, 0, 1]], [[0, 0, 0, 0], [0, 0, 0, 0]]),
    "ends_mid_episode": ([[0, 0, 0, 0], [0, 0, 0, 0]], [[0, 0, 0, 0], [0, 0, 0, 0]]),
    "truncated_mid_row": ([[0, 0, 0, 0, 0], [0, 0, 0, 0, 1]], [[0, 0, 1, 0, 0], [0, 1, 0, 0, 0]]),
    "terminated_mid_row": ([[0, 1, 0, 0, 1], [1, 0, 0, 0, 0]], [[0, 0, 0, 0, 0], [0, 0, 0, 0, 0]]),
    "multiple_episodes": ([[0, 1, 0, 0, 0, 0], [1, 0, 0, 1, 0, 0]], [[0, 0, 0, 1, 0, 0], [0, 1, 0, 0, 0, 1]]),
    "single_step_rows": ([[1], [0], [0]], [[0], [1], [0]]),
    "every_step_terminated": ([[1, 1, 1], [1, 1, 1]], [[0, 0, 0], [0, 0, 0]]),
    "truncated_last_step": ([[0, 0, 0, 0], [0, 1, 0, 0]], [[0, 0, 0, 1], [0, 0, 0, 1]]),
    "stale_critic": ([[0, 0, 1, 0, 0], [0, 0, 0, 0, 0]], [[0, 0, 0, 0, 0], [0, 0, 1, 0, 0]]),
}

_GAMMAS = (Fraction(0), Fraction(1, 2), Fraction(0.99), Fraction(1))
_LAMBDAS = (Fraction(0), Fraction(0.95), Fraction(1))
_NS = (1, 2, 3, 8)


def _rollout(name: str, seed: int):
    """Rewards, values and next values of a pattern: next_values[t] = values[t + 1] inside a
    segment (a consistent critic) except in ``stale_critic``; at a segment end, an independent
    value of the final observation (0 after a termination: it is never used there)."""
    rng = random.Random(f"{seed}/returns/{name}")
    terminated, truncated = _PATTERNS[name]
    rewards, values, next_values = [], [], []
    for term, trunc in zip(terminated, truncated, strict=True):
        T = len(term)
        r = [_dyadic(rng, -1, 2) for _ in range(T)]
        v = [_dyadic(rng, -2, 2) for _ in range(T)]
        nv = []
        for t in range(T):
            if term[t]:
                nv.append(Fraction(0))
            elif trunc[t] or t == T - 1 or name == "stale_critic":
                nv.append(_dyadic(rng, -2, 2))
            else:
                nv.append(v[t + 1])
        rewards.append(r)
        values.append(v)
        next_values.append(nv)
    return rewards, values, next_values, terminated, truncated


def _pattern_flags(name: str, terminated, truncated, next_values, values) -> set[str]:
    flags = set()
    for term, trunc in zip(terminated, truncated, strict=True):
        T = len(term)
        if any(term[:-1]):
            flags.add("terminated_step")
        if any(trunc):
            flags.add("truncated_step")
        if not term[-1] and not trunc[-1]:
            flags.add("ends_mid_episode")
        if sum(term[:-1]) + sum(trunc[:-1]) >= 1:
            flags.add("multiple_episodes")
        if T == 1:
            flags.add("single_step_row")
    if name == "stale_critic":
        flags.add("next_values_inconsistent")
    return flags


def _segment_left(terminated, truncated) -> int:
    """The most steps left in a segment (for the n_beyond_segment flag)."""
    best = 0
    for term, trunc in zip(terminated, truncated, strict=True):
        run = 0
        for t in range(len(term)):
            run += 1
            best = max(best, run)
            if term[t] or trunc[t]:
                run = 0
    return best


def _rows(exprs_per_row) -> list[list[str]]:
    evaluators: dict = {}
    return [[_digits(e, evaluators) for e in row] for row in exprs_per_row]


def _returns_inputs(rewards, values, next_values, terminated, truncated) -> dict:
    return {
        "rewards": [[_num(v) for v in row] for row in rewards],
        "values": None if values is None else [[_num(v) for v in row] for row in values],
        "next_values": None if next_values is None else [[_num(v) for v in row] for row in next_values],
        "terminated": terminated,
        "truncated": truncated,
    }


def _abs_rows(rows, sign_: int = 1):
    return [[sign_ * abs(Fraction(v)) for v in row] for row in rows]


def _returns_expected(estimator: str, args: dict, rewards, values, next_values, terminated, truncated):
    """The estimator's rows, and ``abs_scale``: the largest sum of absolute values of the terms of an
    entry (the same definition with |r|, |V'| and -|V|: every weight gamma^k lam^m is >= 0)."""
    g = sp.Rational(args["gamma"])

    def build(r, v, nv):
        rows = list(zip(r, v, nv, terminated, truncated, strict=True))
        if estimator == "discounted_returns":
            return {"returns": [discounted_return_exprs(r_, te, tr, g, nv_) for r_, _, nv_, te, tr in rows]}
        if estimator == "n_step_returns":
            n = args["n"]
            return {"returns": [n_step_return_exprs(r_, nv_, te, tr, g, n) for r_, _, nv_, te, tr in rows]}
        if estimator == "td_errors":
            return {"td_errors": [td_error_exprs(r_, v_, nv_, te, g) for r_, v_, nv_, te, _ in rows]}
        lam = sp.Rational(args["lam"])
        if estimator == "lambda_returns":
            return {"returns": [lambda_return_exprs(r_, nv_, te, tr, g, lam) for r_, _, nv_, te, tr in rows]}
        adv = [gae_exprs(r_, v_, nv_, te, tr, g, lam) for r_, v_, nv_, te, tr in rows]
        ret = [
            [a - sp.Rational(x) for a, x in zip(arow, v_, strict=True)]
            for arow, v_ in zip(adv, v, strict=True)
        ]
        return {"advantages": adv, "returns": ret}

    exact = build(rewards, values, next_values)
    exact["returns" if "returns" in exact else "td_errors"]  # noqa: B018 (a key check)
    if estimator == "gae_advantages":  # value targets A + V (build's "returns" is A - V for the scale)
        exact["returns"] = [
            [a + sp.Rational(x) for a, x in zip(arow, v_, strict=True)]
            for arow, v_ in zip(exact["advantages"], values, strict=True)
        ]
    scales = build(_abs_rows(rewards), _abs_rows(values, -1), _abs_rows(next_values))
    largest = max(x for rows in scales.values() for row in rows for x in row)
    out = {key: _rows(rows) for key, rows in exact.items()}
    out["abs_scale"] = _digits(largest)
    return out


#: estimator -> (uses values, argument grid)
def _grids():
    return {
        "discounted_returns": (False, [{"gamma": g} for g in _GAMMAS]),
        "td_errors": (True, [{"gamma": g} for g in _GAMMAS]),
        "n_step_returns": (False, [{"gamma": g, "n": n} for n in _NS for g in _GAMMAS[1:3]]),
        "lambda_returns": (False, [{"gamma": g, "lam": lam} for lam in _LAMBDAS for g in _GAMMAS]),
        "gae_advantages": (True, [{"gamma": g, "lam": lam} for lam in _LAMBDAS for g in _GAMMAS]),
    }


def _argument_flags(args: dict, left: int) -> set[str]:
    flags = set()
    if args["gamma"] == 0:
        flags.add("gamma_zero")
    if args["gamma"] == 1:
        flags.add("gamma_one_episodic")
    if args.get("lam") == 0:
        flags.add("lambda_zero")
    if args.get("lam") == 1:
        flags.add("lambda_one")
    if "n" in args and args["n"] > left:
        flags.add("n_beyond_segment")
    return flags


def _args_json(args: dict) -> dict:
    return {k: (v if isinstance(v, int) else float(v)) for k, v in args.items()}


def returns_vectors(*, seed: int = 20251121, estimators: tuple[str, ...] | None = None) -> list[dict]:
    """Discounted, n-step and lambda returns, TD errors and GAE (advantages and value targets) on
    rollouts with terminated and truncated steps, several episodes per row, one-step rows and a stale
    critic, for gamma in {0, 1/2, 0.99, 1}, lambda in {0, 0.95, 1} and n in {1, 2, 3, 8}; plus
    invalid inputs (a step both terminated and truncated, gamma outside [0, 1], NaN, a missing
    bootstrap, a shape mismatch)."""
    out = []
    for estimator, (uses_values, grid) in _grids().items():
        if estimators is not None and estimator not in estimators:
            continue
        for name in _PATTERNS:
            rewards, values, next_values, terminated, truncated = _rollout(name, seed)
            base = _pattern_flags(name, terminated, truncated, next_values, values)
            left = _segment_left(terminated, truncated)
            for index, args in enumerate(grid):
                expected = _returns_expected(
                    estimator, args, rewards, values, next_values, terminated, truncated
                )
                flags = base | _argument_flags(args, left)
                entries = [
                    x for key, rows in expected.items() if key != "abs_scale" for row in rows for x in row
                ]
                if _subnormal(entries):
                    flags.add("subnormal_result")
                out.append(
                    vector(
                        f"returns/{estimator}/{name}/{index}",
                        flags,
                        estimator=estimator,
                        case_class=name,
                        arguments=_args_json(args),
                        inputs=_returns_inputs(
                            rewards, values if uses_values else None, next_values, terminated, truncated
                        ),
                        expected=expected,
                    )
                )
        out += _invalid_returns(estimator, uses_values, grid[-1], seed)
    return out


def _invalid_returns(estimator: str, uses_values: bool, args: dict, seed: int) -> list[dict]:
    rewards, values, next_values, terminated, truncated = _rollout("truncated_mid_row", seed)
    cases = []
    both = [list(row) for row in terminated]
    both[0][2] = 1  # step 2 of row 0 is truncated too
    if estimator != "td_errors":  # td_errors takes no truncation flags
        cases.append(
            (
                "terminated_and_truncated",
                dict(terminated=both),
                "conflicting_flags",
                "step 2 of row 0 is flagged both terminated and truncated",
            )
        )
    cases.append(
        (
            "gamma_above_one",
            dict(args={**args, "gamma": Fraction(3, 2)}),
            "bad_argument",
            "gamma must lie in [0, 1]",
        )
    )
    cases.append(
        (
            "gamma_negative",
            dict(args={**args, "gamma": Fraction(-1, 2)}),
            "bad_argument",
            "gamma must lie in [0, 1]",
        )
    )
    bad = [list(row) for row in rewards]
    bad[1][3] = NAN
    cases.append(("nan_reward", dict(rewards=bad), "nan_input", "a reward is NaN"))
    if estimator == "discounted_returns":
        cases.append(
            (
                "missing_next_values",
                dict(next_values=None),
                "missing_bootstrap",
                "a truncated step needs next_values (a truncation is not a termination)",
            )
        )
    short = [row[:-1] for row in next_values]
    cases.append(
        (
            "next_values_shape_mismatch",
            dict(next_values=short),
            "shape_mismatch",
            "next_values has one column fewer than rewards",
        )
    )
    out = []
    for case_class, change, flag, reason in cases:
        inputs = dict(
            rewards=rewards, next_values=next_values, terminated=terminated, truncated=truncated, args=args
        )
        inputs.update(change)
        out.append(
            vector(
                f"returns/{estimator}/{case_class}/0",
                {flag},
                "invalid",
                reason,
                estimator=estimator,
                case_class=case_class,
                arguments=_args_json(inputs["args"]),
                inputs=_returns_inputs(
                    inputs["rewards"],
                    values if uses_values else None,
                    inputs["next_values"],
                    inputs["terminated"],
                    inputs["truncated"],
                ),
                expected=None,
            )
        )
    return out


# ---------------------------------------------------------------------------------------------
# importance sampling (estimators.md eqs. (8)-(13))


def _log_ratio_flags(target, behavior) -> set[str]:
    xs = [Fraction(a) - Fraction(b) for a, b in zip(target, behavior, strict=True)]
    flags = set()
    if xs and all(x == 0 for x in xs):
        flags.add("equal_policies")
    if xs and max(abs(x) for x in xs) > 20:
        flags.add("log_ratio_20")
    if xs and max(abs(x) for x in xs) >= 50:
        flags.add("log_ratio_50")
    return flags


def _weight_batches(rng):
    """case class -> (target_logp, behavior_logp) rows for importance_weights."""
    t = [[_dyadic(rng, -3, -0.125) for _ in range(4)] for _ in range(2)]
    b = [[_dyadic(rng, -3, -0.125) for _ in range(4)] for _ in range(2)]
    return {
        "random": (t, b),
        "equal_policies": (t, t),
        "extreme_log_ratio": (
            [[Fraction(-1), Fraction(-60)], [Fraction(-1, 2), Fraction(-25)]],
            [[Fraction(-51), Fraction(-1, 4)], [Fraction(-45, 2), Fraction(-1, 2)]],
        ),
        "subnormal_weight": ([[Fraction(-741), Fraction(-1)]], [[Fraction(-1, 2), Fraction(-1)]]),
    }


def _sample_batches(rng):
    """case class -> (f, weights, extra flags) for is_estimate / snis_estimate."""
    f = [_dyadic(rng, -2, 2) for _ in range(5)]
    w = [_dyadic(rng, 0.125, 3) for _ in range(5)]
    return {
        "random": (f, w, ()),
        "single_sample": (f[:1], w[:1], ("single_sample",)),
        "equal_weights": (f, [Fraction(1)] * 5, ("equal_policies",)),
        "zero_weights": (f, [Fraction(0), w[1], Fraction(0), w[3], w[4]], ()),
        "large_weights": (f[:3], [Fraction(2**40), Fraction(1, 2**20), Fraction(3, 2)], ("large_ratio",)),
    }


def _episode_batches(rng):
    """case class -> (rewards, target_logp, behavior_logp, mask) rows for the trajectory estimators."""
    T = 4
    r = [[_dyadic(rng, -1, 2) for _ in range(T)] for _ in range(2)]
    t = [[_dyadic(rng, -2, -0.125) for _ in range(T)] for _ in range(2)]
    b = [[_dyadic(rng, -2, -0.125) for _ in range(T)] for _ in range(2)]
    full = [[1] * T for _ in range(2)]
    return {
        "random": (r, t, b, full),
        "masked_steps": (r, t, b, [[1, 1, 1, 0], [1, 1, 0, 0]]),
        "equal_policies": (r, t, t, full),
        "extreme_log_ratio": (
            r,
            [[Fraction(-1)] * T, [Fraction(-30)] * T],
            [[Fraction(-14)] * T, [Fraction(-1, 2)] * T],
            full,
        ),
    }


def importance_vectors(*, seed: int = 20251121) -> list[dict]:
    """Importance weights, IS and SNIS estimates, trajectory weights, trajectory and per-decision IS
    (gamma in {0, 0.99, 1}), with equal policies, masked steps, log-ratios beyond +-50, a subnormal
    weight, one sample, zero and large weights; and invalid inputs (NaN, a negative weight, weights
    summing to 0, gamma outside [0, 1], shape mismatches)."""
    rng = random.Random(f"{seed}/importance")
    out = []
    for case_class, (t, b) in _weight_batches(rng).items():
        weights = _rows([importance_weight_exprs(tr, br) for tr, br in zip(t, b, strict=True)])
        flags = set().union(*(_log_ratio_flags(tr, br) for tr, br in zip(t, b, strict=True)))
        if _subnormal([w for row in weights for w in row]):
            flags.add("subnormal_result")
        out.append(
            vector(
                f"importance/importance_weights/{case_class}",
                flags,
                estimator="importance_weights",
                case_class=case_class,
                arguments={},
                inputs={
                    "target_logp": [[_num(v) for v in row] for row in t],
                    "behavior_logp": [[_num(v) for v in row] for row in b],
                },
                expected={"weights": weights, "abs_scale": "0.0"},
            )
        )
    for estimator, fn in (("is_estimate", is_estimate_expr), ("snis_estimate", snis_estimate_expr)):
        for case_class, (f, w, extra) in _sample_batches(rng).items():
            out.append(
                vector(
                    f"importance/{estimator}/{case_class}",
                    set(extra),
                    estimator=estimator,
                    case_class=case_class,
                    arguments={},
                    inputs={"f": [_num(v) for v in f], "weights": [_num(v) for v in w]},
                    expected={
                        "estimate": _digits(fn(f, w)),
                        "abs_scale": _digits(fn([abs(v) for v in f], w)),
                    },
                )
            )
    episodes = _episode_batches(rng)
    for estimator in ("trajectory_importance_weights", "trajectory_is", "per_decision_is"):
        for case_class, (r, t, b, mask) in episodes.items():
            gammas = (None,) if estimator == "trajectory_importance_weights" else (0, Fraction(0.99), 1)
            for index, gamma in enumerate(gammas):
                flags = set().union(*(_log_ratio_flags(tr, br) for tr, br in zip(t, b, strict=True)))
                if any(0 in row for row in mask):
                    flags.add("masked_steps")
                if gamma == 0:
                    flags.add("gamma_zero")
                if gamma == 1:
                    flags.add("gamma_one_episodic")
                rows = list(zip(r, t, b, mask, strict=True))
                if estimator == "trajectory_importance_weights":
                    values = [_digits(trajectory_weight_expr(tr, br, m)) for _, tr, br, m in rows]
                    key, arguments, scale = "weights", {}, "0.0"
                else:
                    fn = trajectory_is_expr if estimator == "trajectory_is" else per_decision_is_expr
                    values = [_digits(fn(rr, tr, br, m, sp.Rational(gamma))) for rr, tr, br, m in rows]
                    key, arguments = "estimates", {"gamma": float(gamma)}
                    absolute = [
                        fn([abs(x) for x in rr], tr, br, m, sp.Rational(gamma)) for rr, tr, br, m in rows
                    ]
                    scale = _digits(sum(absolute, sp.Integer(0)))
                out.append(
                    vector(
                        f"importance/{estimator}/{case_class}/{index}",
                        flags,
                        estimator=estimator,
                        case_class=case_class,
                        arguments=arguments,
                        inputs={
                            "rewards": [[_num(v) for v in row] for row in r],
                            "target_logp": [[_num(v) for v in row] for row in t],
                            "behavior_logp": [[_num(v) for v in row] for row in b],
                            "mask": mask,
                        },
                        expected={key: values, "abs_scale": scale},
                    )
                )
    out += _invalid_importance(episodes["random"])
    return out


def _invalid_importance(episode) -> list[dict]:
    r, t, b, mask = episode
    f = [Fraction(1), Fraction(-1, 2), Fraction(3, 4)]
    out = []
    nan_t = [list(row) for row in t]
    nan_t[0][1] = NAN
    out.append(
        vector(
            "importance/importance_weights/nan_logp",
            {"nan_input"},
            "invalid",
            "target_logp is NaN",
            estimator="importance_weights",
            case_class="nan_logp",
            arguments={},
            inputs={
                "target_logp": [[_num(v) for v in row] for row in nan_t],
                "behavior_logp": [[_num(v) for v in row] for row in b],
            },
            expected=None,
        )
    )
    out.append(
        vector(
            "importance/importance_weights/shape_mismatch",
            {"shape_mismatch"},
            "invalid",
            "target_logp and behavior_logp have different shapes",
            estimator="importance_weights",
            case_class="shape_mismatch",
            arguments={},
            inputs={
                "target_logp": [[_num(v) for v in row] for row in t],
                "behavior_logp": [[_num(v) for v in row[:-1]] for row in b],
            },
            expected=None,
        )
    )
    for estimator in ("is_estimate", "snis_estimate"):
        cases = [
            (
                "negative_weight",
                [Fraction(1), Fraction(-1, 4), Fraction(2)],
                "negative_weight",
                "a weight is negative",
            ),
            ("nan_f", [Fraction(1)] * 3, "nan_input", "f holds NaN"),
        ]
        if estimator == "snis_estimate":
            cases.append(("zero_weight_sum", [Fraction(0)] * 3, "zero_weight_sum", "the weights sum to 0"))
        for case_class, w, flag, reason in cases:
            ff = [f[0], NAN, f[2]] if case_class == "nan_f" else f
            out.append(
                vector(
                    f"importance/{estimator}/{case_class}",
                    {flag},
                    "invalid",
                    reason,
                    estimator=estimator,
                    case_class=case_class,
                    arguments={},
                    inputs={"f": [_num(v) for v in ff], "weights": [_num(v) for v in w]},
                    expected=None,
                )
            )
    for estimator in ("trajectory_is", "per_decision_is"):
        for case_class, gamma in (("gamma_above_one", 1.5), ("gamma_negative", -0.5)):
            out.append(
                vector(
                    f"importance/{estimator}/{case_class}",
                    {"bad_argument"},
                    "invalid",
                    "gamma must lie in [0, 1]",
                    estimator=estimator,
                    case_class=case_class,
                    arguments={"gamma": gamma},
                    inputs={
                        "rewards": [[_num(v) for v in row] for row in r],
                        "target_logp": [[_num(v) for v in row] for row in t],
                        "behavior_logp": [[_num(v) for v in row] for row in b],
                        "mask": mask,
                    },
                    expected=None,
                )
            )
    return out


# ---------------------------------------------------------------------------------------------
# token log-probabilities from logits (kl.md eqs. (14)-(15))


def _logit_rows(seed: int):
    """case class -> (logits rows with None for -inf, tokens, extra flags)."""
    rng = random.Random(f"{seed}/logprobs")
    rand = [[_dyadic(rng, -4, 4) for _ in range(6)] for _ in range(3)]
    bf16 = [[Fraction(rng.randint(-128, 128), 16) for _ in range(5)] for _ in range(2)]
    return {
        "random": (rand, [0, 5, 2], ()),
        "bf16_exact_logits": (bf16, [4, 1], ("bf16_exact_inputs",)),
        "uniform_logits": ([[Fraction(3, 4)] * 5, [Fraction(-7)] * 5], [2, 0], ("uniform_logits",)),
        "large_logits": (
            [
                [Fraction(1000), Fraction(1001), Fraction(999, 2)],
                [Fraction(-5000), Fraction(-5001), Fraction(-5000)],
            ],
            [0, 1],
            ("large_logits",),
        ),
        "dominant_logit": (
            [[Fraction(100), Fraction(0), Fraction(-1)], [Fraction(100), Fraction(0), Fraction(-1)]],
            [0, 2],
            ("dominant_logit",),
        ),
        "neg_inf_logit": (
            [[Fraction(1), None, Fraction(-1, 2), None], [None, Fraction(0), None, Fraction(-3)]],
            [0, 1],
            ("neg_inf_logit",),
        ),
        "vocab_one": ([[Fraction(5, 2)], [Fraction(-3)]], [0, 0], ("vocab_one",)),
        "subnormal_probability": ([[Fraction(0), Fraction(-740), Fraction(-1, 2)]], [0], ()),
    }


def _logits_json(rows) -> list[list[str]]:
    return [[NEG_INF if v is None else _num(v) for v in row] for row in rows]


def logprob_vectors(*, seed: int = 20251121) -> list[dict]:
    """log p of the chosen token and d log p / d logits per row: random and bfloat16-exact logits,
    equal logits, logits of +-1000 and beyond (exp overflows without the max shift), a dominant
    logit, -inf logits, V = 1, a subnormal probability; invalid: NaN, +inf, a row of -inf, tokens out
    of range, a shape mismatch."""
    out = []
    for case_class, (rows, tokens, extra) in _logit_rows(seed).items():
        pairs = [token_logprob_exprs(row, tok) for row, tok in zip(rows, tokens, strict=True)]
        evaluators: dict = {}
        logp = [_digits(v, evaluators) for v, _ in pairs]
        grad = [[_digits(g, evaluators) for g in grads] for _, grads in pairs]
        flags = set(extra)
        # the terms of z_y - logsumexp(z): |z| up to the largest finite logit, plus log V <= V
        scale = max(max(abs(v) for v in row if v is not None) + len(row) for row in rows)
        if _subnormal([g for row in grad for g in row] + logp):
            flags.add("subnormal_result")
        out.append(
            vector(
                f"logprobs/{case_class}",
                flags,
                case_class=case_class,
                inputs={"logits": _logits_json(rows), "tokens": tokens},
                expected={"logp": logp, "grad_logits": grad, "abs_scale": _digits(sp.Rational(scale))},
            )
        )
    row = [Fraction(1), Fraction(-1, 2), Fraction(2)]
    invalid = {
        "nan_logit": ([[Fraction(1), NAN, Fraction(0)]], [0], "nan_input", "a logit is NaN"),
        "pos_inf_logit": ([[Fraction(1), POS_INF, Fraction(0)]], [0], "inf_input", "a logit is +inf"),
        "all_neg_inf_row": ([[None, None, None]], [0], "all_neg_inf_row", "a row of logits is all -inf"),
        "token_out_of_range": ([row], [3], "bad_argument", "token 3 is outside [0, V = 3)"),
        "negative_token": ([row], [-1], "bad_argument", "token -1 is outside [0, V = 3)"),
        "tokens_shape_mismatch": ([row, row], [0], "shape_mismatch", "2 rows of logits and 1 token"),
    }
    for case_class, (rows, tokens, flag, reason) in invalid.items():
        out.append(
            vector(
                f"logprobs/{case_class}",
                {flag},
                "invalid",
                reason,
                case_class=case_class,
                inputs={"logits": _logits_json(rows), "tokens": tokens},
                expected=None,
            )
        )
    return out
