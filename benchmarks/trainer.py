"""Tokens per second of the tiny-LM trainer, as ratios measured in one run:
rollout with the KV cache vs without it, and the RL update (forward + backward + AdamW on the
policy loss) vs cached rollout. Run: ``python benchmarks/trainer.py [--device cuda] [--n 512]``."""

from __future__ import annotations

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--n", type=int, default=512, help="sequences per rollout / update")
    parser.add_argument("--n-embd", type=int, default=64)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

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
