"""Policy-loss case classes at the edges of the arithmetic: inputs exact in a reduced precision
(``half_overflow``, ``dual_clip_tie``, ``ratio_overflow``), a step without a single token
(``empty_step``) and a batch without a single row (``zero_rows``).

Each generator returns the cases of one class for a variant (see ``refimpl.conformance.case_types``
for the conventions every case follows); ``policy_cases.policy_loss_cases`` assembles them.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .case_types import _JUNK_LOGP, _JUNK_OLD, PolicyLossCase, _assemble

__all__ = [
    "half_overflow_cases",
    "dual_clip_tie_cases",
    "empty_step_cases",
    "ratio_overflow_cases",
    "zero_rows_cases",
    "float32_tie_log_ratio",
    "ratio_overflows",
]


def _exact_case(case_class, index, rows_old, rows_logp, adv, dtype, note, g, ref_rows=None):
    """A case from explicit per-row (old_logp, logp) values, exactly representable in ``dtype``."""
    n, width = len(rows_old), max(len(r) for r in rows_old)
    old = torch.full((n, width), _JUNK_OLD, dtype=torch.float64)
    logp = torch.full((n, width), _JUNK_LOGP, dtype=torch.float64)
    mask = torch.zeros((n, width), dtype=torch.bool)
    for i, (o_row, l_row) in enumerate(zip(rows_old, rows_logp, strict=True)):
        old[i, : len(o_row)] = torch.tensor(o_row, dtype=torch.float64)
        logp[i, : len(l_row)] = torch.tensor(l_row, dtype=torch.float64)
        mask[i, : len(o_row)] = True
    for x in (old, logp):
        if not torch.equal(x.to(dtype).double(), x):
            raise RuntimeError(f"{case_class}/{index}: inputs are not exact in {dtype}")
    a = torch.tensor(adv, dtype=torch.float64)
    ref = None
    if ref_rows is not None:  # reference log-probs: exact in dtype, junk at masked positions
        ref = torch.full((n, width), -3.0, dtype=torch.float64)
        for i, r_row in enumerate(ref_rows):
            ref[i, : len(r_row)] = torch.tensor(r_row, dtype=torch.float64)
        ref = ref.to(dtype)
    return PolicyLossCase(
        case_class,
        index,
        logp.to(dtype),
        old.to(dtype),
        a.to(dtype),
        mask,
        a,
        torch.tensor([i // 2 for i in range(n)]),
        ref,
        None,
        note,
    )


def half_overflow_cases(variant, seq, g, index):
    """Half-precision inputs near the overflow range (values exact in their dtype):

    0: fp16 log-ratios up to 10.875 (ratios up to 52 839, near fp16's largest 65 504) with negative
       advantages, every term and every partial sum representable in fp16; old_logp = -14, whose
       ``exp`` is subnormal in fp16 (a ratio formed as ``exp(logp) / exp(old_logp)`` loses it).
    1: fp16 terms of ~46 630 each: their sum overflows fp16 although the mean does not (a loss that
       sums in fp16 returns inf; computed in float32 it is finite).
    2: bf16 log-probs of magnitude 70-120 (bf16 spacing 0.5 there) with log-ratios of +-0.5 to
       +-1.5: ``exp(logp)`` underflows to 0 in bf16 and float32.
    """
    f16, bf16 = torch.float16, torch.bfloat16
    big = [
        _exact_case(
            "half_overflow",
            index,
            [[-14.0, -1.0, -0.5], [-14.0, -2.0], [-1.5, -0.75, -2.25, -0.25]],
            [[-3.125, -0.875, 0.125], [-3.5, -2.375], [-1.4375, -0.125, -2.625, 0.0625]],
            [-0.5, -0.5, 0.75],
            f16,
            "fp16 log-ratios up to 10.875 (ratio 52839)",
            g,
        ),
        _exact_case(
            "half_overflow",
            index + 1,
            [[-14.0, -14.0], [-14.0, -14.0]],
            [[-3.25, -3.25], [-3.25, -3.25]],
            [-1.0, -1.0],
            f16,
            "fp16 terms of 46630: their sum overflows fp16, their mean does not",
            g,
        ),
        _exact_case(
            "half_overflow",
            index + 2,
            [[-100.0, -75.5, -110.0], [-90.0, -120.0], [-80.0, -70.5, -95.0, -101.5]],
            [[-99.5, -74.5, -110.5], [-91.0, -120.5], [-78.5, -70.0, -94.0, -102.5]],
            [0.8, -1.1, 1.4],
            bf16,
            "bf16 log-probs of magnitude 70-120",
            g,
        ),
    ]
    return big


def float32_tie_log_ratio(bound: float) -> float | None:
    """A float32 log-ratio ``x`` whose float32 ``exp`` is exactly ``float32(bound)`` (searched over
    a few float32 ulps around ``log(bound)``), None when there is none. For 3.0 it is
    float32(log 3) = 1.0986123085...: ``exp`` in float32 gives 3.0, in float64 3.00000006."""
    x = torch.tensor(math.log(bound), dtype=torch.float32)
    target = torch.tensor(bound, dtype=torch.float32)
    up, down = x.clone(), x.clone()
    for _ in range(16):
        for candidate in (up, down):
            if bool(torch.exp(candidate) == target):
                return float(candidate)
        up = torch.nextafter(up, torch.tensor(math.inf, dtype=torch.float32))
        down = torch.nextafter(down, torch.tensor(-math.inf, dtype=torch.float32))
    return None


def dual_clip_tie_cases(variant, seq, g, index):
    """float32 inputs whose float32 ratio is exactly the dual clip ``c`` (A < 0): the spec's
    inclusive gate keeps the whole gradient ``-A c`` there (policy_losses.md eq. (7); float32 inputs
    are judged as computed in float32); a ``torch.max`` / ``torch.min`` with ``c A`` halves it
    (OpenRLHF loss.py:210: float32 r = 3.0, A = -1 gives 1.5; a subgradient of the kink, which the judge
    accepts with a note). Empty without a dual clip."""
    if variant.dual_clip is None or variant.ratio != "token" or variant.gate != "clip":
        return []
    x = float32_tie_log_ratio(variant.dual_clip)
    if x is None:
        return []
    return [
        _exact_case(
            "dual_clip_tie", index, [[0.0, -1.0, -0.5], [0.0, 0.0]], [[x, -0.75, -0.25], [x, 0.125]],
            [-1.0, -0.5], torch.float32, f"float32 ratio exactly {variant.dual_clip} (exp of {x!r})", g,
        ),
    ]


def empty_step_cases(variant, seq, g, index):
    """A step whose every row is padding (no token at all), whole and in two micro-batches: the
    spec's loss and gradient are 0 (the normaliser is at least 1, policy_losses.md eq. (11));
    dividing by the step's token count gives 0 / 0 (OpenRLHF)."""
    whole = _assemble("empty_step", index, [0, 0, 0], [[], [], []], [0.7, -1.1, 0.4], g,
                      note="every row empty")
    split = _assemble("empty_step", index + 1, [0, 0, 0, 0], [[], [], [], []], [-0.3, 0.9, 1.2, -0.6], g,
                      micro_batches=((0, 1), (2, 3)), note="2 micro-batches, every row empty")
    return [whole, split]


#: the largest log-ratio whose ``exp`` is finite, per dtype (log of the largest finite value)
_EXP_LIMIT = {dt: math.log(torch.finfo(dt).max) for dt in (torch.float16, torch.bfloat16, torch.float32)}


def ratio_overflows(case: PolicyLossCase, compute_dtype: torch.dtype) -> bool:
    """True when some unmasked token's log-ratio (or a row's mean log-ratio) exceeds the log of the
    largest finite value of ``compute_dtype``: ``exp`` overflows to inf there (88.72 in float32 and
    bf16, 11.09 in fp16); never for float64."""
    limit = _EXP_LIMIT.get(compute_dtype)
    if limit is None or not bool(case.mask.any()):
        return False
    x = torch.where(case.mask, case.logp.double() - case.old_logp.double(), 0.0)
    return bool((x > limit).any())


def ratio_overflow_cases(variant, seq, g, index):
    """A closed gate on a ratio past the dtype's range (exact inputs in each dtype): A > 0 with
    log-ratios 95 / 96 (float32 / bf16: ``exp`` overflows above 88.72) or 12 (fp16, above 11.09) and,
    with a dual clip, A < 0 above it. The spec's gate passes no gradient there (policy_losses.md eqs.
    (6)-(8): the clipped term is the constant ``(1 + eps_high) A``, SAPO's sigmoid is saturated), so
    the exact gradient is 0 and the value finite; ``exp`` of the raw log-ratio gives inf, and the
    clamp's zero derivative times inf is a NaN gradient (Liger, AReaL). A KL term gets reference
    log-probs equal to the policy's there (k3 = 0). For gates that close (clip, sapo, cispo and
    GMPO's log-space clip, eq. (18), whose clipped log-ratio never overflows) and for gate ``none``
    (``f = r a``, nothing to close), whose overflowing tokens sit in rows with A = 0 (a group of equal
    rewards): ``f`` and its gradient ``a r`` are exactly 0 there, ``0 * inf`` is NaN."""
    if variant.gate not in ("clip", "sapo", "cispo", "log_clip", "none") or (
            variant.gate in ("clip", "log_clip") and variant.eps_high is None):
        return []
    if variant.gate == "cispo" and variant.eps_high is None:
        return []
    cases = []
    specs = [(torch.float32, -100.0, -5.0), (torch.bfloat16, -100.0, -4.0), (torch.float16, -14.0, -2.0)]
    for k, (dtype, old, logp) in enumerate(specs):
        big = logp - old
        rows_old = [[old, -1.0, old], [-1.5, -0.75], [old, old, old]]
        rows_logp = [[logp, -0.875, logp], [-1.5, -0.875], [logp, logp, logp]]
        adv = [0.0, 0.5, 0.0] if variant.gate == "none" else [1.0, 0.5, 0.75]
        if variant.dual_clip is not None:  # A < 0 beyond the dual clip: closed as well
            rows_old.append([old, -1.0])
            rows_logp.append([logp, -1.0])
            adv.append(-0.5)
        ref = [list(r) for r in rows_logp] if variant.kl_coef > 0 else None
        cases.append(_exact_case("ratio_overflow", index + k, rows_old, rows_logp, adv, dtype,
                                 f"{dtype} log-ratios {big:g} " + ("with A = 0" if variant.gate == "none"
                                                                    else "under a closed gate"),
                                 g, ref_rows=ref))
    return cases


def zero_rows_cases(variant, seq, g, index):
    """A batch with no rows at all (``[0, T]`` tensors, e.g. the empty micro-batch of an uneven split):
    the spec's loss is 0 (policy_losses.md eq. (11), the normaliser at least 1) and the
    gradient w.r.t. the empty log-probs is empty; a mean over the rows divides 0 by 0."""
    none = _assemble("zero_rows", index, [], [], [], g, note="no rows: [0, T] tensors")
    empty = none.logp.new_zeros((0, 3))
    return [dataclasses.replace(none, logp=empty, old_logp=empty.clone(), mask=none.mask.new_zeros((0, 3)))]
