"""Per-call cost of the compiled fast path ``fused_policy_loss`` beyond its kernel (issue 29, item 2).

At a tiny batch (default 4x8, GRPO, float32, a bool mask) the kernel's work is negligible, so a call's
time is its fixed cost. Times, layer by layer, in interleaved rounds (thread CPU time, 1 thread,
medians and interquartile ranges): forward + backward; forward; the compiled function through
dynamo's entry (guards, AOT-autograd's runtime wrappers, inductor's code); inductor's generated
``call`` alone (captured from ``CompiledFxGraph`` on one call and then called directly: what a
guard-free entry would pay); forward + backward under ``torch.compiler.set_stance(...,
skip_guard_eval_unsafe=True)``; and the eager ``policy_loss``.

Usage: ``python benchmarks/fused_overhead.py [NxT]`` (compiles GRPO first: seconds to minutes).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
from torch._inductor.output_code import CompiledFxGraph

from refimpl.losses import GRPO, policy_loss
from refimpl.losses.fused_policy import _kernel, _plan, fused_policy_loss


def main() -> None:
    torch.set_num_threads(1)
    n, t = (int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "4x8").split("x"))
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(n, t, generator=g)).requires_grad_(True)
    old = logp.detach() + 0.01 * torch.randn(n, t, generator=g)
    adv = torch.randn(n, generator=g)
    mask = torch.ones(n, t, dtype=torch.bool)
    start = time.perf_counter()
    fused_policy_loss(logp, old, adv, mask, GRPO)[0].backward()
    print(f"first call (compile, or load from inductor's caches): {time.perf_counter() - start:.1f} s wall")
    plan = _plan(GRPO, False, False, False, False, False, True, False)
    kernel = _kernel(plan, torch.float32, torch.float32, "cpu", True)
    inputs = (logp.detach(), old, adv, mask.float(), None, None, None, None, torch.ones(1),
              torch.zeros(1, dtype=torch.bool), torch.ones(1))
    captured = []
    real = CompiledFxGraph.__call__

    def spy(self, args):
        captured.append((self.current_callable, list(args)))
        return real(self, args)

    CompiledFxGraph.__call__ = spy
    try:
        kernel(*inputs)
    finally:
        CompiledFxGraph.__call__ = real
    call, args = captured[0]

    def both(loss_fn=fused_policy_loss):
        loss_fn(logp, old, adv, mask, GRPO)[0].backward()

    def unsafe():
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            both()

    fns = {"fused forward + backward": both,
           "fused forward": lambda: fused_policy_loss(logp, old, adv, mask, GRPO),
           "dynamo entry (kernel + guards)": lambda: kernel(*inputs),
           "inductor call alone": lambda: call(list(args)),
           "fwd + bwd, skip_guard_eval_unsafe": unsafe,
           "eager policy_loss fwd + bwd": lambda: both(policy_loss)}
    calls, rounds = 200, 15
    times = {name: [] for name in fns}
    for fn in fns.values():
        for _ in range(20):
            fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            began = time.thread_time()
            for _ in range(calls):
                fn()
            times[name].append((time.thread_time() - began) / calls * 1e3)
    print(f"[{n}, {t}] ms a call, medians of {rounds} interleaved rounds of {calls} calls; load average "
          + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    for name, values in times.items():
        q = statistics.quantiles(values, n=4)
        print(f"  {name:<36} {statistics.median(values):.4f}  (IQR {q[0]:.4f}-{q[2]:.4f})")


if __name__ == "__main__":
    main()
