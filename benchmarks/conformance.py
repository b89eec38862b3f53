"""How long the conformance kit takes (issue "The conformance kit": under 30 s per preset on 2 CPU cores).

Prints, for every preset and shipped convention, the wall time of one full ``check_policy_loss``
run (every case class; the user function is our own implementation, so the time is the kit's
cost plus one reference-cost loss per case), of ``convention_differences`` and of the other
checkers, all in one process. Usage: ``python benchmarks/conformance.py [--threads 2]``.
"""

from __future__ import annotations

import argparse
import time

import torch

from refimpl.advantages import group_advantages
from refimpl.conformance import (
    check_group_advantages,
    check_kl,
    check_policy_loss,
    check_token_logprobs,
    convention_differences,
    profile,
    reference_policy_loss_fn,
    resolve_preset,
)
from refimpl.kl import kl_k3
from refimpl.losses import PRESETS
from refimpl.losses.logprobs import token_logprobs

TARGET_SECONDS = 30.0


def _timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"conformance kit timings, {args.threads} CPU thread(s); target < {TARGET_SECONDS:.0f} s per preset"
    )
    print(f"{'preset':<12}{'convention':<12}{'cases':>6}{'check s':>9}{'differences s':>15}  result")
    worst = 0.0
    for name in PRESETS:
        for convention in ("reference", "trl", "verl"):
            try:
                profile(convention, name)
            except ValueError:
                continue
            _, variant = resolve_preset(name)
            fn = reference_policy_loss_fn(variant, convention, name)
            seconds, report = _timed(lambda: check_policy_loss(fn, name, convention=convention))  # noqa: B023
            diff_seconds, _ = _timed(lambda: convention_differences(name, convention))  # noqa: B023
            worst = max(worst, seconds + diff_seconds)
            status = "pass" if report.ok else "FAIL " + ",".join(report.failing_classes())
            row = f"{name:<12}{convention:<12}{len(report.results):>6}{seconds:>9.2f}{diff_seconds:>15.2f}"
            print(f"{row}  {status}")
    others = {
        "check_kl(k3)": lambda: check_kl(kl_k3, "k3"),
        "check_group_advantages": lambda: check_group_advantages(
            lambda r, g: group_advantages(
                r,
                g,
                scale="group",
                std="population",
                eps=1e-6,
                eps_inside_sqrt=True,
                zero_variance="zero",
                singleton="zero",
            )
        ),
        "check_token_logprobs": lambda: check_token_logprobs(token_logprobs),
    }
    for label, run in others.items():
        seconds, report = _timed(run)
        print(f"{label:<36}{seconds:>9.2f}  {'pass' if report.ok else 'FAIL'}")
    print(
        f"slowest preset run (check + differences): {worst:.2f} s "
        f"({'within' if worst < TARGET_SECONDS else 'OVER'} the {TARGET_SECONDS:.0f} s target)"
    )


if __name__ == "__main__":
    main()
