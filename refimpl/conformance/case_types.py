"""The case types of the conformance kit and the helpers every case class is built with.

Inputs are built in float64 from a fixed seed (``torch.Generator``), on the CPU, so a case id such
as ``"on_boundary/2"`` always denotes the same tensors. Masked positions hold finite junk (the loss
must ignore them), except in ``masked_nonfinite`` (NaN, +inf, -inf there); ratios "exactly on a
boundary" are float64 log-ratios whose ``exp`` (the CPU's) equals the boundary exactly, so an
implementation that computes ``exp(logp - old_logp)`` sees the tie. Another device's ``exp`` may
round them a unit in the last place off the boundary: a check on a device computes its expected
values there (``case.to(device)``), so that the reference sees the ratio the function sees.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from refimpl.losses import PolicyLossVariant

__all__ = [
    "PolicyLossCase",
    "KLCase",
    "AdvantageCase",
    "LogprobCase",
    "POLICY_CASE_CLASSES",
    "clip_bounds",
    "log_ratio_hitting",
]

_JUNK_LOGP, _JUNK_OLD, _JUNK_REF = -7.25, -0.5, -3.0  # finite junk at masked positions


class _Identified:
    """Stable case id ``"<case class>/<index>"`` and size (elements of the first input tensor)."""

    @property
    def case_id(self) -> str:
        return f"{self.case_class}/{self.index}"

    @property
    def size(self) -> int:
        return int(getattr(self, dataclasses.fields(self)[2].name).numel())

    def to(self, device: torch.device | str):
        """The same case with every tensor on ``device`` (values, dtypes and the case id unchanged; a
        tensor already there is not copied): where a check runs on a device, its expected values are
        computed from this (``engine.run_cases``)."""
        moved = {
            f.name: value.to(device)
            for f in dataclasses.fields(self)
            if isinstance(value := getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **moved)


@dataclass(frozen=True)
class PolicyLossCase(_Identified):
    """One input of a policy-loss check.

    ``logp``, ``old_logp``, ``ref_logp`` are ``[N, T]`` in ``dtype`` (float64 except the bf16 /
    fp16 classes); ``advantages`` ``[N]``; ``mask`` ``[N, T]`` bool; ``micro_batches`` a tuple of
    row-index tuples (None: one batch); ``rewards`` / ``group_ids`` the group data the advantages
    came from (for adapters that want them).
    """

    case_class: str
    index: int
    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    rewards: torch.Tensor
    group_ids: torch.Tensor
    ref_logp: torch.Tensor | None = None
    micro_batches: tuple[tuple[int, ...], ...] | None = None
    note: str = ""


@dataclass(frozen=True)
class KLCase(_Identified):
    case_class: str
    index: int
    logp: torch.Tensor
    ref_logp: torch.Tensor


@dataclass(frozen=True)
class AdvantageCase(_Identified):
    """Sequence rewards ``[N]`` by group; ``lengths`` ``[N]`` the responses' token counts (None: one
    token each), read by a token-weighted convention (``adv_weighting``) and by adapters that take them
    (``adapter.takes_lengths``: per-token advantages)."""

    case_class: str
    index: int
    rewards: torch.Tensor
    group_ids: torch.Tensor
    lengths: torch.Tensor | None = None


@dataclass(frozen=True)
class LogprobCase(_Identified):
    case_class: str
    index: int
    logits: torch.Tensor
    tokens: torch.Tensor
    weights: torch.Tensor = field(repr=False)  # fixed cotangent for the gradient check


POLICY_CASE_CLASSES = (
    "inside_clip",
    "outside_clip",
    "on_boundary",
    "extreme_log_ratio",
    "ragged",
    "empty_rows",
    "zero_variance_group",
    "singleton_group",
    "bf16",
    "fp16",
    "micro_batch",
    "kl_penalty",
    "masked_nonfinite",
    "padding_micro_batch",
    "half_overflow",
    "dual_clip_tie",
    "empty_step",
    "ratio_overflow",
    "zero_rows",
    "golden_vectors",
)


def clip_bounds(variant: PolicyLossVariant) -> tuple[float | None, float | None, float | None]:
    """(lower, upper, dual_clip) ratio bounds of ``variant``'s gate (None where absent)."""
    if variant.gate not in ("clip", "cispo"):
        return None, None, None
    lower = None if variant.eps_low is None else 1.0 - variant.eps_low
    upper = None if variant.eps_high is None else 1.0 + variant.eps_high
    return lower, upper, variant.dual_clip


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _uniform(g: torch.Generator, shape, low: float, high: float) -> torch.Tensor:
    return low + (high - low) * torch.rand(shape, generator=g, dtype=torch.float64)


