"""Benchmark of the policy-loss family against a one-pass floor and every installed framework's own loss
(spec: specs/policy_losses.md; issues 21 and 29).

Prints, for each size ``N x T`` (``--size``, repeatable; default 64x512, 256x2048 and 1024x4096), in
one process, float32 log-probs with ragged (prefix) masks, forward + backward with metrics and guards:

1. per preset: the floor ``(exp(logp - old) * A * mask).sum() / mask.sum()`` (eager autograd, forward
   and backward: one pass of the simplest loss), ``policy_loss`` (what users and the trainer call: the
   eager closed form of refimpl/losses/closed_form.py), its readable reference ``reference_policy_loss``,
   with ``--compiled`` the compiled fast path ``fused_policy_loss`` (C++ loops on a CPU, Triton on
   CUDA; its compile time printed and left out), and the fastest installed framework on that preset;
   each as a ratio to the floor, and ours / fastest framework;
2. every framework's profile mode of each preset, its own function called directly on the same
   tensors (benchmarks/peers.py: the conformance adapters' conversions run once, outside the timing;
   Liger-Kernel's loss math on the batch), ours / theirs.

Timing: on a CPU the calling thread's CPU time with one intra-op thread (other processes on a shared
machine then slow both sides alike), on CUDA synchronised wall time; ``--rounds`` rounds in which every
function runs once, in an order shuffled each round (benchmarks/timing.py: what runs just before a
function moves its time); each figure is the median over the rounds, and ``spread``
is the largest interquartile range over the row's functions divided by its median. The load average
is printed with each table. Targets (issue 29), the column ``target`` (``met`` or ``MISSED``): on a CPU
(item 1) policy_loss at most 0.5x the fastest framework and 3x the floor at 256x2048 and 1024x4096
(from 2**18 tokens on), at most 1x the fastest at 64x512; on CUDA (item 5), where policy_loss runs its
reference body, the compiled fused_policy_loss (always timed there) at most 0.5x the fastest framework
and 1.5x the floor.

Usage: ``python benchmarks/losses.py [--size 256x2048 ...] [--presets grpo dapo] [--compiled]
[--aot] [--baseline FILE] [--no-frameworks] [--rounds 15] [--device cuda] [--loop] [--logprobs]
[--overhead]``; ``--quick`` is ``--size 64x512``. ``--aot`` adds ``fused_policy_loss(compile="aot")``
(AOTInductor packages) and ``--baseline FILE`` another version of ``refimpl/losses/fused_policy.py`` (an
A/B in one run) to the compiled path's rounds, in a table of their own. ``--overhead`` adds item 2's
table: the compiled path's cost a call beyond its kernel, with its target (benchmarks/fused_overhead.py
``--aot``, run as a child process).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from timing import median_times, sync  # benchmarks/timing.py

from refimpl.losses import DR_GRPO, PRESETS, loss_normalizer, policy_loss, reference_policy_loss
from refimpl.losses.fused_policy import fused_policy_loss


def make_batch(n: int, t: int, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    old = -torch.rand(n, t, generator=g) * 3
    logp = old + 0.1 * torch.randn(n, t, generator=g)
    return {
        "logp": logp.to(device),
        "old_logp": old.to(device),
        "advantages": torch.randn(n, generator=g).to(device),
        "mask": mask.to(device),
    }


def floor_step(batch) -> None:
    logp = batch["logp"].detach().requires_grad_(True)
    mask = batch["mask"].to(logp.dtype)
    loss = (torch.exp(logp - batch["old_logp"]) * batch["advantages"].unsqueeze(-1) * mask).sum() / mask.sum()
    loss.backward()


def loss_step(batch, variant, loss_fn=policy_loss) -> None:
    """One forward + backward of ``loss_fn`` (metrics included: they are computed with the loss)."""
    logp = batch["logp"].detach().requires_grad_(True)
    loss, metrics = loss_fn(logp, batch["old_logp"], batch["advantages"], batch["mask"], variant)
    loss.backward()


def agreement(batch, variant, loss_fn=policy_loss) -> float:
    """Largest difference of ``loss_fn`` from the reference on the benchmark's tensors (loss, gradient
    and metrics), relative to each quantity's largest magnitude: a check of the path on the device
    measured."""
    results = []
    for fn in (reference_policy_loss, loss_fn):
        logp = batch["logp"].detach().requires_grad_(True)
        loss, metrics = fn(logp, batch["old_logp"], batch["advantages"], batch["mask"], variant)
        loss.backward()
        results.append([loss.detach(), logp.grad, *metrics.values()])
    worst = 0.0
    for expected, got in zip(*results, strict=True):
        e, g = expected.double(), got.double()
        worst = max(worst, float((g - e).abs().max()) / (float(e.abs().max()) + 1e-30))
    return worst


def loop_step(batch, variant) -> None:
    logp = batch["logp"].detach().requires_grad_(True)
    normalizer = loss_normalizer(batch["mask"], variant)
    total = 0.0
    for i in range(logp.shape[0]):
        loss, _ = policy_loss(logp[i : i + 1], batch["old_logp"][i : i + 1], batch["advantages"][i : i + 1],
                              batch["mask"][i : i + 1], variant, normalizer=normalizer)
        total = total + loss
    total.backward()



def _cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo; elsewhere ``platform.processor()``), family and model."""
    import platform

    fields = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or "unknown CPU"
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    if "cpu family" in fields and "model" in fields:
        name += f", family {fields['cpu family']} model {fields['model']}"
    return name


