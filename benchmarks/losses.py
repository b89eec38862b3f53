"""Benchmark of the policy-loss family (spec: specs/policy_losses.md; issue 21 "A fast path for the
losses").

Prints, in one run (ratios measured in the same process on the same tensors; on CPU the calling
thread's CPU time with one intra-op thread, on CUDA synchronised wall time; best of rounds in which
the compared functions run alternately, so that load from other processes affects them alike):

1. forward + backward time of every preset (metrics and guards included) on [N, T] float32
   log-probs with ragged (prefix) masks: the eager reference ``policy_loss``, the fast path
   ``fused_policy_loss`` (``torch.compile``: C++ loops on a CPU, Triton kernels on CUDA) and the
   same fused formulas not compiled, each as a ratio to the one-pass floor
   ``(exp(logp - old) * A * mask).sum() / mask.sum()`` (eager, forward and backward). Targets: the
   fast path at most 1.5x the floor on a GPU, 2x on a CPU. ``--loop`` adds the ratio of the eager
   reference to a per-sequence loop (``policy_loss`` row by row with the global normaliser).
2. when TRL, verl or OpenRLHF are installed (``make frameworks``): every mode of each framework's
   profile (the driver's ``PROFILE``) run through its conformance driver
   (the installed framework's own loss code) on the same tensors, forward + backward, against
   ``policy_loss`` and ``fused_policy_loss`` with the same variant: ours / theirs (target for the
   fast path: at most 0.5).
3. ``--logprobs``: the tables of benchmarks/logprobs.py (``token_logprobs`` against
   ``log_softmax().gather()``; the fused lm head against the naive one and Liger-Kernel's fused
   GRPO loss).

The fast path compiles one graph per variant on its first call (seconds each; printed, and left
out of the timings).

Usage: ``python benchmarks/losses.py`` (N = 256, T = 2048), ``--quick`` for a small run (N = 64,
T = 512), ``--device cuda``, ``--presets grpo dapo`` to time some presets only,
``--no-frameworks``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time

import torch

from refimpl.losses import DR_GRPO, PRESETS, loss_normalizer, policy_loss
from refimpl.losses.fused_policy import fused_policy_loss

FUSED_EAGER = functools.partial(fused_policy_loss, compile=False)
LOSSES = {"eager": policy_loss, "fast": fused_policy_loss, "fused, not compiled": FUSED_EAGER}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _clock(device: torch.device):
    """CUDA: wall time (with synchronisation). CPU: the calling thread's CPU time, run with one
    intra-op thread, so that other processes on a shared machine do not distort the ratios."""
    return time.perf_counter if device.type == "cuda" else time.thread_time


def _time_once(fn, device: torch.device) -> float:
    clock = _clock(device)
    _sync(device)
    start = clock()
    fn()
    _sync(device)
    return clock() - start


def best_times(fns: dict, device: torch.device, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """(best, median) seconds of each fn, over ``rounds`` rounds in which every fn runs once in turn
    (after one warm-up call each); the median / best ratio shows the noise."""
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(_time_once(fn, device))
    best = {name: min(x) for name, x in samples.items()}
    median = {name: sorted(x)[len(x) // 2] for name, x in samples.items()}
    return best, median


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


def agreement(batch, variant) -> float:
    """Largest difference of the fast path from the eager reference on the benchmark's tensors
    (loss, gradient and metrics), relative to each quantity's largest magnitude: a check of the
    compiled kernels on the device measured."""
    results = []
    for loss_fn in (policy_loss, fused_policy_loss):
        logp = batch["logp"].detach().requires_grad_(True)
        loss, metrics = loss_fn(logp, batch["old_logp"], batch["advantages"], batch["mask"], variant)
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


def compile_fast_path(batch, variants: list, device: torch.device) -> None:
    """Compile the fast path's graph of each variant (its first call), outside the timings."""
    start = time.perf_counter()
    for variant in variants:
        loss_step(batch, variant, fused_policy_loss)
    _sync(device)
    print(f"torch.compile of the fast path: {time.perf_counter() - start:.1f} s wall for {len(variants)} "
          f"variant(s) (first calls, left out of the timings)")


def _preset_variants(names: list[str], t: int) -> dict:
    """The presets to time; Dr. GRPO with L_max the padded width ``t``."""
    return {name: dataclasses.replace(DR_GRPO, max_length=t) if name == "dr_grpo" else PRESETS[name]
            for name in names}


