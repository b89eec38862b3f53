"""Benchmark: batched GAE (refimpl.estimators.gae_advantages) vs a per-trajectory Python loop.

Prints, in one run, the time of ``gae_advantages`` on ``[N, T]`` rollouts (default N = 4096,
T = 1024, float32 and float64, random terminations and truncations with probability 1/200 per
step each) and of a per-trajectory reference: a Python loop over rows, splitting each row into
episodes and running the textbook backward recursion in plain floats. The loop is too slow to run
on all N rows, so it is timed on a subset of ``--loop-rows`` rows (default 64) and scaled
linearly by N / loop_rows (rows are independent, so its cost is linear in N); the table says so.
The batched result is checked against the loop on that subset (max abs difference printed).

Usage: ``python benchmarks/estimators.py [--n 4096] [--t 1024] [--loop-rows 64] [--device cpu]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from refimpl.estimators import gae_advantages


def loop_gae(rewards, values, next_values, terminated, truncated, gamma: float, lam: float) -> np.ndarray:
    """Per-trajectory reference: Python lists and floats, one episode at a time."""
    out = np.zeros(rewards.shape)
    for i in range(rewards.shape[0]):
        r, v, nv = rewards[i].tolist(), values[i].tolist(), next_values[i].tolist()
        te, tr = terminated[i].tolist(), truncated[i].tolist()
        T = len(r)
        row = [0.0] * T
        start = 0
        while start < T:
            end = start
            while end < T - 1 and not te[end] and not tr[end]:
                end += 1
            running = 0.0
            for t in range(end, start - 1, -1):
                delta = r[t] + gamma * (0.0 if te[t] else nv[t]) - v[t]
                running = delta + (gamma * lam * running if t < end else 0.0)
                row[t] = running
            start = end + 1
        out[i] = row
    return out


def make_rollout(N: int, T: int, dtype: torch.dtype, device: torch.device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(N, T, generator=g, dtype=torch.float64)
    values = torch.randn(N, T, generator=g, dtype=torch.float64)
    final = torch.randn(N, T, generator=g, dtype=torch.float64)
    u = torch.rand(N, T, generator=g, dtype=torch.float64)
    terminated, truncated = u < 0.005, (u >= 0.005) & (u < 0.01)
    next_values = torch.cat([values[:, 1:], final[:, -1:]], dim=1)
    next_values = torch.where(terminated | truncated, final, next_values)
    to = dict(dtype=dtype, device=device)
    floats = (x.to(**to) for x in (rewards, values, next_values))
    return (*floats, terminated.to(device), truncated.to(device))


def time_batched(args, device: torch.device, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        gae_advantages(*args, 0.99, 0.95)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--t", type=int, default=1024)
    parser.add_argument("--loop-rows", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    opts = parser.parse_args()
    device = torch.device(opts.device)
    N, T, k = opts.n, opts.t, min(opts.loop_rows, opts.n)
    print(f"GAE on [N={N}, T={T}], gamma=0.99, lam=0.95, device={device}, "
          f"torch threads={torch.get_num_threads()}")
    rows = []
    for dtype in (torch.float32, torch.float64):
        args = make_rollout(N, T, dtype, device)
        batched = time_batched(args, device)
        subset = [x[:k].cpu().numpy() for x in args]
        start = time.perf_counter()
        ref = loop_gae(*subset, 0.99, 0.95)
        loop_subset = time.perf_counter() - start
        loop_full = loop_subset * N / k
        got = gae_advantages(*(x[:k] for x in args), 0.99, 0.95).advantages.double().cpu().numpy()
        name = str(dtype).replace("torch.", "")
        rows.append((name, batched, loop_subset, loop_full, np.abs(got - ref).max()))
    print(f"{'dtype':8} {'batched s':>10} {f'loop s ({k} rows)':>17} {'loop s (scaled to N)':>21} "
          f"{'speed-up':>9} {'max |diff|':>11}")
    for name, batched, loop_subset, loop_full, diff in rows:
        print(f"{name:8} {batched:10.4f} {loop_subset:17.3f} {loop_full:21.2f} {loop_full / batched:8.1f}x "
              f"{diff:11.2e}")
    print(f"(the loop is timed on {k} of {N} rows and scaled by N / {k}; rows are independent)")


if __name__ == "__main__":
    main()
