"""Per-call cost of the compiled fast path ``fused_policy_loss`` beyond its kernel (issue 29, item 2).

At a tiny batch (default 4x8, GRPO, float32, a bool mask) the kernel's work is negligible, so a call's
time is its fixed cost. Times, layer by layer, in interleaved rounds (the order shuffled each round,
benchmarks/timing.py; thread CPU time, 1 thread, medians and interquartile ranges): forward + backward;
forward; the compiled function through dynamo's entry (guards, AOT-autograd's runtime wrappers,
inductor's code); inductor's generated ``call`` alone (captured from ``CompiledFxGraph`` on one call and
then called directly: the kernel); autograd's own floor (a custom Function whose forward returns a
cached tensor and whose backward is one product, forward + backward: what any differentiable call pays);
the eager ``policy_loss``; and, with ``--baseline FILE``, another version of
``refimpl/losses/fused_policy.py`` (e.g. ``git show main:refimpl/losses/fused_policy.py >
/tmp/base.py``), forward + backward and forward, interleaved with the rest: a before / after in one run;
with ``--aot``, ``compile="aot"`` (an AOTInductor package, ``refimpl.losses.fused_aot``) forward +
backward and its C++ runner alone. "beyond the kernel" is forward + backward less inductor's call (the
runner's time includes its own entry).

Usage: ``python benchmarks/fused_overhead.py [--size NxT] [--rounds R] [--aot] [--baseline FILE]`` (compiles
GRPO first: seconds to minutes).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

import torch
from losses import OVERHEAD_TARGET_MS, load_module, overhead_verdict  # benchmarks/losses.py
from timing import interleaved_samples  # benchmarks/timing.py
from torch._inductor.output_code import CompiledFxGraph

from refimpl.losses import GRPO, policy_loss
from refimpl.losses.fused_policy import _entry, fused_policy_loss


def _repeat(fn, calls: int) -> None:
    for _ in range(calls):
        fn()


class _Floor(torch.autograd.Function):
    """Autograd's fixed cost: forward returns a cached value, backward one product."""

    @staticmethod
    def forward(ctx, value, grad, x):
        ctx.grad = grad
        return value

    @staticmethod
    def backward(ctx, grad_output):
        return None, None, grad_output * ctx.grad


def _inductor_call(kernel, inputs):
    """Inductor's generated ``call`` and its arguments, captured on one call of ``kernel``."""
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
    return captured[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="4x8", help="NxT (default 4x8)")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    parser.add_argument("--calls", type=int, default=200, help="calls per function per round (default 200)")
    parser.add_argument("--aot", action="store_true", help="also compile='aot' (AOTInductor; compiles GRPO)")
    parser.add_argument("--baseline", help="another fused_policy.py to time beside this one")
    args = parser.parse_args()
    torch.set_num_threads(1)
    n, t = (int(x) for x in args.size.split("x"))
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(n, t, generator=g)).requires_grad_(True)
    old = logp.detach() + 0.01 * torch.randn(n, t, generator=g)
    adv = torch.randn(n, generator=g)
    mask = torch.ones(n, t, dtype=torch.bool)
    start = time.perf_counter()
    fused_policy_loss(logp, old, adv, mask, GRPO)[0].backward()
    print(f"first call (compile, or load from inductor's caches): {time.perf_counter() - start:.1f} s wall")
    entry = _entry(GRPO, False, False, False, False, False, torch.bool, False, torch.float32, logp.device,
                   True)
    inputs = (logp.detach(), old, adv, mask.float(), None, None, None, None, *entry.constants)
    call, call_args = _inductor_call(entry.kernel, inputs)
    value, grad = torch.tensor(0.5), torch.ones(n, t)

    def both(loss_fn=fused_policy_loss):
        loss_fn(logp, old, adv, mask, GRPO)[0].backward()

    fns = {"fused forward + backward": both,
           "fused forward": lambda: fused_policy_loss(logp, old, adv, mask, GRPO),
           "dynamo entry (kernel + guards)": lambda: entry.kernel(*inputs),
           "inductor call alone (the kernel)": lambda: call(list(call_args)),
           "autograd floor (fwd + bwd)": lambda: _Floor.apply(value, grad, logp).backward(),
           "eager policy_loss fwd + bwd": lambda: both(policy_loss)}
    if args.aot:
        aot_both = functools.partial(both, functools.partial(fused_policy_loss, compile="aot"))
        start = time.perf_counter()
        aot_both()
        print(f"first call with compile='aot' (export and compile, or load the package): "
              f"{time.perf_counter() - start:.1f} s wall")
        aot = _entry(GRPO, False, False, False, False, False, torch.bool, False, torch.float32, logp.device,
                     "aot").kernel
        present = [x for x in inputs if x is not None]
        fns["aot forward + backward"] = aot_both
        fns["aot runner alone (kernel + entry)"] = lambda: aot.runner.run(present)
    if args.baseline:
        base = load_module(args.baseline).fused_policy_loss
        base(logp, old, adv, mask, GRPO)[0].backward()  # its compile (or inductor's cache)
        fns["baseline forward + backward"] = lambda: both(base)
        fns["baseline forward"] = lambda: base(logp, old, adv, mask, GRPO)
    for fn in fns.values():
        for _ in range(20):
            fn()
    # each round runs every entry's ``calls`` calls in turn, in an order shuffled each round
    batched = {name: functools.partial(_repeat, fn, args.calls) for name, fn in fns.items()}
    samples = interleaved_samples(batched, torch.device("cpu"), args.rounds)
    times = {name: [x / args.calls * 1e3 for x in xs] for name, xs in samples.items()}
    print(f"[{n}, {t}] GRPO float32, ms a call, medians of {args.rounds} interleaved rounds of {args.calls} "
          "calls (thread CPU time, 1 thread); load average " + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    for name, values in times.items():
        q = statistics.quantiles(values, n=4)
        print(f"  {name:<36} {statistics.median(values):.4f}  (IQR {q[0]:.4f}-{q[2]:.4f})")
    kernel = statistics.median(times["inductor call alone (the kernel)"])
    for name in ("fused forward + backward", "aot forward + backward", "baseline forward + backward"):
        if name in times:
            beyond = statistics.median(times[name]) - kernel
            entry = {"fused": "compile=True", "aot": 'compile="aot"'}.get(name.split()[0], name.split()[0])
            print(f"  beyond the kernel, {entry:<26} {beyond:.4f}  target (issue 29 item 2, at most "
                  f"{OVERHEAD_TARGET_MS} ms): {overhead_verdict(beyond)}")


if __name__ == "__main__":
    main()