def log_ratio_hitting(ratio: float) -> float:
    """A float64 ``x`` with ``exp(x) == ratio`` exactly in float64, searched by ulps around
    ``log(ratio)``; when no float64 maps exactly onto ``ratio`` (e.g. 3.0), the ``x`` whose ``exp``
    is closest (the tie is then as close as float64 allows, on a fixed side)."""
    target = torch.tensor(ratio, dtype=torch.float64)
    x = torch.tensor(math.log(ratio), dtype=torch.float64)
    inf = torch.tensor(math.inf, dtype=torch.float64)
    best, best_gap = x, float("inf")
    up, down = x.clone(), x.clone()
    for _ in range(64):
        for cand in (up, down):
            gap = abs(float(torch.exp(cand) - target))
            if gap == 0.0:
                return float(cand)
            if gap < best_gap:
                best, best_gap = cand, gap
        up, down = torch.nextafter(up, inf), torch.nextafter(down, -inf)
    return float(best)


def _assemble(
    case_class: str,
    index: int,
    lengths: list[int],
    log_ratio_rows: list[list[float]],
    advantages: list[float],
    g: torch.Generator,
    *,
    exact_logp: dict | None = None,
    group_ids: list[int] | None = None,
    rewards: list[float] | None = None,
    micro_batches=None,
    with_ref: bool = False,
    note: str = "",
) -> PolicyLossCase:
    """Tensors from per-row log-ratios (ragged): old_logp random in [-3, -0.1], logp = old + x;
    ``exact_logp[(i, t)] = ratio`` places token (i, t) exactly on ``ratio``."""
    n, width = len(lengths), max([*lengths, 1])
    old = torch.full((n, width), _JUNK_OLD, dtype=torch.float64)
    logp = torch.full((n, width), _JUNK_LOGP, dtype=torch.float64)
    ref = torch.full((n, width), _JUNK_REF, dtype=torch.float64)
    mask = torch.zeros((n, width), dtype=torch.bool)
    for i, (length, row) in enumerate(zip(lengths, log_ratio_rows, strict=True)):
        olds = _uniform(g, (length,), -3.0, -0.1)
        refs = olds + _uniform(g, (length,), -0.6, 0.6)
        for t in range(length):
            old[i, t] = olds[t]
            ref[i, t] = refs[t]
            mask[i, t] = True
            if exact_logp and (i, t) in exact_logp:
                # old = 0 keeps logp - old == x bit-exact (x has bits far below ulp(old))
                old[i, t] = 0.0
                logp[i, t] = log_ratio_hitting(exact_logp[(i, t)])
            else:
                logp[i, t] = old[i, t] + row[t]
    ids = torch.tensor(group_ids if group_ids is not None else [i // 2 for i in range(n)], dtype=torch.long)
    r = torch.tensor(rewards if rewards is not None else advantages, dtype=torch.float64)
    return PolicyLossCase(
        case_class,
        index,
        logp,
        old,
        torch.tensor(advantages, dtype=torch.float64),
        mask,
        r,
        ids,
        ref if with_ref else None,
        micro_batches,
        note,
    )


def _band(variant: PolicyLossVariant) -> tuple[float, float]:
    """log-ratio interval strictly inside the gate's band (a default band for ungated variants)."""
    lower, upper, _ = clip_bounds(variant)
    lo = math.log(lower) if lower is not None else -0.5
    hi = math.log(upper) if upper is not None else 0.5
    return lo, hi


def _rows_with_sequence_mean(g, lengths, targets) -> list[list[float]]:
    """Token log-ratios whose mean over each row equals ``targets[i]`` (sequence-level ratios)."""
    rows = []
    for length, target in zip(lengths, targets, strict=True):
        noise = _uniform(g, (length,), -0.05, 0.05)
        noise = noise - noise.mean()
        rows.append([float(target + v) for v in noise])
    return rows
