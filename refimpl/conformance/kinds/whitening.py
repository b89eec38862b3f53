"""Kind ``whitening``: masked batch whitening (normalisation) of per-token advantages.

The function is called as ``fn(advantages [N, T], mask [N, T]) -> [N, T]`` and judged on the
counted entries against ``refimpl.whitening.masked_whiten_reference`` (advantages.md eq. (20)-(22),
two-pass). The spec: the token-weighted mean and population variance of the counted entries, no
epsilon, a constant batch gives 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from refimpl.whitening import masked_whiten_reference

from .base import Expected, Kind, KindCase, check_choices

__all__ = ["WhiteningFlags", "WHITENING", "whitening_cases", "expected_whitening"]


@dataclass(frozen=True)
class WhiteningFlags:
    """How a framework whitens (defaults: the spec).

    whiten_mean: "masked" | "unmasked" (the plain mean of the padded batch, padding included).
    whiten_std: "population" | "sample" (Bessel's n / (n - 1)).
    whiten_weighting: "token" | "sequence" (every non-empty row weighs 1).
    eps / eps_placement: sqrt(var + eps) ("variance"), sqrt(var) + eps ("std"), sqrt(max(var, eps))
        ("floor").
    whiten_count_eps: added to the count in the means (verl's masked_mean: mask.sum() + 1e-8).
    whiten_one_pass: True: the variance as E[x^2] - E[x]^2 in float32 (cancels on a large offset).
    whiten_one_pass_dtype: with ``whiten_one_pass``, "float32" (as above: the variance clamped at 0, eps
        inside the square root) | "float64" (AReaL's masked_normalization: sum(x m) / n and sum(x^2 m) / n in
        float64, no clamp (a negative variance gives NaN), ``whiten_std`` and the eps placement honoured).
        The kit's cases are exact in float32, where float64 sums of squares are exact too: the float64
        one-pass variance departs only on float64 inputs (1e8 +- 1: var 0, +-inf with eps 0), which a
        float32 function cannot be judged on; tests/test_conformance_kinds.py checks it there.
    whiten_masked_nonfinite: "ignored" | "propagate" (the padding multiplied by the mask: a NaN / inf there
        makes every output NaN).
    whiten_sample_single: "raise" | "nan": a sample variance of one counted entry, n / (n - 1) = 1 / 0,
        refused with an error (torch's ``var``: verl, SkyRL) or 1 / 0 times a variance of 0, NaN (Tunix).
    """

    whiten_mean: str = "masked"
    whiten_std: str = "population"
    whiten_weighting: str = "token"
    whiten_eps: float = 0.0
    whiten_eps_placement: str = "variance"
    whiten_count_eps: float = 0.0
    whiten_one_pass: bool = False
    whiten_one_pass_dtype: str = "float32"
    whiten_masked_nonfinite: str = "ignored"
    whiten_sample_single: str = "raise"

    def __post_init__(self) -> None:
        check_choices(self, {"whiten_mean": ("masked", "unmasked"), "whiten_std": ("population", "sample"),
                             "whiten_weighting": ("token", "sequence"),
                             "whiten_eps_placement": ("variance", "std", "floor"),
                             "whiten_one_pass": (False, True),
                             "whiten_one_pass_dtype": ("float32", "float64"),
                             "whiten_masked_nonfinite": ("ignored", "propagate"),
                             "whiten_sample_single": ("raise", "nan")})


def _exact32(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to float32 and back: inputs a float32 implementation sees unchanged."""
    return x.float().double()


def _mask(lengths, width: int) -> torch.Tensor:
    return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]


def whitening_cases(seed: int = 0) -> list[KindCase]:
    """Per-token advantages ``[4, 6]`` with a prefix mask per row, by what the whitening must get
    right."""
    g = torch.Generator().manual_seed(seed + 131)

    def case(name, x, lengths, note="", junk=True):
        mask = _mask(lengths, x.shape[1])
        if junk:  # finite junk at padding: the whitening must not read it
            junk = 7.0 + 3.0 * torch.rand(x.shape, generator=g, dtype=torch.float64)
            x = torch.where(mask, x, _exact32(junk))
        return KindCase(name, 0, {"advantages": _exact32(x), "mask": mask}, note=note)

    base = torch.randn((4, 6), generator=g, dtype=torch.float64)
    nonfinite = base.clone()
    nonfinite[0, 5], nonfinite[1, 4], nonfinite[3, 2] = math.nan, math.inf, -math.inf
    offset = 1000.0 + torch.randint(-8, 9, (4, 6), generator=g).to(torch.float64) / 64  # exact in float32
    return [
        case("equal_lengths", base, [6, 6, 6, 6], junk=False),
        case("ragged", base * 2.0 + 0.5, [6, 2, 4, 1], "rows of 6, 2, 4 and 1 tokens"),
        case("padding_junk", base, [3, 5, 2, 4], "values 7-10 at every padding position"),
        case("empty_rows", base, [4, 0, 3, 0], "two rows without a counted token"),
        KindCase("masked_nonfinite", 0, {"advantages": nonfinite, "mask": _mask([5, 4, 6, 2], 6)},
                 note="NaN, +inf and -inf at padding positions"),
        case("large_offset", offset, [6, 5, 6, 4], "1000 + k/64: a one-pass float32 variance cancels",
             junk=False),
        case("constant", torch.full((4, 6), 1000.125, dtype=torch.float64), [6, 3, 5, 2],
             "every counted entry 1000.125: variance 0, the spec gives 0", junk=False),
        case("single_token", base, [0, 1, 0, 0], "one counted entry in the batch: the spec gives 0"),
    ]


def expected_whitening(case: KindCase, flags: WhiteningFlags) -> dict[str, Expected]:
    x, mask = case.inputs["advantages"], case.inputs["mask"]
    single = flags.whiten_std == "sample" and int(mask.sum()) == 1
    if single and flags.whiten_sample_single == "nan":
        return {"advantages": Expected(torch.full_like(x, math.nan, dtype=torch.float64), mask)}
    if flags.whiten_one_pass and flags.whiten_one_pass_dtype == "float64":
        out = _one_pass_float64(x, mask, flags)
    elif flags.whiten_one_pass:  # the one-pass float32 variance of the counted entries (not the spec)
        m32, x32 = mask.to(torch.float32), torch.where(mask, x, 0.0).to(torch.float32)
        n = m32.sum().clamp(min=1.0)
        mu = (x32 * m32).sum() / n
        var = ((x32 * x32 * m32).sum() / n - mu * mu).clamp(min=0.0)
        out = ((x32 - mu) / torch.sqrt(var + flags.whiten_eps)).double()
    else:
        out = masked_whiten_reference(x, mask, mean=flags.whiten_mean, std=flags.whiten_std,
                                      weighting=flags.whiten_weighting,
                                      eps=flags.whiten_eps, eps_placement=flags.whiten_eps_placement,
                                      count_eps=flags.whiten_count_eps)
    if flags.whiten_masked_nonfinite == "propagate" and not bool(torch.isfinite(x).all()):
        out = torch.full_like(out, math.nan)
    return {"advantages": Expected(out.double(), mask)}


def _one_pass_float64(x: torch.Tensor, mask: torch.Tensor, flags: WhiteningFlags) -> torch.Tensor:
    """E[x^2] - E[x]^2 over the counted entries in float64 as AReaL's masked_normalization forms it
    (functional.py:38-53): padding zeroed by the mask, n = sum(mask), no clamp of the variance."""
    m = mask.to(torch.float64)
    z = torch.where(mask, x, 0.0)
    n = m.sum()
    mean = z.sum() / n
    var = (z * z).sum() / n - mean**2
    if flags.whiten_std == "sample":
        var = var * (n / (n - 1))
    eps = flags.whiten_eps
    placement = flags.whiten_eps_placement
    std = var.sqrt() + eps if placement == "std" else (var + eps).sqrt() if placement == "variance" else (
        var.clamp(min=eps).sqrt())
    return (z - mean) / std


def float32_rtol(case: KindCase) -> float:
    """The tolerance of a float32 whitening of ``case``: the float32 sum of n counted entries is off by
    up to n u max|x| (u = 2^-24), the centred values by as much, and the division by the standard
    deviation s scales that: 2 n u max|x| / s (the condition number of centring on a large offset)."""
    x, mask = case.inputs["advantages"], case.inputs["mask"]
    counted = x[mask & torch.isfinite(x)]
    if counted.numel() < 2:
        return 0.0
    s = float(counted.std(unbiased=False))
    return 0.0 if s == 0.0 else 2 * counted.numel() * 2.0**-24 * float(counted.abs().max()) / s


def _call(fn, adapter, case: KindCase) -> dict:
    x, mask = case.inputs["advantages"].clone(), case.inputs["mask"].clone()
    out = adapter(fn, x, mask) if adapter is not None else fn(x, mask)
    return {"advantages": out}


WHITENING = Kind(
    name="whitening",
    title="advantage whitening (masked batch mean and variance)",
    signature="fn(advantages [N, T], mask [N, T] bool) -> whitened advantages [N, T]",
    flags=WhiteningFlags,
    cases=lambda seed=0: whitening_cases(seed),
    expected=expected_whitening,
    call=_call,
    float32_rtol=float32_rtol,
)
