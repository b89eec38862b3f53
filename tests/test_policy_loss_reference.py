"""Helpers shared by the policy-loss tests: the slow per-sequence loop reference (written from
specs/policy_losses.md, independently of refimpl's batched code), conversions to the sympy spec,
and the docs/architecture.md tolerance check."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import sympy as sp
import torch

from refimpl.losses import PolicyLossVariant
from specs.policy_losses import LossSpec, build_policy_loss, evaluate_float64


def to_spec(variant: PolicyLossVariant) -> LossSpec:
    return LossSpec(**dataclasses.asdict(variant))


# ----------------------------------------------------------------------------------------------
# slow loop reference (md eqs. (2)-(13)), scalar torch ops and Python ifs


def _loop_gate(v: PolicyLossVariant, log_r: torch.Tensor, log_r_sg: float, a: float,
               unit_logp: torch.Tensor) -> torch.Tensor:
    r = torch.exp(log_r)
    if v.gate in ("none", "log_clip"):  # log_clip: the log-ratio is already clipped (_loop_log_clip)
        return r * a
    if v.gate == "sapo":
        tau = v.tau_pos if a > 0 else v.tau_neg
        return 4.0 / tau * torch.sigmoid(tau * (r - 1.0)) * a
    r_value = math.exp(log_r_sg)
    lower = -math.inf if v.eps_low is None else 1.0 - v.eps_low
    upper = math.inf if v.eps_high is None else 1.0 + v.eps_high
    if v.gate == "cispo":
        return min(max(r_value, lower), upper) * a * unit_logp
    # hard clip, policy_losses.md eq. (6): open iff (a > 0 and r <= 1 + eps_high) or (a <= 0 and r >= 1 -
    # eps_low
    # [and r <= c]); closed -> the clipped constant.
    if a > 0:
        return r * a if r_value <= upper else torch.tensor(upper * a, dtype=r.dtype)
    if r_value < lower:
        return torch.tensor(lower * a, dtype=r.dtype)
    if v.dual_clip is not None and r_value > v.dual_clip:
        return torch.tensor(v.dual_clip * a, dtype=r.dtype)
    return r * a


def _loop_log_clip(v: PolicyLossVariant, log_r: torch.Tensor, a: float) -> torch.Tensor:
    """md eq. (18), GMPO: min(l, eps_high) for a > 0, max(l, -eps_low) for a <= 0; a token on the
    bound keeps l (and its gradient)."""
    if v.gate != "log_clip":
        return log_r
    value = float(log_r.detach())
    if a > 0:
        keep = v.eps_high is None or value <= v.eps_high
        return log_r if keep else torch.tensor(v.eps_high, dtype=log_r.dtype)
    keep = v.eps_low is None or value >= -v.eps_low
    return log_r if keep else torch.tensor(-v.eps_low, dtype=log_r.dtype)


def _loop_behavior(v: PolicyLossVariant, log_w: float) -> float:
    if v.behavior_correction == "none":
        return 1.0
    w = math.exp(log_w)
    if v.behavior_correction == "truncate":
        return min(w, v.behavior_cap)
    return w if w <= v.behavior_cap else 0.0


def _loop_kl(v: PolicyLossVariant, lp: torch.Tensor, ref: float | None, exact: float | None):
    if exact is not None:
        return torch.tensor(exact, dtype=lp.dtype)
    log_r = ref - lp
    return {"k1": -log_r, "k2": 0.5 * log_r**2, "k3": torch.exp(log_r) - 1.0 - log_r}[v.kl_estimator]


def loop_reference(logp, old_logp, advantages, mask, v: PolicyLossVariant, *, ref_logp=None,
                   behavior_logp=None, entropy=None, kl=None, normalizer=None) -> torch.Tensor:
    """The loss, one sequence and one token at a time. ``logp`` must be a leaf requiring grad."""
    n_rows, width = logp.shape
    contributions, total_tokens, nonempty = [], 0, 0
    sequence_kls = []  # kl_scale "sequence" (md eq. (19)): beta sum_t KL_{i,t} of each sequence
    for i in range(n_rows):
        idx = [t for t in range(width) if bool(mask[i, t])]
        n = len(idx)
        if n == 0:
            continue
        nonempty += 1
        total_tokens += n
        lps = [logp[i, t] for t in idx]
        olds = [float(old_logp[i, t]) for t in idx]
        log_s = sum(lp.detach().item() - o for lp, o in zip(lps, olds, strict=True)) / n
        token_values = []
        seq_term = None
        if v.ratio in ("token", "gspo_token"):
            for k, t in enumerate(idx):
                a = float(advantages[i, t]) if advantages.ndim == 2 else float(advantages[i])
                if v.ratio == "token":
                    log_r, log_r_sg = _loop_log_clip(v, lps[k] - olds[k], a), lps[k].detach().item() - olds[k]
                else:
                    log_r, log_r_sg = lps[k] - lps[k].detach().item() + log_s, log_s
                term = _loop_gate(v, log_r, log_r_sg, a, lps[k])
                if behavior_logp is not None:
                    term = term * _loop_behavior(v, olds[k] - float(behavior_logp[i, t]))
                token_values.append(-term)
        else:
            a = float(advantages[i])
            total = sum(_loop_log_clip(v, lp - o, a) for lp, o in zip(lps, olds, strict=True))
            total_sg = sum(lp.detach().item() - o for lp, o in zip(lps, olds, strict=True))
            total_lp = sum(lps)
            log_w = 0.0 if behavior_logp is None else sum(o - float(behavior_logp[i, t])
                                                          for o, t in zip(olds, idx, strict=True))
            if v.ratio == "sequence_mean":
                total, total_sg, total_lp, log_w = total / n, total_sg / n, total_lp / n, log_w / n
            seq_term = _loop_gate(v, total, total_sg, a, total_lp) * _loop_behavior(v, log_w)
            token_values = [torch.zeros((), dtype=logp.dtype) for _ in idx]
        for k, t in enumerate(idx):
            if v.kl_coef > 0:
                ref = None if ref_logp is None else float(ref_logp[i, t])
                exact = None if kl is None else float(kl[i, t])
                term = v.kl_coef * _loop_kl(v, lps[k], ref, exact)
                if v.kl_scale == "sequence":
                    sequence_kls.append(term)
                else:
                    token_values[k] = token_values[k] + term
            if v.entropy_coef > 0:
                token_values[k] = token_values[k] - v.entropy_coef * float(entropy[i, t])
        c = sum(token_values)
        if v.aggregation in ("seq_mean_token_mean", "seq_sqrt_token_mean"):
            c = c / n
        if seq_term is not None:
            c = c - seq_term * (n if v.aggregation in ("token_mean", "seq_sum", "seq_mean_token_sum") else 1)
        if v.aggregation == "seq_sqrt_token_mean":
            c = c * math.sqrt(v.group_size)
        contributions.append(c)
    if normalizer is not None:
        d = float(normalizer)
    elif v.aggregation == "token_mean":
        d = max(total_tokens, 1)
    elif v.aggregation == "seq_sum":
        d = max(nonempty * v.max_length, 1)
    else:
        d = max(nonempty, 1)
    if not contributions:
        return (logp * 0.0).nan_to_num().sum()
    if sequence_kls:  # the sequence count: local, or carried by a sequence-counting normaliser
        count = {"seq_sum": d / (v.max_length or 1), "token_mean": nonempty}.get(v.aggregation, d) \
            if normalizer is not None else nonempty
        return sum(contributions) / d + sum(sequence_kls) / count
    return sum(contributions) / d


# ----------------------------------------------------------------------------------------------
# spec evaluation


def ragged(x: torch.Tensor, mask: torch.Tensor, exact: dict | None = None) -> list[list]:
    """Rows of the unmasked entries; ``exact[(i, t)]`` (a sympy number) replaces an entry."""
    rows = []
    for i in range(mask.shape[0]):
        row = []
        for t in range(mask.shape[1]):
            if bool(mask[i, t]):
                if exact is not None and (i, t) in exact:
                    row.append(exact[(i, t)])
                else:
                    row.append(sp.Rational(float(x[i, t])))
        rows.append(row)
    return rows


def spec_loss_and_grad(variant, logp, old_logp, advantages, mask, *, exact_logp=None, ref_logp=None,
                       behavior_logp=None, entropy=None, kl=None, normalizer=None):
    """(loss, gradient [N, T] float64 tensor with zeros at masked entries, abs scale) from the spec."""
    lengths = tuple(int(mask[i].sum()) for i in range(mask.shape[0]))
    kl_source = "exact" if kl is not None else ("ref" if ref_logp is not None else "none")
    built = build_policy_loss(to_spec(variant), lengths, advantages.ndim == 2, kl_source,
                              entropy is not None, normalizer is not None)
    values = {"logp": ragged(logp, mask, exact_logp), "old_logp": ragged(old_logp, mask),
              "advantages": (ragged(advantages, mask) if advantages.ndim == 2
                             else [sp.Rational(float(a)) for a in advantages])}
    for key, x in (("ref_logp", ref_logp), ("behavior_logp", behavior_logp), ("entropy", entropy),
                   ("kl", kl)):
        if x is not None:
            values[key] = ragged(x, mask)
    if normalizer is not None:
        values["normalizer"] = normalizer
    loss, grad_rows, scale = evaluate_float64(built, values)  # each correctly rounded (specs._exact)
    grad = torch.zeros(mask.shape, dtype=torch.float64)
    for i in range(mask.shape[0]):
        cols = [t for t in range(mask.shape[1]) if bool(mask[i, t])]
        for t, g in zip(cols, grad_rows[i], strict=True):
            grad[i, t] = g
    return loss, grad, scale


def assert_close(actual, expected, scale: float, what: str, rel: float = 1e-10, floor: float = 1e-12):
    """docs/architecture.md tolerance: |a - e| <= rel |e| + floor * scale (elementwise)."""
    a = torch.as_tensor(actual, dtype=torch.float64)
    e = torch.as_tensor(expected, dtype=torch.float64)
    tol = rel * e.abs() + floor * scale
    bad = (a - e).abs() > tol
    assert not bool(bad.any()), f"{what}: max |diff| {float((a - e).abs().max())}, actual {a}, expected {e}"


def exact_ratio_log(b: float) -> sp.Expr:
    """log of the exact binary value b (a boundary ratio)."""
    return sp.log(sp.Rational(Fraction(b)))