def _load() -> str:
    try:
        return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - no getloadavg
        return "load average unknown"


def compile_fast_path(batch, variants: dict, device: torch.device, loss_fn=fused_policy_loss,
                      what: str = "torch.compile of the fast path") -> None:
    """Compile the fast path's graph of each variant (its first call), outside the timings; prints
    each variant's wall time (cold when inductor's caches are empty: TORCHINDUCTOR_CACHE_DIR set to
    an empty directory) and the load average after it."""
    start = time.perf_counter()
    for name, variant in variants.items():
        began = time.perf_counter()
        loss_step(batch, variant, loss_fn)
        sync(device)
        print(f"  compile {name}: {time.perf_counter() - began:.1f} s wall ({_load()})", flush=True)
    print(f"{what}: {time.perf_counter() - start:.1f} s wall for {len(variants)} "
          f"variant(s) (first calls, left out of the timings)")


def _preset_variants(names: list[str], t: int) -> dict:
    """The presets to time; Dr. GRPO with L_max the padded width ``t``."""
    return {name: dataclasses.replace(DR_GRPO, max_length=t) if name == "dr_grpo" else PRESETS[name]
            for name in names}


def judged(device: torch.device) -> str:
    """The column the targets judge: on a CPU ``ours`` (``policy_loss``, issue 29 item 1: the eager path),
    on CUDA ``fast`` (``fused_policy_loss``, item 5: ``policy_loss`` runs its reference body there)."""
    return "fast" if device.type == "cuda" else "ours"


def targets(n: int, t: int, device_type: str = "cpu") -> tuple[float, float | None]:
    """Issue 29's targets at ``N x T``: (at most this times the fastest framework, at most this times the
    floor or None). CPU, ``policy_loss`` (item 1): 1x the fastest below 2**18 tokens (64x512), else 0.5x
    it and 3x the floor (256x2048, 1024x4096). CUDA, ``fused_policy_loss`` (item 5): 0.5x the fastest
    and 1.5x the floor at every size."""
    if device_type == "cuda":
        return 0.5, 1.5
    return (1.0, None) if n * t < 1 << 18 else (0.5, 3.0)


#: issue 29 item 2: a call of the compiled path at most this many ms beyond its kernel
#: (benchmarks/fused_overhead.py measures it; ``--overhead`` runs that script)
OVERHEAD_TARGET_MS = 0.2


def overhead_verdict(beyond_ms: float) -> str:
    """``met`` or ``MISSED`` against item 2's ``OVERHEAD_TARGET_MS``."""
    return "met" if beyond_ms <= OVERHEAD_TARGET_MS else "MISSED"


def overhead_command(rounds: int) -> list[str]:
    """benchmarks/fused_overhead.py with ``compile="aot"`` (item 2's guard-free entry) as a child process:
    its compiled functions and inductor's caches stay out of this process's timings."""
    script = Path(__file__).with_name("fused_overhead.py")
    return [sys.executable, str(script), "--aot", "--rounds", str(rounds)]


def verdict(judged_best: float | None, judged_floor: float, n: int, t: int, device_type: str = "cpu") -> str:
    """``met`` or ``MISSED`` against ``targets`` (``-`` without a framework to compare with)."""
    if judged_best is None:
        return "-"
    best_target, floor_target = targets(n, t, device_type)
    met = judged_best <= best_target and (floor_target is None or judged_floor <= floor_target)
    return "met" if met else "MISSED"


