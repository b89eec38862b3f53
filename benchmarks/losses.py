"""Benchmark of the policy-loss family (spec: specs/policy_losses.md; issue "GRPO family").

Prints, in one run (ratios measured in the same process on the same tensors; on CPU
single-threaded CPU time, on CUDA synchronised wall time):

1. forward + backward time of every preset (metrics included) on [N, T] float32 log-probs with
   ragged (prefix) masks, as ratios to the one-pass floor
   ``(exp(logp - old) * A * mask).sum() / mask.sum()`` (forward and backward) and to a
   per-sequence loop reference (``policy_loss`` called row by row with the global normaliser,
   summed: the same loss, one sequence at a time). Target: each preset at most 5x the floor.
2. when TRL, verl or OpenRLHF are installed (``make frameworks``): every mode of each framework's
   profile (the driver's ``PROFILE``) run through its conformance driver
   (the installed framework's own loss code) on the same tensors, forward + backward, against
   ``policy_loss`` with the same variant: the ratio ours / theirs (below 1: ours is faster).
3. ``token_logprobs`` against ``log_softmax().gather()``: forward + backward time and memory for
   a number of tokens and vocabularies (CUDA: peak allocated bytes; everywhere: bytes autograd
   saves for backward, counted with saved-tensor hooks).

Usage: ``python benchmarks/losses.py`` (defaults: N = 256, T = 2048, 4096 tokens, V in {32k, 128k};
the V = 128k case needs ~8 GB for log_softmax().gather()), ``--quick`` for a small CPU run
(N = 64, T = 512, 1024 tokens), ``--device cuda`` to pick a device.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from refimpl.losses import DR_GRPO, PRESETS, loss_normalizer, policy_loss

try:  # written by another engineer; the second table is skipped without it
    from refimpl.losses.logprobs import token_logprobs
except ImportError:  # pragma: no cover
    token_logprobs = None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _clock(device: torch.device):
    """CUDA: wall time (with synchronisation). CPU: the calling thread's CPU time, run with one
    intra-op thread, so that other processes on a shared machine do not distort the ratios."""
    return time.perf_counter if device.type == "cuda" else time.thread_time


def _times(fn, device: torch.device, repeats: int, warmup: int = 2) -> list[float]:
    """Times of fn() in seconds (see _clock)."""
    clock = _clock(device)
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        _sync(device)
        times.append(clock() - start)
    return times


def _interleaved_ratio(fn, reference, device: torch.device, rounds: int) -> tuple[float, float]:
    """(best time of fn, best-time ratio fn / reference), timing the two alternately so that load
    from other processes affects both alike."""
    best_fn, best_ref = float("inf"), float("inf")
    for _ in range(rounds):
        best_ref = min(best_ref, *_times(reference, device, 1, warmup=1))
        best_fn = min(best_fn, *_times(fn, device, 1, warmup=1))
    return best_fn, best_fn / best_ref


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


def preset_step(batch, variant) -> None:
    logp = batch["logp"].detach().requires_grad_(True)
    loss, metrics = policy_loss(logp, batch["old_logp"], batch["advantages"], batch["mask"], variant)
    loss.backward()


def loop_step(batch, variant) -> None:
    logp = batch["logp"].detach().requires_grad_(True)
    normalizer = loss_normalizer(batch["mask"], variant)
    total = 0.0
    for i in range(logp.shape[0]):
        loss, _ = policy_loss(logp[i : i + 1], batch["old_logp"][i : i + 1], batch["advantages"][i : i + 1],
                              batch["mask"][i : i + 1], variant, normalizer=normalizer)
        total = total + loss
    total.backward()


def policy_loss_table(n: int, t: int, device: torch.device, repeats: int) -> None:
    batch = make_batch(n, t, device)
    floor = min(_times(lambda: floor_step(batch), device, repeats))
    what = "thread CPU time, 1 thread" if device.type == "cpu" else "wall time"
    print(f"\npolicy_loss forward+backward (metrics included), [N={n}, T={t}] float32, ragged masks, "
          f"device {device}; best of {repeats} ({what}), timed alternately with the floor / the loop")
    print(f"floor (one pass): {floor * 1e3:.2f} ms")
    print(f"{'preset':<12} {'ms':>9} {'x floor':>9} {'x loop':>9}")
    for name, variant in PRESETS.items():
        if name == "dr_grpo":
            variant = dataclasses.replace(DR_GRPO, max_length=t)
        seconds, vs_floor = _interleaved_ratio(lambda v=variant: preset_step(batch, v),
                                               lambda: floor_step(batch), device, repeats)
        _, vs_loop = _interleaved_ratio(lambda v=variant: preset_step(batch, v),
                                        lambda v=variant: loop_step(batch, v), device, max(1, repeats // 3))
        print(f"{name:<12} {seconds * 1e3:9.2f} {vs_floor:9.2f} {vs_loop:9.4f}")


def _mode_variant(mode, t: int):
    """The refimpl variant a framework mode implements (its preset with the mode's overrides; a
    Dr. GRPO L_max of the padded width ``t``)."""
    from refimpl.losses import get_preset

    variant = dataclasses.replace(get_preset(mode.preset), **mode.variant_overrides)
    if variant.aggregation == "seq_sum" and variant.max_length is None:
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


def frameworks_table(n: int, t: int, device: torch.device, repeats: int) -> None:
    """Ours / theirs for every policy-loss mode of each installed framework's profile."""
    from refimpl.conformance.frameworks import FRAMEWORKS, load_driver

    batch = make_batch(n, t, device)
    print(f"\npolicy_loss vs the installed frameworks' own loss code (conformance drivers), "
          f"[N={n}, T={t}] float32, device {device}; best of {repeats}, timed alternately")
    print(f"{'framework':<16} {'preset':<11} {'mode':<32} {'ours ms':>9} {'theirs ms':>10} "
          f"{'ours/theirs':>12}")
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
            theirs = min(_times(lambda f=fn, a=adapter: framework_step(batch, f, a), device, repeats))
            ours, ratio = _interleaved_ratio(lambda v=variant: preset_step(batch, v),
                                             lambda f=fn, a=adapter: framework_step(batch, f, a),
                                             device, repeats)
            print(f"{label:<16} {preset:<11} {mode.name:<32} {ours * 1e3:9.2f} {theirs * 1e3:10.2f} "
                  f"{ratio:12.2f}")