def policy_loss_table(n: int, t: int, device: torch.device, rounds: int, names: list[str],
                      loop: bool) -> None:
    batch = make_batch(n, t, device)
    variants = _preset_variants(names, t)
    compile_fast_path(batch, list(variants.values()), device)
    what = "thread CPU time, 1 thread" if device.type == "cpu" else "wall time"
    print(f"\npolicy_loss forward+backward (metrics and guards included), [N={n}, T={t}] float32, ragged "
          f"masks, device {device}; best of {rounds} rounds ({what}), the floor and the three losses timed "
          f"in turn; noise: median / best")
    header = (f"{'preset':<12} {'floor ms':>8} {'eager ms':>9} {'fast ms':>8} {'fused ms':>9} "
              f"{'eager/fl':>9} {'fast/fl':>8} {'fused/fl':>9} {'fast/eager':>10} {'noise':>6}")
    print(header + f" {'rel diff':>9}" + (f" {'eager/loop':>10}" if loop else ""))
    print("(fast: fused_policy_loss compiled; fused: the same formulas not compiled; fl: the floor; "
          "rel diff: "
          "the fast path's largest difference from eager in loss, gradient and metrics, relative)")
    for name, variant in variants.items():
        fns = {"floor": lambda: floor_step(batch)}
        fns.update({label: functools.partial(loss_step, batch, variant, fn) for label, fn in LOSSES.items()})
        best, median = best_times(fns, device, rounds)
        noise = max(median[k] / best[k] for k in best)
        floor = best["floor"]
        fused = best["fused, not compiled"]
        row = (f"{name:<12} {floor * 1e3:8.2f} {best['eager'] * 1e3:9.2f} {best['fast'] * 1e3:8.2f} "
               f"{fused * 1e3:9.2f} {best['eager'] / floor:9.2f} {best['fast'] / floor:8.2f} "
               f"{fused / floor:9.2f} {best['fast'] / best['eager']:10.3f} {noise:6.2f} "
               f"{agreement(batch, variant):9.1e}")
        if loop:
            pair = {"eager": fns["eager"], "loop": lambda v=variant: loop_step(batch, v)}
            looped, _ = best_times(pair, device, max(1, rounds // 3))
            row += f" {looped['eager'] / looped['loop']:10.4f}"
        print(row)


def _mode_variant(mode, t: int):
    """The refimpl variant a framework mode implements (its preset with the mode's overrides; a
    Dr. GRPO L_max of the padded width ``t``, which bounds every length as L_max must)."""
    from refimpl.losses import get_preset

    variant = dataclasses.replace(get_preset(mode.preset), **mode.variant_overrides)
    if variant.aggregation == "seq_sum" and (variant.max_length or 0) < t:
        variant = dataclasses.replace(variant, max_length=t)
    return variant


def framework_step(batch, fn, adapter) -> None:
    """One forward + backward of a framework's own loss through its conformance driver."""
    from refimpl.conformance.checks import PolicyLossCall

    logp = batch["logp"].detach().requires_grad_(True)
    mask = batch["mask"]
    call = PolicyLossCall(
        logp, batch["old_logp"], batch["advantages"], mask, None, batch["advantages"],
        torch.arange(mask.shape[0], device=mask.device), None, {},
        global_tokens=int(mask.sum()), global_sequences=int(mask.any(-1).sum()), global_rows=mask.shape[0],
    )
    adapter(fn, call).backward()


def _framework_modes(t: int) -> list:
    """(framework label, preset, mode name, variant, fn, adapter) of every installed framework's
    profile modes; a line for each framework that is not installed."""
    from refimpl.conformance.frameworks import FRAMEWORKS, load_driver

    rows = []
    for name in FRAMEWORKS:
        driver = load_driver(name)
        reason = driver.availability()
        if reason is not None:
            print(f"{name:<16} skipped: {reason}")
            continue
        label = f"{name} {driver.installed_version()}"
        for preset in driver.profile_table:
            mode = next(m for m in driver.profile_modes(preset) if m.kind == "policy_loss")
            variant = _mode_variant(mode, t)
            fn, adapter = driver.target("policy_loss", mode.name, variant)
            rows.append((label, preset, mode.name, variant, fn, adapter))
    return rows


def frameworks_table(n: int, t: int, device: torch.device, rounds: int) -> None:
    """Ours (eager and fast) / theirs for every policy-loss mode of each installed framework's profile."""
    batch = make_batch(n, t, device)
    print(f"\npolicy_loss vs the installed frameworks' own loss code (conformance drivers), "
          f"[N={n}, T={t}] float32, device {device}; best of {rounds} rounds, the three timed in turn")
    rows = _framework_modes(t)
    compile_fast_path(batch, list({row[3]: None for row in rows}), device)
    print(f"{'framework':<16} {'preset':<11} {'mode':<32} {'eager ms':>9} {'fast ms':>8} {'theirs ms':>10} "
          f"{'eager/theirs':>12} {'fast/theirs':>11} {'noise':>6}")
    for label, preset, mode_name, variant, fn, adapter in rows:
        best, median = best_times({
            "theirs": lambda f=fn, a=adapter: framework_step(batch, f, a),
            "eager": lambda v=variant: loss_step(batch, v),
            "fast": lambda v=variant: loss_step(batch, v, fused_policy_loss),
        }, device, rounds)
        noise = max(median[k] / best[k] for k in best)
        print(f"{label:<16} {preset:<11} {mode_name:<32} {best['eager'] * 1e3:9.2f} "
              f"{best['fast'] * 1e3:8.2f} {best['theirs'] * 1e3:10.2f} "
              f"{best['eager'] / best['theirs']:12.2f} {best['fast'] / best['theirs']:11.3f} {noise:6.2f}")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (N = 64, T = 512)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--presets", nargs="*", default=list(PRESETS), choices=list(PRESETS))
    parser.add_argument("--loop", action="store_true", help="also the per-sequence loop reference")
    parser.add_argument("--no-frameworks", action="store_true", help="skip the frameworks table")
    parser.add_argument("--logprobs", action="store_true", help="also the tables of benchmarks/logprobs.py")
    parser.add_argument("--compile-only", action="store_true",
                        help="only compile the fast path for --presets and (unless --no-frameworks) the "
                             "frameworks' other variants, filling torch.compile's caches for a later run")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # see _clock: thread CPU time measures the whole computation
    torch.manual_seed(0)
    n, t = (64, 512) if args.quick else (256, 2048)
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    if args.compile_only:
        variants = list(_preset_variants(args.presets, t).values())
        if not args.no_frameworks:
            presets = set(_preset_variants(list(PRESETS), t).values())
            variants += [v for v in {row[3]: None for row in _framework_modes(t)} if v not in presets]
        compile_fast_path(make_batch(n, t, device), variants, device)
        return
    policy_loss_table(n, t, device, args.rounds, args.presets, args.loop)
    if not args.no_frameworks:
        frameworks_table(n, t, device, args.rounds)
    if args.logprobs:
        logprobs_tables(device, args.quick, args.rounds)


if __name__ == "__main__":
    main()
