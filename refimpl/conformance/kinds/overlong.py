"""Kind ``overlong``: DAPO's soft overlong punishment added to the sequence reward (Yu et al. 2025,
section 3.4).

The function is called as ``fn(lengths [N] int64, *, max_len, cache_len) -> penalties [N]`` and judged
against ``refimpl.advantages.overlong_penalty`` (advantages.md eq. (8)): 0 up to ``max_len -
cache_len`` tokens, then linear, -1 at ``max_len``, and -1 for every longer response. Values only (a
reward carries no gradient).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from refimpl.advantages import overlong_penalty

from .base import Expected, Kind, KindCase, check_choices

__all__ = ["OverlongFlags", "OVERLONG", "overlong_cases", "expected_overlong"]


@dataclass(frozen=True)
class OverlongFlags:
    """How a framework shapes the reward of a long response (defaults: the spec).

    overlong_floor: "minus_one" (eq. (8): -1 beyond ``max_len``) | "none" (the linear ramp continues past
        ``max_len``: (max_len - cache_len - L) / cache_len, below -1).
    """

    overlong_floor: str = "minus_one"

    def __post_init__(self) -> None:
        check_choices(self, {"overlong_floor": ("minus_one", "none")})


def overlong_cases(seed: int = 0) -> list[KindCase]:
    """Response lengths by where they fall: ``max_len`` 20, ``cache_len`` 5 (``seed`` unused: the
    classes are the boundaries)."""
    del seed

    def case(name, lengths, note, max_len=20, cache_len=5):
        return KindCase(name, 0, {"lengths": torch.tensor(lengths, dtype=torch.int64)},
                        {"max_len": max_len, "cache_len": cache_len}, note)

    return [
        case("within_budget", [0, 1, 9, 15], "L <= max_len - cache_len: no penalty"),
        case("soft_zone", [16, 17, 18, 19], "linear between max_len - cache_len and max_len"),
        case("at_max_len", [20, 20], "L = max_len: -1"),
        case("beyond_max_len", [21, 25, 30, 45], "L > max_len (a multi-turn response, a budget mismatch): "
             "-1"),
        case("cache_is_max_len", [0, 2, 4, 6], "cache_len = max_len = 4: the ramp starts at 0", 4, 4),
    ]


def expected_overlong(case: KindCase, flags: OverlongFlags) -> dict[str, Expected]:
    """eq. (8) in float64 (``refimpl.advantages.overlong_penalty``'s arithmetic, which returns float32;
    it validates the lengths and parameters here), without its floor under ``overlong_floor="none"``."""
    lengths, p = case.inputs["lengths"], case.params
    overlong_penalty(lengths, p["max_len"], p["cache_len"])  # one-line errors for bad input
    ramp = (((p["max_len"] - p["cache_len"]) - lengths.double()) / p["cache_len"]).clamp(max=0.0)
    values = ramp.clamp(min=-1.0) if flags.overlong_floor == "minus_one" else ramp
    return {"penalties": Expected(values)}


def _call(fn, adapter, case: KindCase) -> dict:
    lengths, p = case.inputs["lengths"].clone(), case.params
    out = adapter(fn, lengths, **p) if adapter is not None else fn(lengths, **p)
    return {"penalties": out}


OVERLONG = Kind(
    name="overlong",
    title="DAPO's overlong reward shaping",
    signature="fn(lengths [N] int64, *, max_len, cache_len) -> penalties [N]",
    flags=OverlongFlags,
    cases=lambda seed=0: overlong_cases(seed),
    expected=expected_overlong,
    call=_call,
)