def _saved_bytes_beyond(fn, leaf: torch.Tensor) -> int:
    """Bytes of the tensors autograd saves for backward while fn() builds its graph, each storage
    counted once, not counting the storage of ``leaf`` (the logits themselves)."""
    seen: dict[int, int] = {}
    leaf_ptr = leaf.untyped_storage().data_ptr()

    def pack(x: torch.Tensor):
        storage = x.untyped_storage()
        if storage.data_ptr() != leaf_ptr:
            seen[storage.data_ptr()] = storage.nbytes()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        out = fn()
    out.backward()
    return sum(seen.values())


def logprobs_table(tokens: int, vocabs: list[int], device: torch.device, repeats: int) -> None:
    if token_logprobs is None:
        print("\nrefimpl.losses.logprobs.token_logprobs not available: table skipped")
        return
    print(f"\ntoken_logprobs vs log_softmax().gather(), {tokens} tokens, float32 logits, device {device}")
    print(f"{'V':>8} {'method':<22} {'ms':>9} {'saved* MiB':>10} {'peak MiB':>10}")
    g = torch.Generator().manual_seed(0)
    for vocab in vocabs:
        logits = torch.randn(tokens, vocab, generator=g).to(device)
        ids = torch.randint(0, vocab, (tokens,), generator=g).to(device)
        methods = {
            "log_softmax().gather()": lambda x, ids=ids: torch.log_softmax(x, dim=-1).gather(
                -1, ids.unsqueeze(-1)).squeeze(-1),
            "token_logprobs": lambda x, ids=ids: token_logprobs(x, ids),
        }
        for label, method in methods.items():
            def step(m=method, logits=logits):
                x = logits.detach().requires_grad_(True)
                m(x).sum().backward()

            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            seconds = min(_times(step, device, repeats, warmup=1))
            peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else float("nan")
            x = logits.detach().requires_grad_(True)
            saved = _saved_bytes_beyond(lambda m=method, x=x: m(x).sum(), x) / 2**20
            print(f"{vocab:>8} {label:<22} {seconds * 1e3:9.2f} {saved:10.2f} {peak:10.1f}")
        del logits
    print("saved*: bytes autograd keeps for backward beyond the logits themselves")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for a CPU smoke run")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=None, help="tokens of the logprobs table (4096)")
    parser.add_argument("--vocabs", type=int, nargs="*", default=None, help="V of the logprobs table")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # see _clock: thread CPU time measures the whole computation
    torch.manual_seed(0)
    n, t, tokens, vocabs = (64, 512, 1024, [32_000]) if args.quick else (256, 2048, 4096, [32_000, 128_000])
    policy_loss_table(n, t, device, args.repeats)
    frameworks_table(n, t, device, args.repeats)
    vocabs = vocabs if args.vocabs is None else args.vocabs
    logprobs_table(args.tokens or tokens, vocabs, device, args.repeats)


if __name__ == "__main__":
    main()
