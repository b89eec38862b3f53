"""Tokens per second of the tiny-LM trainer, as ratios measured in one run:
rollout with the KV cache vs without it, and the RL update (forward + backward + AdamW on the
policy loss) vs cached rollout. Run: ``python benchmarks/trainer.py [--device cuda] [--n 512]``.

``python benchmarks/trainer.py --steps`` times whole RL steps (rollout, scoring, update) of the
default trainer on the CPU and, when there is one, on CUDA, with ``compile`` off and on (the
model's forward and the fused policy loss compiled; the first steps, which compile, are left
out): seconds per step, the median of ``--repeats`` interleaved steps, and the ratio to the same
device without compilation.

``python benchmarks/trainer.py --threads`` measures the trainer's CPU thread count instead: a fixed
slice of the main job (warm-up steps, then RL steps, default model) with 1 and 2 threads, on an
otherwise idle machine and with a second CPU-bound process running, each in a fresh process;
it prints the workload's wall and CPU seconds (best of ``--repeats``, start-up excluded), the load
average it ran under and the thread count it picks. The trainer's default thread count
(``refimpl.lm.cli.DEFAULT_THREADS``) comes from this table."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

from refimpl.lm.rollout import generate
from refimpl.lm.tasks import EOS, PAD
from refimpl.lm.train import TrainConfig, Trainer


def _best_time(fn, repeats: int, device: torch.device) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def _threads_workload(sft_steps: int, rl_steps: int) -> None:
    """The measured slice: ``sft_steps`` warm-up steps, then ``rl_steps`` RL steps (default
    config: the main job's model, batch and group sizes)."""
    trainer = Trainer(TrainConfig(device="cpu", dynamic_sampling=False))
    for _ in range(sft_steps):
        trainer.sft_step_once()
    trainer.finish_warmup()
    for _ in range(rl_steps):
        trainer.rl_step()


def _time_child(threads: int, sft_steps: int, rl_steps: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of the workload in a fresh process with ``threads`` threads,
    timed inside that process (Python and torch start-up, tens of seconds on a loaded machine, left
    out)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    out = subprocess.run(
        [sys.executable, __file__, "--worker", str(sft_steps), str(rl_steps)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    wall, cpu = (float(x) for x in out.split()[-2:])
    return wall, cpu


def threads_table(sft_steps: int, rl_steps: int, repeats: int) -> None:
    """1 vs 2 threads, idle and beside one CPU-bound process (a Python busy loop), then the thread
    count this table picks next to the trainer's default ``refimpl.lm.cli.DEFAULT_THREADS``: 2
    only if 2 threads take at least 10 % less wall time in both conditions (a smaller gain is
    within this measurement's noise on a shared machine), else 1, which never uses more CPU."""
    from refimpl.lm.cli import DEFAULT_THREADS

    print(
        f"workload: {sft_steps} warm-up steps + {rl_steps} RL steps (default model and batch), "
        f"{os.cpu_count()} CPUs, load average before: {os.getloadavg()[0]:.1f}"
    )
    print(f"{'condition':28s} {'threads':>7s} {'wall s':>8s} {'CPU s':>8s} {'CPU/wall':>8s}")
    walls: dict[int, list[float]] = {1: [], 2: []}
    for condition in ("no other job", "1 CPU-bound job beside"):
        hog = None
        if condition != "no other job":
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            for threads in (1, 2):
                runs = [_time_child(threads, sft_steps, rl_steps) for _ in range(repeats)]
                wall, cpu = min(runs)
                walls[threads].append(wall)
                print(f"{condition:28s} {threads:7d} {wall:8.2f} {cpu:8.2f} {cpu / wall:8.2f}")
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    ratios = [two / one for one, two in zip(walls[1], walls[2], strict=True)]
    picked = 2 if all(r <= 0.9 for r in ratios) else 1
    agrees = "the same" if picked == DEFAULT_THREADS else "DIFFERENT: update it"
    print(
        f"wall time of 2 threads / 1 thread: {', '.join(f'{r:.2f}' for r in ratios)} (no other job, "
        f"beside one); picked: {picked} thread(s); refimpl.lm.cli.DEFAULT_THREADS = {DEFAULT_THREADS}: "
        f"{agrees}"
    )


def steps_table(devices: list[str], repeats: int, warmup: int) -> None:
    """Seconds per RL step of the default trainer (dapo, the main job's model and batch) for each
    device, compile off and on: both trainers built and warmed up, then their steps interleaved
    (``repeats`` rounds, one step of each per round) so that load from other processes affects both
    alike; medians. On a CPU the process's CPU time (all its threads), on CUDA synchronised wall
    time."""
    print(f"RL step of the default trainer (TrainConfig defaults, dynamic sampling off), median of {repeats} "
          f"interleaved steps after {warmup} warm-up step(s) (the compiling ones); CPU: process CPU time, "
          f"CUDA: synchronised wall time")
    print(f"{'device':<8} {'compile':<8} {'s / step':>9} {'x no compile':>13} {'spread':>7}")
    for device in devices:
        trainers = {}
        for compiled in (False, True):
            torch.manual_seed(0)
            trainer = Trainer(TrainConfig(device=device, dynamic_sampling=False, compile=compiled))
            trainer.finish_warmup()
            for _ in range(warmup):
                trainer.rl_step()
            trainers[compiled] = trainer
        samples = {compiled: [] for compiled in trainers}
        for _ in range(repeats):
            for compiled, trainer in trainers.items():
                samples[compiled].append(_step_time(trainer))
        base = statistics.median(samples[False])
        for compiled, times in samples.items():
            median = statistics.median(times)
            spread = (max(times) - min(times)) / median
            print(f"{device:<8} {str(compiled):<8} {median:9.3f} {median / base:13.2f} {spread:7.2f}",
                  flush=True)


def _step_time(trainer) -> float:
    """One RL step's time: process CPU time on a CPU, synchronised wall time on CUDA."""
    cuda = trainer.device.type == "cuda"
    clock = time.perf_counter if cuda else time.process_time
    if cuda:
        torch.cuda.synchronize()
    start = clock()
    trainer.rl_step()
    if cuda:
        torch.cuda.synchronize()
    return clock() - start


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        wall0, cpu0 = time.perf_counter(), time.process_time()  # all of this process's threads
        _threads_workload(int(sys.argv[2]), int(sys.argv[3]))
        print(time.perf_counter() - wall0, time.process_time() - cpu0)
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--n", type=int, default=512, help="sequences per rollout / update")
    parser.add_argument("--n-embd", type=int, default=64)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", action="store_true", help="the 1-vs-2-threads table instead")
    parser.add_argument("--steps", action="store_true",
                        help="seconds per RL step on CPU and CUDA, compile off and on, instead")
    parser.add_argument("--warmup-steps", type=int, default=2, help="--steps: steps before timing")
    parser.add_argument("--sft-steps", type=int, default=30, help="--threads: warm-up steps measured")
    parser.add_argument("--rl-steps", type=int, default=2, help="--threads: RL steps measured")
    args = parser.parse_args()
    if args.threads:
        threads_table(args.sft_steps, args.rl_steps, args.repeats)
        return
    if args.steps:
        both = args.device in ("auto", "cuda")  # the CPU as the baseline, then CUDA where there is one
        devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
        devices = devices if both else [args.device]
        steps_table(devices, args.repeats, args.warmup_steps)
        return

    # "sort" prompts are 7 tokens; a longer generation shows the cache's effect.
    config = TrainConfig(
        task="sort",
        loss="dapo",
        device=args.device,
        n_embd=args.n_embd,
        n_layer=args.n_layer,
        max_new_tokens=args.max_new_tokens,
        group_size=8,
        prompts_per_step=args.n // 8,
        micro_batch_size=args.n,
        minibatches=1,
        inner_epochs=1,
        dynamic_sampling=False,
        reward="partial",
    )
    trainer = Trainer(config)
    trainer.finish_warmup()
    device = trainer.device
    prompts = trainer.task.sample_problems(args.n, torch.Generator().manual_seed(0)).prompts.to(device)
    model = trainer.model.eval()
    tokens = args.n * args.max_new_tokens

    def rollout(use_cache):
        gen = torch.Generator(device).manual_seed(1)
        return lambda: generate(
            model,
            prompts,
            max_new_tokens=args.max_new_tokens,
            eos=EOS,
            pad=PAD,
            generator=gen,
            use_cache=use_cache,
        )

    t_cached = _best_time(rollout(True), args.repeats, device)
    t_uncached = _best_time(rollout(False), args.repeats, device)
    model.train()
    batch = trainer.collect()
    update_tokens = float(batch.mask.sum())
    t_update = _best_time(lambda: trainer.update(batch), args.repeats, device)

    print(
        f"device {device}, {trainer.model.num_parameters()} parameters, N = {args.n}, "
        f"{args.max_new_tokens} new tokens after a {prompts.shape[1]}-token prompt"
    )
    rows = [
        ("rollout, KV cache", tokens / t_cached),
        ("rollout, no cache", tokens / t_uncached),
        ("RL update (fwd+bwd+AdamW)", update_tokens / t_update),
    ]
    base = rows[0][1]
    print(f"{'':28s} {'tokens/s':>12s} {'ratio to cached rollout':>24s}")
    for name, rate in rows:
        print(f"{name:28s} {rate:12.0f} {rate / base:24.2f}")
    print(f"KV-cache speed-up of rollout: {t_uncached / t_cached:.2f}x")


if __name__ == "__main__":
    main()
