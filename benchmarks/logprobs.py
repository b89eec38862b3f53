"""Benchmark of token log-probabilities (spec: kl.md section 6; issue 21 "Log-probabilities at the
speed of the naive code, at a fraction of its memory").

Prints, in one run (ratios measured in the same process on the same tensors; on CPU the calling
thread's CPU time with one intra-op thread, on CUDA synchronised wall time; best of interleaved
rounds, their order shuffled each round: benchmarks/timing.py):

1. ``token_logprobs`` (its default backend: the Triton kernels on CUDA, the eager chunked path
   elsewhere; on CUDA the eager path too) against ``log_softmax(logits.float()).gather()``:
   forward + backward time and peak memory beyond the logits and their gradient, at 4096 tokens,
   V in {32k, 128k} (2**15, 2**17), float32 and bfloat16 logits. Targets (CUDA): time <= 1.2x and
   memory <= 0.5x the naive code's.
2. ``--sweep``: the eager path's time against its chunk size (``chunk_elements``), the measurement
   behind ``refimpl.losses.logprobs.DEVICE_CHUNK_ELEMENTS``.
3. The lm head: ``lm_head_logprobs(hidden, weight, tokens)`` against
   ``log_softmax(hidden @ weight.T).gather()``, each followed by the GRPO loss
   (``policy_loss(..., replace(GRPO, kl_coef=0.04), ref_logp=...)``), the same loss fused with the lm
   head (``lm_head_policy_loss``: the logits formed once, three products per chunk), and Liger-Kernel's
   ``LigerFusedLinearGRPOLoss`` (``loss_type="grpo"``, ``beta=0.04``, its defaults otherwise:
   ``compiled=True`` on CUDA, eager on CPU, ``chunk_size=1``) on the same hidden states, weight,
   tokens, old and reference log-probs, advantages and mask: B sequences of T tokens (N = B T), d, V stated;
   forward + backward time (medians of interleaved rounds) and peak memory beyond the inputs and
   their gradients. Targets: the fused path's memory <= 0.25x the naive code's (N = 4096, d = 2048,
   V = 128k, float32; issue 21); on a CPU at most Liger-Kernel's time at V = 32k and 128k with
   memory <= 0.1x the naive code's (issue 29). ``--lm-head BxTxDxV`` (repeatable) sets the size,
   ``--chunk-rows R,R`` adds rows of both lm-head paths with those ``chunk_rows`` beside the default
   rule's (``lm_head_chunk_rows``), ``--lm-head-only`` skips tables 1 and 2.

Peak memory: on CUDA ``max_memory_allocated`` over the step; on CPU the allocations the profiler
records (``peak_bytes``), the same quantity counted from the CPU allocator's events.

Usage: ``python benchmarks/logprobs.py --device cuda`` (the issue's sizes; about a minute on an
H100), ``python benchmarks/logprobs.py`` on CPU (smaller sizes by default: 1024 tokens, V in
{2**15, 2**17}; the lm head at B = 2, T = 256, d = 256, V = 2**15), ``--quick`` for a smoke run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import torch
from timing import best_times, median_times, sync  # benchmarks/timing.py

from refimpl.losses import GRPO, policy_loss, token_logprobs
from refimpl.losses.lm_head import lm_head_chunk_rows, lm_head_logprobs
from refimpl.losses.lm_head_loss import lm_head_policy_loss


def peak_bytes(fn, device: torch.device) -> int:
    """Peak bytes allocated on ``device`` while ``fn()`` runs, beyond what was allocated before it
    (tensors ``fn`` returns count; what it frees before returning counts only while it lived).
    CUDA: ``torch.cuda.max_memory_allocated``. CPU: the running sum of the allocation and release
    events ``torch.profiler`` records (``profile_memory=True``), in the order they happened."""
    if device.type == "cuda":
        sync(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        sync(device)
        return torch.cuda.max_memory_allocated(device) - before
    if device.type != "cpu":
        raise ValueError(f"peak_bytes measures cpu and cuda, got {device.type}")
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation:
            events.append((event.start_time_ns, event.extra_fields.alloc_size))
    if not events:
        raise RuntimeError("the profiler recorded no allocation on the CPU: peak_bytes cannot measure here")
    current = peak = 0
    for _, size in sorted(events, key=lambda e: e[0]):
        current += size
        peak = max(peak, current)
    return peak


def naive_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """What frameworks write: the log-softmax of the logits in float32 (float64 ones as they are),
    gathered (TRL's and verl's fallback)."""
    upcast = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return torch.log_softmax(upcast, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def logprob_methods(device: torch.device) -> dict:
    methods = {"log_softmax().gather()": naive_logprobs,
               "token_logprobs": token_logprobs}
    if device.type == "cuda":
        methods["token_logprobs eager"] = lambda x, ids: token_logprobs(x, ids, backend="eager")
    return methods


def logprobs_table(tokens: int, vocabs: list[int], dtypes: list[torch.dtype], device: torch.device,
                   rounds: int) -> None:
    print(f"\ntoken_logprobs vs log_softmax(logits.float()).gather(), {tokens} tokens, forward + backward, "
          f"device {device}")
    print(f"{'V':>7} {'dtype':<9} {'method':<24} {'ms':>9} {'x naive':>8} {'peak MiB':>9} {'x naive':>8}")
    g = torch.Generator().manual_seed(0)
    for vocab in vocabs:
        for dtype in dtypes:
            logits = torch.randn(tokens, vocab, generator=g).mul_(3).to(device=device, dtype=dtype)
            ids = torch.randint(0, vocab, (tokens,), generator=g).to(device)
            grad_bytes = logits.numel() * logits.element_size()
            steps = {}
            for label, method in logprob_methods(device).items():
                def step(m=method, logits=logits, ids=ids):
                    x = logits.detach().requires_grad_(True)
                    m(x, ids).sum().backward()
                    return x.grad
                steps[label] = step
            seconds = best_times(steps, device, rounds)
            # beyond the logits (allocated before) and their gradient (returned)
            peaks = {label: (peak_bytes(step, device) - grad_bytes) / 2**20 for label, step in steps.items()}
            base = "log_softmax().gather()"
            for label in steps:
                print(f"{vocab:>7} {str(dtype)[6:]:<9} {label:<24} {seconds[label] * 1e3:9.2f} "
                      f"{seconds[label] / seconds[base]:8.2f} {peaks[label]:9.1f} "
                      f"{peaks[label] / peaks[base]:8.3f}")
            del logits, steps


def sweep_table(tokens: int, vocab: int, device: torch.device, rounds: int) -> None:
    print(f"\neager token_logprobs against chunk_elements, {tokens} x {vocab} float32 logits, "
          f"device {device}")
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(tokens, vocab, generator=g).to(device)
    ids = torch.randint(0, vocab, (tokens,), generator=g).to(device)
    steps = {"log_softmax().gather()": lambda: naive_logprobs(
        logits.detach().requires_grad_(True), ids).sum().backward()}
    for power in range(12, 29, 2):
        if (1 << power) <= 4 * tokens * vocab:
            steps[f"2**{power}"] = lambda c=1 << power: token_logprobs(
                logits.detach().requires_grad_(True), ids, chunk_elements=c, backend="eager").sum().backward()
    seconds = best_times(steps, device, rounds)
    base = seconds["log_softmax().gather()"]
    for label, s in seconds.items():
        print(f"{label:<24} {s * 1e3:9.2f} ms {s / base:6.2f}x")


def _liger_loss(compiled: bool):
    try:
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
    except ImportError:
        return None
    return LigerFusedLinearGRPOLoss(beta=0.04, loss_type="grpo", use_ref_model=True, compiled=compiled)


def lm_head_table(b: int, t: int, d: int, vocab: int, dtype: torch.dtype, device: torch.device,
                  rounds: int, chunks: tuple[int, ...] = ()) -> None:
    """The lm-head table at B, T, d, V: the naive code, ``lm_head_logprobs`` and
    ``lm_head_policy_loss`` (their default chunk, ``lm_head_chunk_rows``) and, for each of ``chunks``,
    both with ``chunk_rows=c``; Liger-Kernel's fused linear GRPO loss; medians of ``rounds``
    interleaved rounds."""
    n = b * t
    default = lm_head_chunk_rows(n, vocab, dtype, device=device)
    print(f"\nlm head + GRPO loss, B = {b}, T = {t} (N = {n}), d = {d}, V = {vocab}, {str(dtype)[6:]}, "
          f"forward + backward, device {device}; default chunk {default} rows")
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(b, t, d, generator=g).to(device=device, dtype=dtype)
    weight = (torch.randn(vocab, d, generator=g) / d**0.5).to(device=device, dtype=dtype)
    tokens = torch.randint(0, vocab, (b, t), generator=g).to(device)
    with torch.no_grad():
        base_logp = lm_head_logprobs(hidden, weight, tokens)
    old = (base_logp + 0.01 * torch.randn(b, t, generator=g).to(device)).float()
    ref = (base_logp + 0.01 * torch.randn(b, t, generator=g).to(device)).float()
    advantages = torch.randn(b, generator=g).to(device)
    lengths = torch.randint(t // 2, t + 1, (b,), generator=g)
    mask = (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).to(device)
    variant = dataclasses.replace(GRPO, kl_coef=0.04)
    input_bytes = 2 * (hidden.numel() + weight.numel()) * hidden.element_size()  # the inputs' gradients

    def ours_loss(logp):
        return policy_loss(logp, old, advantages, mask, variant, ref_logp=ref)[0]

    def leaves():
        return hidden.detach().requires_grad_(True), weight.detach().requires_grad_(True)

    def naive():
        h, w = leaves()
        logp = torch.log_softmax((h @ w.T).float(), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        loss = ours_loss(logp)
        loss.backward()
        return loss.detach(), h.grad, w.grad

    def fused():
        h, w = leaves()
        loss = ours_loss(lm_head_logprobs(h, w, tokens))
        loss.backward()
        return loss.detach(), h.grad, w.grad

    def fused_loss(rows=None):
        h, w = leaves()
        loss = lm_head_policy_loss(h, w, tokens, old, advantages, mask, variant, ref_logp=ref,
                                   chunk_rows=rows)[0]
        loss.backward()
        return loss.detach(), h.grad, w.grad

    steps = {"log_softmax(h @ W.T)": naive, "lm_head_logprobs": fused, "lm_head_policy_loss": fused_loss}
    for rows in chunks:
        def chunked(rows=rows):
            h, w = leaves()
            loss = ours_loss(lm_head_logprobs(h, w, tokens, chunk_rows=rows))
            loss.backward()
            return loss.detach(), h.grad, w.grad
        steps[f"chunk_rows={rows}"] = chunked
        steps[f"policy chunk_rows={rows}"] = lambda rows=rows: fused_loss(rows)
    # Liger compiles its loss math with torch.compile by default; on CPU that means inductor's C++
    # toolchain, so the CPU run uses its eager mode (the chunked matmuls, where the time goes, are
    # eager in both)
    liger = _liger_loss(compiled=device.type == "cuda")
    if liger is not None:
        def liger_step():
            h, w = leaves()
            loss = liger(h, w, tokens, mask.to(dtype), advantages, ref_per_token_logps=ref,
                         old_per_token_logps=old)[0]
            loss.backward()
            return loss.detach(), h.grad, w.grad
        steps["Liger GRPO (fused)"] = liger_step
        try:
            liger_step()
        except Exception as error:  # report and go on: the other rows stand alone
            print(f"Liger-Kernel failed here ({type(error).__name__}: {str(error).splitlines()[0][:200]}): "
                  "its row skipped")
            del steps["Liger GRPO (fused)"]
            liger = None
    losses = {label: float(step()[0]) for label, step in steps.items()}
    seconds, spread = median_times(steps, device, rounds, spread="range")
    peaks = {label: (peak_bytes(step, device) - input_bytes // 2) / 2**20 for label, step in steps.items()}
    print(f"medians of {rounds} interleaved rounds, spread (max - min) / median up to {spread:.2f}; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"{'method':<24} {'loss':>12} {'ms':>10} {'x naive':>8} {'x Liger':>8} {'peak MiB':>9} "
          f"{'x naive':>8}")
    liger_time = seconds.get("Liger GRPO (fused)", float("nan"))
    base = "log_softmax(h @ W.T)"
    for label in steps:
        print(f"{label:<24} {losses[label]:12.6g} {seconds[label] * 1e3:10.2f} "
              f"{seconds[label] / seconds[base]:8.2f} {seconds[label] / liger_time:8.2f} "
              f"{peaks[label]:9.1f} {peaks[label] / peaks[base]:8.3f}")
    if liger is None:
        print("no Liger-Kernel row (not installed: pip install --no-deps liger-kernel==0.8.5)")
    else:
        for label in ("lm_head_logprobs", "lm_head_policy_loss"):
            print(f"{label} / Liger: time {seconds[label] / liger_time:.2f}, memory "
                  f"{peaks[label] / peaks['Liger GRPO (fused)']:.2f}")
    print("peak MiB: beyond the inputs and their gradients")


def _head_size(text: str) -> tuple[int, int, int, int]:
    try:
        size = tuple(int(x) for x in text.lower().split("x"))
    except ValueError:
        size = ()
    if len(size) != 4 or min(size) < 1:
        raise argparse.ArgumentTypeError(f"an lm-head size is BxTxDxV (positive integers, e.g. "
                                         f"2x1024x256x131072), got {text!r}")
    return size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sweep", action="store_true",
                        help="also time the eager path against its chunk size")
    parser.add_argument("--no-lm-head", action="store_true", help="skip the lm-head table")
    parser.add_argument("--lm-head", type=_head_size, action="append", metavar="BxTxDxV",
                        help="the lm-head table's size (repeatable; default by device)")
    parser.add_argument("--chunk-rows", type=lambda text: tuple(int(x) for x in text.split(",")), default=(),
                        metavar="R,R,...", help="also time lm_head_logprobs with these chunk_rows")
    parser.add_argument("--lm-head-only", action="store_true", help="only the lm-head table(s)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    if args.quick:
        tokens, vocabs, head = 256, [4096], (2, 64, 64, 4096)
    elif device.type == "cuda":
        tokens, vocabs, head = 4096, [1 << 15, 1 << 17], (4, 1024, 2048, 1 << 17)
    else:
        tokens, vocabs, head = 1024, [1 << 15, 1 << 17], (2, 256, 256, 1 << 15)
    if not args.lm_head_only:
        logprobs_table(tokens, vocabs, [torch.float32, torch.bfloat16], device, args.rounds)
    if args.sweep and not args.lm_head_only:
        sweep_table(tokens, vocabs[0], device, args.rounds)
    if not args.no_lm_head:
        for size in args.lm_head or [head]:
            lm_head_table(*size, torch.float32, device, max(2, args.rounds // 2), args.chunk_rows)


if __name__ == "__main__":
    main()
