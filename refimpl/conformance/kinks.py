"""The subdifferential of the policy objective at its kinks (specs/policy_losses.md section 3, "The
subdifferential at a kink"): which entries of a case sit on a kink, the two one-sided derivatives
there, and whether a gradient lies between them.

The kinks of the spec's objective in ``logp`` are those of its hard gates, each on one side of the
advantage's sign (``a = 0`` has none: its term is 0):

* the clip bound ``r = 1 + eps_high`` with ``a > 0`` and ``r = 1 - eps_low`` with ``a < 0``
  (eq. (6): ``min(r a, clip(r) a)`` meets its constant branch there); ``r = 1 - eps_low`` with
  ``a > 0`` and ``r = 1 + eps_high`` with ``a < 0`` are no kinks (both branches are ``r a`` around
  them);
* the dual clip ``r = c`` with ``a < 0`` (eq. (7));
* GMPO's log-space clip ``l = eps_high`` with ``a > 0`` and ``l = -eps_low`` with ``a < 0`` (eq. (18)),
  per token.

SAPO (eq. (8)) is smooth, and CISPO's clip (eq. (9)) sits inside its stop-gradient: its gradient
``clip(r) a`` is continuous in ``r``, so neither has a kink; nor has ``none``. ``r`` is the unit's
ratio of the variant's level (eqs. (2)-(5)): every token of a sequence unit sits on its kink.

"On" a kink is within the rounding of the dtype the ratio is evaluated in (two epsilons of it,
relative to the bound): a ratio that dtype cannot tell from the bound. The open side's derivative
(the gate's inclusive choice) is the expected gradient with the band widened past those ratios (the
bound moved outwards by twice that margin: nothing else moves, the other cases' ratios keep 1 % away
from every bound); the closed side's is the gradient without the tied units' surrogate terms (their
branch is a constant there): the expected gradient of the same case with the advantages of the rows
that hold a tied unit set to 0 (a zero advantage removes the unit's term and changes nothing else: the
normaliser, the KL and the entropy do not read it), taken at the tied entries only. Every value
between the two, entry by entry, is accepted (for a sequence unit that box holds the segment of its
subgradients).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .expected import expected_policy_loss

__all__ = ["KINKS", "TIE_NOTE", "kink_entries", "kink_subgradient_note"]

#: each kink: (name in a note, the spec's equation)
KINKS = {
    "lower": ("the lower clip bound 1 - eps_low", "(6)"),
    "upper": ("the upper clip bound 1 + eps_high", "(6)"),
    "dual": ("the dual-clip tie", "(7)"),
    "log_lower": ("the log-ratio bound -eps_low", "(18)"),
    "log_upper": ("the log-ratio bound eps_high", "(18)"),
}


def _unit_log_ratio(case, variant) -> torch.Tensor:
    """``[N, T]`` float64: each entry's unit log-ratio (md eqs. (2)-(5); the token's own for
    ``log_clip``), 0 at masked positions."""
    x = torch.where(case.mask, case.logp.double() - case.old_logp.double(), 0.0)
    if variant.ratio == "token" or variant.gate == "log_clip":
        return x
    total = x.sum(dim=-1, keepdim=True)
    if variant.ratio in ("sequence_mean", "gspo_token"):
        total = total / case.mask.sum(dim=-1, keepdim=True).clamp(min=1)
    return torch.where(case.mask, total.expand_as(x), 0.0)


def _near(value: torch.Tensor, bound: float | None, rel: float) -> torch.Tensor:
    if bound is None or not math.isfinite(bound):
        return torch.zeros_like(value, dtype=torch.bool)
    return (value - bound).abs() <= rel * max(abs(bound), 1.0)


def _margin(dtype: torch.dtype) -> float:
    return 2.0 * torch.finfo(dtype).eps


def kink_entries(case, variant, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``{kink: [N, T] bool}``: the masked entries whose unit sits on that kink (``KINKS``; only
    those with at least one entry), within the rounding of ``dtype`` (module docstring)."""
    v = variant
    if v.gate not in ("clip", "log_clip") or case.mask.numel() == 0:
        return {}
    adv = case.advantages.double()
    adv = adv.unsqueeze(-1).expand(case.mask.shape) if adv.ndim == 1 else adv
    positive, negative = case.mask & (adv > 0), case.mask & (adv < 0)
    rel = _margin(dtype)
    x = _unit_log_ratio(case, v)
    if v.gate == "log_clip":
        found = {
            "log_lower": negative & _near(x, None if v.eps_low is None else -v.eps_low, rel),
            "log_upper": positive & _near(x, v.eps_high, rel),
        }
    else:
        r = torch.exp(x)
        found = {
            "lower": negative & _near(r, None if v.eps_low is None else 1.0 - v.eps_low, rel),
            "upper": positive & _near(r, None if v.eps_high is None else 1.0 + v.eps_high, rel),
            "dual": negative & _near(r, v.dual_clip, rel),
        }
    return {k: m for k, m in found.items() if bool(m.any())}