def size_tables(n: int, t: int, device: torch.device, rounds: int, names: list[str], *, compiled: bool,
                frameworks: bool, loop: bool, others: dict | None = None) -> None:
    """The two tables of the module docstring for one size."""
    from peers import peer_steps  # benchmarks/peers.py, run as a script from benchmarks/

    batch = make_batch(n, t, device)
    variants = _preset_variants(names, t)
    peers = peer_steps(batch, names) if frameworks else []
    others = others or {}
    if compiled:
        compile_fast_path(batch, variants, device)
    for label, fn in others.items():
        compile_fast_path(batch, variants, device, fn, f"{label} (first calls)")
    what = "thread CPU time, 1 thread" if device.type == "cpu" else "wall time"
    print(f"\n[N={n}, T={t}] float32, ragged masks, device {device}: forward + backward, medians of {rounds} "
          f"interleaved rounds ({what}); {_load()}")
    ours = ("the eager closed form" if device.type == "cpu" else
            "its reference body: the closed form runs on the CPU")
    print(f"ours: policy_loss ({ours}); ref: reference_policy_loss; fast: fused_policy_loss "
          "compiled; fl: the floor; best: the fastest framework on the preset; rel diff: ours against "
          f"the reference (loss, gradient, metrics); target: {judged(device)}'s, issue 29 item "
          f"{1 if device.type == 'cpu' else 5}")
    header = (f"{'preset':<11} {'floor ms':>8} {'ours ms':>8} {'ref ms':>8} " +
              (f"{'fast ms':>8} " if compiled else "") + f"{'ours/fl':>8} {'ref/fl':>7} " +
              (f"{'fast/fl':>8} " if compiled else "") +
              f"{'best':>18} {'best ms':>8} {'ours/best':>9} " + (f"{'fast/best':>9} " if compiled else "") +
              f"{'spread':>6} {'rel diff':>9} {'target':>6}" + (f" {'ref/loop':>9}" if loop else ""))
    print(header)
    mode_rows, other_rows = [], []
    for name, variant in variants.items():
        fns = {"floor": lambda: floor_step(batch),
               "ours": functools.partial(loss_step, batch, variant, policy_loss),
               "ref": functools.partial(loss_step, batch, variant, reference_policy_loss)}
        if compiled:
            fns["fast"] = functools.partial(loss_step, batch, variant, fused_policy_loss)
        fns.update({label: functools.partial(loss_step, batch, variant, fn) for label, fn in others.items()})
        theirs = [p for p in peers if p.preset == name]
        fns.update({f"peer{i}": p.step for i, p in enumerate(theirs)})
        median, spread = median_times(fns, device, rounds)
        floor = median["floor"]
        row = (f"{name:<11} {floor * 1e3:8.2f} {median['ours'] * 1e3:8.2f} {median['ref'] * 1e3:8.2f} " +
               (f"{median['fast'] * 1e3:8.2f} " if compiled else "") +
               f"{median['ours'] / floor:8.2f} {median['ref'] / floor:7.2f} " +
               (f"{median['fast'] / floor:8.2f} " if compiled else ""))
        judged_best = None
        if theirs:
            i = min(range(len(theirs)), key=lambda k: median[f"peer{k}"])
            best = median[f"peer{i}"]
            judged_best = median[judged(device)] / best
            row += (f"{theirs[i].framework.split()[0]:>18} {best * 1e3:8.2f} {median['ours'] / best:9.2f} " +
                    (f"{median['fast'] / best:9.2f} " if compiled else ""))
            for k, p in enumerate(theirs):
                mode_rows.append((p, median[f"peer{k}"], median["ours"], median.get("fast")))
        else:  # no framework on this preset
            row += f"{'-':>18} {'-':>8} {'-':>9} " + (f"{'-':>9} " if compiled else "")
        if others:
            other_rows.append((name, median))
        target = verdict(judged_best, median[judged(device)] / floor, n, t, device.type)
        row += f"{spread:6.2f} {agreement(batch, variant):9.1e} {target:>6}"
        if loop:
            pair = {"ref": fns["ref"], "loop": lambda v=variant: loop_step(batch, v)}
            looped, _ = median_times(pair, device, max(1, rounds // 3))
            row += f" {looped['ref'] / looped['loop']:9.4f}"
        print(row)
    if other_rows:
        print(f"\nother versions of the compiled path at [N={n}, T={t}] (timed in the rounds above), ms and "
              f"their time / fast's")
        print(f"{'preset':<11} {'fast ms':>8} " + " ".join(f"{label:>14} {'/fast':>6}" for label in others))
        for name, median in other_rows:
            print(f"{name:<11} {median['fast'] * 1e3:8.2f} " + " ".join(
                f"{median[label] * 1e3:14.2f} {median[label] / median['fast']:6.2f}" for label in others))
    if mode_rows:
        print(f"\nevery framework mode at [N={n}, T={t}] (its own function, called directly; timed in the "
              f"rounds above)")
        print(f"{'framework':<16} {'preset':<11} {'mode':<34} {'theirs ms':>9} {'ours/theirs':>11}" +
              (f" {'fast/theirs':>11}" if compiled else ""))
        for p, theirs_time, ours, fast in mode_rows:
            print(f"{p.framework:<16} {p.preset:<11} {p.mode:<34} {theirs_time * 1e3:9.2f} "
                  f"{ours / theirs_time:11.2f}" + (f" {fast / theirs_time:11.2f}" if compiled else ""))


def logprobs_tables(device: torch.device, quick: bool, rounds: int) -> None:
    """The tables of benchmarks/logprobs.py (token_logprobs, the fused lm head, Liger-Kernel)."""
    try:
        import logprobs as logprobs_benchmark  # benchmarks/logprobs.py, run as a script from benchmarks/
    except ImportError:
        print("\nbenchmarks/logprobs.py not found: no token_logprobs / lm-head tables")
        return
    if quick:
        tokens, vocabs, head = 256, [4096], (2, 64, 64, 4096)
    elif device.type == "cuda":
        tokens, vocabs, head = 4096, [1 << 15, 1 << 17], (4, 1024, 2048, 1 << 17)
    else:
        tokens, vocabs, head = 1024, [1 << 15, 1 << 17], (2, 256, 256, 1 << 15)
    logprobs_benchmark.logprobs_table(tokens, vocabs, [torch.float32, torch.bfloat16], device, rounds)
    logprobs_benchmark.lm_head_table(*head, torch.float32, device, max(2, rounds // 2))


def load_module(path: str, name: str = "baseline_fused_policy"):
    """A module from a file under ``name`` (another version of a refimpl module, e.g. fused_policy.py or
    closed_form.py; its imports resolve in this tree), a fresh copy on every call."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _size(text: str) -> tuple[int, int]:
    try:
        n, t = (int(x) for x in text.lower().split("x"))
    except ValueError:
        message = f"a size is NxT (positive integers, e.g. 256x2048), got {text!r}"
        raise argparse.ArgumentTypeError(message) from None
    if n < 1 or t < 1:
        raise argparse.ArgumentTypeError(f"a size is NxT with positive integers, got {text!r}")
    return n, t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " ").strip('"'))
    parser.add_argument("--size", type=_size, action="append", metavar="NxT",
                        help="a batch size N x T (repeatable; default 64x512, 256x2048 and 1024x4096)")
    parser.add_argument("--quick", action="store_true", help="the size 64x512 only")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (medians over them)")
    parser.add_argument("--presets", nargs="*", default=list(PRESETS), choices=list(PRESETS), metavar="NAME",
                        help=f"presets to time (default: all: {', '.join(PRESETS)})")
    parser.add_argument("--compiled", action="store_true",
                        help="also the compiled fast path fused_policy_loss (compiles each preset first; "
                        "always on CUDA, where the targets judge it)")
    parser.add_argument("--aot", action="store_true",
                        help="also fused_policy_loss(compile='aot'), AOTInductor packages "
                        "(implies --compiled)")
    parser.add_argument("--baseline", metavar="FILE",
                        help="also FILE's fused_policy_loss (another version of "
                        "refimpl/losses/fused_policy.py, "
                        "e.g. from git show main:refimpl/losses/fused_policy.py), compiled, interleaved "
                        "with this one's (implies --compiled)")
    parser.add_argument("--loop", action="store_true", help="also the reference against a per-sequence loop")
    parser.add_argument("--no-frameworks", action="store_true", help="skip the frameworks")
    parser.add_argument("--logprobs", action="store_true", help="also the tables of benchmarks/logprobs.py")
    parser.add_argument("--overhead", action="store_true",
                        help="also item 2's table: the compiled path's cost a call beyond its kernel "
                        "(benchmarks/fused_overhead.py --aot in a child process, after the tables)")
    parser.add_argument("--compile-only", action="store_true",
                        help="only compile the fast path for --presets, filling torch.compile's caches")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # see timing.clock: thread CPU time measures the whole computation
    torch.manual_seed(0)
    sizes = args.size or ([(64, 512)] if args.quick else [(64, 512), (256, 2048), (1024, 4096)])
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    else:
        print(f"device: CPU ({_cpu_name()}, {os.cpu_count()} logical cores), torch {torch.__version__}, "
              f"{torch.backends.cpu.get_cpu_capability()}, 1 thread")
    if args.compile_only:
        n, t = sizes[0]
        compile_fast_path(make_batch(n, t, device), _preset_variants(args.presets, t), device)
        return
    others = {}
    if args.aot:
        others["aot"] = functools.partial(fused_policy_loss, compile="aot")
    if args.baseline:
        others["baseline"] = load_module(args.baseline).fused_policy_loss
    for n, t in sizes:
        compiled = args.compiled or bool(others) or judged(device) == "fast"
        size_tables(n, t, device, args.rounds, args.presets, compiled=compiled,
                    frameworks=not args.no_frameworks, loop=args.loop, others=others)
    if args.logprobs:
        logprobs_tables(device, args.quick, args.rounds)
    if args.overhead:
        print(f"\nissue 29 item 2 ({' '.join(overhead_command(args.rounds)[1:])}):", flush=True)
        subprocess.run(overhead_command(args.rounds), check=True)


if __name__ == "__main__":
    main()
