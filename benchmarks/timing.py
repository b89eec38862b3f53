"""Timing shared by the benchmarks: the clock, one call's time, and rounds that interleave the functions
compared in an order shuffled each round.

A function's time depends on what ran just before it (which of its inputs and buffers are still
cached, the allocator's free lists): on the development machine two copies of one loss measured 1.4x
apart when one of them always followed another framework's step. A fixed order, or one rotated by one
each round (which keeps every function after the same one), biases the comparison; a shuffled order
(fixed seed, so a run can be repeated) gives every function every predecessor.

On a CPU the clock is the calling thread's CPU time, run with one intra-op thread, so that other
processes on a shared machine slow every function alike; on CUDA synchronised wall time.
"""

from __future__ import annotations

import random
import statistics
import time

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock(device: torch.device):
    """CUDA: wall time (with synchronisation). CPU: the calling thread's CPU time."""
    return time.perf_counter if device.type == "cuda" else time.thread_time


def time_once(fn, device: torch.device) -> float:
    """Seconds of one call of ``fn``."""
    now = clock(device)
    sync(device)
    start = now()
    fn()
    sync(device)
    return now() - start


def interleaved_samples(fns: dict, device: torch.device, rounds: int,
                        seed: int = 0) -> dict[str, list[float]]:
    """Each function's times over ``rounds`` rounds (after one warm-up call each), every function once
    per round in an order shuffled each round (``random.Random(seed)``)."""
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    shuffle = random.Random(seed).shuffle
    for _ in range(rounds):
        shuffle(order)
        for name in order:
            samples[name].append(time_once(fns[name], device))
    return samples


def median_times(fns: dict, device: torch.device, rounds: int, *, spread: str = "iqr"
                 ) -> tuple[dict[str, float], float]:
    """(median seconds of each fn, spread) over ``rounds`` interleaved rounds (``interleaved_samples``);
    spread: the largest interquartile range (``"iqr"``) or max - min (``"range"``) over the median, over
    the functions."""
    samples = interleaved_samples(fns, device, rounds)
    median = {name: statistics.median(x) for name, x in samples.items()}
    widest = 0.0
    for name, x in samples.items():
        if spread == "range":
            width = max(x) - min(x)
        else:
            q = statistics.quantiles(x, n=4) if len(x) > 1 else [x[0]] * 3
            width = q[2] - q[0]
        widest = max(widest, width / median[name])
    return median, widest


def best_times(fns: dict, device: torch.device, rounds: int) -> dict[str, float]:
    """Best time in seconds of each fn over ``rounds`` interleaved rounds (``interleaved_samples``)."""
    return {name: min(x) for name, x in interleaved_samples(fns, device, rounds).items()}