def _widened(v, kinks, dtype: torch.dtype):
    """``v`` with the bound of each of ``kinks`` moved outwards by twice the margin of "on" (the
    open side of every ratio on it)."""
    wide = 2.0 * _margin(dtype)
    changes = {}
    if "upper" in kinks:
        changes["eps_high"] = v.eps_high + wide * (1.0 + v.eps_high)
    if "lower" in kinks:
        changes["eps_low"] = v.eps_low + wide
    if "dual" in kinks:
        changes["dual_clip"] = v.dual_clip * (1.0 + wide)
    if "log_upper" in kinks:
        changes["eps_high"] = v.eps_high + wide * max(v.eps_high, 1.0)
    if "log_lower" in kinks:
        changes["eps_low"] = v.eps_low + wide * max(v.eps_low, 1.0)
    return dataclasses.replace(v, **changes)


def _note(kinks) -> str:
    names = [KINKS[k][0] for k in KINKS if k in kinks]
    equations = sorted({KINKS[k][1] for k in kinks})
    where = "eq. " + equations[0] if len(equations) == 1 else "eqs. " + ", ".join(equations)
    return f"a subgradient at {' and '.join(names)} (policy_losses.md {where})"


#: the note of a gradient accepted inside the subdifferential at the dual-clip tie alone
TIE_NOTE = _note(("dual",))


def kink_subgradient_note(case, got_grad, exp_grad, variant, conv, dtype: torch.dtype,
                          slack: float) -> str | None:
    """The note naming the kinks where ``got_grad`` departs from ``exp_grad`` (the expected gradient
    under ``conv``) when it lies, entry by entry within ``slack``, between the two one-sided
    derivatives of every kink ``case`` sits on (module docstring); None otherwise (no kink, a
    non-finite gradient, an entry outside). ``variant`` is effective under ``conv``; the one-sided
    derivatives are taken under ``conv`` with the spec's inclusive dual-clip gate; ``dtype`` is the one
    the ratio is evaluated in."""
    if not bool(torch.isfinite(got_grad).all()):
        return None
    kinks = kink_entries(case, variant, dtype)
    if not kinks:
        return None
    tied = torch.stack(list(kinks.values())).any(dim=0)
    inclusive = dataclasses.replace(conv, dual_clip_tie="inclusive")
    rows = tied.any(dim=-1)
    adv = case.advantages.clone()
    adv[rows] = 0.0
    try:
        open_grad = expected_policy_loss(case, _widened(variant, kinks, dtype), inclusive)[1]
        closed = expected_policy_loss(dataclasses.replace(case, advantages=adv), variant, inclusive)[1]
    except (ValueError, TypeError, RuntimeError):
        return None
    open_grad, tied = open_grad.detach().double().cpu(), tied.cpu()
    other = torch.where(tied, closed.detach().double().cpu(), open_grad)
    g = got_grad.detach().double().cpu()
    inside = (g >= torch.minimum(open_grad, other) - slack) & (g <= torch.maximum(open_grad, other) + slack)
    if not bool(inside.all()):
        return None
    off = (g - exp_grad.detach().double().cpu()).abs() > slack
    hit = [k for k, m in kinks.items() if bool((m.cpu() & off).any())]
    return _note(hit) if hit else None
